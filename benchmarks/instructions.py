"""The server's instructions per job of a drain, now against another revision: exact, not timed.

Throughput on a small shared machine moves by more than the few percent a
change to the hot statements costs. This counts instead: a private
PostgreSQL server runs under Valgrind's callgrind (``valgrind`` and the
machine's ``initdb``/``postgres`` are needed), and one backend drains jobs
with the claim and the completion a worker sends (``CLAIM`` then
``COMPLETE``, in batches of a given size) on each side's own schema and
statements. Each side's ``SCHEMA`` and statements are read from its own
``src/pgqueue`` (``pgqueue._sql``, or ``pgqueue._core.sql`` before it),
imported in a process of its own. Instructions per job are the difference between a
backend that drains ``--jobs`` and one that drains ``WARM`` jobs, so
connecting and the first plans cancel out; the same count repeats to
within 0.1%. It depends on ``--jobs`` (the table's size and history), so
compare counts taken at the same ``--jobs``.

What it does not count: the worker's Python, the WAL writer, the network.

Usage: python -m benchmarks.instructions --baseline REF [--batches 5,20,100]
       [--jobs 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import asyncpg

from benchmarks._common import markdown_table, write_json
from pgqueue._sql.literals import array, claim_places

if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = Path(__file__).resolve().parent.parent
WARM = 200
QUEUE = "default"

# Prints the statements a drain runs, from whichever layout the tree has.
_READ_STATEMENTS = """
import json
try:
    from pgqueue._sql.claims import CLAIM
    from pgqueue._sql.outcomes import COMPLETE
    from pgqueue._sql.schema import SCHEMA
    from pgqueue._sql.settings import WORKER_SETTINGS
except ImportError:
    from pgqueue._core.sql import CLAIM, COMPLETE, SCHEMA, WORKER_SETTINGS
print(json.dumps({"CLAIM": CLAIM, "COMPLETE": COMPLETE, "SCHEMA": SCHEMA,
                  "WORKER_SETTINGS": WORKER_SETTINGS}))
