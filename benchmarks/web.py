"""The web dashboard's page times on a table of a million jobs.

Fills ``pgq_bench_web`` with ``--rows`` jobs in one ``INSERT ... SELECT
generate_series`` (three queues; 94 % completed, the rest pending, scheduled,
running, dead and cancelled), runs ``VACUUM ANALYZE``, then requests each page
``--requests`` times through the app (`pgqueue.web.create_app` on a pool of
4, called in-process over httpx's ASGI transport: the app's and the
database's time, no network) and prints the median and the slowest request
of each. Page 1,000 of a queue's listing (and the last page of the dead
jobs) is reached by its keyset cursor (the id that ends the page before,
found once with an OFFSET by the benchmark itself; the app never uses one).

Usage: python -m benchmarks.web [--rows 1000000] [--requests 20]
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import asyncpg
import httpx

from benchmarks._common import (
    base_parser,
    bench_database,
    markdown_table,
    resolve_dsn,
    run,
    write_json,
)
from pgqueue._sql.leases import SEED_LIMIT
from pgqueue.web import create_app

PAGE_SIZE = 50

FILL = """
INSERT INTO pgqueue_jobs (queue, job_type, payload, status, attempts, max_attempts, run_at,
                          created_at, updated_at, completed_at, last_error, result)
SELECT (ARRAY['emails', 'reports', 'billing'])[1 + g % 3],
       CASE WHEN g % 97 = 0 THEN 'rare_type' ELSE 'send_email' END,
       jsonb_build_object('n', g),
       s.status,
       CASE WHEN s.status IN ('dead') THEN 5 WHEN s.status = 'pending' THEN 0 ELSE 1 END,
       5,
       CASE WHEN s.status = 'pending' AND g % 5 = 0 THEN now() + interval '1 day'
            ELSE now() - make_interval(secs => ($1 - g) / 100.0) END,
       now() - make_interval(secs => ($1 - g) / 100.0),
       now() - make_interval(secs => ($1 - g) / 100.0),
       CASE WHEN s.status = 'completed' THEN now() - make_interval(secs => ($1 - g) / 100.0) END,
       CASE WHEN s.status = 'dead' THEN E'ValueError: boom\\nTraceback ...' END,
       CASE WHEN s.status = 'completed' THEN '{"ok": true}'::jsonb END
FROM generate_series(1, $1) AS g
CROSS JOIN LATERAL (
    SELECT CASE WHEN g % 100 < 94 THEN 'completed'
                WHEN g % 100 < 97 THEN 'pending'
                WHEN g % 100 < 98 THEN 'dead'
                WHEN g % 100 < 99 THEN 'cancelled'
                WHEN g % 1000 = 999 THEN 'running'
                ELSE 'completed' END AS status
) AS s
"""


async def fill(dsn: str, rows: int) -> dict[str, int]:
    connection = await asyncpg.connect(dsn)
    try:
        started = time.perf_counter()
        await connection.execute(FILL, rows)
        filled = time.perf_counter() - started
        await connection.execute("VACUUM ANALYZE pgqueue_jobs")
        print(f"filled {rows:,} rows in {filled:.1f} s (+ VACUUM ANALYZE)")
        await connection.execute(SEED_LIMIT, "billing", 4)
        await connection.execute(
            "INSERT INTO pgqueue_periodic (name, schedule, queue, job_type, next_tick)"
            " VALUES ('nightly', '0 3 * * *', 'reports', 'build_report', now())"
        )
        found = {
            "dead": await connection.fetchval(
                "SELECT max(id) FROM pgqueue_jobs WHERE status = 'dead'"
            ),
            "newest": await connection.fetchval("SELECT max(id) FROM pgqueue_jobs"),
        }
        # The ids ending page 999 of a queue's jobs and the page before the last of the dead jobs (the benchmark's OFFSET,
        # only to find the cursor of page 1,000).
        offset = PAGE_SIZE * 999 - 1
        found["emails_999"] = await connection.fetchval(
            "SELECT id FROM pgqueue_jobs WHERE queue = 'emails' ORDER BY id DESC"
            " OFFSET $1 LIMIT 1",
            offset,
        )
        found["dead_last"] = await connection.fetchval(
            "SELECT id FROM pgqueue_jobs WHERE status = 'dead' ORDER BY id DESC"
            " OFFSET (SELECT (count(*) - 1) / $1 * $1 - 1 FROM pgqueue_jobs"
            "         WHERE status = 'dead') LIMIT 1",
            PAGE_SIZE,
        )
        return found
    finally:
        await connection.close()


async def measure(dsn: str, rows: int, requests: int) -> list[dict[str, Any]]:
    ids = await fill(dsn, rows)
    pages = [
        ("Queues", "/"),
        ("Queues, live refresh", "/fragments/queues"),
        ("Jobs (all)", "/jobs"),
        ("Jobs of a queue", "/jobs?queue=emails"),
        ("Dead jobs", "/jobs?status=dead"),
        ("Dead jobs of a queue", "/jobs?status=dead&queue=billing"),
        ("Ready jobs", "/jobs?status=ready"),
        ("Completed of a queue", "/jobs?status=completed&queue=reports"),
        ("Jobs of a rare type", "/jobs?type=rare_type"),
        ("Page 1,000 of a queue", f"/jobs?queue=emails&before={ids['emails_999']}"),
        ("Last page of dead jobs", f"/jobs?status=dead&before={ids['dead_last']}"),
        ("A job", f"/jobs/{ids['dead']}"),
        ("Retry confirmation", f"/jobs/{ids['dead']}/retry"),
        ("Retry all confirmation", "/retry-all?queue=emails"),
        ("Periodic", "/periodic"),
    ]
    results = []
    async with asyncpg.create_pool(dsn, min_size=4, max_size=4) as pool:
        app = create_app(pool, read_only=False, page_size=PAGE_SIZE)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://b") as c:
            for name, path in pages:
                times = []
                for _ in range(requests + 1):  # the first one warms up
                    # Frames are shared for a second: time reading one, not the cache.
                    _read_a_fresh_frame_next(app)
                    started = time.perf_counter()
                    answer = await c.get(path)
                    times.append((time.perf_counter() - started) * 1000)
                    assert answer.status_code == 200, (path, answer.status_code)
                times = times[1:]
                results.append(
                    {
                        "page": name,
                        "path": path,
                        "median_ms": statistics.median(times),
                        "max_ms": max(times),
                    }
                )
                print(f"{name}: {statistics.median(times):.1f} ms")
    return results


def _read_a_fresh_frame_next(app: Any) -> None:
    """Make the next request read a fresh frame (the dashboard shares one for a second)."""
    for route in app.routes:
        dashboard = getattr(route.endpoint, "__self__", None)
        if dashboard is not None:
            dashboard._framed_at = float("-inf")
            return


def main() -> None:
    parser = base_parser(__doc__ or "", runs=1)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    dsn = resolve_dsn(args.dsn)
    with bench_database(dsn, "web") as target:
        results = run(measure(target, args.rows, args.requests))
    print()
    print(
        markdown_table(
            ["page", "median", "slowest"],
            [
                [r["page"], f"{r['median_ms']:.1f} ms", f"{r['max_ms']:.1f} ms"]
                for r in results
            ],
        )
    )
    write_json(
        "web",
        {"rows": args.rows, "requests": args.requests, "results": results},
        enabled=not args.no_json,
    )


if __name__ == "__main__":
    main()
