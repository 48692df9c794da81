"""The job lifecycle of schema v2 against a real server: priorities, unique
jobs, cancel, snooze and retry-after, results, and the fencing invariant."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue._sql.channels import OUTCOMES_CHANNEL
from pgqueue._sql.claims import CLAIM
from pgqueue._sql.literals import array, claim_places
from pgqueue._sql.outcomes import COMPLETE, FINISH, RESCUE
from tests.helpers import (
    RecordingLogger,
    drain,
    listening,
    no_backoff,
    noop,
    queue_count,
    row,
    rows,
    running,
    wait_for_row,
    wait_until,
)

NO_SERVER = "postgresql://nobody@127.0.0.1:1/none"


# --- priority -------------------------------------------------------------------------


async def test_higher_priorities_run_first_then_by_run_at_and_id(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    order: list[str] = []
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=1, prefetch=20)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        order.append(job.payload)

    earlier = datetime.now(UTC) - timedelta(minutes=1)
    await queue.enqueue_many(
        [
            pgqueue.NewJob("t", "0-late"),
            pgqueue.NewJob("t", "5-late", priority=5),
            pgqueue.NewJob("t", "-5", priority=-5),
            pgqueue.NewJob("t", "0-early", run_at=earlier),
            pgqueue.NewJob("t", "5-early", priority=5, run_at=earlier),
            pgqueue.NewJob("t", "2", priority=2),
        ]
    )
    await queue.enqueue("t", "0-last")
    await drain(worker)
    assert order == ["5-early", "5-late", "2", "0-early", "0-late", "0-last", "-5"]
    assert {r["priority"] for r in await rows(pool, queue.name)} == {5, 2, 0, -5}


async def test_a_higher_priority_job_overtakes_a_backlog_at_once(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # poll_interval=60: only its NOTIFY can make the worker look for it, and
    # the claim round after that must take it ahead of the backlog.
    started: list[str] = []
    urgent_enqueued = anyio.Event()
    committed_at: list[int] = []  # jobs started when the urgent one's enqueue returned
    backlog = 2000
    worker = pgqueue.Worker(
        pool, queue=queue.name, concurrency=2, prefetch=2, poll_interval=60
    )

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        started.append(job.payload)
        if len(started) == 50:
            await queue.enqueue("t", "urgent", priority=5)
            committed_at.append(len(started))
            urgent_enqueued.set()
        await anyio.lowlevel.checkpoint()

    await queue.enqueue_many([("t", "backlog")] * backlog)
    async with running(worker):
        await wait_until(lambda: _ran(started, "urgent"), within=30)
    position = started.index("urgent")
    # Once its enqueue has returned (committed), at most the jobs already
    # held (4) and one claim round in flight (4 more) start before it. The
    # other consumer keeps starting jobs while the enqueue runs, however
    # long the commit takes on a loaded disk: count from its return. It may
    # start before that return (a lone enqueue's wakeup leaves at its
    # commit, before the commit's answer reaches the producer), never
    # before the 50 jobs that led to its enqueue.
    assert 50 <= position <= committed_at[0] + 8, (
        position,
        committed_at,
    )


async def _ran(started: list[str], payload: str) -> bool:
    return payload in started


@pytest.mark.parametrize(
    ("priority", "error"),
    [
        (6, ValueError),
        (-6, ValueError),
        (1.0, TypeError),
        (True, TypeError),
        ("1", TypeError),
    ],
)
async def test_a_bad_priority_is_refused_before_any_sql(
    queue_name: str, priority: Any, error: type[Exception]
) -> None:
    queue = pgqueue.Queue(
        asyncpg.create_pool(NO_SERVER), name=queue_name
    )  # never started
    with pytest.raises(error, match="priority"):
        await queue.enqueue("t", {}, priority=priority)
    with pytest.raises(error, match="job 0: priority"):
        await queue.enqueue_many([pgqueue.NewJob("t", {}, priority=priority)])


# --- unique jobs -----------------------------------------------------------------------


async def test_a_unique_key_returns_the_live_job_and_inserts_and_wakes_nothing(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    async with listening(dsn, pgqueue.JOBS_CHANNEL) as wakeups:
        first = await queue.enqueue(
            "report", {"v": 1}, unique_key=f"{queue.name}-2026-12"
        )
        # Its wakeup comes with the commit (a lone enqueue NOTIFYs itself).
        await wakeups.wait_for(queue.name)
        wakeups.payloads.clear()
        again = await queue.enqueue(
            "report", {"v": 2}, unique_key=f"{queue.name}-2026-12"
        )
        other_type = await queue.enqueue(
            "other", {}, unique_key=f"{queue.name}-2026-12"
        )
        await wakeups.wait_for(queue.name)  # other_type's
    assert again == first
    assert other_type != first
    assert wakeups.payloads == [queue.name]
    assert await queue_count(pool, queue.name) == 2
    assert json.loads((await row(pool, first))["payload"]) == {"v": 1}
    with pytest.raises(pgqueue.DuplicateJobError) as raised:
        await queue.enqueue(
            "report", {}, unique_key=f"{queue.name}-2026-12", on_conflict="raise"
        )
    assert (raised.value.job_id, raised.value.unique_key) == (
        first,
        f"{queue.name}-2026-12",
    )


@pytest.mark.parametrize("ending", ["completed", "dead", "cancelled"])
async def test_the_key_is_free_again_once_the_job_ends(
    pool: asyncpg.Pool, queue: pgqueue.Queue, ending: str
) -> None:
    first = await queue.enqueue("t", {}, unique_key=queue.name, max_attempts=1)
    if ending == "cancelled":
        assert await queue.cancel(first) == {first: "cancelled"}
    else:
        worker = pgqueue.Worker(pool, queue=queue.name)

        @worker.handler("t")
        async def handle(_job: pgqueue.Job) -> None:
            if ending == "dead":
                raise RuntimeError

        await drain(worker)
    assert (await row(pool, first))["status"] == ending
    second = await queue.enqueue("t", {}, unique_key=queue.name)
    assert second != first


async def test_fifty_concurrent_enqueuers_of_one_key_get_one_row(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    connections = [await asyncpg.connect(dsn) for _ in range(50)]
    try:
        ids: list[int] = []
        async with anyio.create_task_group() as tg:
            for connection in connections:

                async def enqueue(connection: asyncpg.Connection = connection) -> None:
                    ids.append(
                        await queue.enqueue(
                            "t", {}, unique_key=queue.name, connection=connection
                        )
                    )

                tg.start_soon(enqueue)
    finally:
        for connection in connections:
            await connection.close()
    assert len(ids) == 50
    assert len(set(ids)) == 1
    assert await queue_count(pool, queue.name) == 1


async def test_enqueue_many_merges_duplicate_keys_and_finds_live_ones(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    live = await queue.enqueue("t", "live", unique_key=f"{queue.name}-a")
    ids = await queue.enqueue_many(
        [
            pgqueue.NewJob("t", "1", unique_key=f"{queue.name}-b"),
            ("t", "plain"),
            pgqueue.NewJob("t", "2", unique_key=f"{queue.name}-a"),
            pgqueue.NewJob("t", "3", unique_key=f"{queue.name}-b"),
            pgqueue.NewJob("u", "4", unique_key=f"{queue.name}-b"),
            ("t", "plain again"),
        ]
    )
    assert ids[2] == live
    assert ids[0] == ids[3]
    assert len({ids[0], ids[1], ids[4], ids[5], live}) == 5
    stored = {r["id"]: json.loads(r["payload"]) for r in await rows(pool, queue.name)}
    assert stored == {
        live: "live",
        ids[0]: "1",
        ids[1]: "plain",
        ids[4]: "4",
        ids[5]: "plain again",
    }
    with pytest.raises(pgqueue.DuplicateJobError) as raised:
        await queue.enqueue_many(
            [("t", "new"), pgqueue.NewJob("t", "dup", unique_key=f"{queue.name}-a")],
            on_conflict="raise",
        )
    assert raised.value.job_id == live


async def test_a_key_enqueued_in_a_rolled_back_transaction_is_free(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    async with pool.acquire() as connection:
        transaction = connection.transaction()
        await transaction.start()
        await queue.enqueue("t", {}, unique_key=queue.name, connection=connection)
        await transaction.rollback()
    job_id = await queue.enqueue("t", {}, unique_key=queue.name)
    assert [r["id"] for r in await rows(pool, queue.name)] == [job_id]


async def test_no_state_change_of_a_live_keyed_job_hits_the_unique_index(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    """Claim, retry, snooze, release and rescue keep the one row; enqueues find it."""
    logger = RecordingLogger()
    seen: list[tuple[int, int]] = []
    job_id = await queue.enqueue("t", {}, unique_key=queue.name)
    worker = pgqueue.Worker(
        pool, queue=queue.name, backoff=no_backoff, rescue_after=0.5, logger=logger
    )

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        seen.append((job.attempts, job.snoozes))
        assert await queue.enqueue("t", {}, unique_key=queue.name) == job.id
        if job.attempts == 1 and job.snoozes == 0:
            raise pgqueue.Snooze(0)
        if job.attempts == 1:
            raise RuntimeError("retry me")

    await drain(worker)
    assert seen == [(1, 0), (1, 1), (2, 1)]
    # A rescue of an orphaned run, too.
    again = await queue.enqueue("t", {}, unique_key=queue.name)
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'running', attempts = 1,"
        " updated_at = now() - interval '1 hour' WHERE id = $1",
        again,
    )
    await pool.fetch(RESCUE, [queue.name], 1, 100)
    assert await queue.enqueue("t", {}, unique_key=queue.name) == again
    assert "unique" not in " ".join(str(e) for _, _, e in logger.records)
    assert (await row(pool, job_id))["status"] == "completed"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"unique_key": ""}, ValueError),
        ({"unique_key": "a\x00b"}, ValueError),
        ({"unique_key": 7}, TypeError),
        ({"unique_key": "k", "on_conflict": "ignore"}, ValueError),
        ({"track": 1}, TypeError),
    ],
)
async def test_bad_unique_options_are_refused_before_any_sql(
    queue_name: str, kwargs: dict[str, Any], error: type[Exception]
) -> None:
    queue = pgqueue.Queue(asyncpg.create_pool(NO_SERVER), name=queue_name)
    with pytest.raises(error):
        await queue.enqueue("t", {}, **kwargs)


# --- cancel ------------------------------------------------------------------------------


async def test_cancel_reports_what_became_of_each_id(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    pending, running_id, done = await queue.enqueue_many([("t", 1), ("t", 2), ("t", 3)])
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'running', attempts = 1 WHERE id = $1",
        running_id,
    )
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed' WHERE id = $1", done
    )
    missing = done + 1_000_000
    result = await queue.cancel(pending, running_id, done, missing, pending)
    assert result == {
        pending: "cancelled",
        running_id: "requested",
        done: "finished",
        missing: "not_found",
    }
    assert (await row(pool, pending))["status"] == "cancelled"
    assert (await row(pool, running_id))["cancel_requested"] is True
    assert (await row(pool, done))["status"] == "completed"
    assert await queue.cancel(pending) == {pending: "finished"}
    assert await queue.cancel() == {}


async def test_a_cancelled_pending_job_is_never_claimed(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    ran: list[int] = []
    cancelled, kept = await queue.enqueue_many([("t", 1), ("t", 2)])
    await queue.cancel(cancelled)
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        ran.append(job.id)

    await drain(worker)
    assert ran == [kept]
    stored = await row(pool, cancelled)
    assert (stored["status"], stored["attempts"], stored["last_error"]) == (
        "cancelled",
        0,
        "cancelled by request",
    )


async def _run_until_cancelled(
    pool: asyncpg.Pool,
    queue: pgqueue.Queue,
    worker: pgqueue.Worker,
    *,
    swallow: bool = False,
    within: float = 5.0,
) -> dict[str, Any]:
    """Start a job that waits forever, cancel it, return its row once it ended."""
    started = anyio.Event()
    cancelled_in_handler = anyio.Event()

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled_in_handler.set()
            if not swallow:
                raise

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        with anyio.fail_after(10):
            await started.wait()
        assert await queue.cancel(job_id) == {job_id: "requested"}
        with anyio.fail_after(within):
            await cancelled_in_handler.wait()
        return await wait_for_row(
            pool, job_id, within=within, status="completed" if swallow else "cancelled"
        )


async def test_a_running_job_is_cancelled_within_a_second_through_its_notify(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(
        pool, queue=queue.name, rescue_after=3600
    )  # no heartbeat soon
    stored = await _run_until_cancelled(pool, queue, worker, within=1.0)
    assert (stored["attempts"], stored["last_error"]) == (1, "cancelled by request")


async def test_a_missed_cancel_notify_is_caught_by_the_next_heartbeat(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # listen=False: no NOTIFY reaches the worker; heartbeats every 0.3 s.
    worker = pgqueue.Worker(
        pool, queue=queue.name, listen=False, poll_interval=0.1, rescue_after=0.9
    )
    stored = await _run_until_cancelled(pool, queue, worker, within=3.0)
    assert stored["status"] == "cancelled"


async def test_a_handler_that_finishes_anyway_completes(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name)
    stored = await _run_until_cancelled(pool, queue, worker, swallow=True)
    assert stored["status"] == "completed"


async def test_a_cancelled_job_is_never_retried(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    started = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name, backoff=no_backoff)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            msg = "cleanup failed"
            raise RuntimeError(msg) from None  # would be a retry, but for the cancel

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        with anyio.fail_after(10):
            await started.wait()
        await queue.cancel(job_id)
        stored = await wait_for_row(pool, job_id, status="cancelled")
    assert stored["attempts"] == 1


async def test_a_prefetched_job_that_is_cancelled_never_runs(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    release, started = anyio.Event(), anyio.Event()
    ran: list[Any] = []
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=1, prefetch=1)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        ran.append(job.payload)
        started.set()
        await release.wait()

    first, held = await queue.enqueue_many([("t", "first"), ("t", "held")])
    async with running(worker):
        with anyio.fail_after(10):
            await started.wait()
        await wait_for_row(pool, held, status="running")  # prefetched
        assert await queue.cancel(held) == {held: "requested"}
        await wait_until(lambda: _cancel_seen(worker, held))
        release.set()
        await wait_for_row(pool, held, status="cancelled")
        await wait_for_row(pool, first, status="completed")
    assert ran == ["first"]


async def _cancel_seen(worker: pgqueue.Worker, job_id: int) -> bool:
    return job_id in worker._runner._cancelled


async def test_a_cancel_requested_while_the_worker_drains_is_honoured(
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
        stopped = anyio.Event()

        async def stop() -> None:
            await worker.stop()  # waits for the handler, which never ends by itself
            stopped.set()

        tg.start_soon(stop)
        await wait_until(lambda: _claim_stopped(worker))
        assert await queue.cancel(job_id) == {job_id: "requested"}
        with anyio.fail_after(5):
            await stopped.wait()
    assert (await row(pool, job_id))["status"] == "cancelled"


async def _claim_stopped(worker: pgqueue.Worker) -> bool:
    return worker._claim_scope.cancel_called


async def test_rescue_cancels_an_orphaned_job_whose_cancel_was_requested(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("t", {})
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'running', attempts = 1,"
        " updated_at = now() - interval '1 hour' WHERE id = $1",
        job_id,
    )
    assert await queue.cancel(job_id) == {job_id: "requested"}
    worker = pgqueue.Worker(pool, queue=queue.name, rescue_after=60)
    worker.register("t", noop)
    async with running(worker):
        stored = await wait_for_row(pool, job_id, status="cancelled")
    assert stored["last_error"] == "cancelled by request"


@pytest.mark.parametrize(
    ("job_id", "error"),
    [
        (0, ValueError),
        (-1, ValueError),
        (1.0, TypeError),
        (True, TypeError),
        (2**63, ValueError),
    ],
)
async def test_bad_ids_are_refused_before_any_sql(
    queue_name: str, job_id: Any, error: type[Exception]
) -> None:
    queue = pgqueue.Queue(asyncpg.create_pool(NO_SERVER), name=queue_name)
    with pytest.raises(error, match="job id"):
        await queue.cancel(1, job_id)


# --- snooze and retry-after ----------------------------------------------------------------


async def test_a_job_may_snooze_any_number_of_times_without_dying(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    seen: list[tuple[int, int]] = []
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        seen.append((job.attempts, job.snoozes))
        if job.snoozes < 100:
            raise pgqueue.Snooze(0)

    job_id = await queue.enqueue("t", {}, max_attempts=1)
    await drain(worker, within=30)
    stored = await row(pool, job_id)
    assert (stored["status"], stored["attempts"], stored["snoozes"]) == (
        "completed",
        1,
        100,
    )
    assert seen == [(1, n) for n in range(101)]


async def test_a_snooze_waits_its_seconds_on_the_database_clock(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        raise pgqueue.Snooze(3600)

    job_id = await queue.enqueue("t", {})
    await drain(worker)
    stored = await row(pool, job_id)
    now = await pool.fetchval("SELECT now()")
    assert (stored["status"], stored["attempts"], stored["snoozes"]) == (
        "pending",
        0,
        1,
    )
    assert timedelta(minutes=59) < stored["run_at"] - now <= timedelta(hours=1)


async def test_retry_after_replaces_the_backoff_and_uses_up_attempts(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, backoff=lambda _: 10_000.0)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        raise pgqueue.RetryAfter(0 if job.attempts == 1 else 1800, "rate limited")

    job_id = await queue.enqueue("t", {}, max_attempts=3)
    await drain(worker)
    stored = await row(pool, job_id)
    now = await pool.fetchval("SELECT now()")
    assert (stored["status"], stored["attempts"]) == ("pending", 2)
    assert stored["last_error"] == "RetryAfter: rate limited"
    assert timedelta(minutes=29) < stored["run_at"] - now <= timedelta(minutes=30)
    # The last attempt fails for good.
    await pool.execute("UPDATE pgqueue_jobs SET run_at = now() WHERE id = $1", job_id)
    worker = pgqueue.Worker(pool, queue=queue.name)
    worker.register("t", handle)
    await drain(worker)
    assert (await row(pool, job_id))["status"] == "dead"


@pytest.mark.parametrize("seconds", [-1, float("nan"), float("inf"), "5", None])
def test_snooze_and_retry_after_check_their_seconds(seconds: Any) -> None:
    for kind in (pgqueue.Snooze, pgqueue.RetryAfter):
        with pytest.raises((TypeError, ValueError)):
            kind(seconds)


async def test_fencing_holds_across_a_snooze(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    """Run A is superseded, run B snoozes (giving its attempt back), run C runs:
    A's late write matches nothing at every step."""
    places = claim_places({})
    job_id = await queue.enqueue("t", {})

    async def claim() -> int:
        (claimed,) = await pool.fetch(CLAIM, queue.name, 1, *places)
        attempts: int = claimed["attempts"]
        return attempts

    async def write(attempt: int, status: str, delay: float = 0.0) -> bool:
        """Write through FINISH, and a completion through COMPLETE as well."""
        key = (array([job_id]), array([attempt]))
        written = []
        if status == "completed":
            written += await pool.fetch(COMPLETE, *key, [None])
        written += await pool.fetch(
            FINISH, *key, [status], array([delay]), ["late"], [None]
        )
        return bool(written)

    a = await claim()
    await pool.execute(
        "UPDATE pgqueue_jobs SET updated_at = now() - interval '1 hour' WHERE id = $1",
        job_id,
    )
    await pool.fetch(RESCUE, [queue.name], 60, 100)
    b = await claim()
    assert (a, b) == (1, 2)
    assert not await write(a, "completed")  # B runs
    assert await write(b, "snoozed")  # B snoozes: its attempt is given back
    assert (await row(pool, job_id))["attempts"] == 1
    assert not await write(a, "completed")  # pending
    c = await claim()
    assert c == 2
    assert not await write(a, "completed")  # C runs: attempt 2, not A's 1
    assert not await write(a, "dead")
    assert await write(c, "completed")
    stored = await row(pool, job_id)
    assert (stored["status"], stored["attempts"], stored["snoozes"]) == (
        "completed",
        2,
        1,
    )


