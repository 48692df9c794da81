"""Soak: a steady enqueue rate through workers with retention, for a set time.

A producer in this process enqueues ``--rate`` jobs per second (one
``enqueue_many`` every ``--tick`` seconds, catching up if a call was slow);
``--workers`` worker processes (spawned, ``concurrency=--concurrency``,
``retain=--retain``) run a no-op handler. Every ``--sample`` seconds one row
goes to a CSV: the jobs table's size (``pg_table_size``), its indexes'
(``pg_indexes_size``; the claim index and the primary key apart), live and
dead tuples and autovacuum runs (``pg_stat_user_tables``), the pending
backlog, jobs enqueued and completed per second, claim latency p50/p99/max,
the workers' CPU and the machine's load average.

Claim latency is the handler's start (``time.time()`` in the worker process)
minus the job's ``run_at``, which PostgreSQL sets to the enqueue
transaction's start: from enqueue to start, on one machine's clock.

``--hold-open S --hold-at T``: at T seconds a separate connection opens a
transaction, takes an xid (``txid_current()``) and sits idle in it for S
seconds, so that vacuum can remove nothing deleted or updated meanwhile.

The target: in the last ``--window`` seconds, the largest table and index
size and the median of the per-sample p99s within 1.25x of those in the
``--window`` seconds after ``--warmup``. Writes
``results/soak[_LABEL].csv``, ``.png`` and ``.json``.

Usage: python -m benchmarks.soak [--minutes 30] [--rate 2000] [--retain 60]
       [--hold-open 600 --hold-at 600] [--label hold]
"""

from __future__ import annotations

import argparse
import array
import asyncio
import csv
import multiprocessing
import os
import statistics
import time
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import psutil

import pgqueue
from benchmarks._common import (
    RESULTS_DIR,
    bench_database,
    expect,
    markdown_table,
    percentile,
    resolve_dsn,
    server_settings,
    write_json,
)

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from pathlib import Path

JOB_TYPE = "soak"
TARGET = 1.25
POOL_MAX = 10

SIZES = """
SELECT pg_table_size('pgqueue_jobs') AS table_bytes,
       pg_indexes_size('pgqueue_jobs') AS index_bytes,
       pg_relation_size('idx_pgqueue_jobs_claim') AS claim_index_bytes,
       pg_relation_size('pgqueue_jobs_pkey') AS pkey_bytes,
       s.n_live_tup AS live_tuples, s.n_dead_tup AS dead_tuples,
       s.autovacuum_count AS autovacuums,
       (SELECT count(*) FROM pgqueue_jobs WHERE status = 'pending') AS backlog
FROM pg_stat_user_tables AS s
WHERE s.relid = 'pgqueue_jobs'::regclass
"""


@dataclass
class Sample:
    """One row of the CSV."""

    t_s: float
    phase: str
    enqueued_per_s: float
    completed_per_s: float
    backlog: int
    claim_p50_ms: float
    claim_p99_ms: float
    claim_max_ms: float
    table_mb: float
    indexes_mb: float
    claim_index_mb: float
    pkey_mb: float
    live_tuples: int
    dead_tuples: int
    autovacuums: int
    holding: int
    worker_cpu_pct: float
    load1: float
    load5: float


# --- worker process ------------------------------------------------------------


def worker_child(
    connection: Connection,
    dsn: str,
    concurrency: int,
    prefetch: int,
    retain: float,
    rescue_after: float,
) -> None:
    """Worker process: run a no-op worker; answer "sample" with the latencies since the last."""
    asyncio.run(_worker(connection, dsn, concurrency, prefetch, retain, rescue_after))


