"""Durable handlers' signals: ``job.wait_for``, ``Queue.signal`` and ``pgqueue_signal``.

Through the public API on a real server: a signal sent before the wait is
kept, one sent after wakes the parked job without a poll, one sent from SQL
counts, one sent in a rolled-back transaction never arrives, a wait times
out, a finished job takes no signal and an unknown one raises, 200 parked
jobs hold no slot, and the Go module's claim never takes a parked row.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import asyncpg
import psycopg
import pytest

import pgqueue
import pgqueue.sync
from tests.go_module import GO_CLAIM
from tests.helpers import RecordingLogger, row, running, wait_for_row, wait_until


def _approvals(worker: pgqueue.Worker, got: list[Any]) -> None:
    @worker.handler("approval")
    async def approval(job: pgqueue.Job) -> Any:
        decision = await job.wait_for("approve", timeout=job.payload.get("timeout"))
        got.append((job.attempts, decision))
        return decision


async def test_a_signal_sent_before_the_wait_is_kept(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    got: list[Any] = []
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=0.2)
    _approvals(worker, got)
    job_id = await queue.enqueue("approval", {})
    assert await queue.signal(job_id, "approve", {"by": "ann"}) is True
    assert await queue.signal(job_id, "approve", {"by": "bob"}) is True  # history
    async with running(worker):
        done = await wait_for_row(pool, job_id, status="completed")
    assert got == [(1, {"by": "ann"})]  # never parked: the signal was there
    assert json.loads(done["result"]) == {"by": "ann"}
    signals = json.loads(done["signals"])
    assert [(s["name"], s["payload"]) for s in signals] == [
        ("approve", {"by": "ann"}),
        ("approve", {"by": "bob"}),
    ]
    # A finished job takes no signal; no job at all raises.
    assert await queue.signal(job_id, "approve", {"by": "eve"}) is False
    assert len(json.loads((await row(pool, job_id))["signals"])) == 2
    with pytest.raises(pgqueue.JobNotFoundError):
        await queue.signal(2**62, "approve")


async def test_a_signal_sent_after_the_wait_wakes_the_parked_job_without_a_poll(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    got: list[Any] = []
    logger = RecordingLogger()
    worker = pgqueue.Worker(
        pool, queue=queue.name, concurrency=1, poll_interval=60, logger=logger
    )
    _approvals(worker, got)
    job_id = await queue.enqueue("approval", {})
    async with running(worker):
        parked = await wait_for_row(pool, job_id, status="parked")
        assert parked["attempts"] == 0  # given back
        assert json.loads(parked["wait"]) == {"signal": "approve", "until": None}
        async with pool.acquire() as connection:
            assert await connection.fetch(GO_CLAIM, queue.name, 10) == []
        # Another signal's name does not wake it.
        assert await queue.signal(job_id, "reject", None) is True
        assert (await row(pool, job_id))["status"] == "parked"
        sent = await pool.fetchval("SELECT clock_timestamp()")
        assert await queue.signal(job_id, "approve", ["yes", 1]) is True
        done = await wait_for_row(pool, job_id, status="completed")
    assert got == [(1, ["yes", 1])]
    assert (done["completed_at"] - sent).total_seconds() < 1.0  # no poll of 60 s
    assert logger.messages("error") == []


async def test_a_signal_from_sql_counts_and_one_in_a_rolled_back_transaction_never_arrives(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    got: list[Any] = []
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60)
    _approvals(worker, got)
    job_id = await queue.enqueue("approval", {})
    async with running(worker):
        await wait_for_row(pool, job_id, status="parked")
        async with pool.acquire() as connection:
            transaction = connection.transaction()
            await transaction.start()
            assert await queue.signal(job_id, "approve", "never", connection=connection)
            await transaction.rollback()
            # An unknown id inside a transaction leaves it usable.
            async with connection.transaction():
                with pytest.raises(pgqueue.JobNotFoundError):
                    await queue.signal(2**62, "approve", connection=connection)
                assert await connection.fetchval("SELECT 1") == 1
        stored = await row(pool, job_id)
        assert (stored["status"], stored["signals"]) == ("parked", None)
        assert await pool.fetchval(
            "SELECT pgqueue_signal($1, 'approve', '{\"from\": \"psql\"}'::jsonb)",
            job_id,
        )
        await wait_for_row(pool, job_id, status="completed")
    assert got == [(1, {"from": "psql"})]


async def test_a_signal_through_pgqueue_sync(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    got: list[Any] = []
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60)
    _approvals(worker, got)
    job_id = await queue.enqueue("approval", {})
    async with running(worker):
        await wait_for_row(pool, job_id, status="parked")

        def send() -> bool:
            with psycopg.connect(dsn) as connection:
                sync_queue = pgqueue.sync.Queue(connection, queue.name)
                with pytest.raises(pgqueue.JobNotFoundError):
                    sync_queue.signal(2**62, "approve")
                with pytest.raises(ValueError, match="signal name"):
                    sync_queue.signal(job_id, "")
                return sync_queue.signal(job_id, "approve", {"sync": True})

        assert await anyio.to_thread.run_sync(send) is True
        await wait_for_row(pool, job_id, status="completed")
    assert got == [(1, {"sync": True})]


async def test_a_wait_that_times_out_raises_wait_timeout_in_the_next_run_and_every_replay(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    seen: list[str] = []
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60)

    @worker.handler("t")
    async def handler(job: pgqueue.Job) -> str:
        try:
            await job.wait_for("approve", timeout=1)
        except pgqueue.WaitTimeout as exc:
            seen.append(f"timeout {exc.what}")
        # A second wait: a replay must decide the first one alike.
        await job.wait_for("ship")
        seen.append("shipped")
        return "done"

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        await wait_until(lambda: _has_waited(pool, job_id), within=3)
        timed = await row(pool, job_id)
        assert (timed["status"], timed["attempts"]) == ("pending", 0)
        wait = json.loads(timed["wait"])
        assert wait["signal"] == "approve"
        assert wait["until"] is not None
        await wait_for_row(pool, job_id, status="parked", within=5)
        # The approval comes too late: the replay keeps the timeout.
        assert await queue.signal(job_id, "approve", "late") is True
        assert await queue.signal(job_id, "ship") is True
        done = await wait_for_row(pool, job_id, status="completed")
    assert seen == [
        "timeout signal approve",
        "timeout signal approve",
        "shipped",
    ]
    assert "pgqueue:timeout:signal:approve" in json.loads(done["steps"])


async def test_bad_waits_and_signals_raise_before_any_sql(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    refused: list[type[BaseException]] = []
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=0.2)

    @worker.handler("t")
    async def handler(job: pgqueue.Job) -> None:
        for name, timeout in (("", None), ("x", -1), ("x" * 256, None), (7, None)):
            try:
                await job.wait_for(name, timeout=timeout)  # type: ignore[arg-type]
            except (TypeError, ValueError) as exc:
                refused.append(type(exc))

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        await wait_for_row(pool, job_id, status="completed")
    assert refused == [ValueError, ValueError, ValueError, TypeError]
    for bad in ((0, "x"), (job_id, ""), (job_id, "a\nb")):
        with pytest.raises(ValueError, match=r"job id|signal name"):
            await queue.signal(*bad)
    with pytest.raises(ValueError, match=r"at most 65536"):
        await queue.signal(job_id, "big", "x" * 70000)
    with pytest.raises(TypeError):
        await queue.signal(job_id, "x", object())


@pytest.mark.slow
async def test_200_parked_jobs_hold_no_slot(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    got: list[Any] = []
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=4, poll_interval=60)
    _approvals(worker, got)
    plain_ran = anyio.Event()

    @worker.handler("plain")
    async def plain(_job: pgqueue.Job) -> None:
        plain_ran.set()

    ids = await queue.enqueue_many([("approval", {})] * 200)

    async def all_parked() -> bool:
        parked = await pool.fetchval(
            "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1 AND status = 'parked'",
            queue.name,
        )
        return bool(parked == 200)

    async with running(worker):
        await wait_until(all_parked, within=60)
        # Four slots, 200 waits: every slot is free.
        await queue.enqueue("plain", {})
        with anyio.fail_after(5):
            await plain_ran.wait()
        assert await pool.fetchval(
            "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1 AND status = 'running'",
            queue.name,
        ) in (0, 1)
        async with pool.acquire() as connection:
            assert await connection.fetch(GO_CLAIM, queue.name, 500) == []
        for job_id in ids:
            await queue.signal(job_id, "approve", job_id)

        async def all_done() -> bool:
            done = await pool.fetchval(
                "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1 AND status = 'completed'",
                queue.name,
            )
            return bool(done == 201)

        await wait_until(all_done, within=60)
    assert sorted(decision for _, decision in got) == sorted(ids)


async def _has_waited(pool: asyncpg.Pool, job_id: int) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT wait IS NOT NULL FROM pgqueue_jobs WHERE id = $1", job_id
        )
    )


async def test_parked_and_sleeping_jobs_hold_no_global_or_group_slot_and_pause_holds_a_woken_one(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    got: list[Any] = []
    worker = pgqueue.Worker(
        pool,
        queue=queue.name,
        concurrency=2,
        global_limit=1,
        group_limit=1,
        rate_limit=pgqueue.RateLimit(100, 1.0),
        poll_interval=60,
    )
    _approvals(worker, got)
    plain_ran: list[int] = []

    @worker.handler("sleeper")
    async def sleeper(job: pgqueue.Job) -> None:
        if "slept" not in job.steps:
            await job.step("slept", lambda: True)
            await job.sleep(3600)

    @worker.handler("plain")
    async def plain(job: pgqueue.Job) -> None:
        plain_ran.append(job.id)

    admin = pgqueue.Admin(pool)
    parked_id = await queue.enqueue("approval", {}, group="tenant")
    sleeping_id = await queue.enqueue("sleeper", {}, group="tenant")
    async with running(worker):
        await wait_for_row(pool, parked_id, status="parked")
        await wait_until(lambda: _has_waited(pool, sleeping_id))
        # The one fleet-wide slot and the group's one turn are free.
        plain_id = await queue.enqueue("plain", {}, group="tenant")
        await wait_for_row(pool, plain_id, status="completed")
        [stats] = await admin.stats(queue.name)
        assert (stats.parked, stats.scheduled, stats.running) == (1, 1, 0)
        # A signal while the queue is paused: due, but held until resumed.
        assert await admin.pause(queue.name)
        assert await queue.signal(parked_id, "approve", "go") is True
        assert (await row(pool, parked_id))["status"] == "pending"
        # The signal's wakeup makes the worker claim at once: it takes
        # nothing while the queue is paused.
        await anyio.sleep(0.5)
        assert (await row(pool, parked_id))["status"] == "pending"
        assert await admin.resume(queue.name)
        await wait_for_row(pool, parked_id, status="completed")
        # Cancelling a parked job cancels it at once; retention keeps it.
        other_id = await queue.enqueue("approval", {})
        await wait_for_row(pool, other_id, status="parked")
        assert await queue.prune(0) == 2  # the completed ones
        assert (await row(pool, other_id))["status"] == "parked"
        assert await queue.cancel(other_id) == {other_id: "cancelled"}
        assert (await row(pool, other_id))["status"] == "cancelled"
    assert got == [(1, "go")]
    assert plain_ran == [plain_id]


async def test_a_signal_wakes_a_wait_with_a_timeout_at_once(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    got: list[Any] = []
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60)
    _approvals(worker, got)
    job_id = await queue.enqueue("approval", {"timeout": 3600})
    async with running(worker):
        await wait_until(lambda: _has_waited(pool, job_id))
        waiting = await row(pool, job_id)
        # Pending until the deadline (the Go claim's too), not parked.
        assert (waiting["status"], waiting["attempts"]) == ("pending", 0)
        assert (
            3500 < (waiting["run_at"] - waiting["updated_at"]).total_seconds() <= 3600
        )
        async with pool.acquire() as connection:
            assert await connection.fetch(GO_CLAIM, queue.name, 10) == []
        assert await queue.signal(job_id, "approve", "now") is True
        done = await wait_for_row(pool, job_id, status="completed", within=5)
    assert got == [(1, "now")]
    assert (done["completed_at"] - waiting["updated_at"]).total_seconds() < 60


async def test_a_parked_job_holds_its_unique_key_and_the_upgrade_rebuilds_the_old_index(
    fresh_dsn: str,
) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool:
        # The unique index as pgqueue made it before parked jobs.
        await pool.execute(
            "DROP INDEX idx_pgqueue_jobs_unique;"
            " CREATE UNIQUE INDEX idx_pgqueue_jobs_unique"
            " ON pgqueue_jobs (queue, job_type, unique_key)"
            " WHERE unique_key IS NOT NULL AND status IN ('pending', 'running')"
        )
        await pool.execute(pgqueue.SCHEMA_UPGRADE)
        definition = await pool.fetchval(
            "SELECT pg_get_indexdef('idx_pgqueue_jobs_unique'::regclass)"
        )
        assert "parked" in definition
        await pool.execute(pgqueue.SCHEMA_UPGRADE)  # idempotent
        queue = pgqueue.Queue(pool, name="q")
        got: list[Any] = []
        worker = pgqueue.Worker(pool, queue="q", poll_interval=0.2)
        _approvals(worker, got)
        job_id = await queue.enqueue("approval", {}, unique_key="order-1")
        async with running(worker):
            await wait_for_row(pool, job_id, status="parked")
            assert await queue.enqueue("approval", {}, unique_key="order-1") == job_id
            with pytest.raises(pgqueue.DuplicateJobError):
                await queue.enqueue(
                    "approval", {}, unique_key="order-1", on_conflict="raise"
                )
            await queue.signal(job_id, "approve", 1)
            await wait_for_row(pool, job_id, status="completed")
        assert got == [(1, 1)]
