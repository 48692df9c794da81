"""Bulk enqueue against the raw COPY floor, rounds alternating.

Each round measures, in a fresh database each and in an order that rotates
from round to round:

- ``enqueue_many`` in calls of each ``--chunks`` size (the COPY path for
  calls of ``COPY_MIN_JOBS`` jobs or more), and the same calls through the
  path it does not take at that size: the INSERT path (what
  ``enqueue_many`` did before the COPY path, and still does for smaller
  calls), or the COPY path forced;
- the floor: asyncpg's ``copy_records_to_table`` of the same ``--jobs`` rows
  (the columns pgqueue copies, ids 1..N), no library code; timed once for
  the COPY alone (records built beforehand) and once with the payloads'
  ``json.dumps`` and the records' building;
- pgqueuer's bulk enqueue in calls of 1,000 (with ``--pgqueuer``).

``--sweep`` then measures the COPY and INSERT paths at each call size, for
the threshold. Jobs are ``("noop", {"i": i})``, as in ``benchmarks.enqueue``.

Usage: python -m benchmarks.bulk [--jobs 50000] [--chunks 1000 50000] [--runs 5]
       [--pgqueuer] [--sweep 100 200 500 1000 2000] [--sweep-jobs 20000]
"""

from __future__ import annotations

import json
import statistics
import time
from contextlib import contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any

import asyncpg

from benchmarks import _pgqueue_runs as pgq
from benchmarks._common import (
    base_parser,
    bench_database,
    fmt_summary,
    markdown_table,
    resolve_dsn,
    run,
    summarize,
    write_json,
)
from pgqueue import _queue
from pgqueue._copy import COPY_MIN_JOBS
from pgqueue._sql.enqueue import COPY_COLUMNS, COPY_TABLE

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


@contextmanager
def threshold(jobs: int) -> Iterator[None]:
    """enqueue_many copying calls of ``jobs`` or more."""
    _queue.COPY_MIN_JOBS = jobs  # type: ignore[attr-defined]
    try:
        yield
    finally:
        _queue.COPY_MIN_JOBS = COPY_MIN_JOBS  # type: ignore[attr-defined]


def enqueue_many(
    dsn: str, n: int, chunk: int, *, copy: bool = True, force: bool = False
) -> float:
    """Jobs per second of enqueue_many in calls of ``chunk`` (verified).

    Without ``copy``, the COPY path is off; with ``force``, it takes calls
    of any size.
    """
    jobs = 1 if force else COPY_MIN_JOBS if copy else 2**63
    with threshold(jobs):
        return pgq.enqueue_bulk(dsn, n, chunk, name="bulk")


async def _floor(dsn: str, n: int) -> tuple[float, float]:
    connection = await asyncpg.connect(dsn)
    try:
        now = await connection.fetchval("SELECT now()")
        jobs = [(pgq.JOB_TYPE, {"i": i}) for i in range(n)]
        start = time.perf_counter()
        records = [
            (i, "default", job_type, json.dumps(payload), 5, now, 0, False, None)
            for i, (job_type, payload) in enumerate(jobs, 1)
        ]
        copy_start = time.perf_counter()
        await connection.copy_records_to_table(
            COPY_TABLE, records=records, columns=COPY_COLUMNS
        )
        end = time.perf_counter()
        count = await connection.fetchval("SELECT count(*) FROM pgqueue_jobs")
    finally:
        await connection.close()
    if count != n:
        msg = f"the COPY floor wrote {count} rows, expected {n}"
        raise AssertionError(msg)
    return n / (end - copy_start), n / (end - start)


def floor(dsn: str, n: int) -> tuple[float, float]:
    """Jobs per second of the raw COPY: alone, and with encoding and records."""
    with bench_database(dsn, "bulk_floor") as db:
        return run(_floor(db, n))


def pgqueuer_bulk(dsn: str, n: int) -> float:
    from benchmarks import _pgqueuer_runs

    return _pgqueuer_runs.enqueue_bulk(dsn, n, 1000, name="bulk_pgqueuer")


