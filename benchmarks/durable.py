"""Durable steps, pgqueue vs DBOS Transact on the same server, rounds alternating.

Two measurements, each run for both sides back to back in every round (the
order flips every round), each side in a fresh database of its own, and
pgqueue's floor:

- steps: ``--jobs`` jobs of ``--steps`` no-op steps each, ``--concurrency``
  of them at a time. pgqueue: the jobs are enqueued first, then one worker
  process drains them, its handler calling ``job.step`` K times. DBOS:
  ``--concurrency`` tasks start the async ``@DBOS.workflow`` one after the
  other (DBOS's fastest path: no DBOS queue), each calling a ``@DBOS.step``
  K times. Steps per second, and the CPU per step of the process and of the
  database's backends.
- latency: an idle pgqueue worker (concurrency 1) runs one job at a time,
  from the start of ``Queue.enqueue`` to ``Tracker.wait`` seeing it
  completed; DBOS awaits one workflow at a time. Each side runs ``--latency-jobs``
  jobs of K steps and as many of none: the difference of the medians is
  what the K steps add. The time inside the handler (the workflow's body)
  is recorded too.
- floor: the bare fenced step statement (``pgqueue._sql.durable.STEP``)
  from a bare asyncpg loop of ``--concurrency`` lanes, for ``--jobs``
  running jobs of ``--steps`` steps: from one connection, one statement at
  a time (as the worker's upkeep connection sends them); from one
  connection per lane; and batched on one connection (the steps waiting
  while a write is in flight, in one statement).

DBOS runs in a subprocess of the interpreter ``--dbos-python`` (a
virtualenv with ``dbos``; see benchmarks/README.md), with its documented
configuration (``name`` and ``system_database_url``, the default pool of 20).

Usage: python -m benchmarks.durable [--rounds 3] [--jobs 500] [--steps 10]
       [--concurrency 10] [--latency-jobs 50] [--dbos-python /tmp/dbosvenv/bin/python]
       [--only steps,latency,floor]
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg

import pgqueue
from benchmarks import _pgqueue_runs as pgq
from benchmarks._common import (
    ChildLink,
    PostgresSampler,
    base_parser,
    bench_database,
    fmt,
    markdown_table,
    peak_rss_mb,
    percentile,
    process_cpu,
    resolve_dsn,
    run,
    run_child,
    server_settings,
    summarize,
    write_json,
)
from pgqueue._sql.durable import STEP
from pgqueue._sql.settings import WORKER_SETTINGS

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

ROOT = Path(__file__).resolve().parent.parent
DBOS_SCRIPT = Path(__file__).resolve().parent / "_dbos_runs.py"
DEFAULT_DBOS_PYTHON = os.environ.get("DBOS_PYTHON", "/tmp/dbosvenv/bin/python")
WARM = 3
"""Jobs run before the latency is measured (connections, caches)."""


async def nothing() -> None:
    """The step: does nothing, returns nothing."""


async def run_steps(job: pgqueue.Job, steps: int) -> float:
    """``steps`` no-op steps of ``job``; the seconds they took."""
    start = time.perf_counter()
    for k in range(steps):
        await job.step(f"s{k}", nothing)
    return time.perf_counter() - start


# --- pgqueue: steps per second --------------------------------------------------


def steps_child(
    connection: Connection, dsn: str, n: int, steps: int, concurrency: int
) -> None:
    """Worker process: drain ``n`` jobs of ``steps`` steps at ``concurrency``."""
    asyncio.run(_steps(ChildLink(connection), dsn, n, steps, concurrency))


async def _steps(
    link: ChildLink, dsn: str, n: int, steps: int, concurrency: int
) -> None:
    async with asyncpg.create_pool(
        dsn, min_size=pgq.POOL_MIN, max_size=pgq.POOL_MAX
    ) as pool:
        worker = pgqueue.Worker(pool, concurrency=concurrency, prefetch=concurrency)
        done = anyio.Event()
        seen: set[int] = set()
        calls = 0

        @worker.handler(pgq.JOB_TYPE)
        async def handler(job: pgqueue.Job) -> None:
            nonlocal calls
            await run_steps(job, steps)
            calls += 1
            seen.add(job.id)
            if calls >= n:
                done.set()

        await link.ready()
        cpu0 = process_cpu()
        start = time.perf_counter()
        with anyio.fail_after(600 + n * steps / 20):
            async with anyio.create_task_group() as group:
                group.start_soon(worker.run)
                await done.wait()
                await worker.stop()
        elapsed = time.perf_counter() - start
        await link.done(
            {
                "seconds": elapsed,
                "steps_per_s": n * steps / elapsed,
                "jobs_per_s": n / elapsed,
                "handled": calls,
                "distinct": len(seen),
                "worker_cpu_s": process_cpu() - cpu0,
                "peak_rss_mb": peak_rss_mb(),
            }
        )


async def verify_steps(dsn: str, n: int, steps: int) -> None:
    """Fail unless every job completed once with its ``steps`` steps recorded."""
    connection = await asyncpg.connect(dsn)
    try:
        good = await connection.fetchval(
            "SELECT count(*) FROM pgqueue_jobs WHERE status = 'completed'"
            " AND attempts = 1 AND (SELECT count(*) FROM jsonb_object_keys(steps)) = $1",
            steps,
        )
    finally:
        await connection.close()
    if good != n:
        msg = f"pgqueue: {good} jobs completed once with {steps} steps, expected {n}"
        raise AssertionError(msg)


def pgqueue_steps(dsn: str, n: int, steps: int, concurrency: int) -> dict[str, Any]:
    """One verified drain of ``n`` jobs of ``steps`` steps in a fresh database."""
    name = "durable_pgqueue"
    with bench_database(dsn, name) as db:
        run(pgq.fill(db, n))
        result = run_child(
            steps_child, db, n, steps, concurrency, database=f"pgq_bench_{name}"
        )
        pgq.check_handled(result, n, "pgqueue")
        run(verify_steps(db, n, steps))
    return result


# --- pgqueue: latency of one job --------------------------------------------------


def latency_child(connection: Connection, dsn: str, runs: int, steps: int) -> None:
    """Worker and producer in one process: ``runs`` jobs of ``steps`` steps and of none."""
    asyncio.run(_latency(ChildLink(connection), dsn, runs, steps))


async def _latency(link: ChildLink, dsn: str, runs: int, steps: int) -> None:
    async with asyncpg.create_pool(
        dsn, min_size=pgq.POOL_MIN, max_size=pgq.POOL_MAX
    ) as pool:
        # A long poll interval, so every job is started by its NOTIFY.
        worker = pgqueue.Worker(pool, concurrency=1, poll_interval=30.0)
        queue = pgqueue.Queue(pool)
        body: list[float] = []

        @worker.handler(pgq.JOB_TYPE)
        async def handler(job: pgqueue.Job) -> None:
            body.append(await run_steps(job, job.payload["steps"]))

        out: dict[str, list[float]] = {}
        async with anyio.create_task_group() as group, pgqueue.Tracker(pool) as tracker:
            group.start_soon(worker.run)
            with anyio.fail_after(10):
                while worker.listener_pid is None:  # noqa: ASYNC110 - no event to await
                    await anyio.sleep(0.01)
            await link.ready()
            with anyio.fail_after(60 + runs):
                for k in (steps, 0):
                    totals = []
                    for i in range(WARM + runs):
                        start = time.perf_counter()
                        job_id = await queue.enqueue(
                            pgq.JOB_TYPE, {"steps": k}, track=True
                        )
                        outcome = await tracker.wait(job_id)
                        totals.append(time.perf_counter() - start)
                        if outcome.status != "completed":
                            msg = (
                                f"pgqueue latency: job {job_id} ended {outcome.status}"
                            )
                            raise AssertionError(msg)
                        if i == WARM - 1:
                            totals.clear()
                            body.clear()
                    out[f"total_{k}"] = totals
                    out[f"body_{k}"] = list(body)
                    body.clear()
            await worker.stop()
        await link.done(out)


def pgqueue_latency(dsn: str, runs: int, steps: int) -> dict[str, Any]:
    """Latencies (seconds) of ``runs`` jobs of ``steps`` steps and of none."""
    name = "durable_pgqueue_latency"
    with bench_database(dsn, name) as db:
        return run_child(latency_child, db, runs, steps, database=f"pgq_bench_{name}")


# --- the floor of a step write ------------------------------------------------------

# Several runs' steps in one statement: what a batching step writer would
# send (as the outcome writer batches completions). Fenced as STEP is.
BATCHED_STEP = """
UPDATE pgqueue_jobs AS j
SET steps = CASE WHEN pg_catalog.jsonb_typeof(j.steps) = 'object' THEN j.steps
                 ELSE '{}'::jsonb END
            || pg_catalog.jsonb_build_object(w.name, pg_catalog.jsonb_build_object(
                   'result', w.result::jsonb, 'at', pg_catalog.now())),
    updated_at = pg_catalog.now()