async def _worker(
    link: Connection,
    dsn: str,
    concurrency: int,
    prefetch: int,
    retain: float,
    rescue_after: float,
) -> None:
    async with asyncpg.create_pool(dsn, min_size=2, max_size=POOL_MAX) as pool:
        worker = pgqueue.Worker(
            pool,
            concurrency=concurrency,
            prefetch=prefetch,
            retain=retain,
            rescue_after=rescue_after,
        )
        latencies = array.array("d")

        async def noop(job: pgqueue.Job) -> None:
            latencies.append(time.time() - job.run_at.timestamp())

        worker.register(JOB_TYPE, noop)
        link.send(("ready", None))
        async with anyio.create_task_group() as group:
            group.start_soon(worker.run)
            while True:
                command = await asyncio.to_thread(link.recv)
                if command == "sample":
                    link.send(("sample", latencies.tobytes()))
                    del latencies[:]
                elif command == "stop":
                    await worker.stop()
                    link.send(("stopped", latencies.tobytes()))
                    return


class Workers:
    """The worker processes and their pipes."""

    def __init__(self, count: int, *args: Any) -> None:
        context = multiprocessing.get_context("spawn")
        self._links: list[Connection] = []
        self._processes: list[Any] = []
        for _ in range(count):
            parent, child = context.Pipe()
            process = context.Process(
                target=worker_child, args=(child, *args), daemon=True
            )
            process.start()
            self._links.append(parent)
            self._processes.append(process)

    async def _ask(self, command: str | None, kind: str) -> list[float]:
        got = array.array("d")
        for link, process in zip(self._links, self._processes, strict=True):
            if command is not None:
                link.send(command)
            data = await asyncio.to_thread(expect, link, process, kind, 120)
            if data is not None:
                got.frombytes(data)
        return list(got)

    async def ready(self) -> None:
        """Wait until every worker is connected."""
        await self._ask(None, "ready")

    async def sample(self) -> list[float]:
        """Claim latencies (seconds) of the jobs started since the last sample."""
        return await self._ask("sample", "sample")

    async def stop(self) -> list[float]:
        """Stop the workers; the latencies not yet sampled."""
        rest = await self._ask("stop", "stopped")
        for process in self._processes:
            process.join(30)
        return rest

    def cpu_seconds(self) -> float:
        """User+system CPU seconds of the worker processes so far."""
        total = 0.0
        for process in self._processes:
            try:
                times = psutil.Process(process.pid).cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
        return total

    def kill(self) -> None:
        """Kill any worker process still alive."""
        for process in self._processes:
            if process.is_alive():
                process.kill()
                process.join()


# --- the run ----------------------------------------------------------------------


class Producer:
    """Enqueues ``rate`` jobs per second, one ``enqueue_many`` every ``tick``."""

    def __init__(self, queue: pgqueue.Queue, rate: float, tick: float) -> None:
        self._queue = queue
        self._rate = rate
        self._tick = tick
        self.sent = 0
        self.slow_calls = 0

    async def run(self, until: float) -> None:
        """Enqueue on schedule until ``until`` (monotonic); a slow call is caught up on."""
        start = time.monotonic()
        next_tick = start
        while (now := time.monotonic()) < until:
            due = int(self._rate * (now - start)) - self.sent
            if due > 0:
                jobs = [(JOB_TYPE, {"i": self.sent + k}) for k in range(due)]
                await self._queue.enqueue_many(jobs)
                self.sent += due
                if time.monotonic() - now > self._tick:
                    self.slow_calls += 1
            next_tick += self._tick
            await asyncio.sleep(max(0.0, next_tick - time.monotonic()))


async def hold_open(dsn: str, at: float, seconds: float, state: dict[str, int]) -> None:
    """At ``at`` (monotonic) open a transaction with an xid and keep it ``seconds``."""
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    connection = await asyncpg.connect(dsn)
    try:
        async with connection.transaction():
            await connection.fetchval("SELECT txid_current()")
            state["holding"] = 1
            await asyncio.sleep(seconds)
        state["holding"] = 0
    finally:
        await connection.close()


def phase_of(t: float, args: argparse.Namespace) -> str:
    """What part of the run ``t`` seconds after the start falls in."""
    if args.hold_open and args.hold_at <= t < args.hold_at + args.hold_open:
        return "hold"
    if t <= args.warmup:
        return "warmup"
    if args.hold_open and t >= args.hold_at + args.hold_open:
        return "recovery"
    return "steady"


