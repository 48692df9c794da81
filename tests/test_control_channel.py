"""The control channel against a real server: a NOTIFY is a hint, the row decides.

Any role that can connect may NOTIFY on ``pgqueue_control``; the worker
cancels a job only when its row says its cancel was requested.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import TYPE_CHECKING

import anyio
import asyncpg

import pgqueue
from pgqueue._sql.channels import CONTROL_CHANNEL
from pgqueue._sql.literals import array
from pgqueue._sql.outcomes import CANCEL_REQUESTED
from pgqueue._sql.settings import WORKER_SETTINGS
from tests.helpers import RecordingLogger, plan_nodes, running, wait_for_row

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

FLOOD = 100_000

# Payloads nobody's job id is: empty, words, signs, spaces, digits Python's
# int() reads but are not ASCII, more digits than int() takes, past bigint.
GARBAGE = [
    "",
    "cancel",
    "-1",
    " 1",
    "1 ",
    "+1",
    "1.0",
    "0x1",
    "²",
    "١٢",
    "9" * 7999,
    "9" * 30,
]


@contextlib.asynccontextmanager
async def stranger(admin_dsn: str, dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection of a new login role with no privilege on pgqueue's tables.

    Falls back to a connection of the test's own role where the server
    refuses the new role a login (a server whose rules ask for a password).
    """
    role = f"pgqueue_stranger_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE ROLE "{role}" LOGIN')
        try:
            try:
                connection = await asyncpg.connect(dsn, user=role)
            except (asyncpg.PostgresError, OSError):
                connection = await asyncpg.connect(dsn)
            else:
                may_write = await connection.fetchval(
                    "SELECT has_table_privilege('pgqueue_jobs', 'UPDATE')"
                )
                assert may_write is False
            try:
                yield connection
            finally:
                await connection.close()
        finally:
            await admin.execute(f'DROP ROLE IF EXISTS "{role}"')
    finally:
        await admin.close()


async def test_a_flood_of_control_notifications_cancels_nothing_and_a_real_cancel_still_works(
    pool: asyncpg.Pool, queue: pgqueue.Queue, admin_dsn: str, dsn: str
) -> None:
    logger = RecordingLogger()
    # rescue_after: no heartbeat during the test, so only the control channel
    # can end a run early.
    worker = pgqueue.Worker(
        pool, queue=queue.name, concurrency=5, rescue_after=3600, logger=logger
    )
    release = anyio.Event()
    started: dict[int, anyio.Event] = {}
    interrupted: dict[int, anyio.Event] = {}

    async def handle(job: pgqueue.Job) -> None:
        started[job.id].set()
        try:
            if job.type == "victim":
                await anyio.sleep_forever()
            await release.wait()
        except anyio.get_cancelled_exc_class():
            interrupted[job.id].set()
            raise

    worker.register("hold", handle)
    worker.register("victim", handle)
    holds = [await queue.enqueue("hold", {}) for _ in range(3)]
    first, second = [await queue.enqueue("victim", {}) for _ in range(2)]
    for job_id in [*holds, first, second]:
        assert job_id <= FLOOD  # the flood names every running job
        started[job_id], interrupted[job_id] = anyio.Event(), anyio.Event()

    async with running(worker), stranger(admin_dsn, dsn) as attacker:
        with anyio.fail_after(10):
            for event in started.values():
                await event.wait()
        sent = await attacker.fetchval(
            "SELECT count(pg_notify($1, g::text)) FROM generate_series(1, $2::int) g",
            CONTROL_CHANNEL,
            FLOOD,
        )
        assert sent == FLOOD
        await attacker.execute(
            "SELECT pg_notify($1, p) FROM unnest($2::text[]) p",
            CONTROL_CHANNEL,
            GARBAGE,
        )
        # Notifications arrive in commit order: once the worker acts on this
        # cancel, it has seen the whole flood.
        assert await queue.cancel(first) == {first: "requested"}
        with anyio.fail_after(15):
            await interrupted[first].wait()
        assert [h for h in holds if interrupted[h].is_set()] == []
        # A real cancel takes effect within a second.
        assert await queue.cancel(second) == {second: "requested"}
        with anyio.fail_after(1):
            await interrupted[second].wait()
        assert worker.running_jobs == len(holds)
        release.set()
        for job_id in holds:
            await wait_for_row(pool, job_id, status="completed")
        for job_id in (first, second):
            stored = await wait_for_row(pool, job_id, status="cancelled")
            assert stored["last_error"] == "cancelled by request"
    assert [h for h in holds if interrupted[h].is_set()] == []
    noisy = [m for level, m, _ in logger.records if level in ("warning", "error")]
    assert noisy == []
    assert logger.messages("info").count("%s cancelled by request") == 2


async def test_repeated_notifies_naming_a_running_job_do_not_cancel_it(
    pool: asyncpg.Pool, queue: pgqueue.Queue, dsn: str
) -> None:
    # From the test's own role this time, naming the job again and again.
    worker = pgqueue.Worker(pool, queue=queue.name, rescue_after=3600)
    release = anyio.Event()
    started: dict[int, anyio.Event] = {}
    interrupted: list[int] = []

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> str:
        started[job.id].set()
        try:
            await release.wait()
        except anyio.get_cancelled_exc_class():
            interrupted.append(job.id)
            raise
        return "done"

    job_id, other = await queue.enqueue("t", {}), await queue.enqueue("t", {})
    started[job_id], started[other] = anyio.Event(), anyio.Event()
    async with running(worker):
        with anyio.fail_after(10):
            await started[job_id].wait()
            await started[other].wait()
        connection = await asyncpg.connect(dsn)
        try:
            for _ in range(20):
                await connection.execute(
                    "SELECT pg_notify($1, $2)", CONTROL_CHANNEL, str(job_id)
                )
        finally:
            await connection.close()
        # Acting on this cancel, the worker has seen every NOTIFY before it.
        assert await queue.cancel(other) == {other: "requested"}
        await wait_for_row(pool, other, within=5, status="cancelled")
        assert interrupted == [other]
        release.set()
        stored = await wait_for_row(pool, job_id, status="completed")
    assert stored["result"] == "done" or stored["result"] == '"done"'


async def test_the_read_of_cancel_requests_goes_through_the_primary_key(
    fresh_dsn: str,
) -> None:
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await connection.execute(
            "INSERT INTO pgqueue_jobs (queue, job_type)"
            " SELECT 'q', 't' FROM generate_series(1, 20000)"
        )
        await connection.execute(
            "UPDATE pgqueue_jobs SET status = 'running', attempts = 1,"
            " cancel_requested = id % 1000 = 0 WHERE id % 100 = 0"
        )
        await connection.execute("ANALYZE pgqueue_jobs")
        held = array([1000, 1100, 2000, 20001])
        async with connection.transaction():
            # Planned as the worker's connections plan it: generically.
            for name, value in WORKER_SETTINGS.items():
                await connection.execute(f"SET LOCAL {name} = {value}")
            requested = await connection.fetch(CANCEL_REQUESTED, held)
            await connection.execute("PREPARE requested AS " + CANCEL_REQUESTED)
            raw = await connection.fetchval(
                f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE requested('{held}')"
            )
            await connection.execute("DEALLOCATE requested")
    finally:
        await connection.close()
    assert sorted(r["id"] for r in requested) == [1000, 2000]
    scans = [
        (node["Node Type"], node.get("Index Name"))
        for node in plan_nodes(json.loads(raw)[0]["Plan"])
        if node.get("Relation Name") == "pgqueue_jobs"
    ]
    assert scans == [("Index Scan", "pgqueue_jobs_pkey")]
