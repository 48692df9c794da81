"""Enqueue throughput: one job per awaited call, and enqueue_many in calls of 1,000.

Usage: python -m benchmarks.enqueue [--single 5000] [--bulk 50000] [--chunk 1000] [--runs 3]
"""

from __future__ import annotations

from typing import Any

from benchmarks import _pgqueue_runs as pgq
from benchmarks._common import (
    base_parser,
    fmt_summary,
    markdown_table,
    resolve_dsn,
    summarize,
    write_json,
)


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--single", type=int, default=5_000)
    parser.add_argument("--bulk", type=int, default=50_000)
    parser.add_argument("--chunk", type=int, default=1_000)
    args = parser.parse_args()
    dsn = resolve_dsn(args.dsn)
    single: list[float] = []
    bulk: list[float] = []
    for i in range(args.runs):
        single.append(pgq.enqueue_single(dsn, args.single))
        bulk.append(pgq.enqueue_bulk(dsn, args.bulk, args.chunk))
        print(f"run {i + 1}: single {single[-1]:,.0f}/s, bulk {bulk[-1]:,.0f}/s")
    out: dict[str, Any] = {
        "single": {
            "jobs": args.single,
            "jobs_per_s": summarize(single),
            "runs": single,
        },
        "bulk": {
            "jobs": args.bulk,
            "chunk": args.chunk,
            "jobs_per_s": summarize(bulk),
            "runs": bulk,
        },
    }
    print()
    print(
        markdown_table(
            ["enqueue", "jobs/s median (min..max)"],
            [
                [
                    f"single, N={args.single:,}",
                    fmt_summary(out["single"]["jobs_per_s"]),
                ],
                [
                    f"enqueue_many, N={args.bulk:,} in calls of {args.chunk:,}",
                    fmt_summary(out["bulk"]["jobs_per_s"]),
                ],
            ],
        )
    )
    write_json("enqueue", out, enabled=not args.no_json)


if __name__ == "__main__":
    main()