FROM unnest($1::bigint[], $2::int[], $3::text[], $4::text[]) AS w(id, attempts, name, result)
WHERE j.id = w.id AND j.attempts = w.attempts AND j.status = 'running'
RETURNING j.id
"""

FLOOR_MODES = ("one connection", "one connection per lane", "batched, one connection")


def floor_child(
    connection: Connection, dsn: str, n: int, steps: int, concurrency: int, mode: str
) -> None:
    """Bare asyncpg: ``concurrency`` lanes write ``steps`` steps for each of ``n`` running jobs."""
    asyncio.run(_floor(ChildLink(connection), dsn, n, steps, concurrency, mode))


async def _floor(
    link: ChildLink, dsn: str, n: int, steps: int, concurrency: int, mode: str
) -> None:
    lanes = concurrency if mode == FLOOR_MODES[1] else 1
    connections = [
        await asyncpg.connect(dsn, server_settings=WORKER_SETTINGS)
        for _ in range(lanes)
    ]
    lock = asyncio.Lock()
    pending: list[tuple[int, str, asyncio.Future[None]]] = []
    wanted = asyncio.Event()

    async def write(lane: int, job_id: int, name: str) -> None:
        if mode == FLOOR_MODES[0]:
            async with lock:  # as the worker's upkeep connection serializes
                row = await connections[0].fetchrow(STEP, job_id, 1, name, "null")
        elif mode == FLOOR_MODES[1]:
            row = await connections[lane].fetchrow(STEP, job_id, 1, name, "null")
        else:
            done = asyncio.get_running_loop().create_future()
            pending.append((job_id, name, done))
            wanted.set()
            await done
            return
        assert row is not None

    async def writer() -> None:
        while True:
            await wanted.wait()
            wanted.clear()
            batch = pending[:]
            pending.clear()
            rows = await connections[0].fetch(
                BATCHED_STEP,
                [b[0] for b in batch],
                [1] * len(batch),
                [b[1] for b in batch],
                ["null"] * len(batch),
            )
            assert len(rows) == len(batch)
            for _, _, done in batch:
                done.set_result(None)

    jobs = iter(
        [r[0] for r in await connections[0].fetch("SELECT id FROM pgqueue_jobs")]
    )

    async def lane(index: int) -> None:
        for job_id in jobs:
            for k in range(steps):
                await write(index, job_id, f"s{k}")

    try:
        await link.ready()
        cpu0 = process_cpu()
        start = time.perf_counter()
        async with anyio.create_task_group() as group:
            if mode == FLOOR_MODES[2]:
                group.start_soon(writer)
            async with anyio.create_task_group() as lanes_group:
                for index in range(concurrency):
                    lanes_group.start_soon(lane, index)
            group.cancel_scope.cancel()
        elapsed = time.perf_counter() - start
        await link.done(
            {
                "seconds": elapsed,
                "steps_per_s": n * steps / elapsed,
                "worker_cpu_s": process_cpu() - cpu0,
            }
        )
    finally:
        for each in connections:
            await each.close()


async def _running(dsn: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(
            "UPDATE pgqueue_jobs SET status = 'running', attempts = 1"
        )
    finally:
        await connection.close()


def step_floor(
    dsn: str, n: int, steps: int, concurrency: int, mode: str
) -> dict[str, Any]:
    """Steps per second of the bare step statement, written as ``mode`` says."""
    name = "durable_floor"
    with bench_database(dsn, name) as db:
        run(pgq.fill(db, n))
        run(_running(db))
        result = run_child(
            floor_child, db, n, steps, concurrency, mode, database=f"pgq_bench_{name}"
        )
        run(verify_floor(db, n, steps))
    return result


async def verify_floor(dsn: str, n: int, steps: int) -> None:
    """Fail unless every job holds its ``steps`` steps."""
    connection = await asyncpg.connect(dsn)
    try:
        good = await connection.fetchval(
            "SELECT count(*) FROM pgqueue_jobs"
            " WHERE (SELECT count(*) FROM jsonb_object_keys(steps)) = $1",
            steps,
        )
    finally:
        await connection.close()
    if good != n:
        msg = f"step floor: {good} jobs hold {steps} steps, expected {n}"
        raise AssertionError(msg)


# --- DBOS -------------------------------------------------------------------------


def dbos(python: str, dsn: str, spec: dict[str, Any]) -> dict[str, Any]:
    """One DBOS measurement (``spec``: see benchmarks._dbos_runs) in a fresh database."""
    name = "durable_dbos"
    with bench_database(dsn, name, setup=None) as db:
        spec = {**spec, "dsn": db}
        child = subprocess.Popen(
            [python, str(DBOS_SCRIPT), json.dumps(spec)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None
        assert child.stdout is not None
        try:
            _expect(child, "ready")
            sampler = PostgresSampler(f"pgq_bench_{name}")
            sampler.start()
            child.stdin.write("go\n")
            child.stdin.flush()
            try:
                line = _expect(child, None)
            finally:
                every, ours = sampler.stop()
            result: dict[str, Any] = json.loads(line)
            result["postgres_cpu_s"] = every
            result["postgres_db_cpu_s"] = ours
            child.stdin.write("exit\n")
            child.stdin.flush()
            child.wait(60)
        finally:
            if child.poll() is None:
                child.kill()
            child.wait()
    return result


def _expect(child: subprocess.Popen[str], word: str | None) -> str:
    """The child's next line (which must be ``word``, if given)."""
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    if not line or (word is not None and line != word):
        assert child.stderr is not None
        child.kill()
        msg = f"DBOS side: expected {word or 'a result'}, got {line!r}\n{child.stderr.read()[-3000:]}"
        raise RuntimeError(msg)
    return line


