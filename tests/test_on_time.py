"""Delayed jobs start on time, whatever the worker's ``poll_interval``.

An idle worker asks when its queue's next job falls due after each claim
that found nothing more (see `pgqueue._sql.claims.NEXT_DUE`), and wakes
then: a job enqueued with ``delay=`` or ``run_at=`` by another process (its
wakeup came at its enqueue, and found nothing due), by SQL, or retried or
snoozed, starts within `ON_TIME` of its ``run_at`` with a 60 s poll.

Lateness is measured on the database clock, from the claimed row's
``run_at`` to the handler's start (`Starts`); the tests wait on events,
with deadlines.
"""

from __future__ import annotations

import contextlib
import gc
import math
import sys
import textwrap
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import anyio
import asyncpg
import pytest

import pgqueue
from tests.helpers import running, wait_until

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

POLL = 60.0
DELAY = 2.0
ON_TIME = timedelta(milliseconds=50)


class Starts:
    """Each run's lateness: when the handler started, on the database clock, minus the job's ``run_at``.

    The handler reads the local clock as it starts (a query there would add
    its own round trip to what is measured); `wait` converts those readings
    to the database clock (`clock_offset`).
    """

    def __init__(self, pool: asyncpg.Pool, runs: int = 1) -> None:
        self._pool = pool
        self._runs = runs
        self._started: list[tuple[float, datetime, int]] = []
        self.done = anyio.Event()

    async def started(self, job: pgqueue.Job) -> None:
        self._started.append((time.time(), job.run_at, job.id))
        if len(self._started) >= self._runs:
            self.done.set()

    async def wait(self) -> list[timedelta]:
        with anyio.fail_after(DELAY + 10):
            await self.done.wait()
        offset = await clock_offset(self._pool)
        return [
            timedelta(seconds=at + offset - run_at.timestamp())
            for at, run_at, _ in self._started
        ]

    async def on_time(self) -> None:
        """Wait for the runs: each started within `ON_TIME` of its ``run_at``.

        A run the local clock puts later is on time all the same if its
        outcome's write, which began after the handler started, began within
        `ON_TIME` of ``run_at`` on the database clock alone (the row's
        ``completed_at``). A failure says, for the diagnosis, when the run's
        claim began (``claimed_at``) and its outcome's write (when it
        completed), both after ``run_at``.
        """
        starts = await self.wait()
        assert starts, starts
        late = [
            (each, run)
            for each, run in zip(starts, self._started, strict=True)
            if not timedelta(0) <= each < ON_TIME
        ]
        if not late:
            return
        written = await self._written([job_id for _, (_, _, job_id) in late])
        said = []
        for each, (_, run_at, job_id) in late:
            claimed, completed, row_run_at = written[job_id]
            if row_run_at != run_at:
                said.append(f"job {job_id} started {each} after run_at (local clock)")
                continue  # the row holds a later run
            if (
                claimed >= timedelta(0)
                and completed is not None
                and completed < ON_TIME
            ):
                continue
            said.append(
                f"job {job_id} started {each} after run_at (local clock);"
                f" its claim began {claimed} after it, its outcome's write {completed}"
            )
        assert not said, said

    async def _written(
        self, job_ids: list[int]
    ) -> dict[int, tuple[timedelta, timedelta | None, datetime]]:
        """For each job, its last claim's and its completion's time after ``run_at``; its ``run_at``.

        Waits (within 10 s) for the jobs to complete: a run that ends later
        (retried, snoozed) has no completion of its own.
        """
        query = (
            "SELECT id, claimed_at - run_at, completed_at - run_at, run_at"
            " FROM pgqueue_jobs WHERE id = ANY($1::bigint[])"
        )

        async def completed() -> bool:
            rows = await self._pool.fetch(query, job_ids)
            return all(row[2] is not None for row in rows)

        with contextlib.suppress(TimeoutError):
            await wait_until(completed)
        rows = await self._pool.fetch(query, job_ids)
        return {row[0]: (row[1], row[2], row[3]) for row in rows}


async def clock_offset(pool: asyncpg.Pool, samples: int = 5) -> float:
    """Seconds the database clock is ahead of the local one.

    From the quickest of ``samples`` round trips on one connection, the
    database's reading taken as at its midpoint: off by at most half that
    trip. A single trip can be off by half of a slow one (a query that
    waited for the CPU before it was answered).
    """
    quickest = (math.inf, 0.0)
    async with pool.acquire() as connection:
        for _ in range(samples):
            before = time.time()
            database = await connection.fetchval("SELECT clock_timestamp()")
            after = time.time()
            trip = after - before
            if trip < quickest[0]:
                quickest = (trip, database.timestamp() - (before + after) / 2)
    return quickest[1]


