"""Drain N pre-enqueued no-op jobs with one worker process; verify each completed once.

Usage: python -m benchmarks.drain [--jobs 20000] [--concurrency 10 100] [--runs 3]
                                  [--global-limit N] [--prefetch P]

``--global-limit N`` drains under a fleet-wide limit of N (``Worker(global_limit=N)``);
``--prefetch P`` sets the worker's prefetch (default: the worker's default).
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


def per_job_us(results: list[dict[str, Any]], key: str, n: int) -> list[float]:
    """``key`` (CPU seconds) of each run as microseconds per job."""
    return [r[key] / n * 1e6 for r in results]


def describe(results: list[dict[str, Any]], n: int) -> dict[str, Any]:
    """The summaries a drain reports."""
    return {
        "jobs_per_s": summarize([r["jobs_per_s"] for r in results]),
        "worker_cpu_us_per_job": summarize(per_job_us(results, "worker_cpu_s", n)),
        "postgres_db_cpu_us_per_job": summarize(
            per_job_us(results, "postgres_db_cpu_s", n)
        ),
        "postgres_all_cpu_us_per_job": summarize(
            per_job_us(results, "postgres_cpu_s", n)
        ),
        "peak_rss_mb": summarize([r["peak_rss_mb"] for r in results]),
    }


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--global-limit", type=int, default=None, metavar="N")
    parser.add_argument("--prefetch", type=int, default=None, metavar="P")
    args = parser.parse_args()
    dsn = resolve_dsn(args.dsn)
    out: dict[str, Any] = {
        "jobs": args.jobs,
        "runs": args.runs,
        "global_limit": args.global_limit,
        "prefetch": args.prefetch,
        "results": {},
    }
    rows = []
    for concurrency in args.concurrency:
        results = []
        for i in range(args.runs):
            result = pgq.drain(
                dsn,
                args.jobs,
                concurrency,
                global_limit=args.global_limit,
                prefetch=args.prefetch,
            )
            result.pop("marks", None)
            print(
                f"C={concurrency} run {i + 1}: {result['jobs_per_s']:,.0f} jobs/s (verified)"
            )
            results.append(result)
        summary = describe(results, args.jobs)
        out["results"][f"C={concurrency}"] = {"summary": summary, "runs": results}
        rows.append(
            [
                str(concurrency),
                fmt_summary(summary["jobs_per_s"]),
                fmt_summary(summary["worker_cpu_us_per_job"]),
                fmt_summary(summary["postgres_db_cpu_us_per_job"]),
                fmt_summary(summary["postgres_all_cpu_us_per_job"]),
                fmt_summary(summary["peak_rss_mb"]),
            ]
        )
    print()
    print(
        markdown_table(
            [
                "C",
                "jobs/s",
                "worker CPU µs/job",
                "PG CPU µs/job (bench db)",
                "PG CPU µs/job (all)",
                "peak RSS MiB",
            ],
            rows,
        )
    )
    write_json("drain", out, enabled=not args.no_json)


if __name__ == "__main__":
    main()
