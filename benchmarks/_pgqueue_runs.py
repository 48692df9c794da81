"""pgqueue's side of every benchmark: fill, drain, enqueue, wake, floor, verify.

Each ``*_child`` function is the target of a spawned worker process (see
`benchmarks._common.run_child`); the other functions run in the parent.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg

import pgqueue
from benchmarks._common import (
    ChildLink,
    bench_database,
    peak_rss_mb,
    process_cpu,
    run,
    run_child,
)
from pgqueue._sql.claims import CLAIM
from pgqueue._sql.literals import HEAD_OF_LINE, array, claim_places
from pgqueue._sql.outcomes import COMPLETE
from pgqueue._sql.settings import WORKER_SETTINGS

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from contextlib import AbstractContextManager
    from multiprocessing.connection import Connection

    Alongside = Callable[[str], AbstractContextManager[object]]
    """Given the benchmark database's DSN: a context to measure inside."""

QUEUE = "default"
JOB_TYPE = "noop"
# The job type of a flood into another queue (benchmarks.producers).
FLOOD_TYPE = "flood"
# Pool for the worker: claims, outcome writes and sweeps go through it; the
# LISTEN connection is the worker's own. The same sizes are used for pgqueuer.
POOL_MIN = 2
POOL_MAX = 10


# --- filling and checking -----------------------------------------------------


async def fill(dsn: str, n: int) -> None:
    """Insert ``n`` pending no-op jobs in one statement (what enqueue_many would write)."""
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(
            "INSERT INTO pgqueue_jobs (queue, job_type, payload)"
            " SELECT $1, $2, jsonb_build_object('i', g) FROM generate_series(1, $3) AS g",
            QUEUE,
            JOB_TYPE,
            n,
        )
        await connection.execute("VACUUM ANALYZE pgqueue_jobs")
    finally:
        await connection.close()


async def verify_drain(dsn: str, n: int) -> None:
    """Fail unless every one of the ``n`` jobs completed exactly once."""
    connection = await asyncpg.connect(dsn)
    try:
        row = await connection.fetchrow(
            "SELECT count(*), count(*) FILTER (WHERE status = 'completed'"
            " AND attempts = 1 AND completed_at IS NOT NULL) FROM pgqueue_jobs"
        )
        assert row is not None
        total, good = row
    finally:
        await connection.close()
    if total != n or good != n:
        msg = f"pgqueue drain check failed: {total} rows, {good} completed once, expected {n}"
        raise AssertionError(msg)


def check_handled(result: dict[str, Any], n: int, who: str) -> None:
    """Fail unless the handler ran exactly ``n`` times on ``n`` distinct jobs."""
    if result["handled"] != n or result["distinct"] != n:
        msg = (
            f"{who}: handler ran {result['handled']} times on {result['distinct']}"
            f" distinct jobs, expected {n}"
        )
        raise AssertionError(msg)


# --- drain ----------------------------------------------------------------------


def drain_child(
    connection: Connection,
    dsn: str,
    n: int,
    concurrency: int,
    global_limit: int | None = None,
    prefetch: int | None = None,
) -> None:
    """Worker process: drain ``n`` jobs at ``concurrency`` (under ``global_limit``) and report."""
    asyncio.run(
        _drain(ChildLink(connection), dsn, n, concurrency, global_limit, prefetch)
    )


async def _drain(
    link: ChildLink,
    dsn: str,
    n: int,
    concurrency: int,
    global_limit: int | None,
    prefetch: int | None,
) -> None:
    async with asyncpg.create_pool(dsn, min_size=POOL_MIN, max_size=POOL_MAX) as pool:
        worker = pgqueue.Worker(
            pool,
            concurrency=concurrency,
            prefetch=prefetch,
            global_limit=global_limit,
        )
        seen: set[int] = set()
        marks: list[float] = []
        step = max(n // 10, 1)
        done = anyio.Event()
        calls = 0

        async def noop(job: pgqueue.Job) -> None:
            nonlocal calls
            calls += 1
            seen.add(job.id)
            if calls % step == 0:
                marks.append(time.perf_counter())
            if calls >= n:
                done.set()

        worker.register(JOB_TYPE, noop)
        await link.ready()
        cpu0 = process_cpu()
        start = time.perf_counter()
        with anyio.fail_after(600 + n / 200):
            async with anyio.create_task_group() as group:
                group.start_soon(worker.run)
                await done.wait()
                await worker.stop()
        elapsed = time.perf_counter() - start
        cpu = process_cpu() - cpu0
        await link.done(
            {
                "seconds": elapsed,
                "jobs_per_s": n / elapsed,
                "handled": calls,
                "distinct": len(seen),
                "worker_cpu_s": cpu,
                "peak_rss_mb": peak_rss_mb(),
                "marks": [m - start for m in marks],
            }
        )


def drain(
    dsn: str,
    n: int,
    concurrency: int,
    name: str = "drain",
    global_limit: int | None = None,
    prefetch: int | None = None,
    *,
    around: Alongside | None = None,
) -> dict[str, Any]:
    """One verified drain of ``n`` jobs in a fresh database; the child's measurements.

    ``prefetch`` defaults to the worker's default: up to C more jobs held
    while the backlog lasts, so at most 2C claimed, the tightest cap
    pgqueuer allows its batch size C (``max_concurrent_tasks >= 2 *
    batch_size``; left unset, it has none).
    ``around(dsn)``, if given, is entered after the fill and left after the
    drain (an open transaction, for example).
    """
    with bench_database(dsn, name) as db:
        run(fill(db, n))
        with nullcontext() if around is None else around(db):
            result = run_child(
                drain_child,
                db,
                n,
                concurrency,
                global_limit,
                prefetch,
                database=f"pgq_bench_{name}",
            )
        check_handled(result, n, "pgqueue")
        run(verify_drain(db, n))
    return result


# --- enqueue --------------------------------------------------------------------


async def _single(dsn: str, n: int) -> float:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=1) as pool:
        queue = pgqueue.Queue(pool)
        start = time.perf_counter()
        for i in range(n):
            await queue.enqueue(JOB_TYPE, {"i": i})
        return time.perf_counter() - start


