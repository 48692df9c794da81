"""The web dashboard's queries stay on indexes on a table full of completed jobs.

The table of tests/test_admin_plans.py (200,000 completed rows of two queues,
and pending, running, dead and cancelled ones). Two checks:

* ``EXPLAIN (ANALYZE, BUFFERS)`` of every statement a page runs (the
  listings' summaries, a job's preview, summary and durable state), with each filter the
  listing offers (queue, status, type, a keyset cursor either way), shows
  no sequential scan of ``pgqueue_jobs``, with the default plans and with
  generic ones;
* every page, requested through the app on a one-connection pool, adds no
  sequential scan to ``pg_stat_user_tables`` (whatever statement it runs).

No index was added for the dashboard: it reads through the primary key,
the claim and rescue indexes, and the partial index of dead and cancelled
jobs that `pgqueue.Admin` uses.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import asyncpg
import httpx
import pytest

from pgqueue._sql.admin import DEAD_COUNT, RETRYABLE_IDS
from pgqueue._sql.dashboard import (
    DASHBOARD_DEAD_SHOWN,
    DASHBOARD_ENQUEUED_SHOWN,
    DASHBOARD_NEWEST,
    DASHBOARD_RUNNING_SHOWN,
    JOB_PREVIEW_SHOWN,
    JOB_SUMMARY_SHOWN,
    shown_summaries_query,
)
from pgqueue._sql.durable_view import JOB_DURABLE
from pgqueue._sql.listings import (
    JOB,
    JOB_STATUSES,
    jobs_query,
)
from pgqueue.web import create_app
from tests.helpers import explain_analyze
from tests.test_admin_plans import _check_indexed, fill

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytestmark = pytest.mark.slow


@pytest.fixture
async def big_table(fresh_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await fill(
            connection,
            "UPDATE pgqueue_jobs SET job_type = 'report' WHERE id % 1000 = 0",
            "INSERT INTO pgqueue_periodic (name, schedule, queue, job_type)"
            " VALUES ('nightly', '0 3 * * *', 'a', 'noop')",
            analyze="VACUUM ANALYZE",
        )
        yield connection
    finally:
        await connection.close()


@pytest.mark.parametrize("mode", ["auto", "force_generic_plan"])
async def test_every_statement_of_the_pages_uses_an_index(
    big_table: asyncpg.Connection, mode: str
) -> None:
    await big_table.execute(f"SET plan_cache_mode = {mode}")
    middle = await big_table.fetchval("SELECT max(id) / 2 FROM pgqueue_jobs")
    newest = await big_table.fetchval(DASHBOARD_NEWEST)
    # The queues page's frame (statements of Admin.stats are in test_admin_plans).
    statements: list[tuple[str, tuple[Any, ...]]] = [
        (DASHBOARD_NEWEST, ()),
        (DASHBOARD_ENQUEUED_SHOWN, (newest - 100, newest, ["a", "b"])),
        (JOB, (middle,)),
        (JOB_PREVIEW_SHOWN, (middle, 50_000)),
        (JOB_SUMMARY_SHOWN, (middle,)),
        (JOB_DURABLE, (middle, 200)),
    ]
    # The frame's running and dead jobs: of every queue, of one, by a name's part.
    for names, contains in ((None, None), (["a"], None), (None, "a")):
        statements.append((DASHBOARD_RUNNING_SHOWN, (names, contains, 5, True)))
        statements.append((DASHBOARD_DEAD_SHOWN, (names, contains, 5)))
    # The listing: every status, with and without a queue, a type, a cursor.
    for status, queue, job_type, before in itertools.product(
        (None, *JOB_STATUSES), (None, "a"), (None, "report"), (None, middle)
    ):
        if (
            mode == "force_generic_plan"
            and job_type is not None
            and status in (None, "completed")
        ):
            # No index serves a type among every job: either plan reads rows
            # until 51 match (1 in 1,000 here), and a generic plan, which
            # cannot know the type is rare, picks between a walk of the
            # primary key and a scan by a sample's estimates (both were
            # seen). The README states what such a listing costs.
            continue
        # The pages list summaries (Admin.job_summaries); Admin.jobs reads
        # the same rows with every column.
        for query in (jobs_query, shown_summaries_query):
            args = (queue, job_type, before, 51)
            statements.append((query(status), args))
            if before is not None:  # a Newer page, back up from the same cursor
                statements.append((query(status, newer=True), args))
    # Retry all: its confirmation's count, and the ids it retries.
    for queue, job_type in itertools.product((None, "a"), (None, "report")):
        statements.append((DEAD_COUNT, (queue, job_type)))
        statements.append((RETRYABLE_IDS, ("dead", queue, job_type, 1000, 0)))
    for sql, args in statements:
        plan = await explain_analyze(big_table, sql, *args)
        try:
            _check_indexed(plan)
        except AssertionError as exc:
            raise AssertionError(f"{sql.strip()[:200]} {args}: {exc}") from None


async def test_no_page_scans_the_table(
    fresh_dsn: str, big_table: asyncpg.Connection
) -> None:
    dead = await big_table.fetchval(
        "SELECT max(id) FROM pgqueue_jobs WHERE status = 'dead'"
    )
    middle = await big_table.fetchval("SELECT max(id) / 2 FROM pgqueue_jobs")
    pages = [
        "/",
        "/fragments/queues",
        "/fragments/queues",
        "/jobs",
        "/jobs?queue=a",
        "/jobs?type=report",
        f"/jobs?before={middle}",
        f"/jobs?queue=b&status=completed&type=report&before={middle}",
        f"/jobs?after={middle}",
        f"/jobs?queue=b&status=completed&type=report&after={middle}",
        f"/jobs?status=dead&after={middle}",
        "/jobs?status=dead&queue=a",
        "/jobs?status=ready",
        "/jobs?status=running",
        f"/jobs/{dead}",
        f"/jobs/{dead}/retry",
        f"/jobs/{middle}/signal",
        "/retry-all?queue=a&type=report",
        "/periodic",
        # The filter of ?where=, and the count of "All N matching" of a
        # status an index serves. Another count may scan (at most 10,001
        # matches, stopped there): it is asked for only when the box is
        # checked, never with a page.
        "/jobs?where=queue=a&where=status=dead",
        f"/jobs?where=status=completed&where=queue=b&before={middle}",
        "/api/count?where=status=dead",
        "/api/count?where=status=running&where=queue=a",
    ]
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=1) as pool:
        app = create_app(pool, read_only=False)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://localhost"
        ) as c:
            for path in pages:
                await pool.execute("SELECT pg_stat_force_next_flush()")
                before = await _seq_scans(big_table)
                answer = await c.get(path)
                assert answer.status_code == 200, path
                await pool.execute("SELECT pg_stat_force_next_flush()")
                await pool.execute("SELECT 1")  # flushes at the end of this one
                assert await _seq_scans(big_table) == before, path


async def _seq_scans(connection: asyncpg.Connection) -> int:
    scans: int = await connection.fetchval(
        "SELECT seq_scan FROM pg_stat_user_tables WHERE relname = 'pgqueue_jobs'"
    )
    return scans
