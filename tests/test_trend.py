"""The trend: what the workers count into pgqueue_trend equals what the rows say, and how Admin reads it."""

from __future__ import annotations

import json
from datetime import timedelta

import asyncpg
import pytest

import pgqueue
from pgqueue._engine.trend import bucket_of, bucket_value
from pgqueue._trend import percentile, step_of

HOSTILE = '<b onmouseover="x">&\u202eevil</b>'


async def run_mix(pool: asyncpg.Pool, queue: pgqueue.Queue) -> None:
    """Jobs that complete, fail once and then complete, and fail until dead; run until none is due."""
    for n in range(7):
        await queue.enqueue("ok", {"n": n})
    for n in range(4):
        await queue.enqueue("flaky", {"n": n})
    for n in range(3):
        await queue.enqueue(HOSTILE, {"n": n}, max_attempts=2)
    worker = pgqueue.Worker(
        pool, queue=queue.name, concurrency=4, backoff=lambda _: 0.0
    )

    @worker.handler("ok")
    async def ok(job: pgqueue.Job) -> None:
        return None

    @worker.handler("flaky")
    async def flaky(job: pgqueue.Job) -> None:
        if job.attempts == 1:
            raise RuntimeError("first attempt fails")

    @worker.handler(HOSTILE)
    async def bad(job: pgqueue.Job) -> None:
        raise RuntimeError("always")

    await worker.run(until_empty=True)


async def counts_from_rows(
    pool: asyncpg.Pool, queue: str
) -> dict[str, tuple[int, int, int]]:
    """Per job type: (completed, failed attempts, dead), read from the jobs' rows (errors hold every failed attempt)."""
    records = await pool.fetch(
        """SELECT job_type,
                  count(*) FILTER (WHERE status = 'completed') AS completed,
                  coalesce(sum(jsonb_array_length(coalesce(errors, '[]'))), 0) AS failed,
                  count(*) FILTER (WHERE status = 'dead') AS dead
           FROM pgqueue_jobs WHERE queue = $1 GROUP BY job_type""",
        queue,
    )
    return {r["job_type"]: (r["completed"], r["failed"], r["dead"]) for r in records}


async def test_trend_equals_the_rows(pool: asyncpg.Pool, queue: pgqueue.Queue) -> None:
    await run_mix(pool, queue)
    admin = pgqueue.Admin(pool)
    rows = await admin.trend(queue=queue.name, since=timedelta(hours=1))
    expected = await counts_from_rows(pool, queue.name)
    assert expected == {"ok": (7, 0, 0), "flaky": (4, 4, 0), HOSTILE: (0, 6, 3)}
    assert {r.job_type: (r.completed, r.failed, r.dead) for r in rows} == expected
    assert [r.job_type for r in rows] == sorted(expected)
    for r in rows:
        assert r.queue == queue.name
        assert r.mean_run_time is not None
        assert r.mean_run_time >= 0
        assert r.p95_run_time is not None
        assert r.p95_run_time >= 0
        assert set(r.to_json()) == {
            "queue",
            "job_type",
            "completed",
            "failed",
            "dead",
            "mean_run_time",
            "p95_run_time",
        }
    # One type, and the window's sums as points.
    (only,) = await admin.trend(queue=queue.name, job_type="flaky", since=3600)
    assert (only.completed, only.failed) == (4, 4)
    points = await admin.trend_points(queue=queue.name, since=timedelta(hours=1))
    assert sum(p.completed for p in points) == 11
    assert sum(p.failed for p in points) == 10
    assert sum(p.dead for p in points) == 3
    # A bucket per minute, queue and type (one worker flushed at its stop).
    buckets = await pool.fetchval(
        "SELECT count(*) FROM pgqueue_trend WHERE queue = $1", queue.name
    )
    assert 3 <= buckets <= 6


async def test_flushes_add_up(pool: asyncpg.Pool, queue: pgqueue.Queue) -> None:
    """Two workers' flushes into the same minute add, histograms included."""
    await run_mix(pool, queue)
    await run_mix(pool, queue)
    (row,) = await pgqueue.Admin(pool).trend(queue=queue.name, job_type="ok")
    assert row.completed == 14
    histogram = await pool.fetch(
        "SELECT run_times FROM pgqueue_trend WHERE queue = $1 AND job_type = 'ok'",
        queue.name,
    )
    assert sum(sum(json.loads(h["run_times"]).values()) for h in histogram) == 14


