"""Every ``async with`` pgqueue offers lets the body's exception out as itself.

`Tracker` and `Connections` run background tasks (a LISTEN connection, a
reader, a poller) in a task group that spans the caller's block, and
`Subscriber.run` runs its callbacks beside its listener. Whatever the block
raises (a ``TimeoutError`` from `Tracker.wait`, `JobNotFoundError`,
`SchemaError`, the caller's own error, a ``BaseException``) must reach an
``except`` for its own type, not an ``ExceptionGroup``. A group is raised
only when a background part fails too; the last tests show that case.

Every ``pytest.raises`` here is outside the ``async with`` it is about.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue import Connections, JobNotFoundError, SchemaError, Tracker
from pgqueue._core.taskgroup import BlockTaskGroup
from tests.helpers import RecordingLogger

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

NOWHERE = "postgresql://nobody@127.0.0.1:1/none"
MISSING_ID = 2**62


class Stop(BaseException):
    """A BaseException of the caller's own, as KeyboardInterrupt or SystemExit are."""


class LoggerBrokeError(Exception):
    """What `BrokenLogger` raises: a background part's own failure."""


class BrokenLogger(RecordingLogger):
    """A logger that fails at its first record of ``level`` (a background part then fails)."""

    def __init__(self, level: str) -> None:
        super().__init__()
        self.level = level

    def _log(self, level: str, msg: str, *args: Any, **kwargs: Any) -> None:
        super()._log(level, msg, *args, **kwargs)
        if level == self.level:
            raise LoggerBrokeError(msg)


async def pending_job(queue: pgqueue.Queue) -> int:
    """A job no worker takes during the test."""
    return await queue.enqueue("nobody_handles_this", {}, run_at=None)


# --------------------------------------------------------------------------
# Tracker


async def test_tracker_wait_timeout_is_caught_by_except_timeout_error(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await pending_job(queue)
    caught = None
    with anyio.fail_after(10):
        try:
            async with Tracker(pool) as tracker:
                await tracker.wait(job_id, timeout=0.05)
        except TimeoutError as exc:
            caught = exc
    assert type(caught) is TimeoutError
    assert str(caught) == f"job {job_id} did not end within 0.05 s"


async def test_tracker_job_not_found_comes_out_as_itself(pool: asyncpg.Pool) -> None:
    with anyio.fail_after(10), pytest.raises(JobNotFoundError) as info:
        async with Tracker(pool) as tracker:
            await tracker.wait(MISSING_ID)
    assert type(info.value) is JobNotFoundError
    assert str(MISSING_ID) in str(info.value)


async def test_tracker_schema_error_comes_out_as_itself(fresh_dsn: str) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=2) as pool:
        job_id = await pgqueue.Queue(pool).enqueue("t", {})
        await pool.execute("ALTER TABLE pgqueue_jobs DROP COLUMN result")
        with anyio.fail_after(10), pytest.raises(SchemaError, match="result"):
            async with Tracker(pool) as tracker:
                await tracker.wait(job_id)


async def test_tracker_with_a_dsn_lets_the_body_error_out_as_itself(
    dsn: str,
) -> None:
    # A DSN tracker also owns a connection, closed on the way out.
    error = ValueError("the caller's own")

    async def block() -> None:
        async with Tracker(dsn) as tracker:
            with pytest.raises(JobNotFoundError):
                await tracker.wait(MISSING_ID)
            raise error

    with anyio.fail_after(10), pytest.raises(ValueError, match="own") as info:
        await block()
    assert info.value is error
    # Not re-raised by pgqueue: its traceback holds only the caller's frames.
    assert [entry.name for entry in info.traceback][-1:] == ["block"]
    assert all(entry.path == Path(__file__) for entry in info.traceback)


async def test_tracker_lets_a_base_exception_out_as_itself(pool: asyncpg.Pool) -> None:
    error = Stop()
    with anyio.fail_after(10), pytest.raises(Stop) as info:
        async with Tracker(pool):
            raise error
    assert info.value is error


