"""Awaited outcomes against a real server: `Tracker.wait` for every way a job ends.

Until the worker writes outcomes with their notification, the writers are
simulated in SQL: a tracked job's end is an ``UPDATE`` and a ``pg_notify``
in one transaction; a Go worker's is the ``UPDATE`` alone.

Most trackers here poll once an hour, so that what settles a wait is
provably the notification, the first read or the reconnect, never the poll.
The tracker logs every read at DEBUG ("job outcomes read"); tests wait on
those records to know that a wait has had its first read.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue import (
    AlreadyStartedError,
    JobNotFoundError,
    JobOutcome,
    PgQueueError,
    SchemaError,
    Status,
    Tracker,
    TrackerClosedError,
)
from pgqueue._sql.channels import OUTCOMES_CHANNEL
from pgqueue._sql.literals import array
from tests.helpers import RecordingLogger, row, running, wait_until

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

HOUR = 3600.0
_LATER = datetime.now(UTC) + timedelta(days=1)
READ = "job outcomes read"
NOWHERE = "postgresql://nobody@127.0.0.1:1/none"


class Logger(RecordingLogger):
    """A RecordingLogger that can also wait for the n-th record of a message."""

    def extras(self, fragment: str) -> list[dict[str, Any]]:
        return [extra for _, msg, extra in self.records if fragment in msg]

    def reads(self) -> list[dict[str, Any]]:
        """The extra fields of every read of the tracker, in order."""
        return self.extras(READ)

    async def wait_until(self, done: Any, within: float = 10.0) -> None:
        """Wait until ``done()`` is true, re-checking at each new record."""
        with anyio.fail_after(within):
            while not done():
                self._arrived = anyio.Event()
                await self._arrived.wait()

    async def wait_reads(self, count: int, within: float = 10.0) -> None:
        await self.wait_until(lambda: len(self.reads()) >= count, within)


class Waiting:
    """A `Tracker.wait` running in a task of its own."""

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.outcome: JobOutcome | None = None
        self.error: BaseException | None = None

    async def get(self, within: float = 10.0) -> JobOutcome:
        """The outcome, once the wait returns; raise what it raised."""
        with anyio.fail_after(within):
            await self.done.wait()
        if self.error is not None:
            raise self.error
        assert self.outcome is not None
        return self.outcome


def start_wait(
    tg: TaskGroup, tracker: Tracker, job_id: int, timeout: float | None = None
) -> Waiting:
    waiting = Waiting()

    async def run() -> None:
        try:
            waiting.outcome = await tracker.wait(job_id, timeout)
        except Exception as exc:
            waiting.error = exc
        finally:
            waiting.done.set()

    tg.start_soon(run)
    return waiting


async def waited(
    tg: TaskGroup, tracker: Tracker, logger: Logger, job_id: int
) -> Waiting:
    """Start a wait and return once its first read is done (one wait at a time)."""
    before = len(logger.reads())
    waiting = start_wait(tg, tracker, job_id)
    await logger.wait_reads(before + 1)
    return waiting


async def insert(
    pool: asyncpg.Pool, queue: str, count: int = 1, *, tracked: bool = True
) -> list[int]:
    """Insert ``count`` pending jobs; return their ids in order."""
    ids: list[int] = [
        r["id"]
        for r in await pool.fetch(
            "INSERT INTO pgqueue_jobs (queue, job_type, tracked)"
            " SELECT $1, 'report', $2 FROM generate_series(1, $3)"
            " RETURNING id",
            queue,
            tracked,
            count,
        )
    ]
    return sorted(ids)


async def finish(
    pool: asyncpg.Pool,
    job_id: int,
    status: str = "completed",
    *,
    result: str | None = '{"x":1}',
    last_error: str | None = None,
    notify: bool = True,
    attempts: int = 1,
) -> None:
    """End a job as a worker would: with its notification (tracked) or without (Go)."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "UPDATE pgqueue_jobs SET status = $2, result = $3::text::jsonb,"
            " last_error = $4, attempts = $5, updated_at = now(),"
            " completed_at = CASE WHEN $2 = 'completed' THEN now() END"
            " WHERE id = $1",
            job_id,
            status,
            result,
            last_error,
            attempts,
        )
        if notify:
            await conn.execute(
                "SELECT pg_notify('pgqueue_outcomes', $1::bigint::text)", job_id
            )


