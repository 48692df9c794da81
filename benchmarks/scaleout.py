"""Scale-out: drain N no-op jobs with `pgqueue worker --burst --processes P`, P = 1, 2, 4.

Usage: python -m benchmarks.scaleout [--jobs 100000] [--processes 1 2 4]
       [--concurrency 50] [--runs 3]

For each process count the queue is filled with N jobs (`enqueue_many` in
calls of 1,000, then ``VACUUM ANALYZE``) in a database of its own, then

    python -m pgqueue worker benchmarks.scaleout_app:worker --burst
        --processes P --concurrency C --prefetch C

runs as a subprocess; the time is from its start until it exits 0, and the
run fails unless the table then holds N rows, every one completed with
``attempts = 1``. Process counts alternate within each run (1, 2, 4, then
4, 2, 1, ...). Where the time goes, per run:

- server CPU: the CPU time of the benchmark database's backends (and of
  every ``postgres`` process: WAL writer, checkpointer, other users) over
  the drain, sampled every 100 ms (`benchmarks._common.PostgresSampler`);
- worker CPU: user+system of the ``pgqueue worker`` process tree
  (``RUSAGE_CHILDREN`` of this process around the run: the parent and its
  children, once reaped), and the same for an empty burst (start, connect,
  find nothing, exit) measured once per process count up front, so that
  the per-job figure can be given net of start-up;
- waits: ``pg_stat_activity`` sampled every 50 ms from a connection to
  another database, counting the benchmark database's client backends
  that are in a statement (``state = 'active'``) by
  ``wait_event_type/wait_event`` ("CPU" when there is no wait event);
  idle backends (waiting in Client/ClientRead for their worker) are counted
  apart;
- machine CPU: the share of both cores busy over the run (every process,
  including other users of the machine);
- commits per job (``pg_stat_database.xact_commit`` of the benchmark
  database) and WAL bytes and syncs per job (``pg_stat_wal``, server-wide).
"""

from __future__ import annotations

import asyncio
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import asyncpg
import psutil

import pgqueue
from benchmarks._common import (
    PostgresSampler,
    base_parser,
    bench_database,
    fmt,
    fmt_summary,
    markdown_table,
    resolve_dsn,
    run,
    server_settings,
    summarize,
    write_json,
)

NAME = "scaleout"
DATABASE = f"pgq_bench_{NAME}"
APP = "benchmarks.scaleout_app:worker"
JOB_TYPE = "noop"
CHUNK = 1000
ROOT = Path(__file__).resolve().parent.parent
WAIT_INTERVAL = 0.05
TIMEOUT = 1800.0
WAIT_COLUMNS = (
    "CPU",
    "Client/ClientRead",
    "Lock/transactionid",
    "LWLock/WALWrite",
    "IO/WALSync",
    "IO/WALWrite",
)


# --- filling and checking -------------------------------------------------------


async def fill(dsn: str, n: int) -> None:
    """Enqueue ``n`` no-op jobs with `enqueue_many` in calls of ``CHUNK``."""
    async with asyncpg.create_pool(dsn, min_size=1, max_size=1) as pool:
        queue = pgqueue.Queue(pool)
        for start in range(0, n, CHUNK):
            await queue.enqueue_many(
                [(JOB_TYPE, {"i": i}) for i in range(start, min(start + CHUNK, n))]
            )
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute("VACUUM ANALYZE pgqueue_jobs")
    finally:
        await connection.close()


async def verify(dsn: str, n: int) -> float:
    """Fail unless all ``n`` jobs completed exactly once; seconds from first to last completion."""
    connection = await asyncpg.connect(dsn)
    try:
        row = await connection.fetchrow(
            "SELECT count(*),"
            " count(*) FILTER (WHERE status = 'completed' AND attempts = 1"
            "   AND completed_at IS NOT NULL),"
            " extract(epoch FROM max(completed_at) - min(completed_at))::float8"
            " FROM pgqueue_jobs"
        )
    finally:
        await connection.close()
    assert row is not None
    total, good, window = row
    if total != n or good != n:
        msg = (
            f"scale-out check failed: {total} rows, {good} completed once, expected {n}"
        )
        raise AssertionError(msg)
    return float(window or 0.0)


