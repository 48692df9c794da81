"""Delayed jobs start on time, whatever the worker's ``poll_interval``.

An idle worker asks when its queue's next job falls due after each claim
that found nothing more (see `pgqueue._sql.claims.NEXT_DUE`), and wakes
then: a job enqueued with ``delay=`` or ``run_at=`` by another process (its
wakeup came at its enqueue, and found nothing due), by SQL, or retried or
snoozed, starts within `ON_TIME` of its ``run_at`` with a 60 s poll.

Lateness is measured on the database clock, from the claimed row's
``run_at`` to the handler's start; the tests wait on events, with deadlines.
"""

from __future__ import annotations

import gc
import sys
import textwrap
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import anyio
import asyncpg
import pytest

import pgqueue
from tests.helpers import running

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

POLL = 60.0
DELAY = 2.0
ON_TIME = timedelta(milliseconds=50)


class Starts:
    """Each run's lateness: when the handler started, on the database clock, minus the job's ``run_at``.

    The handler reads the local clock as it starts (a query there would add
    its own round trip to what is measured); `wait` converts those readings
    to the database clock with an offset measured around one query.
    """

    def __init__(self, pool: asyncpg.Pool, runs: int = 1) -> None:
        self._pool = pool
        self._runs = runs
        self._started: list[tuple[float, datetime]] = []
        self._ids: list[int] = []
        self.done = anyio.Event()

    async def started(self, job: pgqueue.Job) -> None:
        self._started.append((time.time(), job.run_at))
        self._ids.append(job.id)
        if len(self._started) >= self._runs:
            self.done.set()

    async def wait(self) -> list[timedelta]:
        with anyio.fail_after(DELAY + 10):
            await self.done.wait()
        before = time.time()
        database = await self._pool.fetchval("SELECT clock_timestamp()")
        offset = database.timestamp() - (before + time.time()) / 2
        return [
            timedelta(seconds=at + offset - run_at.timestamp())
            for at, run_at in self._started
        ]

    async def on_time(self) -> None:
        """Wait for the runs: each started within `ON_TIME` of its ``run_at``.

        A failure says, for the diagnosis, how long after ``run_at`` each
        job's last claim began (the database's ``claimed_at``): a late wake,
        or a slow claim commit and hand-off.
        """
        late = await self.wait()
        assert late, late
        if not all(timedelta(0) <= each < ON_TIME for each in late):
            claims = await self._pool.fetch(
                "SELECT claimed_at - run_at AS after FROM pgqueue_jobs"
                " WHERE id = ANY($1::bigint[])",
                self._ids,
            )
            claimed = [row["after"] for row in claims]
            msg = f"started {late} after run_at; claims began {claimed} after it"
            raise AssertionError(msg)


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


@pytest.mark.xfail(
    strict=False,
    reason="open (issue 43, item 3): in two CI runs of the whole suite this job "
    "started 58 ms after its run_at, its claim on time (5 ms) and 53 ms more to "
    "the handler; it passes alone and in the suite run by hand",
)
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