async def _bulk(dsn: str, n: int, chunk: int) -> float:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=1) as pool:
        queue = pgqueue.Queue(pool)
        chunks = [
            [(JOB_TYPE, {"i": i}) for i in range(s, min(s + chunk, n))]
            for s in range(0, n, chunk)
        ]
        start = time.perf_counter()
        for jobs in chunks:
            await queue.enqueue_many(jobs)
        return time.perf_counter() - start


async def _count(dsn: str) -> int:
    connection = await asyncpg.connect(dsn)
    try:
        count: int = await connection.fetchval("SELECT count(*) FROM pgqueue_jobs")
    finally:
        await connection.close()
    return count


def enqueue_single(dsn: str, n: int, name: str = "enqueue_single") -> float:
    """Jobs per second enqueued one awaited call at a time, in a fresh database."""
    with bench_database(dsn, name) as db:
        seconds = run(_single(db, n))
        if (got := run(_count(db))) != n:
            msg = f"pgqueue single enqueue wrote {got} rows, expected {n}"
            raise AssertionError(msg)
    return n / seconds


def enqueue_bulk(
    dsn: str, n: int, chunk: int = 1000, name: str = "enqueue_bulk"
) -> float:
    """Jobs per second enqueued through enqueue_many in calls of ``chunk``."""
    with bench_database(dsn, name) as db:
        seconds = run(_bulk(db, n, chunk))
        if (got := run(_count(db))) != n:
            msg = f"pgqueue bulk enqueue wrote {got} rows, expected {n}"
            raise AssertionError(msg)
    return n / seconds


# --- wake latency -----------------------------------------------------------------


def wake_child(
    connection: Connection,
    dsn: str,
    total: int,
    queues: Mapping[str, int] | None = None,
) -> None:
    """Worker process: an idle worker (LISTEN on) records enqueue-to-handler latencies.

    It consumes the default queue at concurrency 10, or ``queues``.
    """
    asyncio.run(_wake(ChildLink(connection), dsn, total, queues))


async def _wake(
    link: ChildLink, dsn: str, total: int, queues: Mapping[str, int] | None
) -> None:
    latencies: list[float] = []
    done = anyio.Event()
    async with asyncpg.create_pool(dsn, min_size=POOL_MIN, max_size=POOL_MAX) as pool:
        # A long poll interval, so every wakeup comes from NOTIFY.
        worker = (
            pgqueue.Worker(pool, concurrency=10, poll_interval=30.0)
            if queues is None
            else pgqueue.Worker(pool, queues=queues, poll_interval=30.0)
        )

        @worker.handler(JOB_TYPE)
        async def record(job: pgqueue.Job) -> None:
            latencies.append(time.time() - job.payload["t"])
            if not job.payload["warm"] and len(latencies) >= total:
                done.set()

        @worker.handler(FLOOD_TYPE)
        async def flood(job: pgqueue.Job) -> None:
            pass

        async with anyio.create_task_group() as group:
            group.start_soon(worker.run)
            with anyio.fail_after(10):
                while worker.listener_pid is None:  # noqa: ASYNC110 - no event to await
                    await anyio.sleep(0.01)
            await anyio.sleep(0.2)
            await link.ready()
            with anyio.fail_after(60 + total):
                await done.wait()
            await worker.stop()
        await link.done({"latencies": latencies, "peak_rss_mb": peak_rss_mb()})


