"""Job types a worker has no handler for, under both rules.

``unknown_types="wait"`` (the default) claims only the types the worker has
handlers for, so a job another application (or a newer producer) enqueued
on the queue waits, unclaimed and with no attempt used, for a worker that
has its handler: no worker destroys another's job at first sight.
``"dead"`` (the seed's and the Go module's rule) dead-letters such a job at
once. The claim of some types is one statement on the same indexes as the
claim of every type (`CLAIM_TYPES`), checked here on a table of
20,000 jobs, custom and generic plans alike.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue._sql.claims import CLAIM_TYPES
from pgqueue._sql.literals import claim_places
from tests.cli_apps import RUNS
from tests.helpers import drain, noop, row, running, wait_for_row
from tests.test_statement_plans import _claimed, _plans, _table_scans

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

ROOT = Path(__file__).resolve().parent.parent


async def test_with_unknown_types_dead_a_job_without_a_handler_goes_dead_at_once(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, unknown_types="dead")
    worker.register("old", noop)
    job_id = await queue.enqueue("new", {})
    await drain(worker)
    stored = await row(pool, job_id)
    assert (stored["status"], stored["attempts"], stored["last_error"]) == (
        "dead",
        1,
        "no handler registered for job type 'new'",
    )


async def test_by_default_jobs_of_other_types_wait_for_a_worker_that_has_them(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # Another application's job on a shared queue, or a newer producer's in
    # a rolling deploy: untouched by a worker without its handler.
    old_worker = pgqueue.Worker(pool, queue=queue.name)
    old_worker.register("old", noop)
    new_job = await queue.enqueue("new", {})
    old_job = await queue.enqueue("old", {})
    await drain(old_worker)
    assert (await row(pool, old_job))["status"] == "completed"
    waiting = await row(pool, new_job)
    assert (waiting["status"], waiting["attempts"], waiting["last_error"]) == (
        "pending",
        0,
        None,
    )

    ran: list[int] = []
    newer = pgqueue.Worker(pool, queue=queue.name)

    @newer.handler("new")
    async def handle_new(job: pgqueue.Job) -> None:
        ran.append(job.id)

    newer.register("old", noop)
    await drain(newer)
    done = await row(pool, new_job)
    assert (done["status"], done["attempts"]) == ("completed", 1)
    assert ran == [new_job]


async def test_a_running_waiting_worker_is_woken_but_claims_only_its_types(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    """An old worker running when the new type arrives; a newer one starts beside it."""
    old_worker = pgqueue.Worker(pool, queue=queue.name, unknown_types="wait")
    old_worker.register("old", noop)
    newer = pgqueue.Worker(pool, queue=queue.name, unknown_types="wait")
    newer.register("new", noop)
    newer.register("old", noop)
    async with running(old_worker):
        new_job = await queue.enqueue("new", {})
        # Enqueued after: the old worker's claim after the NOTIFY passed it by.
        old_job = await queue.enqueue("old", {})
        await wait_for_row(pool, old_job, status="completed")
        assert (await row(pool, new_job))["status"] == "pending"
        async with running(newer):
            await wait_for_row(pool, new_job, status="completed", attempts=1)


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("hold", ValueError, "unknown_types must be 'dead' or 'wait', not 'hold'"),
        (None, TypeError, "unknown_types must be 'dead' or 'wait', not None"),
    ],
)
async def test_a_bad_rule_is_refused_before_anything_runs(
    pool: asyncpg.Pool, value: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        pgqueue.Worker(pool, unknown_types=value)


# --- the command line ---------------------------------------------------------


def command(*args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pgqueue",
        "worker",
        "tests.cli_apps.apps:worker",
        *args,
    ]


async def run_cli(
    dsn: str, queue: str, *args: str
) -> subprocess.CompletedProcess[bytes]:
    with anyio.fail_after(30):
        return await anyio.run_process(
            command(*args),
            env={**os.environ, "PGQUEUE_DSN": dsn, "CLI_QUEUE": queue},
            cwd=ROOT,
            check=False,
            stdin=subprocess.DEVNULL,
        )


async def test_pgqueue_worker_unknown_types_wait(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    await pool.execute(RUNS)
    queue = pgqueue.Queue(pool, name=queue_name)
    work = await queue.enqueue("work", {})
    other = await queue.enqueue("other", {})
    result = await run_cli(dsn, queue_name, "--burst", "--unknown-types", "wait")
    assert result.returncode == 0, result.stderr.decode()
    assert (await row(pool, work))["status"] == "completed"
    assert (
        (await row(pool, other))["status"],
        (await row(pool, other))["attempts"],
    ) == (
        "pending",
        0,
    )


async def test_pgqueue_worker_refuses_a_bad_unknown_types(
    dsn: str, queue_name: str
) -> None:
    result = await run_cli(dsn, queue_name, "--burst", "--unknown-types", "hold")
    assert result.returncode == 2
    assert "--unknown-types" in result.stderr.decode()
    assert "hold" in result.stderr.decode()


# --- the claim's plan ---------------------------------------------------------

QUEUE = "default"
PENDING = 20_000


@pytest.fixture
async def mixed_table(fresh_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """20,000 due jobs of QUEUE: one in four of a type no worker claims here."""
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await connection.execute(
            "INSERT INTO pgqueue_jobs (queue, job_type)"
            " SELECT $1, CASE WHEN g % 4 = 0 THEN 'new' ELSE 'noop' END"
            " FROM generate_series(1, $2) AS g",
            QUEUE,
            PENDING,
        )
        await connection.execute("ANALYZE pgqueue_jobs")
        yield connection
    finally:
        await connection.close()


async def test_the_claim_of_some_types_stays_on_the_claim_indexes(
    mixed_table: asyncpg.Connection,
) -> None:
    plans = await _plans(
        mixed_table,
        CLAIM_TYPES,
        QUEUE,
        100,
        *claim_places({}),
        ["noop"],
    )
    for mode, nodes in plans.items():
        scans = _table_scans(nodes)
        assert scans.count(("Index Scan", "idx_pgqueue_jobs_priority")) == 2, (
            mode,
            scans,
        )
        assert ("Index Scan", "idx_pgqueue_jobs_claim") in scans, (mode, scans)
        assert all(kind == "Index Scan" for kind, _ in scans), (mode, scans)
        assert _claimed(nodes) == 100, mode
    taken = await mixed_table.fetch(
        CLAIM_TYPES, QUEUE, 100, *claim_places({}), ["noop"]
    )
    assert {r["job_type"] for r in taken} == {"noop"}
    assert len(taken) == 100