async def _server_counters(admin_dsn: str) -> dict[str, float]:
    connection = await asyncpg.connect(admin_dsn)
    try:
        await connection.execute("SELECT pg_stat_clear_snapshot()")
        commits = await connection.fetchval(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", DATABASE
        )
        wal = await connection.fetchrow(
            "SELECT wal_records, wal_bytes::float8, wal_write, wal_sync FROM pg_stat_wal"
        )
    finally:
        await connection.close()
    assert wal is not None
    return {
        "commits": float(commits or 0),
        "wal_records": float(wal["wal_records"]),
        "wal_bytes": float(wal["wal_bytes"]),
        "wal_write": float(wal["wal_write"]),
        "wal_sync": float(wal["wal_sync"]),
    }


# --- sampling waits -------------------------------------------------------------


class WaitSampler:
    """Counts the benchmark database's client backends by wait event, every 50 ms.

    Runs its own event loop in a thread, on a connection to the admin
    database (so that the sampler is not one of the backends it counts, nor
    of the CPU counted for the benchmark database).
    """

    def __init__(self, admin_dsn: str) -> None:
        self._dsn = admin_dsn
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self.counts: Counter[str] = Counter()
        self.samples = 0
        self.backends_max = 0
        self.error: BaseException | None = None

    def _main(self) -> None:
        try:
            asyncio.run(self._loop())
        except BaseException as exc:  # reported by stop()
            self.error = exc
            self._ready.set()

    async def _loop(self) -> None:
        connection = await asyncpg.connect(self._dsn)
        try:
            self._ready.set()
            while not self._stop.is_set():
                rows = await connection.fetch(
                    "SELECT state, wait_event_type, wait_event FROM pg_stat_activity"
                    " WHERE datname = $1 AND backend_type = 'client backend'",
                    DATABASE,
                )
                self.samples += 1
                self.backends_max = max(self.backends_max, len(rows))
                for state, kind, event in rows:
                    if state != "active":
                        key = f"{state or 'starting'} (not in a statement)"
                    elif kind is None:
                        key = "CPU"
                    else:
                        key = f"{kind}/{event}"
                    self.counts[key] += 1
                await asyncio.sleep(WAIT_INTERVAL)
        finally:
            await connection.close()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(10)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        self._thread.join(10)
        if self.error is not None:
            raise self.error
        total = sum(self.counts.values())
        active = {k: v for k, v in self.counts.items() if "not in a statement" not in k}
        busy = sum(active.values())
        return {
            "active_samples": busy,
            "active_per_sample": busy / self.samples if self.samples else 0.0,
            "samples": self.samples,
            "backend_samples": total,
            "backends_max": self.backends_max,
            "counts": dict(self.counts.most_common()),
            "shares": {k: v / total for k, v in self.counts.most_common()}
            if total
            else {},
        }


# --- one drain ------------------------------------------------------------------


