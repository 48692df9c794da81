"""pgqueuer's side of the comparison, configured as its documentation advises for throughput.

Settings (see benchmarks/README.md): the asyncpg pool driver
(``AsyncpgPoolDriver``) over a pool of the same size pgqueue gets; its own
schema installed through its Python API (``Queries.install()``, what
``pgq install`` runs) into a database of its own, default (durable) tables;
``QueueManager.run(batch_size=C)`` for concurrency C, with no
``max_concurrent_tasks`` (that cap must be at least twice the batch size, so
it could only allow more than C in flight); bulk enqueue through
``Queries.enqueue`` with lists.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import nullcontext
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
from pgqueuer.db import AsyncpgDriver, AsyncpgPoolDriver
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries

from benchmarks._common import (
    ChildLink,
    bench_database,
    peak_rss_mb,
    process_cpu,
    run,
    run_child,
)
from benchmarks._pgqueue_runs import JOB_TYPE, POOL_MAX, POOL_MIN, check_handled

if TYPE_CHECKING:
    from collections.abc import Mapping
    from multiprocessing.connection import Connection

    from pgqueuer.models import Job

    from benchmarks._pgqueue_runs import Alongside

FILL_CHUNK = 1000


async def install(dsn: str) -> None:
    """Install pgqueuer's schema through its API (what ``pgq install`` runs)."""
    connection = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(connection)).install()
    finally:
        await connection.close()


async def fill(dsn: str, n: int) -> None:
    """Enqueue ``n`` no-op jobs through pgqueuer's batch enqueue."""
    async with asyncpg.create_pool(dsn, min_size=1, max_size=2) as pool:
        queries = Queries(AsyncpgPoolDriver(pool))
        for s in range(0, n, FILL_CHUNK):
            k = min(FILL_CHUNK, n - s)
            await queries.enqueue(
                [JOB_TYPE] * k,
                [json.dumps({"i": i}).encode() for i in range(s, s + k)],
                [0] * k,
            )
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute("VACUUM ANALYZE")
    finally:
        await connection.close()


async def verify_drain(dsn: str, n: int) -> None:
    """Fail unless the queue is empty and the log shows ``n`` distinct successes."""
    connection = await asyncpg.connect(dsn)
    try:
        left = await connection.fetchval("SELECT count(*) FROM pgqueuer")
        row = await connection.fetchrow(
            "SELECT count(*), count(DISTINCT job_id) FROM pgqueuer_log"
            " WHERE status = 'successful'"
        )
        assert row is not None
        ok, distinct = row
    finally:
        await connection.close()
    if left != 0 or ok != n or distinct != n:
        msg = f"pgqueuer drain check failed: {left} left, {ok} successes ({distinct} distinct), expected {n}"
        raise AssertionError(msg)


def drain_child(connection: Connection, dsn: str, n: int, concurrency: int) -> None:
    """Worker process: drain ``n`` jobs with batch_size=concurrency and report."""
    asyncio.run(_drain(ChildLink(connection), dsn, n, concurrency))


async def _drain(link: ChildLink, dsn: str, n: int, concurrency: int) -> None:
    async with asyncpg.create_pool(dsn, min_size=POOL_MIN, max_size=POOL_MAX) as pool:
        qm = QueueManager(Queries(AsyncpgPoolDriver(pool)))
        seen: set[int] = set()
        calls = 0

        @qm.entrypoint(JOB_TYPE)
        async def noop(job: Job) -> None:
            nonlocal calls
            calls += 1
            seen.add(job.id)
            if calls >= n:
                qm.shutdown.set()

        await link.ready()
        cpu0 = process_cpu()
        start = time.perf_counter()
        await asyncio.wait_for(qm.run(batch_size=concurrency), 600 + n / 200)
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
            }
        )


def drain(
    dsn: str,
    n: int,
    concurrency: int,
    name: str = "pgqueuer_drain",
    *,
    around: Alongside | None = None,
) -> dict[str, Any]:
    """One verified pgqueuer drain of ``n`` jobs in a fresh database.

    ``around(dsn)``, if given, is entered after the fill and left after the drain.
    """
    with bench_database(dsn, name, install) as db:
        run(fill(db, n))
        with nullcontext() if around is None else around(db):
            result = run_child(
                drain_child, db, n, concurrency, database=f"pgq_bench_{name}"
            )
        check_handled(result, n, "pgqueuer")
        run(verify_drain(db, n))
    return result


async def _count(dsn: str) -> int:
    connection = await asyncpg.connect(dsn)
    try:
        count: int = await connection.fetchval("SELECT count(*) FROM pgqueuer")
    finally:
        await connection.close()
    return count


async def _single(dsn: str, n: int) -> float:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=1) as pool:
        queries = Queries(AsyncpgPoolDriver(pool))
        start = time.perf_counter()
        for i in range(n):
            await queries.enqueue(JOB_TYPE, json.dumps({"i": i}).encode())
        return time.perf_counter() - start


async def _bulk(dsn: str, n: int, chunk: int) -> float:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=1) as pool:
        queries = Queries(AsyncpgPoolDriver(pool))
        chunks = [list(range(s, min(s + chunk, n))) for s in range(0, n, chunk)]
        start = time.perf_counter()
        for ids in chunks:
            # Encoding the payloads is part of the call, as it is for pgqueue.
            await queries.enqueue(
                [JOB_TYPE] * len(ids),
                [json.dumps({"i": i}).encode() for i in ids],
                [0] * len(ids),
            )
        return time.perf_counter() - start


