"""Wake latency: an idle worker (LISTEN on), jobs enqueued one at a time 20 ms apart.

Latency is from the start of the enqueue call (``time.time()`` in the
payload, taken by the producer process) to the start of the handler (in the
worker process). 10 warm-up jobs precede the measured ones.

Usage: python -m benchmarks.wake [--jobs 200] [--gap 0.02] [--runs 3]
"""

from __future__ import annotations

from typing import Any

from benchmarks import _pgqueue_runs as pgq
from benchmarks._common import (
    Summary,
    base_parser,
    fmt_summary,
    markdown_table,
    percentile,
    resolve_dsn,
    summarize,
    write_json,
)

POINTS = (("p50", 50.0), ("p95", 95.0), ("p99", 99.0), ("max", 100.0))


def latency_points(latencies: list[float]) -> dict[str, float]:
    """p50, p95, p99 and max in milliseconds."""
    return {name: percentile(latencies, q) * 1000 for name, q in POINTS}


def summarize_points(runs: list[dict[str, float]]) -> dict[str, Summary]:
    """Each percentile summarized over runs."""
    return {name: summarize([r[name] for r in runs]) for name, _ in POINTS}


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--gap", type=float, default=0.02)
    args = parser.parse_args()
    dsn = resolve_dsn(args.dsn)
    runs = []
    for i in range(args.runs):
        points = latency_points(pgq.wake(dsn, args.jobs, gap=args.gap))
        runs.append(points)
        print(
            f"run {i + 1}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in points.items())
        )
    summary = summarize_points(runs)
    out: dict[str, Any] = {
        "jobs": args.jobs,
        "gap_s": args.gap,
        "ms": summary,
        "runs": runs,
    }
    print()
    print(
        markdown_table(
            ["latency", "ms median (min..max) over runs"],
            [[name, fmt_summary(summary[name])] for name, _ in POINTS],
        )
    )
    write_json("wake", out, enabled=not args.no_json)


if __name__ == "__main__":
    main()