def children_cpu() -> float:
    """User+system CPU seconds of this process's reaped children (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def worker_command(processes: int, concurrency: int) -> list[str]:
    """``python -m pgqueue worker`` for the app, in burst mode."""
    return [
        sys.executable,
        "-m",
        "pgqueue",
        "worker",
        APP,
        "--burst",
        "--processes",
        str(processes),
        "--concurrency",
        str(concurrency),
        "--prefetch",
        str(concurrency),
        "--log-level",
        "WARNING",
    ]


def run_workers(db: str, processes: int, concurrency: int) -> tuple[float, float]:
    """Run the burst to its end; (seconds from start to exit, CPU seconds of the tree)."""
    env = {**os.environ, "PGQUEUE_DSN": db}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p
    )
    with tempfile.TemporaryFile("w+") as log:
        cpu0 = children_cpu()
        start = time.perf_counter()
        process = subprocess.Popen(
            worker_command(processes, concurrency),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        try:
            code = process.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        seconds = time.perf_counter() - start
        cpu = children_cpu() - cpu0
        if code != 0:
            log.seek(0)
            msg = f"pgqueue worker --processes {processes} exited {code}:\n{log.read()}"
            raise RuntimeError(msg)
    return seconds, cpu


def drain(dsn: str, n: int, processes: int, concurrency: int) -> dict[str, Any]:
    """One verified scale-out drain of ``n`` jobs in a fresh database."""
    with bench_database(dsn, NAME) as db:
        run(fill(db, n))
        before = run(_server_counters(dsn))
        waits = WaitSampler(dsn)
        waits.start()
        cpu = PostgresSampler(DATABASE)
        cpu.start()
        machine0 = psutil.cpu_times()
        try:
            seconds, worker_cpu = run_workers(db, processes, concurrency)
        finally:
            machine1 = psutil.cpu_times()
            pg_all, pg_db = cpu.stop()
            wait_report = waits.stop()
        idle = (machine1.idle + machine1.iowait) - (machine0.idle + machine0.iowait)
        window = run(verify(db, n))
        after = run(_server_counters(dsn))
    return {
        "processes": processes,
        "seconds": seconds,
        "jobs_per_s": n / seconds,
        "completion_window_s": window,
        "jobs_per_s_in_window": n / window if window > 0 else None,
        "worker_cpu_s": worker_cpu,
        "postgres_db_cpu_s": pg_db,
        "postgres_cpu_s": pg_all,
        "machine_busy_cores": (psutil.cpu_count() or 1) - idle / seconds,
        "server": {k: after[k] - before[k] for k in after},
        "waits": wait_report,
    }


def empty_burst(dsn: str, processes: int, concurrency: int) -> dict[str, float]:
    """Start-up cost: a burst over an empty queue (wall seconds, CPU seconds of the tree)."""
    with bench_database(dsn, NAME) as db:
        seconds, cpu = run_workers(db, processes, concurrency)
    return {"seconds": seconds, "worker_cpu_s": cpu}


# --- report ---------------------------------------------------------------------


def describe(
    results: list[dict[str, Any]], n: int, startup: dict[str, float]
) -> dict[str, Any]:
    """The summaries of one process count."""

    def us(values: list[float]) -> Any:
        return summarize([v / n * 1e6 for v in values])

    shares: Counter[str] = Counter()
    idle = 0
    for r in results:
        for key, count in r["waits"]["counts"].items():
            if "not in a statement" in key:
                idle += count
            else:
                shares[key] += count
    total = sum(shares.values())
    busy = [(r["worker_cpu_s"] + r["postgres_cpu_s"]) / r["seconds"] for r in results]
    return {
        "jobs_per_s": summarize([r["jobs_per_s"] for r in results]),
        "jobs_per_s_in_window": summarize(
            [r["jobs_per_s_in_window"] or 0.0 for r in results]
        ),
        "seconds": summarize([r["seconds"] for r in results]),
        "worker_cpu_us_per_job": us([r["worker_cpu_s"] for r in results]),
        "worker_cpu_us_per_job_net_of_startup": us(
            [r["worker_cpu_s"] - startup["worker_cpu_s"] for r in results]
        ),
        "postgres_db_cpu_us_per_job": us([r["postgres_db_cpu_s"] for r in results]),
        "postgres_all_cpu_us_per_job": us([r["postgres_cpu_s"] for r in results]),
        "cpu_busy_cores": summarize(busy),
        "jobs_per_commit": summarize([n / r["server"]["commits"] for r in results]),
        "wal_bytes_per_job": summarize([r["server"]["wal_bytes"] / n for r in results]),
        "wal_syncs_per_1000_jobs": summarize(
            [r["server"]["wal_sync"] / n * 1000 for r in results]
        ),
        "wait_shares_in_statements": {k: v / total for k, v in shares.most_common()}
        if total
        else {},
        "backend_samples_in_statements": total,
        "backend_samples_idle": idle,
        "active_backends_per_sample": summarize(
            [r["waits"]["active_per_sample"] for r in results]
        ),
        "machine_busy_cores": summarize([r["machine_busy_cores"] for r in results]),
        "backends_max": max(r["waits"]["backends_max"] for r in results),
    }


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    dsn = resolve_dsn(args.dsn)
    n = args.jobs

    startup: dict[int, dict[str, float]] = {}
    for p in args.processes:
        startup[p] = empty_burst(dsn, p, args.concurrency)
        print(
            f"P={p} empty burst: {startup[p]['seconds']:.2f} s,"
            f" {startup[p]['worker_cpu_s']:.2f} s CPU"
        )

    results: dict[int, list[dict[str, Any]]] = {p: [] for p in args.processes}
    for i in range(args.runs):
        order = args.processes if i % 2 == 0 else list(reversed(args.processes))
        for p in order:
            r = drain(dsn, n, p, args.concurrency)
            results[p].append(r)
            print(
                f"run {i + 1} P={p}: {r['jobs_per_s']:,.0f} jobs/s"
                f" ({r['seconds']:.2f} s, verified), server {r['postgres_db_cpu_s']:.2f} s"
                f" CPU, workers {r['worker_cpu_s']:.2f} s CPU"
            )

    out: dict[str, Any] = {
        "jobs": n,
        "runs": args.runs,
        "concurrency": args.concurrency,
        "prefetch": args.concurrency,
        "command": " ".join(worker_command(0, args.concurrency)[1:]).replace(
            "--processes 0", "--processes P"
        ),
        "server_settings": run(server_settings(dsn)),
        "startup": {str(p): s for p, s in startup.items()},
        "results": {},
    }
    base = None
    rows = []
    wait_rows = []
    for p in args.processes:
        summary = describe(results[p], n, startup[p])
        out["results"][f"P={p}"] = {"summary": summary, "runs": results[p]}
        rate = summary["jobs_per_s"]["median"]
        base = base or rate
        rows.append(
            [
                str(p),
                fmt_summary(summary["jobs_per_s"]),
                f"{rate / base:.2f}x",
                fmt_summary(summary["jobs_per_s_in_window"]),
                f"{startup[p]['seconds']:.2f}",
                fmt_summary(summary["postgres_db_cpu_us_per_job"]),
                fmt_summary(summary["postgres_all_cpu_us_per_job"]),
                fmt_summary(summary["worker_cpu_us_per_job_net_of_startup"]),
                fmt_summary(summary["cpu_busy_cores"]),
                fmt_summary(summary["machine_busy_cores"]),
                fmt(summary["jobs_per_commit"]["median"]),
                fmt(summary["wal_syncs_per_1000_jobs"]["median"]),
            ]
        )
        shares = summary["wait_shares_in_statements"]
        other = 1.0 - sum(shares.get(k, 0.0) for k in WAIT_COLUMNS)
        top_other = ", ".join(
            f"{k} {v:.0%}"
            for k, v in list(shares.items())
            if k not in WAIT_COLUMNS and v >= 0.005
        )
        wait_rows.append(
            [
                str(p),
                str(summary["backends_max"]),
                fmt(summary["active_backends_per_sample"]["median"]),
                *(f"{shares.get(k, 0.0):.0%}" for k in WAIT_COLUMNS),
                f"{other:.0%}" + (f" ({top_other})" if top_other else ""),
            ]
        )
    print()
    print(
        markdown_table(
            [
                "processes",
                "jobs/s (start to exit)",
                "speed-up",
                "jobs/s (first to last completion)",
                "empty burst s",
                "PG CPU µs/job (bench db)",
                "PG CPU µs/job (all)",
                "worker CPU µs/job (net of start-up)",
                "PG + workers, cores busy",
                "machine, cores busy (of 2)",
                "jobs/commit",
                "WAL syncs / 1000 jobs (server)",
            ],
            rows,
        )
    )
    print()
    print(
        markdown_table(
            ["processes", "backends", "in a statement (mean)", *WAIT_COLUMNS, "other"],
            wait_rows,
        )
    )
    write_json(NAME, out, enabled=not args.no_json)


if __name__ == "__main__":
    main()
