"""Schema v2 on a table the Go module created: the upgrade, and both libraries on it.

The table is created with exactly the Go module v1.1.0's DDL; the Go
module's own statements (its INSERT plus NOTIFY, claim, outcome writes and
rescue) run beside pgqueue's, on the same rows, before and after
`pgqueue.SCHEMA_UPGRADE`.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue._copy import COPY_MIN_JOBS
from pgqueue.testing import with_database
from tests.go_module import (
    GO_CLAIM,
    GO_COMPLETE,
    GO_DEAD,
    GO_ENQUEUE,
    GO_RESCUE,
    GO_RETRY,
    GO_SCHEMA,
)
from tests.helpers import noop, row, rows, running, wait_for_row

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

CATALOG = """
SELECT json_build_object(
    'columns', (SELECT json_agg(json_build_array(column_name, data_type, is_nullable, column_default)
                                ORDER BY column_name)
                FROM information_schema.columns WHERE table_name = 'pgqueue_jobs'),
    'indexes', (SELECT json_agg(indexdef ORDER BY indexname)
                FROM pg_indexes WHERE tablename = 'pgqueue_jobs'),
    'checks', (SELECT json_agg(json_build_array(conname, pg_get_constraintdef(oid), convalidated)
                               ORDER BY conname)
               FROM pg_constraint WHERE conrelid = 'pgqueue_jobs'::regclass AND contype = 'c'),
    'triggers', (SELECT json_agg(pg_get_triggerdef(oid) ORDER BY tgname)
                 FROM pg_trigger WHERE tgrelid = 'pgqueue_jobs'::regclass AND NOT tgisinternal)
)::text
"""


@pytest.fixture
async def go_table(fresh_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on a database whose pgqueue_jobs is exactly the Go module's."""
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=6) as pool:
        await pool.execute(pgqueue.SCHEMA_DOWN)
        await pool.execute(GO_SCHEMA)
        yield pool


async def _catalog(executor: Any) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(await executor.fetchval(CATALOG))
    return found


async def test_the_upgrade_brings_a_go_table_to_the_current_schema(
    go_table: asyncpg.Pool, admin_dsn: str
) -> None:
    go_id = await go_table.fetchval(GO_ENQUEUE, "q", "t", '{"n": 1}', 5)
    storage = await go_table.fetchval("SELECT pg_relation_filenode('pgqueue_jobs')")
    await go_table.execute(pgqueue.SCHEMA_UPGRADE)
    await go_table.execute(pgqueue.SCHEMA_UPGRADE)  # idempotent
    upgraded = await _catalog(go_table)
    # Only additions, without rewriting the table.
    assert (
        await go_table.fetchval("SELECT pg_relation_filenode('pgqueue_jobs')")
        == storage
    )
    assert (await row(go_table, go_id))["priority"] == 0
    # The same as a fresh install of SCHEMA.
    async with asyncpg.create_pool(admin_dsn, min_size=1, max_size=1) as admin:
        name = f"pgqueue_fresh_{id(go_table)}"
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            fresh_dsn = with_database(admin_dsn, name)
            fresh = await asyncpg.connect(fresh_dsn)
            try:
                await fresh.execute(pgqueue.SCHEMA)
                installed = await _catalog(fresh)
            finally:
                await fresh.close()
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    assert upgraded == installed
    assert all(valid for _, _, valid in upgraded["checks"])


