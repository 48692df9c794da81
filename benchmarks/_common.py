"""Shared benchmark plumbing: databases, worker processes, CPU sampling, statistics, output.

Every benchmark runs in a database of its own (``pgq_bench_<name>``), created
on the server named by ``--dsn`` / ``PGQUEUE_BENCH_DSN`` and dropped at the end.
Workers run in processes started with the ``spawn`` method, so their RSS and
CPU are their own; a child talks to the parent over a pipe:
``("ready", None)`` once connected, then waits for ``"go"``, then sends
``("done", result)`` when its measurement ends (with its connections
still open) and waits for ``"exit"``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import multiprocessing
import os
import platform
import resource
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg
import psutil

import pgqueue
from pgqueue.testing import with_database

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

__all__ = [
    "DEFAULT_DSN",
    "ChildLink",
    "Summary",
    "base_parser",
    "bench_database",
    "cpu_delta",
    "machine_info",
    "markdown_table",
    "peak_rss_mb",
    "percentile",
    "postgres_cpu",
    "resolve_dsn",
    "run",
    "run_child",
    "summarize",
    "with_database",
    "write_json",
]

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/test"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
CHILD_TIMEOUT = 3600.0

T = TypeVar("T")
Setup = Callable[[str], Awaitable[None]]


# --- command line ----------------------------------------------------------


def base_parser(description: str, *, runs: int = 3) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument(
        "--dsn",
        default=None,
        help=f"server DSN (default: $PGQUEUE_BENCH_DSN or {DEFAULT_DSN})",
    )
    parser.add_argument(
        "--runs", type=int, default=runs, help=f"repetitions (default {runs})"
    )
    parser.add_argument(
        "--no-json", action="store_true", help="do not write benchmarks/results/*.json"
    )
    return parser


def resolve_dsn(arg: str | None) -> str:
    """The DSN from ``--dsn``, else ``PGQUEUE_BENCH_DSN``, else the default."""
    return arg or os.environ.get("PGQUEUE_BENCH_DSN") or DEFAULT_DSN


def run(coro: Awaitable[T]) -> T:
    """Run one coroutine to completion on a fresh event loop."""

    async def main() -> T:
        return await coro

    return asyncio.run(main())


# --- databases ---------------------------------------------------------------


async def _admin(dsn: str, *statements: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


async def install_pgqueue(dsn: str) -> None:
    """Apply `pgqueue.SCHEMA` to the database at ``dsn``."""
    await _admin(dsn, pgqueue.SCHEMA)


@contextmanager
def bench_database(
    dsn: str, name: str, setup: Setup | None = install_pgqueue
) -> Iterator[str]:
    """Create ``pgq_bench_<name>``, run ``setup`` on it, yield its DSN, drop it."""
    database = f"pgq_bench_{name}"
    drop = f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'
    run(_admin(dsn, drop, f'CREATE DATABASE "{database}"'))
    target = with_database(dsn, database)
    try:
        if setup is not None:
            run(setup(target))
        yield target
    finally:
        run(_admin(dsn, drop))


# --- processes and resources -------------------------------------------------


def _is_backend_of(proc: psutil.Process, database: str | None) -> bool:
    """Is ``proc`` a ``postgres`` process (of ``database``, if given)?"""
    if proc.name() != "postgres":
        return False
    # PostgreSQL puts the database name in a backend's process title.
    return database is None or f" {database} " in " ".join(proc.cmdline())


def postgres_cpu(database: str | None = None) -> dict[int, float]:
    """User+system CPU seconds of every local ``postgres`` process (of ``database``), by pid."""
    seen: dict[int, float] = {}
    for proc in psutil.process_iter():
        try:
            if _is_backend_of(proc, database):
                times = proc.cpu_times()
                seen[proc.pid] = times.user + times.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return seen


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two snapshots (pids that appeared count whole)."""
    return sum(used - before.get(pid, 0.0) for pid, used in after.items())