async def produce_timed(
    dsn: str, warm: int, count: int, gap: float, queue: str = QUEUE
) -> list[float]:
    """Enqueue ``warm + count`` jobs one at a time, ``gap`` seconds apart, stamped.

    Returns how long each call took (seconds).
    """
    calls: list[float] = []
    async with asyncpg.create_pool(dsn, min_size=1, max_size=1) as pool:
        into = pgqueue.Queue(pool, queue)
        for i in range(warm + count):
            t = time.time()
            await into.enqueue(JOB_TYPE, {"t": t, "warm": i < warm})
            calls.append(time.time() - t)
            await asyncio.sleep(gap)
    return calls


def wake(
    dsn: str, count: int = 200, warm: int = 10, gap: float = 0.02, name: str = "wake"
) -> list[float]:
    """Latencies (seconds) from the start of enqueue to the start of the handler."""
    return wake_detail(dsn, count, warm, gap, name)[0]


def wake_detail(
    dsn: str,
    count: int = 200,
    warm: int = 10,
    gap: float = 0.02,
    name: str = "wake",
    *,
    queue: str = QUEUE,
    worker_queues: Mapping[str, int] | None = None,
    alongside: Alongside | None = None,
) -> tuple[list[float], list[float]]:
    """Wake latencies and enqueue call times (seconds) of the measured jobs.

    The jobs go to ``queue``; the worker consumes ``worker_queues`` (the
    default queue if ``None``). ``alongside(dsn)`` is entered once the worker
    is listening and left after the last job was enqueued.
    """
    calls: list[float] = []

    def produce(db: str) -> None:
        with nullcontext() if alongside is None else alongside(db):
            calls.extend(run(produce_timed(db, warm, count, gap, queue)))

    with bench_database(dsn, name) as db:
        result = run_child(
            wake_child,
            db,
            warm + count,
            worker_queues,
            while_running=lambda: produce(db),
        )
    latencies: list[float] = result["latencies"][warm:]
    if len(latencies) != count:
        msg = f"pgqueue wake: {len(latencies)} measured jobs, expected {count}"
        raise AssertionError(msg)
    return latencies, calls[warm:]


# --- the raw floor ------------------------------------------------------------------


def floor_child(
    connection: Connection, dsn: str, n: int, batch: int, pipelined: bool
) -> None:
    """Bare asyncpg: `CLAIM` ``batch`` rows, then one fenced `COMPLETE` per batch."""
    asyncio.run(_floor(ChildLink(connection), dsn, n, batch, pipelined))


async def _floor(
    link: ChildLink, dsn: str, n: int, batch: int, pipelined: bool
) -> None:
    # Planned as the worker's own connections are.
    claimer = await asyncpg.connect(dsn, server_settings=WORKER_SETTINGS)
    finisher = (
        await asyncpg.connect(dsn, server_settings=WORKER_SETTINGS)
        if pipelined
        else claimer
    )
    try:
        await link.ready()
        cpu0 = process_cpu()
        start = time.perf_counter()
        finished = 0
        previous: list[asyncpg.Record] = []
        after = HEAD_OF_LINE  # as the worker: past the last job taken
        while True:
            places = {} if after is HEAD_OF_LINE else {0: after}
            claim = claimer.fetch(CLAIM, QUEUE, batch, *claim_places(places))
            if previous:
                finish = finisher.fetch(
                    COMPLETE,
                    array(r[0] for r in previous),
                    array(r[4] for r in previous),
                    [None] * len(previous),
                )
                if pipelined:
                    rows, written = await asyncio.gather(claim, finish)
                else:
                    written = await finish
                    rows = await claim
                finished += len(written)
            else:
                rows = await claim
            if not rows:
                if after is HEAD_OF_LINE:
                    break
                after, previous = HEAD_OF_LINE, []
                continue
            after = max((r[6], r[0]) for r in rows)
            previous = rows
        elapsed = time.perf_counter() - start
        cpu = process_cpu() - cpu0
        await link.done(
            {
                "seconds": elapsed,
                "jobs_per_s": n / elapsed,
                "handled": finished,
                "distinct": finished,
                "worker_cpu_s": cpu,
                "peak_rss_mb": peak_rss_mb(),
            }
        )
    finally:
        await claimer.close()
        if pipelined:
            await finisher.close()


def floor(
    dsn: str, n: int, batch: int, pipelined: bool = True, name: str = "floor"
) -> dict[str, Any]:
    """One verified bare-SQL drain of ``n`` jobs in a fresh database."""
    with bench_database(dsn, name) as db:
        run(fill(db, n))
        result = run_child(
            floor_child, db, n, batch, pipelined, database=f"pgq_bench_{name}"
        )
        check_handled(result, n, "floor")
        run(verify_drain(db, n))
    return result
