"""What a user's code can do to a worker, against a real server: it must keep running.

Handlers that raise text the database refuses, backoffs that return
nonsense, ``CancelledError`` raised by a handler itself, a pool with a jsonb
codec, a job cut off on its last attempt, ``stop()`` from inside a handler,
rows other producers wrote with times Python cannot hold. Each test failed
against the worker as it was before the redesign.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections import Counter
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue._core.errors import MAX_ERROR_LENGTH
from tests.helpers import (
    RecordingLogger,
    drain,
    no_backoff,
    noop,
    row,
    rows,
    running,
    wait_for_row,
    wait_until,
)

if TYPE_CHECKING:
    from collections.abc import Callable


async def statuses(pool: asyncpg.Pool, queue: str) -> Counter[str]:
    return Counter(r["status"] for r in await rows(pool, queue))


# --- 1. error text the database refuses --------------------------------------


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        pytest.param("a\x00b", "ValueError: bad row a\\x00b", id="nul"),
        pytest.param(
            "caf\udce9.csv", "ValueError: bad row caf\\udce9.csv", id="surrogate"
        ),
    ],
)
async def test_an_error_message_the_database_refuses_is_recorded_and_later_jobs_complete(
    pool: asyncpg.Pool, queue: pgqueue.Queue, value: str, stored: str
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=4, backoff=no_backoff)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        if job.payload == "poison":
            msg = f"bad row {value}"
            raise ValueError(msg)

    poison = await queue.enqueue("t", "poison", max_attempts=2)
    fine = await queue.enqueue_many([("t", n) for n in range(50)])
    await drain(worker)
    dead = await row(pool, poison)
    assert (dead["status"], dead["attempts"], dead["last_error"]) == ("dead", 2, stored)
    assert await statuses(pool, queue.name) == {"completed": len(fine), "dead": 1}


async def test_a_long_error_message_is_capped(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        raise ValueError("z" * 1_000_000)

    job_id = await queue.enqueue("t", {}, max_attempts=1)
    await drain(worker)
    stored = await row(pool, job_id)
    assert stored["status"] == "dead"
    assert len(stored["last_error"]) <= MAX_ERROR_LENGTH
    assert stored["last_error"].startswith("ValueError: zzz")


REFUSE_OUTCOMES = """
CREATE FUNCTION refuse_outcomes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status = 'completed' AND NEW.payload ->> 'refuse' = 'completion' THEN
        RAISE EXCEPTION 'this completion is refused';
    END IF;
    IF NEW.last_error LIKE '%refuse this text%' THEN
        RAISE EXCEPTION 'this error text is refused';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refuse_outcomes BEFORE UPDATE ON pgqueue_jobs