async def soak(dsn: str, args: argparse.Namespace, out: Path) -> list[Sample]:
    """Run the soak against the database at ``dsn``; the samples (also written to ``out``)."""
    workers = Workers(
        args.workers,
        dsn,
        args.concurrency,
        args.prefetch,
        args.retain,
        args.rescue_after,
    )
    samples: list[Sample] = []
    state = {"holding": 0}
    try:
        await workers.ready()
        async with asyncpg.create_pool(dsn, min_size=1, max_size=2) as pool:
            stats = await asyncpg.connect(dsn)
            producer = Producer(pgqueue.Queue(pool), args.rate, args.tick)
            start = time.monotonic()
            end = start + args.seconds
            tasks = [asyncio.create_task(producer.run(end))]
            if args.hold_open:
                tasks.append(
                    asyncio.create_task(
                        hold_open(dsn, start + args.hold_at, args.hold_open, state)
                    )
                )
            with out.open("w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow([f.name for f in fields(Sample)])
                last_t, last_sent, last_cpu = 0.0, 0, workers.cpu_seconds()
                next_sample = start + args.sample
                while next_sample <= end + 0.001:
                    await asyncio.sleep(max(0.0, next_sample - time.monotonic()))
                    for task in tasks:
                        if task.done() and task.exception() is not None:
                            raise task.exception()  # type: ignore[misc]
                    latencies = await workers.sample()
                    now = time.monotonic()
                    row = await stats.fetchrow(SIZES)
                    assert row is not None
                    t = now - start
                    span = t - last_t
                    cpu = workers.cpu_seconds()
                    ms = [x * 1000 for x in latencies] or [float("nan")]
                    load = os.getloadavg()
                    sample = Sample(
                        t_s=round(t, 1),
                        phase=phase_of(t, args),
                        enqueued_per_s=round((producer.sent - last_sent) / span, 1),
                        completed_per_s=round(len(latencies) / span, 1),
                        backlog=row["backlog"],
                        claim_p50_ms=round(percentile(ms, 50), 2),
                        claim_p99_ms=round(percentile(ms, 99), 2),
                        claim_max_ms=round(max(ms), 2),
                        table_mb=round(row["table_bytes"] / 2**20, 2),
                        indexes_mb=round(row["index_bytes"] / 2**20, 2),
                        claim_index_mb=round(row["claim_index_bytes"] / 2**20, 2),
                        pkey_mb=round(row["pkey_bytes"] / 2**20, 2),
                        live_tuples=row["live_tuples"],
                        dead_tuples=row["dead_tuples"],
                        autovacuums=row["autovacuums"],
                        holding=state["holding"],
                        worker_cpu_pct=round(100 * (cpu - last_cpu) / span, 1),
                        load1=round(load[0], 2),
                        load5=round(load[1], 2),
                    )
                    samples.append(sample)
                    writer.writerow(asdict(sample).values())
                    handle.flush()
                    print(
                        f"{t / 60:5.1f} min {sample.phase:8} "
                        f"in {sample.enqueued_per_s:7,.0f}/s out {sample.completed_per_s:7,.0f}/s "
                        f"backlog {sample.backlog:6,} p50 {sample.claim_p50_ms:8.1f} ms "
                        f"p99 {sample.claim_p99_ms:8.1f} ms table {sample.table_mb:7.1f} MB "
                        f"indexes {sample.indexes_mb:6.1f} MB dead {sample.dead_tuples:8,} "
                        f"load {sample.load1:.2f}",
                        flush=True,
                    )
                    last_t, last_sent, last_cpu = t, producer.sent, cpu
                    next_sample += args.sample
            for task in tasks:
                await task
            await stats.close()
            print(f"producer: {producer.sent:,} jobs, {producer.slow_calls} slow calls")
        await workers.stop()
    finally:
        workers.kill()
    return samples


# --- summary and plot --------------------------------------------------------------


def window_figures(samples: list[Sample]) -> dict[str, float]:
    """The largest sizes and the median p99 (and its worst) of the samples of a window."""
    return {
        "samples": len(samples),
        "table_mb": max(s.table_mb for s in samples),
        "indexes_mb": max(s.indexes_mb for s in samples),
        "claim_p99_ms": statistics.median(s.claim_p99_ms for s in samples),
        "claim_p99_worst_ms": max(s.claim_p99_ms for s in samples),
        "claim_p50_ms": statistics.median(s.claim_p50_ms for s in samples),
        "completed_per_s": statistics.median(s.completed_per_s for s in samples),
        "dead_tuples": statistics.median(s.dead_tuples for s in samples),
        "load1": statistics.median(s.load1 for s in samples),
    }


def summarize_run(samples: list[Sample], args: argparse.Namespace) -> dict[str, Any]:
    """First window after warm-up vs the last window; ratios and the verdict."""
    first = [s for s in samples if args.warmup < s.t_s <= args.warmup + args.window]
    last = [s for s in samples if s.t_s > args.seconds - args.window]
    if not first or not last:
        return {"first": None, "last": None, "ratios": None, "passed": None}
    a, b = window_figures(first), window_figures(last)
    ratios = {
        key: b[key] / a[key] if a[key] else float("inf")
        for key in ("table_mb", "indexes_mb", "claim_p99_ms")
    }
    return {
        "first": a,
        "last": b,
        "ratios": ratios,
        "passed": all(r <= TARGET for r in ratios.values()),
    }


def plot(samples: list[Sample], args: argparse.Namespace, path: Path) -> bool:
    """Write the PNG (False, and a note, without matplotlib)."""
    try:
        import matplotlib as mpl

        mpl.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot")
        return False
    minutes = [s.t_s / 60 for s in samples]
    figure, axes = plt.subplots(4, 1, figsize=(10, 12), sharex=True)
    size, dead, latency, rate = axes
    size.plot(minutes, [s.table_mb for s in samples], label="table (pg_table_size)")
    size.plot(minutes, [s.indexes_mb for s in samples], label="all indexes")
    size.plot(minutes, [s.claim_index_mb for s in samples], label="claim index")
    size.plot(minutes, [s.pkey_mb for s in samples], label="primary key")
    size.set_ylabel("MB")
    dead.plot(minutes, [s.dead_tuples / 1000 for s in samples], label="dead tuples")
    dead.plot(minutes, [s.live_tuples / 1000 for s in samples], label="live tuples")
    dead.plot(minutes, [s.backlog / 1000 for s in samples], label="pending backlog")
    dead.set_ylabel("thousand rows")
    latency.plot(minutes, [s.claim_p50_ms for s in samples], label="claim p50")
    latency.plot(minutes, [s.claim_p99_ms for s in samples], label="claim p99")
    latency.set_yscale("log")
    latency.set_ylabel("ms (enqueue to start)")
    rate.plot(minutes, [s.enqueued_per_s for s in samples], label="enqueued/s")
    rate.plot(minutes, [s.completed_per_s for s in samples], label="completed/s")
    rate.set_ylabel("jobs/s")
    rate.set_xlabel("minutes")
    load_axis = rate.twinx()
    load_axis.plot(
        minutes,
        [s.load1 for s in samples],
        color="grey",
        linestyle=":",
        label="load 1 min",
    )
    load_axis.set_ylabel("load average")
    for axis in axes:
        axis.axvspan(0, args.warmup / 60, color="0.9", zorder=0)
        axis.axvspan(
            args.warmup / 60,
            (args.warmup + args.window) / 60,
            color="tab:green",
            alpha=0.08,
        )
        axis.axvspan(
            (args.seconds - args.window) / 60,
            args.seconds / 60,
            color="tab:blue",
            alpha=0.08,
        )
        if args.hold_open:
            axis.axvspan(
                args.hold_at / 60,
                (args.hold_at + args.hold_open) / 60,
                color="tab:red",
                alpha=0.1,
            )
        axis.grid(True, alpha=0.3)
        axis.legend(loc="upper left", fontsize="small")
    load_axis.legend(loc="upper right", fontsize="small")
    title = (
        f"pgqueue soak: {args.rate:,.0f} jobs/s, retain {args.retain:g} s, "
        f"{args.workers} worker process(es) x {args.concurrency}"
    )
    if args.hold_open:
        title += f"; transaction held open {args.hold_at / 60:g}-{(args.hold_at + args.hold_open) / 60:g} min (red)"
    size.set_title(
        title + "\ngrey: warm-up; green: first window; blue: last window",
        fontsize="medium",
    )
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return True


async def _vacuum_settings(dsn: str) -> dict[str, str]:
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(
            "SELECT name, setting FROM pg_settings"
            " WHERE name LIKE 'autovacuum%' OR name = 'maintenance_work_mem'"
        )
    finally:
        await connection.close()
    return {row["name"]: row["setting"] for row in rows}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--minutes", type=float, default=30.0, help="length of the run")
    parser.add_argument(
        "--rate", type=float, default=2000.0, help="jobs enqueued per second"
    )
    parser.add_argument(
        "--tick", type=float, default=0.05, help="seconds between enqueue calls"
    )
    parser.add_argument(
        "--retain", type=float, default=60.0, help="the workers' retain="
    )
    parser.add_argument(
        "--rescue-after",
        type=float,
        default=300.0,
        help="the workers' rescue_after= (the sweeps run every half of it; default the library's)",
    )
    parser.add_argument("--workers", type=int, default=1, help="worker processes")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--prefetch", type=int, default=100)
    parser.add_argument(
        "--sample", type=float, default=30.0, help="seconds between samples"
    )
    parser.add_argument(
        "--warmup", type=float, default=300.0, help="seconds of warm-up"
    )
    parser.add_argument(
        "--window",
        type=float,
        default=300.0,
        help="seconds of the first and last windows",
    )
    parser.add_argument(
        "--hold-open", type=float, default=0.0, help="seconds to hold a transaction"
    )
    parser.add_argument(
        "--hold-at", type=float, default=600.0, help="when to open it, seconds"
    )
    parser.add_argument("--label", default="", help="results/soak_LABEL.*")
    parser.add_argument("--database", default="soak", help="pgq_bench_NAME")
    parser.add_argument("--no-json", action="store_true", help="write no JSON")
    args = parser.parse_args()
    args.seconds = args.minutes * 60
    return args


def main() -> None:
    args = parse_args()
    dsn = resolve_dsn(args.dsn)
    stem = "soak" + (f"_{args.label}" if args.label else "")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    csv_path = RESULTS_DIR / f"{stem}.csv"
    with bench_database(dsn, args.database) as db:
        settings = asyncio.run(server_settings(db))
        settings.update(asyncio.run(_vacuum_settings(db)))
        if settings["autovacuum"] != "on":
            print(
                "warning: autovacuum is off on this server: nothing but the"
                " retention sweep's own deletes runs, and dead rows pile up"
            )
        samples = asyncio.run(soak(db, args, csv_path))
    summary = summarize_run(samples, args)
    plotted = plot(samples, args, RESULTS_DIR / f"{stem}.png")
    print()
    if summary["ratios"] is not None:
        first, last, ratios = summary["first"], summary["last"], summary["ratios"]
        print(
            markdown_table(
                ["", "first window", "last window", "last / first"],
                [
                    [
                        "table, MB (largest)",
                        f"{first['table_mb']:.1f}",
                        f"{last['table_mb']:.1f}",
                        f"{ratios['table_mb']:.2f}",
                    ],
                    [
                        "indexes, MB (largest)",
                        f"{first['indexes_mb']:.1f}",
                        f"{last['indexes_mb']:.1f}",
                        f"{ratios['indexes_mb']:.2f}",
                    ],
                    [
                        "claim p99, ms (median of samples)",
                        f"{first['claim_p99_ms']:.1f}",
                        f"{last['claim_p99_ms']:.1f}",
                        f"{ratios['claim_p99_ms']:.2f}",
                    ],
                ],
            )
        )
        print(f"\nwithin {TARGET}x: {'yes' if summary['passed'] else 'NO'}")
    print(f"wrote {csv_path}" + (f" and {stem}.png" if plotted else ""))
    options = {k: v for k, v in vars(args).items() if k not in ("dsn", "no_json")}
    write_json(
        stem,
        {"options": options, "server": settings, **summary},
        enabled=not args.no_json,
    )


if __name__ == "__main__":
    main()
