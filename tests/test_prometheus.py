"""pgqueue.prometheus against a real server: exact values after real drains."""

from __future__ import annotations

import re
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import asyncpg
import pytest
from prometheus_client import CollectorRegistry, generate_latest

import pgqueue
from pgqueue.prometheus import (
    UNKNOWN_JOB_TYPE,
    ProducerMetrics,
    QueueCollector,
    WorkerMetrics,
    serve,
)
from pgqueue.testing._server import free_port
from tests.helpers import no_backoff, row, running, wait_for_row, wait_until
from tests.test_cli_secrets import listening_addresses


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_worker_metrics_after_a_drain(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    q = queue.name
    blocked = {"cancel": anyio.Event(), "stale": anyio.Event()}
    release = anyio.Event()
    worker = pgqueue.Worker(
        pool,
        queue=q,
        concurrency=4,
        backoff=no_backoff,
        rescue_after=60,
        middleware=[metrics.middleware],
        observers=[metrics.observer],
    )

    @worker.handler("ok")
    async def ok(_job: pgqueue.Job) -> None:
        return None

    @worker.handler("flaky")
    async def flaky(_job: pgqueue.Job) -> None:
        raise ValueError("boom")

    @worker.handler("snooze")
    async def snooze(job: pgqueue.Job) -> None:
        if job.snoozes == 0:
            raise pgqueue.Snooze(0)

    @worker.handler("cancel")
    async def cancel(_job: pgqueue.Job) -> None:
        blocked["cancel"].set()
        await anyio.sleep_forever()

    @worker.handler("stale")
    async def stale(_job: pgqueue.Job) -> None:
        blocked["stale"].set()
        await release.wait()

    ok_ids = [await queue.enqueue("ok", {}) for _ in range(3)]
    orphan = await queue.enqueue("ok", {})
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'running', attempts = 1,"
        " updated_at = now() - interval '1 hour' WHERE id = $1",
        orphan,
    )
    flaky_id = await queue.enqueue("flaky", {}, max_attempts=2)
    snooze_id = await queue.enqueue("snooze", {})
    cancel_id = await queue.enqueue("cancel", {})
    stale_id = await queue.enqueue("stale", {})

    async with running(worker):
        with anyio.fail_after(10):
            for event in blocked.values():
                await event.wait()
        for job_type in ("cancel", "stale"):
            assert (
                value(registry, "pgqueue_jobs_in_flight", queue=q, job_type=job_type)
                == 1
            )
        assert await queue.cancel(cancel_id) == {cancel_id: "requested"}
        await wait_for_row(pool, cancel_id, status="cancelled")
        # Rescued meanwhile by another worker: the row is pending again.
        await pool.execute(
            "UPDATE pgqueue_jobs SET status = 'pending',"
            " run_at = now() + interval '1 hour' WHERE id = $1",
            stale_id,
        )
        release.set()

        async def written() -> bool:
            return (
                value(registry, "pgqueue_jobs_finished_total", queue=q, job_type="stale", outcome="stale")
                == 1
            )  # fmt: skip

        await wait_until(written)
        for job_id in (*ok_ids, orphan, snooze_id):
            await wait_for_row(pool, job_id, status="completed")
        await wait_for_row(pool, flaky_id, status="dead")

    finished = {
        (sample.labels["job_type"], sample.labels["outcome"]): sample.value
        for family in registry.collect()
        if family.name == "pgqueue_jobs_finished"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels["queue"] == q
    }
    assert finished == {
        ("ok", "completed"): 4,
        ("flaky", "retried"): 1,
        ("flaky", "dead"): 1,
        ("snooze", "snoozed"): 1,
        ("snooze", "completed"): 1,
        ("cancel", "cancelled"): 1,
        ("stale", "stale"): 1,
    }
    assert value(registry, "pgqueue_jobs_rescued_total", queue=q, status="pending") == 1
    runs = {"ok": 4, "flaky": 2, "snooze": 2, "cancel": 1, "stale": 1}
    for job_type, count in runs.items():
        labels = {"queue": q, "job_type": job_type}
        assert value(registry, "pgqueue_job_duration_seconds_count", **labels) == count
        assert value(registry, "pgqueue_job_wait_seconds_count", **labels) == count
        assert value(registry, "pgqueue_jobs_in_flight", **labels) == 0
    # The blocked run lasted as long as the test held it.
    held = value(
        registry, "pgqueue_job_duration_seconds_sum", queue=q, job_type="stale"
    )
    assert held is not None
    assert held > 0
    # The rescued orphan ran again, as its second attempt.
    assert (await row(pool, orphan))["attempts"] == 2


