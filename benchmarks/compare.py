"""pgqueue vs pgqueuer on the same server, runs alternating, each in fresh databases.

Each run measures every metric for both libraries back to back (the order
flips every run), so both see the same noise; ratios are taken per run
(paired) and their median is reported. The raw floor (bare asyncpg running
pgqueue's claim and batched finish at batch 100) is measured in each run too.

Usage: python -m benchmarks.compare [--runs 3] [--jobs 20000] [--single 5000]
       [--bulk 50000] [--wake-jobs 200]
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from benchmarks import _pgqueue_runs as pgq
from benchmarks._common import (
    base_parser,
    fmt,
    markdown_table,
    resolve_dsn,
    run,
    server_settings,
    summarize,
    write_json,
)
from benchmarks.wake import latency_points

if TYPE_CHECKING:
    from collections.abc import Callable

LIBRARIES = ("pgqueue", "pgqueuer")


@dataclass(frozen=True)
class Metric:
    """One row of the comparison."""

    key: str
    label: str
    unit: str
    higher_is_better: bool
    target: str
    met: Callable[[float, float, float], bool]
    """(pgqueue median, pgqueuer median, median paired ratio) -> target met."""


METRICS = (
    Metric(
        "drain_c10", "drain C=10", "jobs/s", True, ">= 2.5x", lambda a, b, r: r >= 2.5
    ),
    Metric(
        "drain_c100", "drain C=100", "jobs/s", True, ">= 3x", lambda a, b, r: r >= 3
    ),
    Metric(
        "single", "single enqueue", "jobs/s", True, ">= 1.2x", lambda a, b, r: r >= 1.2
    ),
    Metric("bulk", "bulk enqueue", "jobs/s", True, ">= 2x", lambda a, b, r: r >= 2),
    Metric(
        "wake_p50",
        "wake p50",
        "ms",
        False,
        "<= pgqueuer, <= 3 ms",
        lambda a, b, r: a <= b and a <= 3,
    ),
    Metric("wake_p95", "wake p95", "ms", False, "-", lambda a, b, r: True),
    Metric("wake_p99", "wake p99", "ms", False, "<= 8 ms", lambda a, b, r: a <= 8),
    Metric("wake_max", "wake max", "ms", False, "-", lambda a, b, r: True),
    Metric(
        "rss",
        "worker peak RSS (drain C=100)",
        "MiB",
        False,
        "<= pgqueuer",
        lambda a, b, r: a <= b,
    ),
    Metric(
        "worker_cpu",
        "worker CPU per job (C=100)",
        "µs",
        False,
        "-",
        lambda a, b, r: True,
    ),
    Metric(
        "pg_cpu",
        "PG CPU per job (C=100, bench db)",
        "µs",
        False,
        "-",
        lambda a, b, r: True,
    ),
)


def one_run(dsn: str, lib: str, args: Any, record: dict[str, list[float]]) -> None:
    """Measure every metric once for ``lib`` and append to ``record``."""
    # Imported here, not at the top: spawned children re-import this module,
    # and pgqueue's workers must not load pgqueuer (and pydantic) into their RSS.
    from benchmarks import _pgqueuer_runs as pgqr

    side: Any = pgq if lib == "pgqueue" else pgqr
    prefix = "" if lib == "pgqueue" else "pgqueuer_"
    n = args.jobs
    for c in (10, 100):
        result = side.drain(dsn, n, c, name=f"{prefix}drain_c{c}")
        record[f"drain_c{c}"].append(result["jobs_per_s"])
        if c == 100:
            record["rss"].append(result["peak_rss_mb"])
            record["worker_cpu"].append(result["worker_cpu_s"] / n * 1e6)
            record["pg_cpu"].append(result["postgres_db_cpu_s"] / n * 1e6)
    record["single"].append(side.enqueue_single(dsn, args.single))
    record["bulk"].append(side.enqueue_bulk(dsn, args.bulk, 1000))
    points = latency_points(side.wake(dsn, args.wake_jobs))
    for name, value in points.items():
        record[f"wake_{name}"].append(value)


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--single", type=int, default=5_000)
    parser.add_argument("--bulk", type=int, default=50_000)
    parser.add_argument("--wake-jobs", type=int, default=200)
    args = parser.parse_args()
    dsn = resolve_dsn(args.dsn)
    records: dict[str, dict[str, list[float]]] = {
        lib: {m.key: [] for m in METRICS} for lib in LIBRARIES
    }
    floor: list[float] = []
    for i in range(args.runs):
        order = LIBRARIES if i % 2 == 0 else LIBRARIES[::-1]
        for lib in order:
            one_run(dsn, lib, args, records[lib])
        floor.append(pgq.floor(dsn, args.jobs, 100)["jobs_per_s"])
        print(
            f"run {i + 1}: "
            + "; ".join(
                f"{m.label}: {records['pgqueue'][m.key][-1]:,.2f} vs "
                f"{records['pgqueuer'][m.key][-1]:,.2f}"
                for m in METRICS
            )
            + f"; floor {floor[-1]:,.0f}"
        )

    rows = []
    out: dict[str, Any] = {
        "settings": vars(args),
        "server": run(server_settings(dsn)),
        "metrics": {},
    }
    for m in METRICS:
        ours, theirs = records["pgqueue"][m.key], records["pgqueuer"][m.key]
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        a, b = summarize(ours), summarize(theirs)
        ratio = statistics.median(ratios)
        met = m.met(a["median"], b["median"], ratio)
        out["metrics"][m.key] = {
            "unit": m.unit,
            "pgqueue": {**a, "values": ours},
            "pgqueuer": {**b, "values": theirs},
            "ratio_pgqueue_over_pgqueuer": {**summarize(ratios), "values": ratios},
            "target": m.target,
            "met": met,
        }
        rows.append(
            [
                f"{m.label} ({m.unit})",
                f"{fmt(a['median'])} ({fmt(a['min'])}..{fmt(a['max'])})",
                f"{fmt(b['median'])} ({fmt(b['min'])}..{fmt(b['max'])})",
                f"{ratio:.2f}x",
                m.target,
                "" if m.target == "-" else ("yes" if met else "NO"),
            ]
        )
    drain100 = records["pgqueue"]["drain_c100"]
    of_floor = [a / f for a, f in zip(drain100, floor, strict=True)]
    floor_ratio = statistics.median(of_floor)
    fs = summarize(floor)
    out["floor"] = {
        "jobs_per_s": {**fs, "values": floor},
        "pgqueue_c100_over_floor": {**summarize(of_floor), "values": of_floor},
        "target": ">= 0.5",
        "met": floor_ratio >= 0.5,
    }
    rows.append(
        [
            "raw floor, batch 100 (jobs/s)",
            f"drain C=100 = {floor_ratio:.0%} of floor",
            f"floor {fmt(fs['median'])} ({fmt(fs['min'])}..{fmt(fs['max'])})",
            f"{floor_ratio:.2f}",
            ">= 0.5 of floor",
            "yes" if floor_ratio >= 0.5 else "NO",
        ]
    )
    print()
    print(
        f"{args.runs} alternating runs; median (min..max); ratio = median of per-run "
        "pgqueue/pgqueuer ratios (for ms and MiB, lower is better)"
    )
    print(
        markdown_table(
            ["metric", "pgqueue", "pgqueuer", "pgqueue/pgqueuer", "target", "met"],
            rows,
        )
    )
    write_json("compare", out, enabled=not args.no_json)


if __name__ == "__main__":
    main()
