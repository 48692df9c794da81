"""The operations' statements stay on indexes on a table full of completed jobs.

The table holds 200,000 completed rows of two queues, 5,000 pending rows (a
quarter of them not due for an hour), 100 running, 2,000 dead, 500
cancelled and 300 waiting ones. ``EXPLAIN (ANALYZE, BUFFERS)`` of each statement of
`pgqueue.Admin.stats` and of the listings by status must show no
sequential scan of ``pgqueue_jobs``: every scan of it goes through an index
(a bitmap heap scan only over a partial index), and the stats touch a
number of buffers bounded by the pending, running, dead and cancelled rows,
well under the table's pages. `Admin.stats` itself, run inside a
transaction, scans the table sequentially zero times (the statistics
collector's own count for the transaction), and estimates the completed
counts (the table is over the exact-count bound) close to the truth.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

import pgqueue
from pgqueue import _admin
from pgqueue._sql.admin import RETRYABLE_IDS
from pgqueue._sql.dashboard import STATS_TOP
from pgqueue._sql.listings import STATS, jobs_query
from tests.helpers import explain_analyze, plan_buffers, plan_nodes

pytestmark = pytest.mark.slow

COMPLETED = {"a": 150_000, "b": 50_000}

FILL = (
    """
    INSERT INTO pgqueue_jobs (queue, job_type, status, attempts, run_at, created_at,
                              updated_at, completed_at)
    SELECT CASE WHEN g % 4 = 0 THEN 'b' ELSE 'a' END, 'noop', 'completed', 1,
           now() - interval '2 days', now() - interval '2 days',
           now() - interval '1 day', now() - interval '1 day'
    FROM generate_series(1, 200000) AS g
    """,
    """
    INSERT INTO pgqueue_jobs (queue, job_type, run_at)
    SELECT 'a', 'noop', CASE WHEN g % 4 = 0 THEN now() + interval '1 hour'
                             ELSE now() - make_interval(secs => g) END
    FROM generate_series(1, 5000) AS g
    """,
    """
    INSERT INTO pgqueue_jobs (queue, job_type, status, attempts)
    SELECT 'b', 'noop', 'running', 1 FROM generate_series(1, 100)
    """,
    """
    INSERT INTO pgqueue_jobs (queue, job_type, status, attempts, last_error)
    SELECT CASE WHEN g % 2 = 0 THEN 'a' ELSE 'b' END, 'noop',
           CASE WHEN g % 5 = 0 THEN 'cancelled' ELSE 'dead' END, 5, 'boom'
    FROM generate_series(1, 2500) AS g
    """,
    """
    INSERT INTO pgqueue_jobs (queue, job_type, status, parents_left)
    SELECT CASE WHEN g % 3 = 0 THEN 'b' ELSE 'a' END, 'noop', 'waiting', 1
    FROM generate_series(1, 300) AS g
    """,
)


PARTIAL_INDEXES = {
    "idx_pgqueue_jobs_claim",
    "idx_pgqueue_jobs_rescue",
    "idx_pgqueue_jobs_failed",
    "idx_pgqueue_jobs_waiting",
}


def _check_indexed(plan: dict[str, Any]) -> set[str]:
    """Fail on a scan of pgqueue_jobs not through an index; return the indexes used."""
    nodes = plan_nodes(plan)
    used = {n["Index Name"] for n in nodes if "Index Name" in n}
    for node in nodes:
        if node.get("Relation Name") != "pgqueue_jobs":
            continue
        kind = node["Node Type"]
        assert kind not in {"Seq Scan", "Tid Range Scan"}, kind
        if kind == "Bitmap Heap Scan":
            under = {n.get("Index Name") for n in plan_nodes(node)} - {None}
            assert under, node
            assert under <= PARTIAL_INDEXES, under
    assert used, [n["Node Type"] for n in nodes]
    return used


async def fill(
    connection: asyncpg.Connection, *more: str, analyze: str = "ANALYZE"
) -> None:
    """Fill the table (FILL, then ``more``) and ``analyze`` it."""
    for statement in (*FILL, *more):
        await connection.execute(statement)
    if connection.get_server_version() >= (15, 0):
        # A backend reports its inserts at most once a second: counts
        # still pending when ANALYZE sets n_live_tup would be added on
        # top of it later, doubling the table's live rows.
        await connection.execute("SELECT pg_stat_force_next_flush()")
    await connection.execute(f"{analyze} pgqueue_jobs")


@pytest.fixture
async def big_table(fresh_dsn: str) -> Any:
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await fill(connection)
        yield connection
    finally:
        await connection.close()


@pytest.mark.parametrize("mode", ["auto", "force_generic_plan"])
async def test_stats_and_listings_use_indexes_on_a_big_table(
    big_table: asyncpg.Connection, mode: str
) -> None:
    """With the default plans, and with generic ones (as on a worker's connections)."""
    await big_table.execute(f"SET plan_cache_mode = {mode}")
    pages = await big_table.fetchval(
        "SELECT pg_relation_size('pgqueue_jobs') / current_setting('block_size')::int"
    )
    assert pages > _admin.EXACT_COMPLETED_PAGES, pages

    for queue in (None, "a", "b"):
        stats = await explain_analyze(big_table, STATS, queue)
        used = _check_indexed(stats)
        assert used >= PARTIAL_INDEXES, used
        assert plan_buffers(stats) < pages / 4, (plan_buffers(stats), pages)
    # Admin.top_queues: every queue, some by name, those whose name holds "a".
    for names, contains in ((None, None), (["a", "c"], None), (None, "a")):
        top = await explain_analyze(big_table, STATS_TOP, names, contains, 50, [])
        used = _check_indexed(top)
        assert used >= PARTIAL_INDEXES, used
        assert plan_buffers(top) < pages / 4, (plan_buffers(top), pages)

    listings = [
        (status, queue)
        for status in (
            "pending",
            "ready",
            "scheduled",
            "running",
            "dead",
            "cancelled",
            "waiting",
        )
        for queue in ("a", "b")
    ]
    for status, queue in listings:
        plan = await explain_analyze(
            big_table, jobs_query(status), queue, None, None, 50
        )
        _check_indexed(plan)
        assert plan_buffers(plan) < pages / 4, (status, queue, plan_buffers(plan))
    for status in ("dead", "cancelled"):
        plan = await explain_analyze(
            big_table, RETRYABLE_IDS, status, "a", None, 1000, 0
        )
        assert _check_indexed(plan) == {"idx_pgqueue_jobs_failed"}

    # The whole call, in a transaction: no sequential scan of the table.
    transaction = big_table.transaction()
    await transaction.start()
    try:
        found = await pgqueue.Admin(big_table).stats()
        scans = await big_table.fetchrow(
            "SELECT seq_scan, idx_scan FROM pg_stat_xact_user_tables"
            " WHERE relname = 'pgqueue_jobs'"
        )
    finally:
        await transaction.rollback()
    assert scans is not None
    assert scans["seq_scan"] == 0, dict(scans)
    assert scans["idx_scan"] > 0, dict(scans)

    by_queue = {s.queue: s for s in found}
    assert set(by_queue) == {"a", "b"}
    a, b = by_queue["a"], by_queue["b"]
    assert (a.ready, a.scheduled, a.running, a.dead, a.cancelled) == (
        3750,
        1250,
        0,
        1000,
        250,
    )
    assert (a.waiting, b.waiting) == (200, 100)
    assert (b.ready, b.scheduled, b.running, b.dead, b.cancelled) == (
        0,
        0,
        100,
        1000,
        250,
    )
    for stat in found:
        assert stat.completed_estimated
        true = COMPLETED[stat.queue]
        assert abs(stat.completed - true) < true * 0.1, (stat.queue, stat.completed)
