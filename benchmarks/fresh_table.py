"""A worker started on a new, empty table under a steady backlog, side by side with another revision (issue 39).

Each run makes a fresh database with that side's own schema (autovacuum off
for ``pgqueue_jobs`` unless ``--autovacuum``, so that no ANALYZE comes to
the rescue by chance), starts a worker process of that side (one queue, 32
handlers that each sleep 1 ms, the defaults otherwise) and, from this
process, gives it ten jobs (so that its first claims and completions run on
a nearly empty table, as on a new deployment), then keeps ``--backlog`` due
jobs pending (one plain INSERT every 50 ms tops it up) for ``--seconds``. The table grows by every job completed,
since nothing is pruned. The throughput of each 5 s window is read from the
rows' ``completed_at``. Sides alternate, the order flipping every run; each
side's tree is exported with ``git archive`` as ``benchmarks.versus`` does.

Usage: python -m benchmarks.fresh_table --baseline REF [--runs 3]
       [--seconds 60] [--backlog 4000] [--autovacuum]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from benchmarks._common import (
    base_parser,
    bench_database,
    fmt,
    markdown_table,
    resolve_dsn,
    write_json,
)
from benchmarks.versus import ROOT, export

QUEUE = "fresh"
WINDOW = 5.0

# Runs in the side's tree: the worker, until the parent closes its stdin.
WORKER = """
import asyncio, sys
import asyncpg, pgqueue
dsn, queue = sys.argv[1], sys.argv[2]
async def main():
    async with asyncpg.create_pool(dsn, min_size=2, max_size=4) as pool:
        worker = pgqueue.Worker(pool, queue=queue, concurrency=32)
        @worker.handler("sleep")
        async def sleep(job):
            await asyncio.sleep(0.001)
        loop = asyncio.get_running_loop()
        async with asyncio.TaskGroup() as tg:
            tg.create_task(worker.run())
            print("started", pgqueue.__file__, flush=True)
            await loop.run_in_executor(None, sys.stdin.read)
            await worker.stop()
asyncio.run(main())
"""

SCHEMA_OF_TREE = "import pgqueue; print(pgqueue.SCHEMA)"

TOP_UP = """
WITH missing AS (
    SELECT greatest($2::int - count(*), 0)::int AS n FROM pgqueue_jobs
    WHERE queue = $1 AND status = 'pending'
), added AS (
    INSERT INTO pgqueue_jobs (queue, job_type)
    SELECT $1, 'sleep' FROM missing, generate_series(1, missing.n)
    RETURNING 1
)
SELECT count(*) FROM added
"""

FIRST_JOBS = 10

DONE = "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1 AND status = 'completed'"

WINDOWS = """
SELECT floor(extract(epoch FROM completed_at - $1::timestamptz) / $2)::int AS window,
       count(*) AS jobs