async def test_a_worker_or_queue_on_a_go_table_fails_at_once_naming_what_is_missing(
    go_table: asyncpg.Pool,
) -> None:
    message = (
        "column priority, column unique_key, column cancel_requested, column snoozes, "
        "column result, column tracked, column trace_context, column errors, "
        "column snoozed, column checkpoint, column has_children, "
        "column parents_left, column on_parent_failure, column group_key, "
        "column claimed_at, column steps, column signals, column wait, column progress, "
        "index idx_pgqueue_jobs_priority, "
        "index idx_pgqueue_jobs_unique, a status check that allows 'parked'"
    )
    with anyio.fail_after(10), pytest.raises(pgqueue.SchemaError) as raised:
        await pgqueue.Worker(go_table, queue="q").run(until_empty=True)
    assert message in str(raised.value)
    assert "pgqueue.SCHEMA_UPGRADE" in str(raised.value)
    queue = pgqueue.Queue(go_table, name="q")
    for enqueue in (
        queue.enqueue("t", {}),
        queue.enqueue("t", {}, unique_key="k"),
        queue.enqueue_many([("t", {})]),
        queue.enqueue_many([("t", {})] * COPY_MIN_JOBS),
    ):
        with pytest.raises(pgqueue.SchemaError, match="SCHEMA_UPGRADE"):
            await enqueue
    assert await go_table.fetchval("SELECT count(*) FROM pgqueue_jobs") == 0


async def test_install_upgrades_a_go_table(go_table: asyncpg.Pool) -> None:
    await pgqueue.install(go_table)
    await pgqueue.install(go_table)
    job_id = await pgqueue.Queue(go_table, name="q").enqueue("t", {}, priority=3)
    assert (await row(go_table, job_id))["priority"] == 3


async def test_after_the_upgrade_both_libraries_share_the_table(
    go_table: asyncpg.Pool,
) -> None:
    await go_table.execute(pgqueue.SCHEMA_UPGRADE)
    queue = pgqueue.Queue(go_table, name="q")
    ran: list[tuple[int, Any]] = []

    # A Go producer's job runs on our worker.
    go_id = await go_table.fetchval(GO_ENQUEUE, "q", "t", '{"from": "go"}', 5)
    worker = pgqueue.Worker(go_table, queue="q", poll_interval=0.05)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> str:
        ran.append((job.id, job.payload))
        return "done"

    with anyio.fail_after(10):
        await worker.run(until_empty=True)
    stored = await row(go_table, go_id)
    assert (stored["status"], json.loads(stored["result"])) == ("completed", "done")
    assert ran == [(go_id, {"from": "go"})]

    # Our jobs, with every v2 feature, satisfy the Go worker's statements.
    high = await queue.enqueue("t", {"n": 1}, priority=5, unique_key="k", track=True)
    low = await queue.enqueue("t", {"n": 2}, priority=-5)
    claimed = {r["id"]: r["attempts"] for r in await go_table.fetch(GO_CLAIM, "q", 10)}
    assert set(claimed) == {high, low}  # the Go worker ignores priority
    assert await go_table.execute(GO_COMPLETE, high, claimed[high]) == "UPDATE 1"
    assert await go_table.execute(GO_RETRY, low, claimed[low], "go retry") == "UPDATE 1"
    assert (await row(go_table, high))["status"] == "completed"
    # The key is free again once the Go worker completed the job.
    again = await queue.enqueue("t", {"n": 3}, unique_key="k")
    assert again != high
    # A row the Go worker put back runs on ours, with its error.
    with anyio.fail_after(10):
        await worker_for(go_table).run(until_empty=True)
    assert (await row(go_table, low))["status"] == "completed"
    # The Go worker's dead letter and rescue work on our rows.
    dead = await queue.enqueue("t", {})
    rescued = await queue.enqueue("t", {})
    claimed = {r["id"]: r["attempts"] for r in await go_table.fetch(GO_CLAIM, "q", 10)}
    assert await go_table.execute(GO_DEAD, dead, claimed[dead], "boom") == "UPDATE 1"
    await go_table.execute(
        "UPDATE pgqueue_jobs SET updated_at = now() - interval '1 hour' WHERE id = $1",
        rescued,
    )
    await go_table.execute(GO_RESCUE, 60)
    assert (await row(go_table, dead))["status"] == "dead"
    assert (await row(go_table, rescued))["status"] == "pending"