# --- the run ----------------------------------------------------------------------


def ms(values: list[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (seconds) in milliseconds."""
    return percentile(values, q) * 1e3


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--rounds", type=int, dest="runs", help="as --runs")
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument(
        "--latency-jobs", type=int, default=50, help="jobs per latency run"
    )
    parser.add_argument("--dbos-python", default=DEFAULT_DBOS_PYTHON)
    parser.add_argument(
        "--only",
        default="steps,latency,floor",
        help="the measurements to run, comma-separated (default: all)",
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    if unknown := only - {"steps", "latency", "floor"}:
        parser.error(f"--only: unknown measurements {sorted(unknown)}")
    dsn = resolve_dsn(args.dsn)
    k, n = args.steps, args.jobs
    measures = {
        "steps": {
            "pgqueue": lambda: pgqueue_steps(dsn, n, k, args.concurrency),
            "dbos": lambda: dbos(
                args.dbos_python,
                dsn,
                {
                    "mode": "steps",
                    "jobs": n,
                    "steps": k,
                    "concurrency": args.concurrency,
                },
            ),
        },
        "latency": {
            "pgqueue": lambda: pgqueue_latency(dsn, args.latency_jobs, k),
            "dbos": lambda: dbos(
                args.dbos_python,
                dsn,
                {"mode": "latency", "runs": args.latency_jobs, "steps": k},
            ),
        },
    }
    got: dict[str, dict[str, list[dict[str, Any]]]] = {
        kind: {"pgqueue": [], "dbos": []} for kind in measures if kind in only
    }
    floors: dict[str, list[dict[str, Any]]] = {mode: [] for mode in FLOOR_MODES}
    loads = []
    for round_ in range(args.runs):
        loads.append(os.getloadavg()[0])
        if "floor" in only:
            for mode in FLOOR_MODES if round_ % 2 == 0 else FLOOR_MODES[::-1]:
                result = step_floor(dsn, n, k, args.concurrency, mode)
                floors[mode].append(result)
                print(
                    f"round {round_ + 1} floor, {mode}: {result['steps_per_s']:,.0f} steps/s",
                    flush=True,
                )
        for kind, sides in got.items():
            order = ["pgqueue", "dbos"] if round_ % 2 == 0 else ["dbos", "pgqueue"]
            for side in order:
                result = measures[kind][side]()
                sides[side].append(result)
                if kind == "steps":
                    print(
                        f"round {round_ + 1} {side}: {result['steps_per_s']:,.0f} steps/s",
                        flush=True,
                    )
                else:
                    print(
                        f"round {round_ + 1} {side}: {k} steps p50"
                        f" {ms(result[f'total_{k}'], 50):.2f} ms, none"
                        f" {ms(result['total_0'], 50):.2f} ms",
                        flush=True,
                    )
    out: dict[str, Any] = {
        "jobs": n,
        "steps": k,
        "concurrency": args.concurrency,
        "latency_jobs": args.latency_jobs,
        "rounds": args.runs,
        "load_1min_at_each_round": loads,
        "server": run(server_settings(dsn)),
        "dbos_version": _dbos_version(args.dbos_python),
        "results": {},
    }
    rows = []
    if "steps" in got:
        rows.extend(_steps_rows(got["steps"], n, k, out))
    if "latency" in got:
        rows.extend(_latency_rows(got["latency"], k, out))
    print()
    print(
        markdown_table(
            [
                "metric",
                "pgqueue median",
                "DBOS median",
                "pgqueue / DBOS (paired median)",
            ],
            rows,
        )
    )
    if "floor" in only:
        floor_rows = []
        out["floor"] = {}
        for mode, results in floors.items():
            values = [r["steps_per_s"] for r in results]
            out["floor"][mode] = {"steps_per_s": summarize(values), "runs": results}
            floor_rows.append([mode, fmt(statistics.median(values))])
        print()
        print(
            markdown_table(
                ["the bare step statement, written from", "steps/s"], floor_rows
            )
        )
    print(
        f"\nload average (1 min) at each round: {', '.join(f'{x:.1f}' for x in loads)}"
    )
    write_json("durable", out, enabled=not args.no_json)


def _paired(ours: list[float], theirs: list[float]) -> float:
    return statistics.median(o / t for o, t in zip(ours, theirs, strict=True))


def _row(
    out: dict[str, Any], label: str, ours: list[float], theirs: list[float]
) -> list[str]:
    paired = _paired(ours, theirs)
    out["results"][label] = {
        "pgqueue": summarize(ours),
        "dbos": summarize(theirs),
        "paired_ratio": paired,
        "runs": {"pgqueue": ours, "dbos": theirs},
    }
    return [
        label,
        fmt(statistics.median(ours)),
        fmt(statistics.median(theirs)),
        f"{paired:.2f}x",
    ]


def _steps_rows(
    got: dict[str, list[dict[str, Any]]], n: int, k: int, out: dict[str, Any]
) -> list[list[str]]:
    def per_step_us(side: str, key: str) -> list[float]:
        return [r[key] / (n * k) * 1e6 for r in got[side]]

    return [
        _row(
            out,
            "steps/s",
            [r["steps_per_s"] for r in got["pgqueue"]],
            [r["steps_per_s"] for r in got["dbos"]],
        ),
        _row(
            out,
            "process CPU µs/step",
            per_step_us("pgqueue", "worker_cpu_s"),
            per_step_us("dbos", "worker_cpu_s"),
        ),
        _row(
            out,
            "PG CPU µs/step (bench db)",
            per_step_us("pgqueue", "postgres_db_cpu_s"),
            per_step_us("dbos", "postgres_db_cpu_s"),
        ),
    ]


def _latency_rows(
    got: dict[str, list[dict[str, Any]]], k: int, out: dict[str, Any]
) -> list[list[str]]:
    def per_round(side: str, key: str, q: float) -> list[float]:
        return [ms(r[key], q) for r in got[side]]

    def added(side: str, q: float) -> list[float]:
        return [ms(r[f"total_{k}"], q) - ms(r["total_0"], q) for r in got[side]]

    specs = [
        (f"{k}-step job, start to finish, p{q} ms", f"total_{k}", q) for q in (50, 95)
    ]
    specs += [(f"0-step job, start to finish, p{q} ms", "total_0", q) for q in (50, 95)]
    rows = [
        _row(out, label, per_round("pgqueue", key, q), per_round("dbos", key, q))
        for label, key, q in specs
    ]
    rows.append(
        _row(
            out,
            f"added by {k} steps (p50 difference) ms",
            added("pgqueue", 50),
            added("dbos", 50),
        )
    )
    rows += [
        _row(
            out,
            f"{k} steps inside the handler/workflow, p{q} ms",
            per_round("pgqueue", f"body_{k}", q),
            per_round("dbos", f"body_{k}", q),
        )
        for q in (50, 95)
    ]
    return rows


def _dbos_version(python: str) -> str:
    done = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('dbos'))"],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


if __name__ == "__main__":
    main()