FROM pgqueue_jobs
WHERE status = 'completed' AND completed_at >= $1::timestamptz
GROUP BY 1 ORDER BY 1
"""


def _environment(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}"}


def schema_of(tree: Path) -> str:
    """The SCHEMA of ``tree``'s pgqueue."""
    done = subprocess.run(
        [sys.executable, "-c", SCHEMA_OF_TREE],
        cwd=tree,
        env=_environment(tree),
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout


async def _feed_and_count(
    dsn: str, worker: subprocess.Popen[str], seconds: float, backlog: int
) -> tuple[list[float], int]:
    """Keep ``backlog`` jobs pending for ``seconds``; the jobs/s of each window and the rows at the end."""
    connection = await asyncpg.connect(dsn)
    try:
        # The load arrives as on a new deployment: a few jobs first, so that
        # the worker's first claims and completions run on a nearly empty
        # table, then the backlog.
        await connection.fetchval(TOP_UP, QUEUE, FIRST_JOBS)
        await connection.execute("SELECT pg_notify('pgqueue_jobs', $1)", QUEUE)
        async with asyncio.timeout(60):
            # The database has no event to await for it: poll.
            while await connection.fetchval(DONE, QUEUE) < FIRST_JOBS:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        await connection.fetchval(TOP_UP, QUEUE, backlog)
        await connection.execute("SELECT pg_notify('pgqueue_jobs', $1)", QUEUE)
        start = await connection.fetchval("SELECT clock_timestamp()")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if await connection.fetchval(TOP_UP, QUEUE, backlog):
                await connection.execute("SELECT pg_notify('pgqueue_jobs', $1)", QUEUE)
            await asyncio.sleep(0.05)
        assert worker.stdin is not None
        worker.stdin.close()
        await asyncio.get_running_loop().run_in_executor(None, worker.wait, 60)
        windows = await connection.fetch(WINDOWS, start, WINDOW)
        rows = await connection.fetchval("SELECT count(*) FROM pgqueue_jobs")
    finally:
        await connection.close()
    counted = {row["window"]: row["jobs"] for row in windows}
    whole = int(seconds // WINDOW)
    return [counted.get(w, 0) / WINDOW for w in range(whole)], rows


def run_side(
    tree: Path, dsn: str, seconds: float, backlog: int, *, autovacuum: bool
) -> dict[str, Any]:
    """One run of ``tree``'s worker on a fresh table."""
    schema = schema_of(tree)

    async def setup(target: str) -> None:
        connection = await asyncpg.connect(target)
        try:
            await connection.execute(schema)
            if not autovacuum:
                await connection.execute(
                    "ALTER TABLE pgqueue_jobs SET (autovacuum_enabled = false)"
                )
        finally:
            await connection.close()

    with bench_database(dsn, "fresh_table", setup) as target:
        worker = subprocess.Popen(
            [sys.executable, "-c", WORKER, target, QUEUE],
            cwd=tree,
            env=_environment(tree),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert worker.stdout is not None
            started = worker.stdout.readline().split()
            if started[:1] != ["started"] or not Path(started[1]).is_relative_to(tree):
                msg = f"the worker did not start from {tree}: {started}"
                raise RuntimeError(msg)
            rates, rows = asyncio.run(_feed_and_count(target, worker, seconds, backlog))
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    return {"per_window": rates, "rows": rows}


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--baseline", required=True, help="git ref to compare against")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--backlog", type=int, default=4_000)
    parser.add_argument(
        "--autovacuum",
        action="store_true",
        help="leave autovacuum on for pgqueue_jobs (it may analyze the table mid-run)",
    )
    args = parser.parse_args()
    dsn = resolve_dsn(args.dsn)
    results: dict[str, list[dict[str, Any]]] = {"baseline": [], "current": []}
    with tempfile.TemporaryDirectory(prefix="pgqueue-fresh-") as tmp:
        commit = export(args.baseline, Path(tmp))
        trees = {"baseline": Path(tmp), "current": ROOT}
        for run_ in range(args.runs):
            sides = (
                ["baseline", "current"] if run_ % 2 == 0 else ["current", "baseline"]
            )
            for side in sides:
                got = run_side(
                    trees[side],
                    dsn,
                    args.seconds,
                    args.backlog,
                    autovacuum=args.autovacuum,
                )
                results[side].append(got)
                rates = got["per_window"]
                print(
                    f"run {run_ + 1} {side}: {fmt(rates[0])} jobs/s in the first"
                    f" {WINDOW:.0f} s, {fmt(rates[-1])} in the last,"
                    f" {got['rows']:,} rows at the end",
                    flush=True,
                )
    windows = min(len(r["per_window"]) for side in results.values() for r in side)
    rows = []
    for w in range(windows):
        base = statistics.median(r["per_window"][w] for r in results["baseline"])
        now = statistics.median(r["per_window"][w] for r in results["current"])
        rows.append(
            [
                f"{w * WINDOW:.0f}-{(w + 1) * WINDOW:.0f} s",
                fmt(base),
                fmt(now),
                f"{now / base:.2f}x" if base else "-",
            ]
        )
    print()
    print(
        markdown_table(
            [
                "window",
                f"{commit} jobs/s (median)",
                "now jobs/s (median)",
                "now / then",
            ],
            rows,
        )
    )
    write_json(
        "fresh_table",
        {
            "baseline": {"ref": args.baseline, "commit": commit},
            "seconds": args.seconds,
            "backlog": args.backlog,
            "autovacuum": args.autovacuum,
            "window_s": WINDOW,
            "runs": results,
        },
        enabled=not args.no_json,
    )


if __name__ == "__main__":
    main()