async def test_wait_time_runs_from_run_at(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry, buckets=(1.0, 50.0, 70.0))
    worker = pgqueue.Worker(pool, queue=queue.name, middleware=[metrics.middleware])
    worker.register("t", _noop)
    job_id = await queue.enqueue("t", {})
    await pool.execute(
        "UPDATE pgqueue_jobs SET run_at = now() - interval '60 seconds' WHERE id = $1",
        job_id,
    )
    with anyio.fail_after(15):
        await worker.run(until_empty=True)
    labels = {"queue": queue.name, "job_type": "t"}
    assert value(registry, "pgqueue_job_wait_seconds_bucket", **labels, le="50.0") == 0
    assert value(registry, "pgqueue_job_wait_seconds_bucket", **labels, le="70.0") == 1


async def _noop(_job: pgqueue.Job) -> None:
    return None


async def test_producer_metrics_count_new_jobs_duplicates_and_failures(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    registry = CollectorRegistry()
    queue = pgqueue.Queue(pool, name=queue_name, hooks=[ProducerMetrics(registry)])
    key = f"{queue_name}-k"
    await queue.enqueue("a", {})
    await queue.enqueue("b", {}, unique_key=key)
    await queue.enqueue("b", {}, unique_key=key)
    with pytest.raises(pgqueue.DuplicateJobError):
        await queue.enqueue("b", {}, unique_key=key, on_conflict="raise")
    await queue.enqueue_many(
        [
            ("a", {}),
            ("a", {}),
            pgqueue.NewJob("b", {}, unique_key=key),
            pgqueue.NewJob("b", {}, unique_key=f"{key}2"),
            pgqueue.NewJob("b", {}, unique_key=f"{key}2"),
        ]
    )
    async with pool.acquire() as connection:
        closed = connection
    with pytest.raises(asyncpg.InterfaceError):
        await queue.enqueue("a", {}, connection=closed)

    def count(name: str, job_type: str) -> float | None:
        return value(registry, name, queue=queue_name, job_type=job_type)

    assert count("pgqueue_jobs_enqueued_total", "a") == 3
    assert count("pgqueue_jobs_enqueued_total", "b") == 2
    assert count("pgqueue_enqueue_duplicates_total", "a") is None
    assert count("pgqueue_enqueue_duplicates_total", "b") == 4
    assert value(registry, "pgqueue_enqueue_failures_total", queue=queue_name) == 1


async def test_queue_collector_reads_the_stats_from_its_cache(
    fresh_dsn: str, queue_name: str
) -> None:
    # A database of its own: on the run's shared table, grown past 10 MB by
    # other tests, completed jobs are estimated rather than counted.
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=2) as pool:
        await _collector_reads_its_cache(pool, pgqueue.Queue(pool, name=queue_name))


async def _collector_reads_its_cache(pool: asyncpg.Pool, queue: pgqueue.Queue) -> None:
    q = queue.name
    past = datetime.now(UTC) - timedelta(seconds=30)
    ready = [await queue.enqueue("t", {}, run_at=past) for _ in range(2)]
    await queue.enqueue("t", {}, run_at=datetime.now(UTC) + timedelta(hours=1))
    dead, cancelled, running_id, completed = [
        await queue.enqueue("t", {}) for _ in range(4)
    ]
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'dead', attempts = 5 WHERE id = $1", dead
    )
    assert await queue.cancel(cancelled) == {cancelled: "cancelled"}
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'running', attempts = 1,"
        " run_at = now() - interval '20 seconds' WHERE id = $1",
        running_id,
    )
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed', attempts = 1 WHERE id = $1",
        completed,
    )
    await queue.enqueue("t", {}, after=[running_id])
    registry = CollectorRegistry()
    collector = QueueCollector(pool, queue=q, ttl=60, registry=registry)

    def jobs(status: str) -> float | None:
        return value(registry, "pgqueue_queue_jobs", queue=q, status=status)

    assert jobs("ready") is None  # nothing read yet
    assert value(registry, "pgqueue_queue_stats_age_seconds") != value(
        registry, "pgqueue_queue_stats_age_seconds"
    )  # NaN
    await collector.refresh()
    counts = {
        "ready": 2,
        "scheduled": 1,
        "running": 1,
        "completed": 1,
        "dead": 1,
        "cancelled": 1,
        "waiting": 1,
    }
    assert {status: jobs(status) for status in counts} == counts
    lag = value(registry, "pgqueue_queue_lag_seconds", queue=q)
    assert lag is not None
    assert 29 < lag < 120
    longest = value(registry, "pgqueue_queue_longest_running_seconds", queue=q)
    assert longest is not None
    assert 19 < longest < 120
    age = value(registry, "pgqueue_queue_stats_age_seconds")
    assert age is not None
    assert 0 <= age < 10

    # A scrape reads the cache: the database is not asked again.
    await queue.enqueue("t", {})
    await pool.execute("DELETE FROM pgqueue_jobs WHERE id = $1", ready[0])
    assert jobs("ready") == 2
    await collector.refresh()
    assert jobs("ready") == 2  # one more, one fewer
    assert jobs("scheduled") == 1


