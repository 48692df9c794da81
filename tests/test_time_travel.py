"""pgqueue.testing's time: advance, run_due and wait_for, on a real server."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import anyio
import pytest

import pgqueue
from pgqueue.testing import advance, run_due, wait_for
from tests.helpers import listening, row

if TYPE_CHECKING:
    import asyncpg

DAY = 86400.0


def reminder_worker(pool: asyncpg.Pool, queue: str, sent: list[int]) -> pgqueue.Worker:
    worker = pgqueue.Worker(pool, queue=queue)

    @worker.handler("send_reminder")
    async def send(job: pgqueue.Job) -> None:
        sent.append(job.payload["user"])

    return worker


async def test_a_job_due_tomorrow_in_under_a_second(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    started = time.perf_counter()
    sent: list[int] = []
    worker = reminder_worker(pool, queue.name, sent)
    job_id = await queue.enqueue("send_reminder", {"user": 7}, delay=DAY)
    assert await run_due(worker) == []  # not due yet: nothing runs
    assert await advance(pool, DAY - 60) >= 1
    assert await run_due(worker) == []  # a minute early
    await advance(pool, 60)
    (outcome,) = await run_due(worker)  # the same worker, again: it never started
    assert (outcome.job_id, outcome.status) == (job_id, "completed")
    assert sent == [7]
    assert (
        await wait_for(pool, job_id, "completed", timeout=1) == pgqueue.Status.COMPLETED
    )
    # About 0.4 s on a quiet machine (three copies of the worker started);
    # the bound leaves room for a loaded one and is still far from any wait
    # (a day, a poll).
    assert time.perf_counter() - started < 5.0


async def test_back_offs_and_snoozes_come_sooner(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, backoff=lambda _: 3600.0)

    @worker.handler("flaky")
    async def flaky(job: pgqueue.Job) -> None:
        if job.attempts == 1:
            raise RuntimeError("down")

    @worker.handler("sleepy")
    async def sleepy(job: pgqueue.Job) -> None:
        if job.snoozes == 0:
            raise pgqueue.Snooze(7200)

    flaky_id = await queue.enqueue("flaky", {})
    sleepy_id = await queue.enqueue("sleepy", {})
    first = await run_due(worker)
    assert {(o.job_id, o.status) for o in first} == {
        (flaky_id, "pending"),
        (sleepy_id, "snoozed"),
    }
    assert next(o for o in first if o.job_id == flaky_id).error is not None
    await advance(pool, 3600)
    assert [(o.job_id, o.status) for o in await run_due(worker)] == [
        (flaky_id, "completed")
    ]
    await advance(pool, 3600)
    assert [(o.job_id, o.status) for o in await run_due(worker)] == [
        (sleepy_id, "completed")
    ]


async def test_advance_wakes_a_running_worker(
    pool: asyncpg.Pool, dsn: str, queue: pgqueue.Queue
) -> None:
    """A worker already running claims what became due at once: advance NOTIFYs its queue."""
    sent: list[int] = []
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=3600)

    @worker.handler("send_reminder")
    async def send(job: pgqueue.Job) -> None:
        sent.append(job.payload["user"])

    job_id = await queue.enqueue("send_reminder", {"user": 1}, delay=DAY)
    async with (
        listening(dsn, pgqueue.JOBS_CHANNEL) as wakeups,
        anyio.create_task_group() as tg,
    ):
        await tg.start(worker.run)
        await advance(pool, DAY, queues=[queue.name])
        await wakeups.wait_for(queue.name)
        await wait_for(pool, job_id, pgqueue.Status.COMPLETED, timeout=5)
        await worker.stop()
    assert sent == [1]


async def test_advance_leaves_other_queues_and_running_jobs(
    pool: asyncpg.Pool, queue: pgqueue.Queue, queue_name: str
) -> None:
    other = pgqueue.Queue(pool, name=queue_name + "-other")
    mine = await queue.enqueue("t", {}, delay=DAY)
    theirs = await other.enqueue("t", {}, delay=DAY)
    before = (await row(pool, mine))["run_at"], (await row(pool, theirs))["run_at"]
    assert await advance(pool, 100, queues=[queue.name]) == 1
    assert (before[0] - (await row(pool, mine))["run_at"]).total_seconds() == 100
    assert (await row(pool, theirs))["run_at"] == before[1]


async def test_advance_joins_a_transaction(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("t", {}, delay=DAY)
    before = (await row(pool, job_id))["run_at"]
    async with pool.acquire() as connection:
        transaction = connection.transaction()
        await transaction.start()
        await advance(connection, DAY, queues=[queue.name])
        await transaction.rollback()
    assert (await row(pool, job_id))["run_at"] == before


async def test_wait_for_times_out_and_checks(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("t", {}, delay=DAY)
    with pytest.raises(TimeoutError, match="is pending, not completed"):
        await wait_for(pool, job_id, "completed", timeout=0.1)
    with pytest.raises(pgqueue.JobNotFoundError):
        await wait_for(pool, 2**62, "completed", timeout=0.1)
    with pytest.raises(ValueError, match="sleeping"):
        await wait_for(pool, job_id, "sleeping")
    with pytest.raises(ValueError, match="seconds"):
        await advance(pool, -1)


async def test_run_due_refuses_a_started_worker(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name)
    await worker.run(until_empty=True)
    with pytest.raises(pgqueue.AlreadyStartedError):
        await run_due(worker)