async def test_tracker_body_cancelled_from_outside_is_only_cancelled(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await pending_job(queue)
    with anyio.fail_after(10):
        with anyio.move_on_after(0.1) as scope:
            async with Tracker(pool) as tracker:
                await tracker.wait(job_id)
        assert scope.cancelled_caught


async def test_tracker_whose_background_part_fails_raises_a_group(
    pool: asyncpg.Pool,
) -> None:
    # The reader logs each read at DEBUG: that log call fails, the reader
    # with it, and the block (waiting forever) is cancelled.
    logger = BrokenLogger("debug")

    async def block() -> None:
        async with Tracker(pool, logger=logger) as tracker:
            with pytest.raises(JobNotFoundError):
                await tracker.wait(MISSING_ID)
            await anyio.sleep_forever()

    with anyio.fail_after(10), pytest.raises(ExceptionGroup) as info:
        await block()
    assert info.group_contains(LoggerBrokeError, match="job outcomes read")
    leaves = info.value.split(LoggerBrokeError)[1]
    assert leaves is None  # the background failure and nothing else


# --------------------------------------------------------------------------
# Connections


async def test_connections_let_a_tracker_timeout_out_as_itself(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await pending_job(queue)
    with anyio.fail_after(10), pytest.raises(TimeoutError, match=str(job_id)):
        async with (
            Connections(pool) as connections,
            Tracker(pool, connections=connections) as tracker,
        ):
            await tracker.wait(job_id, timeout=0.05)


async def test_connections_let_job_not_found_out_as_itself(dsn: str) -> None:
    # A DSN tracker reads through the shared upkeep connection.
    with anyio.fail_after(10), pytest.raises(JobNotFoundError):
        async with (
            Connections(dsn) as connections,
            Tracker(dsn, connections=connections) as tracker,
        ):
            await tracker.wait(MISSING_ID)


async def test_connections_let_the_body_error_out_as_itself(
    pool: asyncpg.Pool,
) -> None:
    error = ValueError("the caller's own")

    async def block() -> None:
        async with Connections(pool) as connections:
            worker = pgqueue.Worker(pool, queue="contexts", connections=connections)
            async with anyio.create_task_group() as tg:
                await tg.start(worker.run)
                await worker.stop()
            raise error

    with anyio.fail_after(10), pytest.raises(ValueError, match="own") as info:
        await block()
    assert info.value is error


async def test_connections_let_a_base_exception_out_as_itself(
    pool: asyncpg.Pool,
) -> None:
    with anyio.fail_after(10), pytest.raises(Stop):
        async with (
            Connections(pool) as connections,
            Tracker(pool, connections=connections),
        ):
            raise Stop


async def test_connections_whose_listener_fails_raise_a_group(
    pool: asyncpg.Pool,
) -> None:
    # The shared LISTEN connection cannot connect; logging that fails, and
    # the listener (a background task of the Connections) with it.
    logger = BrokenLogger("warning")
    with anyio.fail_after(10), pytest.raises(ExceptionGroup) as info:
        async with (
            Connections(pool, listen=NOWHERE, logger=logger) as connections,
            Tracker(pool, connections=connections),
        ):
            await anyio.sleep_forever()
    assert info.group_contains(LoggerBrokeError, match="LISTEN connection failed")


# --------------------------------------------------------------------------
# Subscriber.run


async def test_subscriber_callback_base_exception_ends_run_as_itself(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    channel = queue_name[:60]
    sub = pgqueue.Subscriber(pool)
    error = Stop()

    @sub.handler(channel)
    async def on_message(_payload: str) -> None:
        raise error

    async def publish_when_listening() -> None:
        await sub.wait_listening()
        await pgqueue.publish(pool, channel, "stop")

    publisher = asyncio.create_task(publish_when_listening())
    try:
        with anyio.fail_after(10), pytest.raises(Stop) as info:
            await sub.run()
    finally:
        await publisher
    assert info.value is error


# --------------------------------------------------------------------------
# the helper itself: a body error and a task failure at once


async def test_block_task_group_raises_a_group_of_both_when_a_task_fails_too() -> None:
    body = ValueError("body")

    async def fails_on_cancel(*, task_status: TaskStatus[None]) -> None:
        task_status.started()
        try:
            await anyio.sleep_forever()
        finally:
            raise LoggerBrokeError("background")

    async def block() -> None:
        async with BlockTaskGroup() as tg:
            await tg.start(fails_on_cancel)
            raise body

    with pytest.raises(ExceptionGroup) as info:
        await block()
    assert body in info.value.exceptions
    assert info.group_contains(LoggerBrokeError, match="background")


async def test_block_task_group_returns_normally_without_errors() -> None:
    ran = anyio.Event()

    async def task() -> None:
        ran.set()

    async with BlockTaskGroup() as tg:
        tg.start_soon(task)
    assert ran.is_set()