"""


def statements(src: Path) -> SimpleNamespace:
    """The drain's statements of the ``pgqueue`` package under ``src``, read in a process of its own."""
    out = subprocess.run(
        [sys.executable, "-c", _READ_STATEMENTS],
        env={**os.environ, "PYTHONPATH": str(src)},
        cwd=src,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return SimpleNamespace(**json.loads(out), claim_places=claim_places, array=array)


def statements_at(ref: str) -> SimpleNamespace:
    """`statements` of the tree at git revision ``ref``."""
    archive = subprocess.run(
        ["git", "archive", ref, "src/pgqueue"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    directory = Path(tempfile.mkdtemp(prefix="pgq-instr-"))
    try:
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(directory, filter="data")
        return statements(directory / "src")
    finally:
        shutil.rmtree(directory)


def _bindir() -> Path:
    found = shutil.which("pg_config")
    if found:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True)
        if (Path(out.stdout.strip()) / "initdb").exists():
            return Path(out.stdout.strip())
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not versions:
        sys.exit("instructions: no initdb found (install PostgreSQL's server package)")
    return versions[-1].parent


def _as_postgres(argv: list[str]) -> list[str]:
    """``argv`` run as the ``postgres`` user when we are root (initdb refuses root)."""
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def callgrind_server() -> Iterator[tuple[str, Path]]:
    """A private server whose processes run under callgrind: its DSN and the profiles' directory."""
    if shutil.which("valgrind") is None:
        sys.exit("instructions: valgrind is needed (apt-get install valgrind)")
    bindir = _bindir()
    top = Path(tempfile.mkdtemp(prefix="pgq-callgrind-"))
    data, profiles = top / "data", top / "profiles"
    profiles.mkdir()
    if os.geteuid() == 0:
        shutil.chown(top, "postgres")
        shutil.chown(profiles, "postgres")
    port = _free_port()
    server: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            _as_postgres(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-A",
                    "trust",
                    "-U",
                    "postgres",
                ]
            ),
            check=True,
            capture_output=True,
        )
        server = subprocess.Popen(
            _as_postgres(
                [
                    "valgrind",
                    "--tool=callgrind",
                    "--trace-children=yes",
                    f"--callgrind-out-file={profiles}/cg.%p",
                    str(bindir / "postgres"),
                    "-D",
                    str(data),
                    "-p",
                    str(port),
                    "-k",
                    str(top),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "autovacuum=off",
                    "-c",
                    "fsync=off",
                ]
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        asyncio.run(_wait_ready(dsn, server))
        yield dsn, profiles
    finally:
        if server is not None:
            subprocess.run(
                _as_postgres(
                    [str(bindir / "pg_ctl"), "-D", str(data), "stop", "-m", "fast"]
                ),
                check=False,
                capture_output=True,
            )
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
        shutil.rmtree(top, ignore_errors=True)


async def _wait_ready(dsn: str, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            connection = await asyncpg.connect(dsn, timeout=5)
        except (OSError, asyncpg.PostgresError):
            if server.poll() is not None or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
        else:
            await connection.close()
            return


def _instructions(profiles: Path, pid: int) -> int:
    """The total instructions of process ``pid``, once it has exited and written its profile."""
    path = profiles / f"cg.{pid}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                if line.startswith(("totals:", "summary:")):
                    return int(line.split()[1])
        time.sleep(0.1)
    msg = f"no callgrind profile for backend {pid}"
    raise RuntimeError(msg)


async def _drain(
    connection: asyncpg.Connection, sql: SimpleNamespace, n: int, batch: int
) -> None:
    run_ats, ids = sql.claim_places({})
    done = 0
    while done < n:
        rows = await connection.fetch(
            sql.CLAIM, QUEUE, min(batch, n - done), run_ats, ids
        )
        if not rows:
            msg = f"claimed {done} of {n} jobs"
            raise RuntimeError(msg)
        written = await connection.fetch(
            sql.COMPLETE,
            sql.array([r[0] for r in rows]),
            sql.array([r["attempts"] for r in rows]),
            [None] * len(rows),
        )
        if len(written) != len(rows):
            msg = f"completed {len(written)} of {len(rows)} claimed jobs"
            raise RuntimeError(msg)
        done += len(rows)


async def per_job(
    dsn: str, profiles: Path, sql: SimpleNamespace, jobs: int, batch: int
) -> float:
    """Instructions per job of a drain at ``batch`` on ``sql``'s schema."""
    admin = await asyncpg.connect(dsn)
    database = "pgq_instructions"
    await admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    await admin.execute(f"CREATE DATABASE {database}")
    await admin.close()
    target = dsn.rsplit("/", 1)[0] + f"/{database}"
    setup = await asyncpg.connect(target)
    await setup.execute(sql.SCHEMA)
    await setup.execute(
        "INSERT INTO pgqueue_jobs (queue, job_type, payload)"
        " SELECT $1, 'noop', jsonb_build_object('i', g) FROM generate_series(1, $2) AS g",
        QUEUE,
        jobs + WARM,
    )
    await setup.execute("VACUUM ANALYZE pgqueue_jobs")
    await setup.close()
    totals = []
    for n in (WARM, jobs):
        connection = await asyncpg.connect(target, server_settings=sql.WORKER_SETTINGS)
        pid = connection.get_server_pid()
        await _drain(connection, sql, n, batch)
        await connection.close()
        totals.append(_instructions(profiles, pid))
    return (totals[1] - totals[0]) / (jobs - WARM)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline", required=True, help="git revision to compare with"
    )
    parser.add_argument(
        "--batches", default="5,20,100", help="claim sizes (comma-separated)"
    )
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--no-json", action="store_true")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    sides = {
        args.baseline: statements_at(args.baseline),
        "now": statements(ROOT / "src"),
    }
    results: dict[str, dict[int, float]] = {side: {} for side in sides}
    with callgrind_server() as (dsn, profiles):
        for batch in batches:
            for side, sql in sides.items():
                results[side][batch] = asyncio.run(
                    per_job(dsn, profiles, sql, args.jobs, batch)
                )
                print(f"batch {batch}, {side}: {results[side][batch]:,.0f}", flush=True)
    rows = [
        [
            str(batch),
            f"{results[args.baseline][batch]:,.0f}",
            f"{results['now'][batch]:,.0f}",
            f"{results['now'][batch] / results[args.baseline][batch]:.3f}",
        ]
        for batch in batches
    ]
    print()
    print(markdown_table(["claim batch", args.baseline, "now", "now / then"], rows))
    payload: dict[str, Any] = {
        "baseline": args.baseline,
        "jobs": args.jobs,
        "instructions_per_job": {side: results[side] for side in sides},
    }
    write_json(
        "instructions", json.loads(json.dumps(payload)), enabled=not args.no_json
    )


if __name__ == "__main__":
    main()