async def test_a_copied_batch_on_an_upgraded_go_table_is_claimed_by_the_go_worker(
    go_table: asyncpg.Pool,
) -> None:
    await go_table.execute(pgqueue.SCHEMA_UPGRADE)
    ids = await pgqueue.Queue(go_table, name="q").enqueue_many(
        [("t", {"n": n}) for n in range(COPY_MIN_JOBS)]
    )
    claimed = await go_table.fetch(GO_CLAIM, "q", COPY_MIN_JOBS + 1)
    assert sorted(r["id"] for r in claimed) == ids
    stored = await rows(go_table, "q")
    assert [json.loads(r["payload"]) for r in stored] == [
        {"n": n} for n in range(COPY_MIN_JOBS)
    ]


def worker_for(pool: asyncpg.Pool) -> pgqueue.Worker:
    worker = pgqueue.Worker(pool, queue="q", poll_interval=0.05)
    worker.register("t", noop)
    return worker


async def test_a_go_worker_ignores_a_cancel_request_and_never_claims_a_cancelled_job(
    go_table: asyncpg.Pool,
) -> None:
    await go_table.execute(pgqueue.SCHEMA_UPGRADE)
    queue = pgqueue.Queue(go_table, name="q")
    pending, running_id = await queue.enqueue_many([("t", 1), ("t", 2)])
    await go_table.execute(
        "UPDATE pgqueue_jobs SET status = 'running', attempts = 1 WHERE id = $1",
        running_id,
    )
    assert await queue.cancel(pending, running_id) == {
        pending: "cancelled",
        running_id: "requested",
    }
    assert await go_table.fetch(GO_CLAIM, "q", 10) == []
    # Its outcome write still lands (the request is ignored).
    assert await go_table.execute(GO_COMPLETE, running_id, 1) == "UPDATE 1"
    statuses = [r["status"] for r in await rows(go_table, "q")]
    assert statuses == ["cancelled", "completed"]


async def test_a_worker_started_before_the_upgrade_runs_after_it(
    go_table: asyncpg.Pool,
) -> None:
    # A worker cannot run on the Go table; once upgraded, a new one can.
    with anyio.fail_after(10), pytest.raises(pgqueue.SchemaError):
        await worker_for(go_table).run(until_empty=True)
    await go_table.execute(pgqueue.SCHEMA_UPGRADE)
    job_id = await pgqueue.Queue(go_table, name="q").enqueue("t", {})
    async with running(worker_for(go_table)):
        await wait_for_row(go_table, job_id, status="completed")


async def test_a_go_worker_never_claims_a_waiting_job_and_its_outcomes_release_children(
    go_table: asyncpg.Pool,
) -> None:
    await go_table.execute(pgqueue.SCHEMA_UPGRADE)
    queue = pgqueue.Queue(go_table, name="q")
    parent, other = await queue.enqueue_many([("t", 1), ("t", 2)])
    child = await queue.enqueue("t", 3, after=[parent])
    doomed = await queue.enqueue("t", 4, after=[other])
    assert (await row(go_table, child))["status"] == "waiting"
    claimed = {r["id"]: r["attempts"] for r in await go_table.fetch(GO_CLAIM, "q", 10)}
    assert set(claimed) == {parent, other}
    assert await go_table.fetch(GO_CLAIM, "q", 10) == []
    # The Go worker's outcome writes release (or cancel) the children too:
    # the trigger runs in their transaction, whoever writes them.
    assert await go_table.execute(GO_COMPLETE, parent, claimed[parent]) == "UPDATE 1"
    assert await go_table.execute(GO_DEAD, other, claimed[other], "boom") == "UPDATE 1"
    assert (await row(go_table, child))["status"] == "pending"
    assert (await row(go_table, doomed))["status"] == "cancelled"
    assert [r["id"] for r in await go_table.fetch(GO_CLAIM, "q", 10)] == [child]


