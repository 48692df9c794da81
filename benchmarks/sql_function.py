"""`Queue.enqueue`'s own INSERT against a call of the SQL function ``pgqueue_enqueue``.

One job per awaited call, in the caller's transaction (``connection=``,
NOTIFY in the statement either way) and by itself on a pool of P
connections with P producers; rounds alternating, medians and the median of
per-round ratios.

Usage: python -m benchmarks.sql_function [--jobs 4000] [--producers 1 8] [--runs 5]
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import asyncpg

import pgqueue
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

CALL = "SELECT pgqueue_enqueue($1, $2::text::jsonb, queue => $3)"


async def _rate(dsn: str, jobs: int, producers: int, *, function: bool) -> float:
    """Jobs per second: ``producers`` tasks, each enqueueing its share in its own transaction."""
    async with asyncpg.create_pool(dsn, min_size=producers, max_size=producers) as pool:
        queue = pgqueue.Queue(pool, name="bench")

        async def produce(share: int) -> None:
            async with pool.acquire() as connection:
                for i in range(share):
                    async with connection.transaction():
                        if function:
                            await connection.fetchval(
                                CALL, "t", f'{{"i": {i}}}', "bench"
                            )
                        else:
                            await queue.enqueue("t", {"i": i}, connection=connection)

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(producers):
                tg.start_soon(produce, jobs // producers)
        seconds = time.perf_counter() - start
        assert await pool.fetchval("SELECT count(*) FROM pgqueue_jobs") == jobs
        await pool.execute("TRUNCATE pgqueue_jobs")
    return jobs / seconds


def main() -> None:
    parser = base_parser(__doc__ or "", runs=5)
    parser.add_argument("--jobs", type=int, default=4_000)
    parser.add_argument("--producers", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    dsn = resolve_dsn(args.dsn)
    out: dict[str, Any] = {}
    rows = []
    with bench_database(dsn, "sql_function") as db:
        for producers in args.producers:
            insert: list[float] = []
            call: list[float] = []
            for i in range(args.runs):
                order = (False, True) if i % 2 == 0 else (True, False)
                for function in order:
                    rate = run(_rate(db, args.jobs, producers, function=function))
                    (call if function else insert).append(rate)
                print(
                    f"P={producers} round {i + 1}: INSERT {insert[-1]:,.0f}/s, "
                    f"pgqueue_enqueue {call[-1]:,.0f}/s"
                )
            ratios = [c / q for c, q in zip(call, insert, strict=True)]
            out[f"p{producers}"] = {
                "insert": summarize(insert),
                "function": summarize(call),
                "function_over_insert": summarize(ratios),
            }
            rows.append(
                [
                    str(producers),
                    fmt_summary(summarize(insert)),
                    fmt_summary(summarize(call)),
                    fmt_summary(summarize(ratios)),
                ]
            )
    print()
    print(
        markdown_table(
            [
                "producers",
                "Queue.enqueue jobs/s",
                "pgqueue_enqueue jobs/s",
                "function / INSERT",
            ],
            rows,
        )
    )
    write_json("sql_function", out, enabled=not args.no_json)


if __name__ == "__main__":
    main()