def enqueue_single(dsn: str, n: int, name: str = "pgqueuer_enqueue_single") -> float:
    """Jobs per second enqueued one awaited call at a time."""
    with bench_database(dsn, name, install) as db:
        seconds = run(_single(db, n))
        if (got := run(_count(db))) != n:
            msg = f"pgqueuer single enqueue wrote {got} rows, expected {n}"
            raise AssertionError(msg)
    return n / seconds


def enqueue_bulk(
    dsn: str, n: int, chunk: int = 1000, name: str = "pgqueuer_enqueue_bulk"
) -> float:
    """Jobs per second enqueued in batches of ``chunk``."""
    with bench_database(dsn, name, install) as db:
        seconds = run(_bulk(db, n, chunk))
        if (got := run(_count(db))) != n:
            msg = f"pgqueuer bulk enqueue wrote {got} rows, expected {n}"
            raise AssertionError(msg)
    return n / seconds


def wake_child(
    connection: Connection,
    dsn: str,
    total: int,
    entrypoints: Mapping[str, int] | None = None,
) -> None:
    """Worker process: an idle pgqueuer worker records enqueue-to-handler latencies.

    With ``entrypoints`` (name to ``concurrency_limit``; ``JOB_TYPE`` among
    them), it serves each with that limit and a batch size of their sum;
    the others' handlers do nothing. Otherwise ``JOB_TYPE`` alone, batch 10.
    """
    asyncio.run(_wake(ChildLink(connection), dsn, total, entrypoints))


async def _wake(
    link: ChildLink, dsn: str, total: int, entrypoints: Mapping[str, int] | None
) -> None:
    latencies: list[float] = []
    async with asyncpg.create_pool(dsn, min_size=POOL_MIN, max_size=POOL_MAX) as pool:
        qm = QueueManager(Queries(AsyncpgPoolDriver(pool)))
        limits = dict(entrypoints or {JOB_TYPE: 0})

        @qm.entrypoint(JOB_TYPE, concurrency_limit=limits.pop(JOB_TYPE))
        async def record(job: Job) -> None:
            assert job.payload is not None
            payload = json.loads(job.payload)
            latencies.append(time.time() - payload["t"])
            if not payload["warm"] and len(latencies) >= total:
                qm.shutdown.set()

        async def nothing(job: Job) -> None:
            pass

        for name, limit in limits.items():
            qm.entrypoint(name, concurrency_limit=limit)(nothing)
        batch = 10 if entrypoints is None else sum(entrypoints.values())
        task = asyncio.create_task(
            qm.run(batch_size=batch, dequeue_timeout=timedelta(seconds=30))
        )
        # pgqueuer has no "listening" signal; give it a second to LISTEN.
        await asyncio.sleep(1.0)
        await link.ready()
        await asyncio.wait_for(task, 60 + total)
        await link.done({"latencies": latencies, "peak_rss_mb": peak_rss_mb()})


async def produce_timed(dsn: str, warm: int, count: int, gap: float) -> list[float]:
    """Enqueue ``warm + count`` stamped jobs one at a time, ``gap`` seconds apart.

    Returns how long each call took (seconds).
    """
    calls: list[float] = []
    async with asyncpg.create_pool(dsn, min_size=1, max_size=1) as pool:
        queries = Queries(AsyncpgPoolDriver(pool))
        for i in range(warm + count):
            t = time.time()
            payload = {"t": t, "warm": i < warm}
            await queries.enqueue(JOB_TYPE, json.dumps(payload).encode())
            calls.append(time.time() - t)
            await asyncio.sleep(gap)
    return calls


def wake(
    dsn: str,
    count: int = 200,
    warm: int = 10,
    gap: float = 0.02,
    name: str = "pgqueuer_wake",
) -> list[float]:
    """Latencies (seconds) from the start of enqueue to the start of the handler."""
    return wake_detail(dsn, count, warm, gap, name)[0]


def wake_detail(
    dsn: str,
    count: int = 200,
    warm: int = 10,
    gap: float = 0.02,
    name: str = "pgqueuer_wake",
    *,
    entrypoints: Mapping[str, int] | None = None,
    alongside: Alongside | None = None,
) -> tuple[list[float], list[float]]:
    """Wake latencies and enqueue call times (seconds) of the measured jobs.

    ``entrypoints``: see `wake_child`. ``alongside(dsn)`` is entered once
    the worker has had its second to LISTEN and left after the last job.
    """
    calls: list[float] = []

    def produce(db: str) -> None:
        with nullcontext() if alongside is None else alongside(db):
            calls.extend(run(produce_timed(db, warm, count, gap)))

    with bench_database(dsn, name, install) as db:
        result = run_child(
            wake_child,
            db,
            warm + count,
            entrypoints,
            while_running=lambda: produce(db),
        )
    latencies: list[float] = result["latencies"][warm:]
    if len(latencies) != count:
        msg = f"pgqueuer wake: {len(latencies)} measured jobs, expected {count}"
        raise AssertionError(msg)
    return latencies, calls[warm:]