# --- results -------------------------------------------------------------------------------


async def test_a_handlers_return_value_is_stored_as_the_result(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> Any:
        return job.payload["give"]

    values: list[Any] = [{"total": 42, "items": [1, 2]}, "text", 1.5, None, [None]]
    ids = [await queue.enqueue("t", {"give": value}) for value in values]
    await drain(worker)
    stored = [await row(pool, job_id) for job_id in ids]
    assert [r["status"] for r in stored] == ["completed"] * len(values)
    assert [
        None if r["result"] is None else json.loads(r["result"]) for r in stored
    ] == values


async def test_a_return_value_that_cannot_be_stored_dead_letters_the_job(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> Any:
        return {1, 2}

    job_id = await queue.enqueue("t", {})
    await drain(worker)
    stored = await row(pool, job_id)
    assert stored["status"] == "dead"
    assert stored["last_error"].startswith(
        "the handler returned what cannot be stored as JSON"
    )
    assert stored["attempts"] == 1


async def test_only_tracked_jobs_announce_their_outcome(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, backoff=no_backoff)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        if job.payload == "fail":
            raise pgqueue.Permanent("no")

    async with listening(dsn, OUTCOMES_CHANNEL) as outcomes:
        tracked = await queue.enqueue("t", "ok", track=True)
        failed = await queue.enqueue("t", "fail", track=True)
        untracked = await queue.enqueue("t", "ok")
        [many] = await queue.enqueue_many([pgqueue.NewJob("t", "ok", track=True)])
        await drain(worker)
        cancelled = await queue.enqueue("t", "ok", track=True)
        await queue.cancel(cancelled)
        await outcomes.wait_for(str(cancelled))
    assert sorted(outcomes.payloads) == sorted(
        str(i) for i in (tracked, failed, many, cancelled)
    )
    assert str(untracked) not in outcomes.payloads