async def test_the_upgrade_replaces_the_slower_forms_of_the_status_check_and_the_trigger(
    fresh_dsn: str,
) -> None:
    # The first schema with dependencies: its status check an IN list and its
    # trigger's WHEN reading OLD, both prepared by PostgreSQL for every claim
    # and outcome write (and the trigger's read for every row).
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=2) as pool:
        await pool.execute(pgqueue.SCHEMA_DOWN)
        await pool.execute(pgqueue.SCHEMA)
        installed = await _catalog(pool)
        await pool.execute(
            """
            ALTER TABLE pgqueue_jobs DROP CONSTRAINT chk_pgqueue_jobs_status;
            ALTER TABLE pgqueue_jobs ADD CONSTRAINT chk_pgqueue_jobs_status
                CHECK (status IN ('pending', 'running', 'completed', 'dead', 'cancelled', 'waiting'));
            DROP TRIGGER pgqueue_parent_ended ON pgqueue_jobs;
            CREATE TRIGGER pgqueue_parent_ended
                AFTER UPDATE OF status ON pgqueue_jobs
                FOR EACH ROW
                WHEN (NEW.has_children AND NEW.status IN ('completed', 'dead', 'cancelled')
                      AND OLD.status NOT IN ('completed', 'dead', 'cancelled'))
                EXECUTE FUNCTION pgqueue_parent_ended();
            """
        )
        assert await _catalog(pool) != installed
        await pool.execute(pgqueue.SCHEMA_UPGRADE)
        await pool.execute(pgqueue.SCHEMA_UPGRADE)  # idempotent
        assert await _catalog(pool) == installed
        # A parent that ends releases its child once; one that ends again
        # (completed after a retry of a dead run, say) is not counted twice.
        queue = pgqueue.Queue(pool, name="q")
        parent = await queue.enqueue("t", 1)
        other = await queue.enqueue("t", 2)
        child = await queue.enqueue("t", 3, after=[parent, other])
        await pool.execute(
            "UPDATE pgqueue_jobs SET status = 'completed' WHERE id = $1", parent
        )
        await pool.execute(
            "UPDATE pgqueue_jobs SET status = 'completed' WHERE id = $1", parent
        )
        assert (await row(pool, child))["status"] == "waiting"
        await pool.execute(
            "UPDATE pgqueue_jobs SET status = 'completed' WHERE id = $1", other
        )
        assert (await row(pool, child))["status"] == "pending"


async def test_the_upgrade_replaces_the_status_check_of_a_table_without_waiting(
    fresh_dsn: str,
) -> None:
    # The schema before dependencies: its status check allows 'cancelled'
    # but not 'waiting', and it has neither their columns nor their table.
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=2) as pool:
        await pool.execute(pgqueue.SCHEMA_DOWN)
        await pool.execute(pgqueue.SCHEMA)
        installed = await _catalog(pool)
        await pool.execute(
            """
            DROP TABLE pgqueue_dependencies;
            DROP TRIGGER pgqueue_parent_ended ON pgqueue_jobs;
            ALTER TABLE pgqueue_jobs DROP COLUMN has_children, DROP COLUMN parents_left,
                DROP COLUMN on_parent_failure, DROP CONSTRAINT chk_pgqueue_jobs_status;
            ALTER TABLE pgqueue_jobs ADD CONSTRAINT chk_pgqueue_jobs_status
                CHECK (status IN ('pending', 'running', 'completed', 'dead', 'cancelled'));
            """
        )
        with pytest.raises(asyncpg.CheckViolationError):
            await pool.execute(
                "INSERT INTO pgqueue_jobs (job_type, status) VALUES ('t', 'waiting')"
            )
        await pool.execute(pgqueue.SCHEMA_UPGRADE)
        await pool.execute(pgqueue.SCHEMA_UPGRADE)  # idempotent
        assert await _catalog(pool) == installed
        queue = pgqueue.Queue(pool, name="q")
        parent = await queue.enqueue("t", 1)
        child = await queue.enqueue("t", 2, after=[parent])
        assert (await row(pool, child))["status"] == "waiting"