async def test_queue_collector_run_refreshes_every_ttl(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    registry = CollectorRegistry()
    collector = QueueCollector(pool, queue=queue.name, ttl=0.05, registry=registry)

    def ready() -> float | None:
        return value(registry, "pgqueue_queue_jobs", queue=queue.name, status="ready")

    async with anyio.create_task_group() as tg:
        tg.start_soon(collector.run)

        async def seen(count: int) -> bool:
            return ready() == count

        await wait_until(lambda: seen(0))
        await queue.enqueue("t", {})
        await wait_until(lambda: seen(1))
        tg.cancel_scope.cancel()


async def test_queue_collector_keeps_to_its_queues_and_says_what_it_left_out(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    busy, quiet, idle = (f"{queue_name}-{n}" for n in ("busy", "quiet", "idle"))
    long = f"{queue_name}-" + "L" * 400  # allowed (at most 1,024 bytes), but long
    await pgqueue.Queue(pool, name=busy).enqueue_many([("t", {})] * 3)
    for name in (quiet, long):
        await pgqueue.Queue(pool, name=name).enqueue("t", {})

    registry = CollectorRegistry()
    listed = [busy, quiet, idle, long]
    collector = QueueCollector(pool, queues=listed, max_queues=3, registry=registry)
    await collector.refresh()
    text = generate_latest(registry).decode()
    labels = re.findall(r'pgqueue_queue_lag_seconds\{queue="([^"]*)"\}', text)
    # The three with the most jobs to do, ties by name; idle (none) left out.
    [cut] = [label for label in labels if label not in (busy, quiet)]
    assert re.fullmatch(re.escape(long[:200]) + r"…\(cut [0-9a-f]{8}\)", cut)
    assert len(labels) == 3
    assert value(registry, "pgqueue_queue_series_omitted") == 1
    assert value(registry, "pgqueue_queue_jobs", queue=busy, status="ready") == 3

    wide = CollectorRegistry()
    collector = QueueCollector(pool, queues=listed, registry=wide)
    await collector.refresh()
    assert value(wide, "pgqueue_queue_jobs", queue=idle, status="ready") == 0
    assert value(wide, "pgqueue_queue_series_omitted") == 0


def test_queue_collector_refuses_bad_arguments() -> None:
    for kwargs, error in (
        ({"ttl": 0}, ValueError),
        ({"max_queues": 0}, ValueError),
        ({"queues": "emails"}, TypeError),
        ({"queues": ["a\x1b"]}, ValueError),
        ({"queue": "a", "queues": ["b"]}, TypeError),
    ):
        with pytest.raises(error):
            QueueCollector(None, registry=CollectorRegistry(), **kwargs)  # type: ignore[arg-type]


async def test_serve_exposes_the_registry_over_http() -> None:
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    metrics.rescued.labels("q", "pending").inc(2)
    port = free_port()
    serve(port, "127.0.0.1", registry=registry)

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            body: bytes = r.read()
            return body.decode()

    text = await anyio.to_thread.run_sync(scrape)
    assert 'pgqueue_jobs_rescued_total{queue="q",status="pending"} 2.0' in text


async def test_job_types_without_a_handler_share_one_label(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    """A producer writing any number of unknown types grows no series."""
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry)
    worker = pgqueue.Worker(
        pool,
        queue=queue.name,
        middleware=[metrics.middleware],
        observers=[metrics.observer],
        unknown_types="dead",  # claimed, so counted
    )

    @worker.handler("known")
    async def known(_job: pgqueue.Job) -> None:
        return None

    hostile = [await queue.enqueue(f"hostile-{n}", {}) for n in range(30)]
    done = await queue.enqueue("known", {})
    async with running(worker):
        for job_id in hostile:
            await wait_for_row(pool, job_id, status="dead")
        await wait_for_row(pool, done, status="completed")

        async def counted() -> bool:
            return (
                value(registry, "pgqueue_jobs_finished_total", queue=queue.name, job_type=UNKNOWN_JOB_TYPE, outcome="dead")
                == 30
            )  # fmt: skip

        await wait_until(counted)
    labels = {
        sample.labels["job_type"]
        for family in registry.collect()
        for sample in family.samples
        if sample.labels.get("queue") == queue.name
    }
    assert labels == {"known", UNKNOWN_JOB_TYPE}


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux's /proc")
async def test_serve_listens_on_this_machine_only_by_default() -> None:
    port = free_port()
    serve(port, registry=CollectorRegistry())
    assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1
