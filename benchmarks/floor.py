"""The raw floor: the library's own claim and batched fenced finish, from a bare asyncpg loop.

``_sql.CLAIM`` of ``--batch`` rows, then one ``_sql.COMPLETE`` for the whole
batch, in a separate process with no pgqueue code on the path. "pipelined"
writes batch k's outcomes on a second connection while batch k+1 is claimed
(the shape the worker aims for); "serial" does both on one connection.

Usage: python -m benchmarks.floor [--jobs 20000] [--batch 100] [--runs 3]
"""

from __future__ import annotations

from typing import Any

from benchmarks import _pgqueue_runs as pgq
from benchmarks._common import (
    base_parser,
    fmt_summary,
    markdown_table,
    resolve_dsn,
    write_json,
)
from benchmarks.drain import describe


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    dsn = resolve_dsn(args.dsn)
    out: dict[str, Any] = {"jobs": args.jobs, "batch": args.batch, "results": {}}
    rows = []
    for mode in ("pipelined", "serial"):
        results = []
        for i in range(args.runs):
            result = pgq.floor(
                dsn, args.jobs, args.batch, pipelined=mode == "pipelined"
            )
            print(f"{mode} run {i + 1}: {result['jobs_per_s']:,.0f} jobs/s (verified)")
            results.append(result)
        summary = describe(results, args.jobs)
        out["results"][mode] = {"summary": summary, "runs": results}
        rows.append(
            [
                mode,
                fmt_summary(summary["jobs_per_s"]),
                fmt_summary(summary["worker_cpu_us_per_job"]),
                fmt_summary(summary["postgres_db_cpu_us_per_job"]),
            ]
        )
    print()
    print(
        markdown_table(
            ["floor", "jobs/s", "client CPU µs/job", "PG CPU µs/job (bench db)"], rows
        )
    )
    write_json("floor", out, enabled=not args.no_json)


if __name__ == "__main__":
    main()