async def complete_all(pool: asyncpg.Pool, ids: list[int]) -> None:
    """Complete every job in one transaction, each with result {"n": id}, and notify each."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "UPDATE pgqueue_jobs SET status = 'completed', attempts = 1,"
            " result = jsonb_build_object('n', id), updated_at = now()"
            " WHERE id = ANY($1::text::bigint[])",
            array(ids),
        )
        await conn.execute(
            "SELECT pg_notify('pgqueue_outcomes', id::text)"
            " FROM unnest($1::text::bigint[]) AS id",
            array(ids),
        )


@pytest.fixture(params=["pool", "dsn"])
def target(request: pytest.FixtureRequest, pool: asyncpg.Pool, dsn: str) -> Any:
    """What a tracker is built on: the pool (reads through it) or a DSN (its own connection)."""
    return pool if request.param == "pool" else dsn


# --------------------------------------------------------------------------
# outcomes


@pytest.mark.parametrize(
    ("status", "result", "last_error", "expected"),
    [
        ("completed", '{"x":1}', None, {"x": 1}),
        ("completed", '{"x":1}', "an earlier attempt failed", {"x": 1}),
        ("dead", None, "ValueError: boom", None),
        ("cancelled", None, "cancelled by an operator", None),
    ],
    ids=["completed", "completed-after-failures", "dead", "cancelled"],
)
async def test_a_notified_end_settles_the_wait_with_the_row(
    pool: asyncpg.Pool,
    queue_name: str,
    status: str,
    result: str | None,
    last_error: str | None,
    expected: Any,
) -> None:
    logger = Logger()
    [job] = await insert(pool, queue_name)
    with anyio.fail_after(15):
        async with (
            Tracker(pool, poll_interval=HOUR, logger=logger) as tracker,
            anyio.create_task_group() as tg,
        ):
            waiting = await waited(tg, tracker, logger, job)
            assert not waiting.done.is_set()  # read once: still pending
            await finish(pool, job, status, result=result, last_error=last_error)
            outcome = await waiting.get()
    assert outcome == JobOutcome(
        id=job,
        status=Status(status),
        result=expected,
        last_error=last_error,
        attempts=1,
    )
    assert outcome.status == status
    assert tracker.waiting == 0


async def test_results_decode_as_json_whatever_codec_the_pool_has(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    results: dict[str, Any] = {
        "null": None,
        '{"a":[1,2.5,true,null,"\u00e9"]}': {"a": [1, 2.5, True, None, "\u00e9"]},
        "42": 42,
        '"text"': "text",
        "[[[]]]": [[[]]],
        "10000000000000000.0": 1e16,
    }

    async def init(connection: asyncpg.Connection) -> None:
        # A common recipe: jsonb decoded by the pool itself.
        await connection.set_type_codec(
            "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )

    ids = await insert(pool, queue_name, len(results) + 1)
    for job, text in zip(ids, results, strict=False):
        await finish(pool, job, result=text)
    await finish(pool, ids[-1], result=None)  # a handler that returned nothing
    async with (
        asyncpg.create_pool(dsn, min_size=1, max_size=2, init=init) as codec_pool,
        Tracker(codec_pool) as tracker,
    ):
        with anyio.fail_after(10):
            outcomes = [await tracker.wait(job) for job in ids]
    assert [o.result for o in outcomes] == [*results.values(), None]
    assert type(outcomes[-2].result) is float


async def test_a_job_that_ended_before_the_wait_returns_after_one_read(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    logger = Logger()
    [job] = await insert(pool, queue_name)
    await finish(pool, job, "dead", result=None, last_error="boom", attempts=5)
    async with Tracker(pool, poll_interval=HOUR, logger=logger) as tracker:
        with anyio.fail_after(10):
            outcome = await tracker.wait(job)
            again = await tracker.wait(job, timeout=5)
    assert outcome == again
    assert (outcome.status, outcome.last_error, outcome.attempts) == ("dead", "boom", 5)
    assert [r["jobs"] for r in logger.reads()] == [1, 1]


async def test_an_end_between_enqueue_and_wait_is_not_missed(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    [job] = await insert(pool, queue_name)
    async with Tracker(pool, poll_interval=HOUR) as tracker:
        # Notified while nobody waits: the tracker drops it; the wait's read finds it.
        await finish(pool, job, result='"done"')
        with anyio.fail_after(10):
            outcome = await tracker.wait(job)
    assert outcome.result == "done"


async def test_ends_racing_their_waits_are_never_missed(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    # Each end lands at some point of its wait's registration and first read;
    # with no poll, the read or the notification must settle every one.
    ids = await insert(pool, queue_name, 100)
    outcomes: dict[int, JobOutcome] = {}

    async def wait(job: int) -> None:
        outcomes[job] = await tracker.wait(job)

    async with Tracker(pool, poll_interval=HOUR) as tracker:
        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for job in ids:
                    if job % 2:
                        tg.start_soon(wait, job)
                        tg.start_soon(finish, pool, job)
                    else:
                        tg.start_soon(finish, pool, job)
                        tg.start_soon(wait, job)
    assert sorted(outcomes) == ids
    assert {o.status for o in outcomes.values()} == {"completed"}


async def test_a_notification_for_a_job_still_running_does_not_settle_it(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    logger = Logger()
    [job] = await insert(pool, queue_name)
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'running', attempts = 1 WHERE id = $1", job
    )
    with anyio.fail_after(15):
        async with (
            Tracker(pool, poll_interval=HOUR, logger=logger) as tracker,
            anyio.create_task_group() as tg,
        ):
            waiting = await waited(tg, tracker, logger, job)
            await pool.execute(
                "SELECT pg_notify('pgqueue_outcomes', $1::bigint::text)", job
            )
            await logger.wait_reads(2)  # the notification made it read the row
            assert not waiting.done.is_set()
            assert tracker.waiting == 1
            # Foreign payloads on the channel are ignored.
            await pool.execute("SELECT pg_notify('pgqueue_outcomes', 'hello')")
            await logger.wait_for("without a job id")
            await finish(pool, job, attempts=1)
            outcome = await waiting.get()
    assert outcome.status == "completed"
    assert logger.reads()[-1] == {"jobs": 1, "ended": 1}


async def test_an_end_without_a_notification_is_found_by_the_poll(
    target: Any, pool: asyncpg.Pool, queue_name: str
) -> None:
    # A Go worker, or a job that was not tracked: no notification at all.
    logger = Logger()
    [job] = await insert(pool, queue_name, tracked=False)
    async with (
        Tracker(target, poll_interval=0.1, logger=logger) as tracker,
        anyio.create_task_group() as tg,
    ):
        waiting = await waited(tg, tracker, logger, job)
        await finish(pool, job, result="[1]", notify=False)
        started = anyio.current_time()
        outcome = await waiting.get(within=5)
        elapsed = anyio.current_time() - started
    assert outcome.result == [1]
    assert elapsed < 2.0  # about one poll_interval, with room for a slow machine


async def test_a_timeout_raises_and_leaves_the_job_and_later_waits_alone(
    target: Any, pool: asyncpg.Pool, queue_name: str
) -> None:
    [job] = await insert(pool, queue_name)
    async with Tracker(target, poll_interval=HOUR) as tracker:
        with anyio.fail_after(10):
            with pytest.raises(
                TimeoutError, match=f"job {job} did not end within 0.2 s"
            ):
                await tracker.wait(job, timeout=0.2)
            with pytest.raises(TimeoutError):
                await tracker.wait(job, timeout=0)
            assert tracker.waiting == 0
            assert (await row(pool, job))["status"] == "pending"
            async with anyio.create_task_group() as tg:
                waiting = start_wait(tg, tracker, job, timeout=10)
                await finish(pool, job)
                outcome = await waiting.get()
    assert outcome.status == "completed"


async def test_a_job_with_no_row_raises_job_not_found(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    missing = 2**62
    [job] = await insert(pool, queue_name)
    async with Tracker(pool, poll_interval=0.05) as tracker:
        with anyio.fail_after(10):
            with pytest.raises(
                JobNotFoundError, match=f"no job has id {missing}"
            ) as info:
                await tracker.wait(missing)
            assert info.value.job_id == missing
            assert isinstance(info.value, LookupError)
            assert isinstance(info.value, PgQueueError)
            # A row deleted while waited for: the next read says so.
            async with anyio.create_task_group() as tg:
                waiting = start_wait(tg, tracker, job)
                await wait_until(lambda: _waiting_for(tracker, 1))
                await pool.execute("DELETE FROM pgqueue_jobs WHERE id = $1", job)
                with pytest.raises(JobNotFoundError) as deleted:
                    await waiting.get()
            assert deleted.value.job_id == job


async def _waiting_for(tracker: Tracker, count: int) -> bool:
    return tracker.waiting == count


async def test_a_worker_and_cancel_announce_tracked_ends_to_the_tracker(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # The real writers, end to end: with no poll, only their notifications
    # (or a wait's first read) can settle these waits.
    logger = Logger()
    done = await queue.enqueue("report", {"n": 7}, track=True)
    failed = await queue.enqueue("fail", {}, track=True)
    cancelled = await queue.enqueue("report", {"n": 0}, track=True, run_at=_LATER)

    async def report(job: pgqueue.Job) -> dict[str, int]:
        return {"double": job.payload["n"] * 2}

    async def fail(_job: pgqueue.Job) -> None:
        msg = "no such account"
        raise pgqueue.Permanent(msg)

    worker = pgqueue.Worker(pool, queue=queue.name)
    worker.register("report", report)
    worker.register("fail", fail)
    with anyio.fail_after(20):
        async with (
            Tracker(pool, poll_interval=HOUR, logger=logger) as tracker,
            anyio.create_task_group() as tg,
        ):
            waits = [start_wait(tg, tracker, job) for job in (done, failed, cancelled)]
            await logger.wait_until(lambda: sum(r["jobs"] for r in logger.reads()) >= 3)
            assert await queue.cancel(cancelled) == {cancelled: "cancelled"}
            async with running(worker):
                outcomes = [await w.get() for w in waits]
    assert outcomes[0] == JobOutcome(
        id=done, status=Status.COMPLETED, result={"double": 14}, attempts=1
    )
    assert (outcomes[1].status, outcomes[1].attempts) == ("dead", 1)
    assert outcomes[1].last_error is not None
    assert "no such account" in outcomes[1].last_error
    assert (outcomes[2].status, outcomes[2].attempts) == ("cancelled", 0)


# --------------------------------------------------------------------------
# many waits, one connection


async def test_200_waits_share_one_listen_connection_and_settle_in_one_batch(
    fresh_dsn: str,
) -> None:
    logger = Logger()
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool:
        ids = await insert(pool, "q", 200)
        waits: list[Waiting] = []
        with anyio.fail_after(20):
            async with (
                Tracker(pool, poll_interval=HOUR, logger=logger) as tracker,
                anyio.create_task_group() as tg,
            ):
                waits = [start_wait(tg, tracker, job) for job in ids]
                # A second wait for each of ten jobs shares its first read.
                waits += [start_wait(tg, tracker, job) for job in ids[:10]]
                await logger.wait_until(
                    lambda: sum(r["jobs"] for r in logger.reads()) >= 200
                )
                assert tracker.waiting == 200
                assert sum(r["jobs"] for r in logger.reads()) == 200
                first_reads = len(logger.reads())
                listening = await pool.fetch(
                    "SELECT pid FROM pg_stat_activity"
                    " WHERE datname = current_database() AND query LIKE 'LISTEN %'"
                )
                assert [r["pid"] for r in listening] == [tracker.listener_pid]
                await complete_all(pool, ids)
                outcomes = [await w.get() for w in waits]
    assert [o.id for o in outcomes] == ids + ids[:10]
    assert all(o.result == {"n": o.id} for o in outcomes)
    assert outcomes[200] is outcomes[0]  # one read, one outcome
    # 200 notifications of one commit arrive together: a few reads, not 200.
    after = logger.reads()[first_reads:]
    assert sum(r["ended"] for r in after) == 200
    assert len(after) <= 10


async def test_a_cancelled_wait_leaves_the_other_waits_for_its_job_waiting(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    [job] = await insert(pool, queue_name)
    with anyio.fail_after(10):
        async with (
            Tracker(pool, poll_interval=HOUR) as tracker,
            anyio.create_task_group() as tg,
        ):
            kept = start_wait(tg, tracker, job)
            with anyio.CancelScope() as scope:
                tg.start_soon(_cancel_soon, scope)
                await tracker.wait(job)
            assert scope.cancelled_caught
            assert tracker.waiting == 1
            await finish(pool, job)
            assert (await kept.get()).status == "completed"
    assert tracker.waiting == 0


async def _cancel_soon(scope: anyio.CancelScope) -> None:
    scope.cancel()


# --------------------------------------------------------------------------
# reconnects, closing, schema


class Gate:
    """A pool ``init`` hook that holds new connections while closed."""

    def __init__(self) -> None:
        self.opened = anyio.Event()
        self.opened.set()

    def close(self) -> None:
        self.opened = anyio.Event()

    async def __call__(self, _connection: asyncpg.Connection) -> None:
        await self.opened.wait()


async def test_an_end_notified_while_listen_is_down_is_read_after_the_reconnect(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    logger = Logger()
    gate = Gate()
    [job] = await insert(pool, queue_name)
    # The tracker reads through this pool's one connection; its LISTEN
    # connection gets the pool's init, so the gate holds its reconnect.
    async with asyncpg.create_pool(dsn, min_size=1, max_size=1, init=gate) as gated:
        with anyio.fail_after(20):
            async with (
                Tracker(gated, poll_interval=HOUR, logger=logger) as tracker,
                anyio.create_task_group() as tg,
            ):
                waiting = await waited(tg, tracker, logger, job)
                old_pid = tracker.listener_pid
                gate.close()
                assert await pool.fetchval("SELECT pg_terminate_backend($1)", old_pid)
                await logger.wait_for("LISTEN connection lost")
                # Notified into the void: nobody listens on the channel now.
                await finish(pool, job, result='{"late":true}')
                assert not waiting.done.is_set()
                gate.opened.set()
                outcome = await waiting.get()
                assert tracker.listener_pid not in (None, old_pid)
    assert outcome.result == {"late": True}
    assert (
        logger.messages("warning").count(
            "LISTEN connection re-established; "
            "notifications sent while it was down were missed"
        )
        == 1
    )


async def test_leaving_fails_pending_waits_and_closes_every_connection(
    fresh_dsn: str, target: Any
) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=2) as pool:
        [job] = await insert(pool, "q")
        built_on = pool if isinstance(target, asyncpg.Pool) else fresh_dsn
        tracker = Tracker(built_on, poll_interval=HOUR)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                async with tracker:
                    waiting = start_wait(tg, tracker, job)
                    await wait_until(lambda: _waiting_for(tracker, 1))
                    listener = tracker.listener_pid
                    started = anyio.current_time()
                with pytest.raises(TrackerClosedError, match="closed while"):
                    await waiting.get()
                assert anyio.current_time() - started < 2.0
        assert tracker.listener_pid is None
        assert tracker.waiting == 0
        with pytest.raises(TrackerClosedError, match="is closed"):
            await tracker.wait(job)
        with pytest.raises(AlreadyStartedError):
            async with tracker:
                pass

        async def only_the_pool_is_left() -> bool:
            others: list[int] = [
                r["pid"]
                for r in await pool.fetch(
                    "SELECT pid FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ]
            return listener not in others and len(others) <= 1

        await wait_until(only_the_pool_is_left)
        # A borrowed pool is never closed.
        assert await pool.fetchval("SELECT 1") == 1


async def test_a_table_without_the_result_column_raises_schema_error(
    fresh_dsn: str,
) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=2) as pool:
        [job] = await insert(pool, "q")
        await pool.execute("ALTER TABLE pgqueue_jobs DROP COLUMN result")
        async with Tracker(pool) as tracker:
            with anyio.fail_after(10), pytest.raises(SchemaError, match="result"):
                await tracker.wait(job)


# --------------------------------------------------------------------------
# bad input

BAD_JOB_IDS: list[tuple[object, type[Exception]]] = [
    (True, TypeError),
    (1.0, TypeError),
    ("1", TypeError),
    (None, TypeError),
    (0, ValueError),
    (-1, ValueError),
    (2**63, ValueError),
]

BAD_TIMEOUTS: list[tuple[object, type[Exception]]] = [
    (-1, ValueError),
    (math.nan, ValueError),
    (math.inf, ValueError),
    ("1", TypeError),
    (True, TypeError),
]


async def test_bad_input_raises_before_any_sql(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    # A tracker never entered, on a server that does not exist: the checks
    # come before the state check and before any I/O.
    idle = Tracker(NOWHERE)
    for job_id, error in BAD_JOB_IDS:
        with pytest.raises(error, match="job id"):
            await idle.wait(job_id)  # type: ignore[arg-type]
    for timeout, error in BAD_TIMEOUTS:
        with pytest.raises(error, match="timeout"):
            await idle.wait(1, timeout)  # type: ignore[arg-type]
    with pytest.raises(TrackerClosedError, match="has not been entered"):
        await idle.wait(1)

    # On an open tracker: nothing is read for a refused wait.
    logger = Logger()
    [job] = await insert(pool, queue_name)
    await finish(pool, job)
    async with Tracker(pool, poll_interval=HOUR, logger=logger) as tracker:
        for job_id, error in BAD_JOB_IDS:
            with pytest.raises(error):
                await tracker.wait(job_id)  # type: ignore[arg-type]
        for timeout, error in BAD_TIMEOUTS:
            with pytest.raises(error):
                await tracker.wait(job, timeout)  # type: ignore[arg-type]
        assert tracker.waiting == 0
        assert logger.reads() == []
        with anyio.fail_after(10):
            assert (await tracker.wait(job)).status == "completed"
    assert len(logger.reads()) == 1


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"dsn_or_pool": 42}, TypeError),
        ({"dsn_or_pool": None}, TypeError),
        ({"poll_interval": 0}, ValueError),
        ({"poll_interval": -1}, ValueError),
        ({"poll_interval": math.nan}, ValueError),
        ({"poll_interval": "1"}, TypeError),
        ({"poll_interval": True}, TypeError),
    ],
)
def test_bad_construction_raises(
    kwargs: dict[str, Any], error: type[Exception]
) -> None:
    arguments: dict[str, Any] = {"dsn_or_pool": NOWHERE, **kwargs}
    with pytest.raises(error):
        Tracker(**arguments)


def test_the_channel_is_the_one_the_writers_notify() -> None:
    assert OUTCOMES_CHANNEL == "pgqueue_outcomes"