def rounds(
    measures: dict[str, Callable[[], float]], count: int
) -> dict[str, list[float]]:
    """Each measure once a round, the order rotating a step each round."""
    names = list(measures)
    got: dict[str, list[float]] = {name: [] for name in names}
    for r in range(count):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            got[name].append(measures[name]())
        line = ", ".join(f"{name} {values[-1]:,.0f}" for name, values in got.items())
        print(f"  round {r + 1}: {line} jobs/s")
    return got


def paired(a: list[float], b: list[float]) -> float:
    """The median of the per-round ratios a/b."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def main() -> None:
    parser = base_parser(__doc__ or "", runs=5)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--chunks", type=int, nargs="+", default=[1_000, 50_000])
    parser.add_argument("--pgqueuer", action="store_true")
    parser.add_argument("--sweep", type=int, nargs="*", default=[])
    parser.add_argument("--sweep-jobs", type=int, default=20_000)
    args = parser.parse_args()
    dsn, n = resolve_dsn(args.dsn), args.jobs
    print(f"COPY_MIN_JOBS = {COPY_MIN_JOBS}; {n:,} jobs; {args.runs} rounds")

    floors: list[tuple[float, float]] = []

    def floor_round() -> float:
        floors.append(floor(dsn, n))
        return floors[-1][0]

    measures: dict[str, Callable[[], float]] = {"floor": floor_round}
    for chunk in args.chunks:
        # enqueue_many as it is, and the path it does not take at that size.
        if chunk >= COPY_MIN_JOBS:
            measures[f"enqueue_many {chunk} (COPY)"] = partial(
                enqueue_many, dsn, n, chunk
            )
            measures[f"INSERT path {chunk}"] = partial(
                enqueue_many, dsn, n, chunk, copy=False
            )
        else:
            measures[f"enqueue_many {chunk} (INSERT)"] = partial(
                enqueue_many, dsn, n, chunk
            )
            measures[f"COPY path {chunk}"] = partial(
                enqueue_many, dsn, n, chunk, force=True
            )
    if args.pgqueuer:
        measures["pgqueuer 1000"] = partial(pgqueuer_bulk, dsn, n)
    got = rounds(measures, args.runs)
    del got["floor"]
    alone = [f[0] for f in floors]
    encoded = [f[1] for f in floors]
    results = {"floor: COPY alone": alone, "floor: encode + COPY": encoded, **got}
    table = []
    for name, values in results.items():
        row = [
            name,
            fmt_summary(summarize(values)),
            f"{paired(values, alone):.2f}",
            f"{paired(values, encoded):.2f}",
        ]
        if args.pgqueuer:
            row.append(f"{paired(values, got['pgqueuer 1000']):.2f}")
        table.append(row)
    headers = [
        "N = " + f"{n:,}",
        "jobs/s median (min..max)",
        "/ COPY alone",
        "/ encode + COPY",
    ]
    if args.pgqueuer:
        headers.append("/ pgqueuer")
    print()
    print(markdown_table(headers, table))
    out: dict[str, Any] = {
        "jobs": n,
        "copy_min_jobs": COPY_MIN_JOBS,
        "results": {
            name: {"jobs_per_s": summarize(v), "runs": v} for name, v in results.items()
        },
    }

    if args.sweep:
        print(f"\nsweep: {args.sweep_jobs:,} jobs (at least 5 calls) per measurement")
        sweep = []
        out["sweep"] = {}
        for chunk in args.sweep:
            jobs = max(args.sweep_jobs, 5 * chunk)
            print(f"calls of {chunk}:")
            pair = rounds(
                {
                    "COPY": partial(enqueue_many, dsn, jobs, chunk, force=True),
                    "INSERT": partial(enqueue_many, dsn, jobs, chunk, copy=False),
                },
                args.runs,
            )
            ratio = paired(pair["COPY"], pair["INSERT"])
            sweep.append(
                [
                    f"{chunk:,}",
                    fmt_summary(summarize(pair["COPY"])),
                    fmt_summary(summarize(pair["INSERT"])),
                    f"{ratio:.2f}",
                ]
            )
            out["sweep"][chunk] = {**pair, "copy_over_insert": ratio}
        print()
        print(
            markdown_table(
                [
                    "jobs a call",
                    "COPY path jobs/s",
                    "INSERT path jobs/s",
                    "COPY / INSERT",
                ],
                sweep,
            )
        )
    write_json("bulk", out, enabled=not args.no_json)


if __name__ == "__main__":
    main()