FOR EACH ROW EXECUTE FUNCTION refuse_outcomes();
"""


async def test_an_outcome_the_server_refuses_never_blocks_the_others(
    fresh_dsn: str,
) -> None:
    """The batch is split until the refused outcomes are found; the rest are written."""
    logger = RecordingLogger()
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool:
        await pool.execute(REFUSE_OUTCOMES)
        queue = pgqueue.Queue(pool, name="refused")
        worker = pgqueue.Worker(
            pool,
            queue="refused",
            concurrency=50,
            prefetch=50,
            backoff=no_backoff,
            logger=logger,
        )
        release = anyio.Event()
        started = 0

        @worker.handler("t")
        async def handle(job: pgqueue.Job) -> None:
            nonlocal started
            started += 1
            if started == 50:
                release.set()
            await release.wait()  # so that the outcomes go out in one batch
            if job.payload.get("refuse") == "text":
                msg = "please refuse this text"
                raise ValueError(msg)

        refused_completion = await queue.enqueue("t", {"refuse": "completion"})
        refused_text = await queue.enqueue("t", {"refuse": "text"}, max_attempts=2)
        await queue.enqueue_many([("t", {"n": n}) for n in range(48)])
        await drain(worker)
        placeholder = "pgqueue could not record this outcome (RaiseError)"
        completion = await row(pool, refused_completion)
        assert completion["status"] == "dead"
        assert completion["last_error"].startswith(placeholder)
        # Its failure was recorded (with a placeholder), retried, then dead.
        text = await row(pool, refused_text)
        assert (text["status"], text["attempts"]) == ("dead", 2)
        assert text["last_error"].startswith(placeholder)
        assert await statuses(pool, "refused") == {"completed": 48, "dead": 2}
    assert "database refused a job outcome; writing a placeholder error" in (
        logger.messages("error")
    )


# --- 2 and 16. backoffs that misbehave, exceptions whose str() raises ---------


class BrokenStr(Exception):
    def __str__(self) -> str:
        msg = "no text for you"
        raise RuntimeError(msg)


def _raises(_attempt: int) -> float:
    msg = "backoff bug"
    raise ZeroDivisionError(msg)


@pytest.mark.parametrize(
    ("backoff", "delay"),
    [
        pytest.param(lambda _a: math.nan, (2, 2.5), id="nan"),
        pytest.param(lambda _a: math.inf, (364 * 86400, 366 * 86400), id="inf"),
        pytest.param(lambda _a: 1e300, (364 * 86400, 366 * 86400), id="huge"),
        pytest.param(lambda _a: -5.0, (-1, 1), id="negative"),
        pytest.param(lambda _a: None, (2, 2.5), id="none"),
        pytest.param(lambda _a: "10", (2, 2.5), id="string"),
        pytest.param(_raises, (2, 2.5), id="raises"),
    ],
)
async def test_a_backoff_that_misbehaves_never_stops_the_worker(
    pool: asyncpg.Pool,
    queue: pgqueue.Queue,
    backoff: Callable[[int], Any],
    delay: tuple[float, float],
) -> None:
    logger = RecordingLogger()
    worker = pgqueue.Worker(
        pool, queue=queue.name, concurrency=2, backoff=backoff, logger=logger
    )

    @worker.handler("fail")
    async def fail(_job: pgqueue.Job) -> None:
        raise BrokenStr

    @worker.handler("ok")
    async def ok(_job: pgqueue.Job) -> None:
        pass

    failed = await queue.enqueue("fail", {})
    fine = await queue.enqueue_many([("ok", n) for n in range(10)])
    await drain(worker)
    stored = await row(pool, failed)
    assert stored["last_error"] == "BrokenStr: (its message could not be read)"
    if delay[1] <= 1:  # taken as 0: retried at once, until dead
        assert (stored["status"], stored["attempts"]) == ("dead", 5)
    else:
        assert (stored["status"], stored["attempts"]) == ("pending", 1)
        now = await pool.fetchval("SELECT now()")
        wait = (stored["run_at"] - now).total_seconds()
        assert delay[0] - 1 <= wait <= delay[1], wait
    assert (await statuses(pool, queue.name))["completed"] == len(fine)
    warned = logger.messages("warning").count(
        "backoff gave no usable delay (logged once)"
    )
    assert warned == 1


# --- 3. CancelledError raised by a handler itself -----------------------------


async def _await_a_cancelled_task() -> None:
    task = asyncio.create_task(asyncio.sleep(10))
    await asyncio.sleep(0)
    task.cancel()
    await task


async def _gather_a_cancelled_task() -> None:
    task = asyncio.create_task(asyncio.sleep(10))
    task.cancel()
    await asyncio.gather(task)


@pytest.mark.parametrize(
    "own_cancel", [_await_a_cancelled_task, _gather_a_cancelled_task]
)
async def test_a_handlers_own_cancelled_error_fails_its_attempt_and_nothing_else(
    pool: asyncpg.Pool, queue: pgqueue.Queue, own_cancel: Callable[[], Any]
) -> None:
    blocked_started, release = anyio.Event(), anyio.Event()
    worker = pgqueue.Worker(
        pool, queue=queue.name, concurrency=2, backoff=no_backoff, poll_interval=0.1
    )

    @worker.handler("blocked")
    async def blocked(_job: pgqueue.Job) -> None:
        blocked_started.set()
        await release.wait()

    @worker.handler("cancels")
    async def cancels(job: pgqueue.Job) -> None:
        if job.attempts == 1:
            await own_cancel()

    stopped = anyio.Event()
    async with anyio.create_task_group() as tg:

        async def run() -> None:
            await worker.run()
            stopped.set()

        tg.start_soon(run)
        blocked_id = await pgqueue.Queue(pool, name=queue.name).enqueue("blocked", {})
        with anyio.fail_after(10):
            await blocked_started.wait()
        cancels_id = await queue.enqueue("cancels", {})
        # Retried after its CancelledError, and completed: the worker goes on.
        stored = await wait_for_row(pool, cancels_id, status="completed")
        assert stored["attempts"] == 2
        assert stored["last_error"] == "CancelledError"
        # The other handler in flight was not cut off.
        assert (await row(pool, blocked_id))["status"] == "running"
        assert not stopped.is_set()
        release.set()
        await wait_for_row(pool, blocked_id, status="completed", attempts=1)
        later = await queue.enqueue("blocked", {})
        await wait_for_row(pool, later, status="completed")
        assert not stopped.is_set()
        with anyio.fail_after(10):
            await worker.stop()


async def test_a_subscriber_callbacks_own_cancelled_error_is_logged_and_delivery_goes_on(
    pool: asyncpg.Pool,
) -> None:
    channel = f"own_cancel_{id(pool)}"
    logger = RecordingLogger()
    sub = pgqueue.Subscriber(pool, logger=logger)
    got: list[str] = []
    done = anyio.Event()

    @sub.handler(channel)
    async def callback(payload: str) -> None:
        if payload == "cancel":
            await _await_a_cancelled_task()
        got.append(payload)
        if payload == "after":
            done.set()

    async with anyio.create_task_group() as app:
        with anyio.fail_after(10):
            await app.start(sub.run)
        await pgqueue.publish(pool, channel, "cancel")
        await pgqueue.publish(pool, channel, "after")
        with anyio.fail_after(10):
            await done.wait()
        sub.stop()
    assert got == ["after"]
    assert not app.cancel_scope.cancel_called
    assert "subscriber callback failed" in logger.messages("error")


# --- 4. a pool whose init registers a jsonb codec ------------------------------


async def _jsonb_codec(connection: asyncpg.Connection) -> None:
    for name in ("json", "jsonb"):
        await connection.set_type_codec(
            name, encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )


PAYLOADS: list[Any] = [
    {"user_id": "01J5", "n": 1, "f": 1.5, "ok": True, "none": None},
    [1, "two", {"three": 3}],
    "just a string",
    42,
]


@pytest.mark.parametrize("codec", [False, True], ids=["plain", "jsonb-codec"])
async def test_payloads_round_trip_the_same_with_and_without_a_jsonb_codec(
    dsn: str, queue_name: str, codec: bool
) -> None:
    seen: list[Any] = []
    async with asyncpg.create_pool(
        dsn, min_size=1, max_size=4, init=_jsonb_codec if codec else None
    ) as pool:
        queue = pgqueue.Queue(pool, name=queue_name)
        one = [await queue.enqueue("t", payload) for payload in PAYLOADS]
        many = await queue.enqueue_many([("t", payload) for payload in PAYLOADS])
        worker = pgqueue.Worker(pool, queue=queue_name, concurrency=1)

        @worker.handler("t")
        async def handle(job: pgqueue.Job) -> None:
            seen.append(job.payload)

        await drain(worker)
    # What any other consumer (psql, the Go module) reads: JSON values, not strings.
    plain = await asyncpg.connect(dsn)
    try:
        stored = await plain.fetch(
            "SELECT id, jsonb_typeof(payload) AS kind, payload::text AS text"
            " FROM pgqueue_jobs WHERE queue = $1 ORDER BY id",
            queue_name,
        )
    finally:
        await plain.close()
    kinds = ["object", "array", "string", "number"]
    assert [r["id"] for r in stored] == one + many
    assert [r["kind"] for r in stored] == kinds + kinds
    assert [json.loads(r["text"]) for r in stored] == PAYLOADS + PAYLOADS
    assert seen == PAYLOADS + PAYLOADS
    assert [type(p) for p in seen] == [type(p) for p in PAYLOADS + PAYLOADS]


# --- 5. a job cut off by stop(timeout) on its last attempt ---------------------


async def test_a_job_cut_off_on_its_last_attempt_is_dead_not_pending(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    started = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=2)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        started.set()
        await anyio.sleep_forever()

    last = await queue.enqueue("t", {}, max_attempts=1)
    more = await queue.enqueue("t", {}, max_attempts=2)
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        await wait_until(lambda: _both_running(pool, queue.name))
        with pytest.raises(TimeoutError, match="2 job"):
            await worker.stop(timeout=0.2)
    assert started.is_set()
    dead = await row(pool, last)
    assert (dead["status"], dead["attempts"]) == ("dead", 1)
    assert "shut down" in dead["last_error"]
    pending = await row(pool, more)
    assert (pending["status"], pending["attempts"]) == ("pending", 1)


async def _both_running(pool: asyncpg.Pool, queue: str) -> bool:
    return (await statuses(pool, queue))["running"] == 2


# --- 13. stop() from a handler, a bad stop(), a cancelled run() ---------------


async def test_stop_awaited_from_inside_a_handler_stops_the_worker(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("shutdown")
    async def shutdown(_job: pgqueue.Job) -> None:
        await worker.stop()

    job_id = await queue.enqueue("shutdown", {})
    with anyio.fail_after(10):
        await worker.run()
    assert (await row(pool, job_id))["status"] == "completed"


async def test_a_bad_stop_timeout_raises_and_changes_nothing(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name)
    worker.register("t", noop)
    async with running(worker):
        with pytest.raises(ValueError, match="timeout"):
            await worker.stop(timeout=-1)
        with pytest.raises(TypeError, match="timeout"):
            await worker.stop(timeout="soon")  # type: ignore[arg-type]
        job_id = await queue.enqueue("t", {})
        await wait_for_row(pool, job_id, status="completed")


async def test_cancelling_run_cuts_a_hung_handler_off_after_the_grace_period(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    started = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name, shutdown_grace=0.3)

    @worker.handler("t")
    async def hang(_job: pgqueue.Job) -> None:
        started.set()
        await anyio.sleep_forever()

    job_id = await queue.enqueue("t", {})
    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            await started.wait()
            cancelled_at = anyio.current_time()
            tg.cancel_scope.cancel()
    took = anyio.current_time() - cancelled_at
    assert 0.3 <= took < 5, took
    stored = await row(pool, job_id)
    assert (stored["status"], stored["attempts"]) == ("pending", 1)
    assert "shut down" in stored["last_error"]


def test_shutdown_grace_is_checked() -> None:
    with pytest.raises(ValueError, match="shutdown_grace"):
        pgqueue.Worker(None, shutdown_grace=-1)  # type: ignore[arg-type]
    pgqueue.Worker(None, shutdown_grace=None)  # type: ignore[arg-type]


# --- 17. times Python cannot represent ---------------------------------------


async def test_a_row_with_a_time_python_cannot_represent_is_dead_lettered_alone(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    ran: list[int] = []
    bc = await pool.fetchval(
        "INSERT INTO pgqueue_jobs (queue, job_type, run_at)"
        " VALUES ($1, 't', '0044-03-15 BC') RETURNING id",
        queue.name,
    )
    far = await pool.fetchval(
        "INSERT INTO pgqueue_jobs (queue, job_type, created_at)"
        " VALUES ($1, 't', '12000-01-01') RETURNING id",
        queue.name,
    )
    mates = await queue.enqueue_many([("t", n) for n in range(3)])
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=10)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        ran.append(job.id)

    await drain(worker)
    assert sorted(ran) == mates  # claimed in one batch with the bad rows
    for job_id, shown in ((bc, "0044-03-15 00:00:00+00 BC"), (far, "12000-01-01")):
        stored = await _row_text(pool, job_id)  # row() cannot decode the time
        assert stored["status"] == "dead"
        assert "a time Python cannot represent" in stored["last_error"]
        assert shown in stored["last_error"]


async def _row_text(pool: asyncpg.Pool, job_id: int) -> dict[str, Any]:
    record = await pool.fetchrow(
        "SELECT status, last_error FROM pgqueue_jobs WHERE id = $1", job_id
    )
    assert record is not None
    return dict(record)


async def test_times_handed_to_handlers_are_always_aware(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    seen: list[datetime] = []
    earliest = datetime.min.replace(tzinfo=UTC)
    await queue.enqueue("t", {}, run_at=earliest)
    await queue.enqueue_many([pgqueue.NewJob("t", {}, run_at=earliest)])
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        seen.extend((job.run_at, job.created_at))

    await drain(worker)
    assert len(seen) == 4
    assert all(t.tzinfo is not None for t in seen)
    assert seen[0] == seen[2] == earliest


# --- 18. a handler that swallows its job_timeout -----------------------------


async def test_a_handler_that_swallows_its_timeout_fails_with_the_timeout(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, job_timeout=0.1)

    @worker.handler("t")
    async def stubborn(_job: pgqueue.Job) -> None:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            return  # swallowed: the handler "completes"

    job_id = await queue.enqueue("t", {}, max_attempts=1)
    await drain(worker)
    stored = await row(pool, job_id)
    assert (stored["status"], stored["last_error"]) == (
        "dead",
        "job timed out after 0.1 s",
    )


async def test_a_handler_that_exits_the_process_stops_the_worker_with_outcomes_written(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    """``sys.exit()`` in a handler ends the worker as a stop would, then propagates."""
    other_started = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=2)

    @worker.handler("exits")
    async def exits(_job: pgqueue.Job) -> None:
        await other_started.wait()
        raise SystemExit(3)

    @worker.handler("other")
    async def other(_job: pgqueue.Job) -> None:
        other_started.set()
        await anyio.sleep_forever()

    exiting = await queue.enqueue("exits", {})
    in_flight = await queue.enqueue("other", {})
    with anyio.fail_after(10), pytest.raises(SystemExit):
        await worker.run()
    for job_id in (exiting, in_flight):
        stored = await row(pool, job_id)
        assert (stored["status"], stored["attempts"]) == ("pending", 1)
        assert "shut down" in stored["last_error"]