class PostgresSampler:
    """Samples PostgreSQL's CPU in a thread, so backends that exit still count.

    A backend's CPU time vanishes with it, and workers close their
    connections when they stop; the last sample of each pid is kept (at most
    ``interval`` of its CPU is lost). Known processes are re-read every
    sample (one /proc read each), and the process list is rescanned for new
    ones every ``rescan`` samples: every sample by default, since a worker
    opens its own connections when it starts and closes them when it stops,
    and a drain can be over within half a second.
    """

    def __init__(
        self, database: str | None, interval: float = 0.1, rescan: int = 1
    ) -> None:
        self._database = database
        self._interval = interval
        self._rescan = rescan
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._known: dict[int, psutil.Process] = {}
        self._ours: set[int] = set()
        """Backends of the database (kept after they exit)."""
        self._last: dict[int, float] = {}
        self._scan()
        self._before = self._read()
        self._last = dict(self._before)

    def _scan(self) -> None:
        for pid in psutil.pids():
            if pid in self._known:
                continue
            try:
                proc = psutil.Process(pid)
                if _is_backend_of(proc, None):
                    self._known[pid] = proc
                    if self._database is not None and _is_backend_of(
                        proc, self._database
                    ):
                        self._ours.add(pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue

    def _read(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for pid, proc in list(self._known.items()):
            try:
                times = proc.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                del self._known[pid]
                continue
            out[pid] = times.user + times.system
        return out

    def _loop(self) -> None:
        count = 0
        while not self._stop.wait(self._interval):
            count += 1
            if count % self._rescan == 0:
                self._scan()
            self._last.update(self._read())

    def start(self) -> None:
        """Start sampling (the baseline was taken at construction)."""
        self._thread.start()

    def stop(self) -> tuple[float, float]:
        """Stop; CPU seconds of all postgres processes and of the database's backends."""
        self._stop.set()
        self._thread.join()
        self._scan()
        self._last.update(self._read())
        ours = self._ours
        every = cpu_delta(self._before, self._last)
        mine = cpu_delta(
            {p: v for p, v in self._before.items() if p in ours},
            {p: v for p, v in self._last.items() if p in ours},
        )
        return every, mine


def process_cpu() -> float:
    """User+system CPU seconds of this process so far."""
    times = psutil.Process().cpu_times()
    return float(times.user + times.system)


def peak_rss_mb() -> float:
    """This process's peak resident set size in MiB.

    Read from ``VmHWM`` in /proc/self/status: ``getrusage``'s ``ru_maxrss``
    survives ``exec``, so a spawned child would report its parent's peak.
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class ChildLink:
    """The child's end of the parent/child handshake."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    async def ready(self) -> None:
        """Tell the parent we are connected and wait for its go."""
        self._connection.send(("ready", None))
        go = await asyncio.to_thread(self._connection.recv)
        if go != "go":
            msg = f"unexpected message from the parent: {go!r}"
            raise RuntimeError(msg)

    async def done(self, result: dict[str, Any]) -> None:
        """Send the measurement back; wait until the parent has sampled the server.

        Call it while the connections are still open: a backend that exits
        takes its CPU time with it.
        """
        self._connection.send(("done", result))
        await asyncio.to_thread(self._connection.recv)


def run_child(
    target: Callable[..., None],
    *args: Any,
    database: str | None = None,
    while_running: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Run ``target(connection, *args)`` in a spawned process and return its result.

    Between the child's "go" and its "done" the parent samples the CPU of
    every ``postgres`` process and adds ``postgres_cpu_s`` (all of them: other
    users of the server count too) and ``postgres_db_cpu_s`` (only the
    backends of ``database``) to the result. ``while_running`` runs in the
    parent after "go" (a producer, for example).
    """
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=target, args=(child, *args), daemon=True)
    process.start()
    try:
        expect(parent, process, "ready")
        sampler = PostgresSampler(database)
        sampler.start()
        parent.send("go")
        try:
            if while_running is not None:
                while_running()
            result = expect(parent, process, "done")
        finally:
            every, ours = sampler.stop()
        assert isinstance(result, dict)
        result["postgres_cpu_s"] = every
        result["postgres_db_cpu_s"] = ours
        parent.send("exit")
        process.join(60)
        return result
    finally:
        if process.is_alive():
            process.kill()
            process.join()


def expect(
    parent: Connection, process: Any, kind: str, timeout: float = CHILD_TIMEOUT
) -> Any:
    """The value of the child's next message, which must be ``kind``.

    Raises if the child exits or sends nothing within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while not parent.poll(0.5):
        if not process.is_alive():
            msg = f"benchmark child exited with code {process.exitcode} before {kind!r}"
            raise RuntimeError(msg)
        if time.monotonic() > deadline:
            msg = f"benchmark child sent no {kind!r} within {timeout:g} s"
            raise TimeoutError(msg)
    got, value = parent.recv()
    if got != kind:
        msg = f"expected {kind!r} from the child, got {got!r}"
        raise RuntimeError(msg)
    return value


# --- statistics and output ---------------------------------------------------


class Summary(dict[str, float]):
    """``median``, ``min``, ``max`` and ``runs`` of a list of measurements."""


def summarize(values: Sequence[float]) -> Summary:
    """Median, min and max of ``values``."""
    return Summary(
        median=statistics.median(values),
        min=min(values),
        max=max(values),
        runs=len(values),
    )


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation."""
    ordered = sorted(values)
    if not ordered:
        msg = "percentile of nothing"
        raise ValueError(msg)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def fmt(value: float, unit: str = "") -> str:
    """A number for a table: thousands separators for big ones, 2 decimals for small."""
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.2f}"
    return f"{text} {unit}".rstrip()


def fmt_summary(summary: Summary, unit: str = "") -> str:
    """``median (min..max) unit``."""
    return (
        f"{fmt(summary['median'])} ({fmt(summary['min'])}..{fmt(summary['max'])}) {unit}"
    ).rstrip()


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub-flavoured markdown table."""
    lines = [
        "| " + " | ".join(headers) + " |",
        "|" + "|".join("---" for _ in headers) + "|",
    ]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return "\n".join(lines)


def source_digest() -> str:
    """A short digest of pgqueue's source files: which code the numbers belong to."""
    digest = hashlib.sha1(usedforsecurity=False)
    for path in sorted(Path(pgqueue.__file__).parent.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def machine_info() -> dict[str, Any]:
    """What the numbers were measured on."""
    return {
        "pgqueue_source_digest": source_digest(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "asyncpg": asyncpg.__version__,
        "pgqueue": pgqueue.__version__,
    }


async def server_settings(dsn: str) -> dict[str, str]:
    """The server settings that matter for these numbers."""
    connection = await asyncpg.connect(dsn)
    try:
        version = await connection.fetchval("SHOW server_version")
        out = {"server_version": str(version)}
        for name in ("fsync", "synchronous_commit", "shared_buffers", "wal_level"):
            out[name] = str(await connection.fetchval(f"SHOW {name}"))
    finally:
        await connection.close()
    return out


def write_json(name: str, payload: dict[str, Any], *, enabled: bool = True) -> None:
    """Write ``benchmarks/results/<name>.json`` (with the machine and a timestamp)."""
    if not enabled:
        return
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    document = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        **payload,
    }
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    print(
        f"\nwrote {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}"
    )
