"""The worker against a real server: claims, outcomes, fencing, rescue, drain, wakeups."""

from __future__ import annotations

import json
import logging
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import asyncpg
import pytest

import pgqueue
from pgqueue._sql import claims as claims_sql
from pgqueue._sql import literals
from pgqueue._sql import outcomes as outcomes_sql
from tests.go_module import GO_ENQUEUE
from tests.helpers import (
    RecordingLogger,
    no_backoff,
    noop,
    row,
    rows,
    running,
    wait_for_row,
    wait_until,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


async def _statuses(pool: asyncpg.Pool, queue: str) -> Counter[str]:
    """How many of the queue's rows are in each status."""
    return Counter(r["status"] for r in await rows(pool, queue))


async def test_processes_a_job(pool: asyncpg.Pool, queue: pgqueue.Queue) -> None:
    seen: list[pgqueue.Job] = []
    done = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("send_welcome_email")
    async def handle(job: pgqueue.Job) -> None:
        seen.append(job)
        done.set()

    job_id = await queue.enqueue("send_welcome_email", {"user_id": "01J5"})
    async with running(worker):
        with anyio.fail_after(10):
            await done.wait()
        stored = await wait_for_row(pool, job_id, status="completed")
    [job] = seen
    assert job.id == job_id
    assert job.queue == queue.name
    assert job.type == "send_welcome_email"
    assert job.payload == {"user_id": "01J5"}
    assert job.attempts == 1
    assert job.max_attempts == 5
    assert job.last_error is None
    assert job.created_at == stored["created_at"]
    assert job.run_at == stored["run_at"]
    assert stored["attempts"] == 1
    assert stored["completed_at"] is not None


async def test_claims_jobs_another_producer_dated_minus_infinity(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # asyncpg reads '-infinity' as a naive datetime.min; the worker must still
    # find its place in line among aware times when both come in one claim.
    await pool.execute(
        "INSERT INTO pgqueue_jobs (queue, job_type, run_at)"
        " VALUES ($1, 't', '-infinity'), ($1, 't', now()), ($1, 't', now())",
        queue.name,
    )
    ran: list[datetime] = []
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=2)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        ran.append(job.run_at)

    with anyio.fail_after(10):
        await worker.run(until_empty=True)
    assert len(ran) == 3
    # Handed to the handler as an aware time, as every time is.
    assert datetime.min.replace(tzinfo=UTC) in ran
    assert all(t.tzinfo is not None for t in ran)
    assert await _statuses(pool, queue.name) == {"completed": 3}


async def test_does_not_claim_future_jobs(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    ran: list[int] = []
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=4)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        ran.append(job.id)

    future = await queue.enqueue("t", {}, run_at=datetime.now(UTC) + timedelta(hours=1))
    now = await queue.enqueue("t", {})
    async with running(worker):
        await wait_for_row(pool, now, status="completed")
    assert ran == [now]
    stored = await row(pool, future)
    assert (stored["status"], stored["attempts"]) == ("pending", 0)


async def test_claims_in_run_at_then_id_order(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    order: list[int] = []
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=1, listen=False)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        order.append(job.payload)

    now = datetime.now(UTC)
    await queue.enqueue_many(
        [
            pgqueue.NewJob("t", 3, run_at=now - timedelta(seconds=1)),
            pgqueue.NewJob("t", 1, run_at=now - timedelta(seconds=3)),
            pgqueue.NewJob("t", 4, run_at=now - timedelta(seconds=1)),
            pgqueue.NewJob("t", 2, run_at=now - timedelta(seconds=2)),
        ]
    )
    async with running(worker):
        await wait_until(lambda: _all_done(pool, queue.name))
    assert order == [1, 2, 3, 4]


async def _all_done(pool: asyncpg.Pool, queue: str, status: str = "completed") -> bool:
    left: int = await pool.fetchval(
        "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1 AND status <> $2",
        queue,
        status,
    )
    return left == 0


async def test_full_batch_claims_again_without_waiting(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # concurrency 1, no LISTEN and a one-minute poll: only re-claiming after
    # a full batch can run five jobs within the deadline.
    worker = pgqueue.Worker(
        pool, queue=queue.name, concurrency=1, poll_interval=60, listen=False
    )
    worker.register("t", noop)
    await queue.enqueue_many([("t", i) for i in range(5)])
    async with running(worker):
        await wait_until(lambda: _all_done(pool, queue.name), within=10)


async def test_two_workers_run_each_job_exactly_once(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    calls: Counter[int] = Counter()
    workers = [pgqueue.Worker(pool, queue=queue.name, concurrency=4) for _ in range(2)]

    async def handle(job: pgqueue.Job) -> None:
        calls[job.id] += 1
        await anyio.lowlevel.checkpoint()

    for worker in workers:
        worker.register("t", handle)
    ids = await queue.enqueue_many([("t", i) for i in range(300)])
    async with running(workers[0]), running(workers[1]):
        await wait_until(lambda: _all_done(pool, queue.name), within=30)
    assert set(calls) == set(ids)
    assert set(calls.values()) == {1}
    assert {r["attempts"] for r in await rows(pool, queue.name)} == {1}


async def test_retries_until_dead_with_the_error_recorded(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name, max_attempts=3)
    attempts: list[int] = []
    worker = pgqueue.Worker(
        pool, queue=queue_name, backoff=no_backoff, poll_interval=0.05
    )

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        attempts.append(job.attempts)
        msg = f"boom {job.attempts}"
        raise RuntimeError(msg)

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        stored = await wait_for_row(pool, job_id, status="dead")
    assert attempts == [1, 2, 3]
    assert stored["attempts"] == 3
    assert stored["last_error"] == "RuntimeError: boom 3"
    assert stored["completed_at"] is None


async def test_retry_waits_for_backoff_on_the_database_clock(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(
        pool, queue=queue.name, backoff=lambda attempt: 3600.0 * attempt
    )

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        raise ValueError

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        stored = await wait_for_row(pool, job_id, status="pending", attempts=1)
    now = await pool.fetchval("SELECT now()")
    assert stored["last_error"] == "ValueError"
    assert timedelta(minutes=59) < stored["run_at"] - now <= timedelta(hours=1)


async def test_permanent_skips_retries(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, backoff=no_backoff)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        try:
            json.loads("{")
        except ValueError as exc:
            msg = "unparseable payload"
            raise pgqueue.Permanent(msg) from exc

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        stored = await wait_for_row(pool, job_id, status="dead")
    assert stored["attempts"] == 1
    assert stored["last_error"] == "Permanent: unparseable payload"


async def test_unregistered_type_goes_dead(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, unknown_types="dead")
    worker.register("known", noop)
    job_id = await queue.enqueue("unknown", {})
    async with running(worker):
        stored = await wait_for_row(pool, job_id, status="dead")
    assert stored["last_error"] == "no handler registered for job type 'unknown'"
    assert stored["attempts"] == 1


async def test_handler_bug_is_retried_then_completes(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(
        pool, queue=queue.name, backoff=no_backoff, poll_interval=0.05
    )

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        if job.attempts == 1:
            _ = 1 / 0

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        stored = await wait_for_row(pool, job_id, status="completed")
    assert stored["attempts"] == 2
    assert stored["last_error"] == "ZeroDivisionError: division by zero"


async def test_notify_wakes_an_idle_worker(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    done = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        done.set()

    async with running(worker):
        await wait_until(_listening(worker))
        await queue.enqueue("t", {})
        with anyio.fail_after(5):
            await done.wait()


def _listening(worker: pgqueue.Worker, other_than: int | None = None) -> Any:
    async def check() -> bool:
        return worker.listener_pid is not None and worker.listener_pid != other_than

    return check


async def test_listen_reconnects_after_the_backend_is_terminated(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    done = anyio.Event()
    logger = RecordingLogger()
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60, logger=logger)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        done.set()

    async with running(worker):
        await wait_until(_listening(worker))
        old_pid = worker.listener_pid
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", old_pid)
        await wait_until(_listening(worker, other_than=old_pid))
        await logger.wait_for("LISTEN connection re-established")
        await queue.enqueue("t", {})
        with anyio.fail_after(5):
            await done.wait()


async def test_graceful_stop_drains_an_in_flight_job(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    started, release = anyio.Event(), anyio.Event()
    ran: list[int] = []
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=2)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        ran.append(job.id)
        started.set()
        await release.wait()

    first = await queue.enqueue("t", {})
    stopped = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            await started.wait()

        async def stop() -> None:
            await worker.stop()
            stopped.set()

        tg.start_soon(stop)
        await wait_until(lambda: _claim_stopped(worker))
        second = await queue.enqueue("t", {})
        assert not stopped.is_set()
        release.set()
        with anyio.fail_after(10):
            await stopped.wait()
    assert ran == [first]
    assert (await row(pool, first))["status"] == "completed"
    assert (await row(pool, second))["status"] == "pending"


async def _claim_stopped(worker: pgqueue.Worker) -> bool:
    return worker._claim_scope.cancel_called


async def test_cancelling_run_drains_then_propagates(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    started, release = anyio.Event(), anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        started.set()
        await release.wait()

    job_id = await queue.enqueue("t", {})
    finished = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def run_then_mark() -> None:
            with anyio.CancelScope() as scope:
                outer.append(scope)
                await worker.run()
            finished.set()

        outer: list[anyio.CancelScope] = []
        tg.start_soon(run_then_mark)
        with anyio.fail_after(10):
            await started.wait()
        outer[0].cancel()
        await wait_until(lambda: _claim_stopped(worker))
        assert not finished.is_set()
        release.set()
        with anyio.fail_after(10):
            await finished.wait()
    assert outer[0].cancelled_caught
    assert (await row(pool, job_id))["status"] == "completed"


async def test_stop_timeout_returns_cut_off_jobs_to_pending(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    started = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        started.set()
        await anyio.sleep_forever()

    job_id = await queue.enqueue("t", {})
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            await started.wait()
        with pytest.raises(TimeoutError, match="1 job"):
            await worker.stop(timeout=0.2)
        # By the time stop() raised, the job was back in pending.
        stored = await row(pool, job_id)
    assert stored["status"] == "pending"
    assert stored["attempts"] == 1
    assert "shut down" in stored["last_error"]


async def test_stop_flushes_every_batched_outcome(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    handled = 0
    all_handled = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=50)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        nonlocal handled
        handled += 1
        if handled == 500:
            all_handled.set()

    await queue.enqueue_many([("t", i) for i in range(500)])
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(30):
            await all_handled.wait()
        await worker.stop()
    assert await _statuses(pool, queue.name) == {"completed": 500}


def _handlers_running(worker: pgqueue.Worker, n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return worker.running_jobs == n

    return check


async def test_without_prefetch_claims_only_free_slots(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    release = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=2)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        await release.wait()

    await queue.enqueue_many([("t", i) for i in range(5)])
    async with running(worker):
        await wait_until(_handlers_running(worker, 2))
        # The claim that started both handlers has returned: nothing more is held.
        assert await _statuses(pool, queue.name) == {"running": 2, "pending": 3}
        release.set()

        async def all_completed() -> bool:
            return await _statuses(pool, queue.name) == {"completed": 5}

        await wait_until(all_completed)


async def _claimed_ahead(
    pool: asyncpg.Pool, queue: pgqueue.Queue, **options: Any
) -> Counter[str]:
    """Ten instant jobs, then twenty that block: the rows held once two block."""
    release = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=2, **options)

    @worker.handler("fast")
    async def fast(_job: pgqueue.Job) -> None:
        pass

    @worker.handler("slow")
    async def slow(_job: pgqueue.Job) -> None:
        await release.wait()

    now = datetime.now(UTC)
    await queue.enqueue_many(
        [
            pgqueue.NewJob("fast", i, run_at=now - timedelta(minutes=1))
            for i in range(10)
        ]
    )
    await queue.enqueue_many([("slow", i) for i in range(20)])
    async with running(worker):
        await wait_until(_handlers_running(worker, 2))
        held = Counter[str]()

        async def settled() -> bool:
            nonlocal held
            held = await _statuses(pool, queue.name)
            return held["completed"] == 10 and worker.running_jobs == 2

        await wait_until(settled)
        if options.get("prefetch") is None:
            # The claim ahead may still be in flight.
            async def ahead() -> bool:
                nonlocal held
                held = await _statuses(pool, queue.name)
                return held["running"] == 4

            await wait_until(ahead)
        release.set()
    return held


async def test_by_default_a_backlog_of_short_jobs_is_claimed_ahead(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # Short handlers and full claims: up to concurrency more are held ready.
    held = await _claimed_ahead(pool, queue)
    assert held == {"completed": 10, "running": 4, "pending": 16}


async def test_prefetch_0_never_claims_ahead(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    held = await _claimed_ahead(pool, queue, prefetch=0)
    assert held == {"completed": 10, "running": 2, "pending": 18}


async def test_prefetched_jobs_not_started_are_given_back_on_stop(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    release = anyio.Event()
    started: list[int] = []
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=1, prefetch=3)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        started.append(job.id)
        await release.wait()

    ids = await queue.enqueue_many([("t", i) for i in range(6)])
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await wait_until(_handlers_running(worker, 1))
        # One handler runs; three more jobs are claimed and held for it.
        assert await _statuses(pool, queue.name) == {"running": 4, "pending": 2}
        tg.start_soon(worker.stop)
        await wait_until(lambda: _claim_stopped(worker))
        release.set()
    assert started == [ids[0]]
    stored = {r["id"]: r for r in await rows(pool, queue.name)}
    assert stored[ids[0]]["status"] == "completed"
    for job_id in ids[1:]:
        # Back in line as if never claimed: no attempt used, no error.
        assert stored[job_id]["status"] == "pending"
        assert stored[job_id]["attempts"] == 0
        assert stored[job_id]["last_error"] is None


async def test_prefetch_runs_every_job_exactly_once(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    seen: Counter[int] = Counter()
    done = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=5, prefetch=20)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        seen[job.id] += 1
        await anyio.lowlevel.checkpoint()
        if len(seen) == 300:
            done.set()

    ids = await queue.enqueue_many([("t", i) for i in range(300)])
    async with running(worker):
        with anyio.fail_after(30):
            await done.wait()
    assert seen == Counter(ids)
    assert await _statuses(pool, queue.name) == {"completed": 300}


async def _drain_with_a_job_put_behind(
    pool: asyncpg.Pool, queue: pgqueue.Queue, backlog: int, poll_interval: float
) -> list[str]:
    """Drain ``backlog`` jobs one at a time; the first handler enqueues a job
    back-dated an hour, behind every job in line. Return the order they ran."""
    order: list[str] = []
    done = anyio.Event()
    worker = pgqueue.Worker(
        pool, queue=queue.name, concurrency=1, poll_interval=poll_interval
    )

    @worker.handler("backlog")
    async def in_line(_job: pgqueue.Job) -> None:
        order.append("backlog")
        if len(order) == 1:
            an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
            await queue.enqueue("behind", {}, run_at=an_hour_ago)
        if len(order) == backlog + 1:
            done.set()

    @worker.handler("behind")
    async def behind(_job: pgqueue.Job) -> None:
        order.append("behind")
        if len(order) == backlog + 1:
            done.set()

    await queue.enqueue_many([("backlog", i) for i in range(backlog)])
    async with running(worker):
        with anyio.fail_after(10):
            await done.wait()
    assert await _statuses(pool, queue.name) == {"completed": backlog + 1}
    return order


async def test_a_job_put_behind_a_draining_worker_waits_no_longer_than_a_poll(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # While the backlog lasts, claims start past the last job taken; one from
    # the head of the line every poll_interval finds the job put behind.
    # 1,000 claims of one job take far longer than one 50 ms poll.
    order = await _drain_with_a_job_put_behind(pool, queue, 1_000, 0.05)
    assert order.index("behind") < len(order) - 1, "ran only after the backlog"


async def test_a_job_put_behind_a_draining_worker_runs_when_the_backlog_ends(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # The poll is 60 s away: only the claim from the head that follows a
    # short claim from past the head finds the job before the deadline.
    order = await _drain_with_a_job_put_behind(pool, queue, 50, 60.0)
    assert sorted(order) == ["backlog"] * 50 + ["behind"]


async def test_a_stale_release_cannot_touch_the_attempt_that_superseded_it(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("t", {})
    (first,) = await pool.fetch(
        claims_sql.CLAIM, queue.name, 1, *literals.claim_places({})
    )
    await _orphan(pool, job_id, attempts=first["attempts"])
    assert [
        r["status"]
        for r in await pool.fetch(outcomes_sql.RESCUE, [queue.name], 60, 1000)
    ] == ["pending"]
    (second,) = await pool.fetch(
        claims_sql.CLAIM, queue.name, 1, *literals.claim_places({})
    )
    written = await pool.fetch(
        outcomes_sql.FINISH,
        literals.array([job_id]),
        literals.array([first["attempts"]]),
        ["released"],
        literals.array([0.0]),
        [None],
        [None],
    )
    assert written == []
    stored = await row(pool, job_id)
    assert stored["status"] == "running"
    assert stored["attempts"] == second["attempts"] == 2


async def _orphan(pool: asyncpg.Pool, job_id: int, *, attempts: int) -> None:
    """Make the job look claimed by a worker that died an hour ago."""
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'running', attempts = $2,"
        " updated_at = now() - interval '1 hour' WHERE id = $1",
        job_id,
        attempts,
    )


async def test_rescues_a_stuck_running_job(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    attempts: list[int] = []
    job_id = await queue.enqueue("t", {})
    await _orphan(pool, job_id, attempts=1)
    worker = pgqueue.Worker(pool, queue=queue.name, rescue_after=60)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        attempts.append(job.attempts)

    async with running(worker):
        stored = await wait_for_row(pool, job_id, status="completed")
    assert attempts == [2]
    assert stored["attempts"] == 2


async def test_rescue_dead_letters_exhausted_jobs_without_running_them(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    ran: list[int] = []
    job_id = await queue.enqueue("t", {}, max_attempts=2)
    await _orphan(pool, job_id, attempts=2)
    worker = pgqueue.Worker(pool, queue=queue.name, rescue_after=60)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        ran.append(job.id)

    async with running(worker):
        stored = await wait_for_row(pool, job_id, status="dead")
    assert ran == []
    assert stored["attempts"] == 2
    assert "max attempts" in stored["last_error"]


async def test_a_stale_run_cannot_overwrite_the_run_that_superseded_it(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # Worker A runs attempt 1 and is cut off from the database long enough
    # for its row to look orphaned (its heartbeat is an hour away); worker B
    # rescues the job and completes attempt 2; then A's attempt 1 fails.
    first_started, release_first = anyio.Event(), anyio.Event()
    logger = RecordingLogger()
    stale = pgqueue.Worker(pool, queue=queue.name, rescue_after=3 * 3600, logger=logger)
    fresh = pgqueue.Worker(pool, queue=queue.name, rescue_after=60)

    @stale.handler("t")
    async def first_run(_job: pgqueue.Job) -> None:
        first_started.set()
        await release_first.wait()
        msg = "the stale run failed"
        raise RuntimeError(msg)

    fresh.register("t", noop)
    job_id = await queue.enqueue("t", {})
    async with running(stale):
        with anyio.fail_after(10):
            await first_started.wait()
        await pool.execute(
            "UPDATE pgqueue_jobs SET updated_at = now() - interval '1 hour' WHERE id = $1",
            job_id,
        )
        async with running(fresh):
            await wait_for_row(pool, job_id, status="completed", attempts=2)
        release_first.set()
        dropped = await logger.wait_for("stale run superseded")
    assert dropped["attempt"] == 1
    stored = await row(pool, job_id)
    assert (stored["status"], stored["attempts"], stored["last_error"]) == (
        "completed",
        2,
        None,
    )


async def test_heartbeats_keep_a_long_job_on_a_live_worker_from_rescue(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # rescue_after 0.3 s: the sweep runs every 0.15 s and would rescue the
    # job about twenty times in 2 s if heartbeats did not keep its row fresh.
    calls: list[int] = []
    worker = pgqueue.Worker(
        pool, queue=queue.name, concurrency=2, poll_interval=0.05, rescue_after=0.3
    )

    @worker.handler("t")
    async def long_job(job: pgqueue.Job) -> None:
        calls.append(job.attempts)
        await anyio.sleep(2)  # the work itself, not synchronisation

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        stored = await wait_for_row(pool, job_id, status="completed")
    assert calls == [1]
    assert stored["attempts"] == 1


async def test_job_timeout_fails_the_attempt(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, job_timeout=0.2)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        await anyio.sleep_forever()

    job_id = await queue.enqueue("t", {}, max_attempts=1)
    async with running(worker):
        stored = await wait_for_row(pool, job_id, status="dead")
    assert stored["last_error"] == "job timed out after 0.2 s"


async def test_retain_prunes_only_old_finished_rows(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    ids = await queue.enqueue_many([("t", i) for i in range(5)])
    ages = [
        ("completed", 7200),
        ("dead", 7200),
        ("completed", 10),
        ("pending", 7200),
        ("running", 7200),
    ]
    for job_id, (status, age) in zip(ids, ages, strict=True):
        await pool.execute(
            "UPDATE pgqueue_jobs SET status = $2, run_at = now() + interval '1 hour',"
            " updated_at = now() - make_interval(secs => $3) WHERE id = $1",
            job_id,
            status,
            age,
        )
    worker = pgqueue.Worker(pool, queue=queue.name, retain=3600, rescue_after=1e6)
    async with running(worker):
        await wait_until(lambda: _count(pool, queue.name, 3))
    assert [r["id"] for r in await rows(pool, queue.name)] == ids[2:]


async def _count(pool: asyncpg.Pool, queue: str, expected: int) -> bool:
    return len(await rows(pool, queue)) == expected


async def test_middleware_wraps_in_order(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    trace: list[str] = []

    def middleware(name: str) -> pgqueue.Middleware:
        def wrap(handler: pgqueue.Handler) -> pgqueue.Handler:
            async def wrapped(job: pgqueue.Job) -> None:
                trace.append(f"{name} before")
                await handler(job)
                trace.append(f"{name} after")

            return wrapped

        return wrap

    worker = pgqueue.Worker(
        pool, queue=queue.name, middleware=[middleware("outer"), middleware("inner")]
    )

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        trace.append("handler")

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        await wait_for_row(pool, job_id, status="completed")
    assert trace == [
        "outer before",
        "inner before",
        "handler",
        "inner after",
        "outer after",
    ]


async def test_a_job_written_by_the_go_module_runs(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    seen: list[pgqueue.Job] = []
    worker = pgqueue.Worker(pool, queue=queue_name, poll_interval=60)

    @worker.handler("send_welcome_email")
    async def handle(job: pgqueue.Job) -> None:
        seen.append(job)

    async with running(worker):
        await wait_until(_listening(worker))
        job_id = await pool.fetchval(
            GO_ENQUEUE, queue_name, "send_welcome_email", '{"user_id":"01J5"}', 5
        )
        await wait_for_row(pool, job_id, within=5, status="completed")
    assert [(j.id, j.payload, j.attempts) for j in seen] == [
        (job_id, {"user_id": "01J5"}, 1)
    ]


async def test_run_returns_promptly_when_listen_server_is_unreachable(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    done = anyio.Event()
    worker = pgqueue.Worker(
        pool,
        queue=queue.name,
        listen="postgresql://postgres@127.0.0.1:1/none",
        poll_interval=0.05,
    )

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        done.set()

    await queue.enqueue("t", {})
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await done.wait()  # polling still works without LISTEN
            tg.cancel_scope.cancel()
    with anyio.fail_after(5), anyio.CancelScope() as scope:
        # A second worker cancelled before it ever claimed also returns at once.
        other = pgqueue.Worker(
            pool, queue=queue.name, listen="postgresql://postgres@127.0.0.1:1/none"
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(other.run)
            await anyio.lowlevel.checkpoint()
            scope.cancel()


async def test_second_run_and_late_register_raise(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name)
    async with running(worker):
        with pytest.raises(pgqueue.AlreadyStartedError):
            await worker.run()
        with pytest.raises(pgqueue.AlreadyStartedError):
            worker.register("late", noop)
    with pytest.raises(pgqueue.AlreadyStartedError):
        await worker.run()


async def test_stop_before_run_makes_run_return(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name)
    await worker.stop()
    job_id = await queue.enqueue("t", {})
    with anyio.fail_after(5):
        await worker.run()
    assert (await row(pool, job_id))["status"] == "pending"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"concurrency": 0}, ValueError),
        ({"concurrency": 1.5}, TypeError),
        ({"prefetch": -1}, ValueError),
        ({"prefetch": 2.0}, TypeError),
        ({"poll_interval": 0}, ValueError),
        ({"poll_interval": float("nan")}, ValueError),
        ({"rescue_after": -1}, ValueError),
        ({"job_timeout": 0}, ValueError),
        ({"retain": -5}, ValueError),
        ({"queue": ""}, ValueError),
        ({"listen": 1}, TypeError),
        ({"backoff": 5}, TypeError),
        ({"middleware": [None]}, TypeError),
    ],
)
def test_constructor_validates(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        pgqueue.Worker(None, **kwargs)  # type: ignore[arg-type]


def test_register_validates() -> None:
    worker = pgqueue.Worker(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="empty"):
        worker.register("", noop)
    with pytest.raises(TypeError, match="callable"):
        worker.register("t", "not a function")  # type: ignore[arg-type]
    assert worker.handler("t")(noop) is noop
    assert repr(worker) == "Worker(queue='default', concurrency=2, state='new')"


@pytest.mark.parametrize("attempt", [-1, 0, 1, 2, 3, 7, 8, 9, 100])
def test_default_backoff_doubles_to_a_ceiling(attempt: int) -> None:
    base = 2 ** min(max(attempt, 1), 8)
    for _ in range(50):
        assert base <= pgqueue.default_backoff(attempt) <= base * 1.25
    assert pgqueue.default_backoff(100) <= 320


def test_is_permanent() -> None:
    permanent = pgqueue.Permanent("x")
    assert pgqueue.is_permanent(permanent)
    assert not pgqueue.is_permanent(ValueError())
    chained = RuntimeError("outer")
    chained.__cause__ = permanent
    assert pgqueue.is_permanent(chained)
    assert pgqueue.is_permanent(ExceptionGroup("g", [ValueError(), permanent]))
    assert not pgqueue.is_permanent(ExceptionGroup("g", [ValueError()]))


async def test_run_until_empty_returns_when_nothing_is_ready(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    seen: list[tuple[int, int]] = []
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=3, backoff=no_backoff)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        seen.append((job.payload, job.attempts))
        if job.payload == 0 and job.attempts == 1:
            msg = "retried at once"
            raise RuntimeError(msg)
        if job.payload == 1:
            await queue.enqueue("t", 99)  # a job enqueued by a job runs too

    future = await queue.enqueue("t", 5, run_at=datetime.now(UTC) + timedelta(hours=1))
    await queue.enqueue_many([("t", i) for i in range(4)])
    with anyio.fail_after(10):
        await worker.run(until_empty=True)
    assert sorted(seen) == [(0, 1), (0, 2), (1, 1), (2, 1), (3, 1), (99, 1)]
    assert await _statuses(pool, queue.name) == {"completed": 5, "pending": 1}
    assert (await row(pool, future))["status"] == "pending"


async def test_a_retry_due_before_the_next_poll_runs_on_time(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # poll_interval 60 and no LISTEN: only the worker's own retry timer can
    # run attempt 2 within the deadline.
    worker = pgqueue.Worker(
        pool, queue=queue.name, poll_interval=60, listen=False, backoff=lambda _: 0.2
    )

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        if job.attempts == 1:
            raise RuntimeError

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        stored = await wait_for_row(pool, job_id, within=5, status="completed")
    assert stored["attempts"] == 2


async def test_many_retries_falling_due_at_different_times_all_run_on_time(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # Each job's retry falls due at its own moment; the worker must keep
    # track of every one, not only the earliest, to beat its 60 s poll.
    failures = 0

    def staggered(_attempt: int) -> float:
        return 0.05 + 0.03 * failures

    worker = pgqueue.Worker(
        pool,
        queue=queue.name,
        concurrency=4,
        poll_interval=60,
        listen=False,
        backoff=staggered,
    )

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        nonlocal failures
        if job.attempts == 1:
            failures += 1
            raise RuntimeError

    ids = await queue.enqueue_many([("t", i) for i in range(12)])
    async with running(worker):
        await wait_until(lambda: _all_done(pool, queue.name), within=8)
    assert [(await row(pool, i))["attempts"] for i in ids] == [2] * 12


async def test_a_wakeup_while_prefetched_jobs_fill_the_worker_is_not_lost(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # concurrency 2 + prefetch 2: a claim waits for 2 free slots. With 3 jobs
    # held, the NOTIFY for 500 more arrives when only 1 slot is free; once
    # the 3 finish, the worker must claim at once, not at its 60 s poll.
    release = anyio.Event()
    worker = pgqueue.Worker(
        pool, queue=queue.name, concurrency=2, prefetch=2, poll_interval=60
    )

    @worker.handler("first")
    async def first(_job: pgqueue.Job) -> None:
        await release.wait()

    worker.register("t", noop)
    async with running(worker):
        await queue.enqueue_many([("first", n) for n in range(3)])
        await wait_until(lambda: _held(worker, 3))
        await queue.enqueue_many([("t", n) for n in range(500)])
        await wait_until(lambda: _more(worker))  # the wakeup was taken in
        release.set()
        await wait_until(lambda: _all_done(pool, queue.name), within=15)


async def _held(worker: pgqueue.Worker, n: int) -> bool:
    return worker._claims.held == n


async def _more(worker: pgqueue.Worker) -> bool:
    return worker._lanes[0].policy.more


async def test_jobs_of_one_claim_start_in_run_at_order(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # One claim takes all five (prefetch), whose ids run against run_at.
    order: list[int] = []
    worker = pgqueue.Worker(
        pool, queue=queue.name, concurrency=1, prefetch=10, listen=False
    )

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        order.append(job.payload)

    now = datetime.now(UTC)
    await queue.enqueue_many(
        [pgqueue.NewJob("t", n, run_at=now - timedelta(seconds=n)) for n in range(5)]
    )
    with anyio.fail_after(10):
        await worker.run(until_empty=True)
    assert order == [4, 3, 2, 1, 0]


async def test_a_claim_skips_rows_another_claim_holds_open(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # Without SKIP LOCKED the worker's claim would wait for the other
    # transaction, which stays open until the worker has run the next job.
    ran: list[int] = []
    first, second = await queue.enqueue_many([("t", 1), ("t", 2)])
    other = await asyncpg.connect(dsn)
    try:
        async with other.transaction():
            held = await other.fetch(
                claims_sql.CLAIM,
                queue.name,
                1,
                *literals.claim_places({}),
            )
            assert [r["id"] for r in held] == [first]
            worker = pgqueue.Worker(pool, queue=queue.name, listen=False)

            @worker.handler("t")
            async def handle(job: pgqueue.Job) -> None:
                ran.append(job.id)

            with anyio.fail_after(5):
                await worker.run(until_empty=True)
            assert ran == [second]
    finally:
        await other.close()
    assert (await row(pool, first))["status"] == "running"


async def test_log_messages_do_not_repeat_the_loggers_name(
    pool: asyncpg.Pool, queue: pgqueue.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="pgqueue")
    worker = pgqueue.Worker(
        pool, queue=queue.name, backoff=no_backoff, unknown_types="dead"
    )

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        if job.attempts == 1:
            raise RuntimeError

    await queue.enqueue("t", {})
    await queue.enqueue("unknown", {})
    with anyio.fail_after(10):
        await worker.run(until_empty=True)
    messages = {r.getMessage() for r in caplog.records if r.name == "pgqueue"}
    assert "worker starting" in messages
    assert any(m.endswith("failed; will retry in 0s: RuntimeError") for m in messages)
    assert any("dead: no handler registered" in m for m in messages)
    assert not [m for m in messages if m.startswith("pgqueue")]
