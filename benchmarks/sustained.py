"""Sustained drain: N jobs (default 1,000,000) through one worker; the last tenth's rate vs the first's.

The N jobs are inserted up front (one INSERT ... generate_series), then one
worker process drains them at ``--concurrency``; the handler stamps the time
at every tenth. Passes when the median of the runs' last-tenth rates over
first-tenth rates is at least 0.8. With the default N this takes several
minutes (filling alone ~1 min).

Usage: python -m benchmarks.sustained [--jobs 1000000] [--concurrency 100] [--runs 1]
"""

from __future__ import annotations

import itertools
from typing import Any

from benchmarks import _pgqueue_runs as pgq
from benchmarks._common import (
    base_parser,
    fmt,
    fmt_summary,
    markdown_table,
    resolve_dsn,
    summarize,
    write_json,
)


def tenth_rates(marks: list[float], n: int) -> list[float]:
    """Jobs per second over each tenth of the drain, from the times each tenth ended."""
    step = n // 10
    edges = [0.0, *marks[:10]]
    return [step / (b - a) for a, b in itertools.pairwise(edges)]


def main() -> None:
    parser = base_parser(__doc__ or "", runs=1)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--concurrency", type=int, default=100)
    args = parser.parse_args()
    dsn = resolve_dsn(args.dsn)
    runs: list[dict[str, Any]] = []
    for i in range(args.runs):
        result = pgq.drain(dsn, args.jobs, args.concurrency, name="sustained")
        rates = tenth_rates(result.pop("marks"), args.jobs)
        last_first = rates[-1] / rates[0]
        runs.append({**result, "tenth_rates": rates, "last_over_first": last_first})
        print(
            f"run {i + 1}: {result['jobs_per_s']:,.0f} jobs/s overall; tenths "
            + ", ".join(fmt(r) for r in rates)
            + f"; last/first {last_first:.2f}"
        )
    overall = summarize([r["jobs_per_s"] for r in runs])
    ratio = summarize([r["last_over_first"] for r in runs])
    passed = ratio["median"] >= 0.8
    out = {
        "jobs": args.jobs,
        "concurrency": args.concurrency,
        "jobs_per_s": overall,
        "last_over_first": ratio,
        "passed": passed,
        "runs": runs,
    }
    print()
    print(
        markdown_table(
            [
                "N",
                "C",
                "jobs/s overall",
                "first tenth /s",
                "last tenth /s",
                "last/first",
                "within 20%",
            ],
            [
                [
                    f"{args.jobs:,}",
                    str(args.concurrency),
                    fmt_summary(overall),
                    fmt(summarize([r["tenth_rates"][0] for r in runs])["median"]),
                    fmt(summarize([r["tenth_rates"][-1] for r in runs])["median"]),
                    fmt_summary(ratio),
                    "yes" if passed else "NO",
                ]
            ],
        )
    )
    write_json(f"sustained_{args.jobs}", out, enabled=not args.no_json)


if __name__ == "__main__":
    main()