async def test_old_buckets_are_outside_the_window(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    await run_mix(pool, queue)
    await pool.execute(
        "UPDATE pgqueue_trend SET bucket = bucket - interval '2 hours' WHERE queue = $1",
        queue.name,
    )
    admin = pgqueue.Admin(pool)
    assert await admin.trend(queue=queue.name) == []
    day = await admin.trend(queue=queue.name, since=timedelta(days=1))
    assert sum(r.completed for r in day) == 11


async def test_bad_input_raises_before_sql(pool: asyncpg.Pool) -> None:
    admin = pgqueue.Admin(pool)
    with pytest.raises(ValueError, match="since"):
        await admin.trend(since=0)
    with pytest.raises(TypeError):
        await admin.trend(since="1h")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="queue"):
        await admin.trend(queue="")
    with pytest.raises(ValueError, match="points"):
        await admin.trend_points(points=0)


async def test_missing_table_is_a_schema_error(fresh_dsn: str) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=2) as pool:
        await pool.execute("DROP TABLE pgqueue_trend")
        with pytest.raises(pgqueue.SchemaError):
            await pgqueue.Admin(pool).trend()


def test_histogram_buckets() -> None:
    for seconds in (0.0004, 0.001, 0.0123, 0.5, 3.0, 7200.0):
        k = bucket_of(seconds)
        assert abs(bucket_value(k) - seconds) / seconds < 0.09
    assert percentile({}, 0.95) is None
    # 95 fast runs and 5 slow ones: the 95th is a fast one; 94 and 6: a slow one.
    fast, slow = bucket_of(0.01), bucket_of(1.0)
    assert percentile({fast: 95, slow: 5}, 0.95) == bucket_value(fast)
    assert percentile({fast: 94, slow: 6}, 0.95) == bucket_value(slow)
    assert step_of(3600, 60) == 60
    assert step_of(86400, 60) == 1440
    assert step_of(60, 60) == 60


async def test_cli_stats_since(
    pool: asyncpg.Pool, dsn: str, queue: pgqueue.Queue
) -> None:
    from tests.test_cli import EXIT_OK, EXIT_USAGE, cli

    await run_mix(pool, queue)
    expected = await counts_from_rows(pool, queue.name)
    result = await cli(dsn, "stats", "--since", "1h", "--queue", queue.name, "--json")
    assert result.code == EXIT_OK, result
    found = result.json()
    assert {
        r["job_type"]: (r["completed"], r["failed"], r["dead"]) for r in found
    } == expected
    assert list(found[0]) == [
        "queue",
        "job_type",
        "completed",
        "failed",
        "dead",
        "mean_run_time",
        "p95_run_time",
    ]
    text = await cli(
        dsn, "stats", "--since", "1d", "--queue", queue.name, "--type", "flaky"
    )
    assert text.code == EXIT_OK, text
    assert "flaky" in text.out
    assert "p95 run" in text.out
    assert "ok" not in text.out.split()
    # A hostile type is printed as text, its controls made visible.
    hostile = await cli(dsn, "stats", "--since", "1h", "--queue", queue.name)
    assert "\u202e" not in hostile.out
    for bad in (["--since", "0"], ["--since", "soon"], ["--type", "flaky"]):
        assert (await cli(dsn, "stats", *bad)).code == EXIT_USAGE


def test_the_histogram_samples_past_its_bound() -> None:
    """Counts and sums are exact; past HISTOGRAM_SAMPLES runs a flush, the histogram is a sample of the same total."""
    import logging
    from datetime import UTC, datetime

    from pgqueue._engine.trend import HISTOGRAM_SAMPLES, TrendTally

    now = datetime.now(UTC)
    job: pgqueue.Job[dict[str, object]] = pgqueue.Job(
        id=1,
        queue="q",
        type="t",
        payload={},
        attempts=1,
        max_attempts=5,
        run_at=now,
        created_at=now,
    )
    runs = HISTOGRAM_SAMPLES * 4
    outcomes = [
        pgqueue.Outcome(
            job, pgqueue.OutcomeKind.COMPLETED, run_time=0.001 * (1 + n % 100)
        )
        for n in range(runs)
    ]
    outcomes.append(pgqueue.Outcome(job, pgqueue.OutcomeKind.DEAD))  # no handler ran
    outcomes.append(
        pgqueue.Outcome(job, pgqueue.OutcomeKind.SNOOZED, 5.0, run_time=0.1)
    )
    tally = TrendTally(["q"], logger=logging.getLogger("test"), fields={})
    tally.add(outcomes, ())
    (counts,) = tally._take().values()
    assert (counts.completed, counts.failed, counts.dead, counts.runs) == (
        runs,
        1,
        1,
        runs,
    )
    assert counts.run_time_sum == pytest.approx(
        sum(0.001 * (1 + n % 100) for n in range(runs))
    )
    assert sum(counts.histogram.values()) == runs
    p95 = percentile(counts.histogram, 0.95)
    assert p95 is not None
    assert p95 == pytest.approx(0.096, rel=0.09)