@pytest.fixture(autouse=True)
def _frozen_heap() -> Iterator[None]:
    """Keep the suite's earlier objects out of the garbage collector's way while a start is timed.

    A full collection of everything the tests before this one left alive
    pauses the event loop for tens of milliseconds: that is the runner's
    heap, not the worker's lateness.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _worker(
    pool: asyncpg.Pool,
    queue: str,
    handle: Callable[[pgqueue.Job], object],
    **options: object,
) -> pgqueue.Worker:
    worker = pgqueue.Worker(pool, queue=queue, poll_interval=POLL, **options)  # type: ignore[arg-type]
    worker.register("t", handle)
    return worker


PRODUCER = textwrap.dedent(
    """
    import asyncio, sys
    import asyncpg, pgqueue

    async def main() -> None:
        async with asyncpg.create_pool(sys.argv[1], min_size=1, max_size=1) as pool:
            print(await pgqueue.Queue(pool, name=sys.argv[2]).enqueue(
                "t", {}, delay=float(sys.argv[3])))

    asyncio.run(main())
    """
)


async def test_a_delayed_job_from_another_process_starts_on_time(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    starts = Starts(pool)
    async with running(_worker(pool, queue_name, starts.started)):
        with anyio.fail_after(30):
            result = await anyio.run_process(
                [sys.executable, "-W", "error", "-c", PRODUCER, dsn, queue_name, "2"],
                check=False,
            )
        assert result.returncode == 0, result.stderr.decode()
        await starts.on_time()


@pytest.mark.parametrize("how", ["delay", "run_at", "many", "keyed"])
async def test_a_delayed_job_from_another_pool_starts_on_time(
    dsn: str, pool: asyncpg.Pool, queue_name: str, how: str
) -> None:
    starts = Starts(pool)
    async with (
        running(_worker(pool, queue_name, starts.started)),
        asyncpg.create_pool(dsn, min_size=1, max_size=2) as other,
    ):
        queue = pgqueue.Queue(other, name=queue_name)
        if how == "delay":
            await queue.enqueue("t", {}, delay=DELAY)
        elif how == "run_at":
            now = await other.fetchval("SELECT now()")
            await queue.enqueue("t", {}, run_at=now + timedelta(seconds=DELAY))
        elif how == "many":
            await queue.enqueue_many([pgqueue.NewJob("t", delay=DELAY)])
        else:
            await queue.enqueue("t", {}, delay=DELAY, unique_key=queue_name)
        await starts.on_time()


async def test_a_delayed_job_enqueued_by_sql_starts_on_time(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    starts = Starts(pool)
    async with running(_worker(pool, queue_name, starts.started)):
        connection = await asyncpg.connect(dsn)
        try:
            await connection.execute(
                "SELECT pgqueue_enqueue('t', '{}', queue => $1, delay => $2)",
                queue_name,
                timedelta(seconds=DELAY),
            )
        finally:
            await connection.close()
        await starts.on_time()


async def test_a_delayed_job_in_the_table_before_the_worker_starts_on_time(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    await pgqueue.Queue(pool, name=queue_name).enqueue("t", {}, delay=DELAY)
    starts = Starts(pool)
    async with running(_worker(pool, queue_name, starts.started)):
        await starts.on_time()


async def test_a_retry_and_a_snooze_start_on_time(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    starts = Starts(pool, runs=3)

    async def handle(job: pgqueue.Job) -> None:
        if job.attempts > 1 or job.snoozes:
            await starts.started(job)
        if job.attempts == 1:
            raise RuntimeError("once more")  # retried after DELAY
        if job.snoozes < 2:
            raise pgqueue.Snooze(DELAY / 2)

    worker = _worker(pool, queue_name, handle, backoff=lambda _attempt: DELAY)
    async with running(worker):
        await pgqueue.Queue(pool, name=queue_name).enqueue("t", {})
        await starts.on_time()


async def test_a_retry_left_by_a_stopped_worker_starts_on_time_with_another(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    """The next worker learns the retry's time from the table at its first claim."""
    failed = anyio.Event()

    async def fail(_job: pgqueue.Job) -> None:
        failed.set()
        raise RuntimeError("retried by the other worker")

    first = _worker(pool, queue_name, fail, backoff=lambda _attempt: DELAY)
    async with running(first):
        await pgqueue.Queue(pool, name=queue_name).enqueue("t", {})
        with anyio.fail_after(10):
            await failed.wait()
    # The first worker has stopped (its retry written) before this one starts
    # and claims from the heads: it learns the retry's time from the table.
    starts = Starts(pool)
    async with running(_worker(pool, queue_name, starts.started)):
        await starts.on_time()
