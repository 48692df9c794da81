"""`Worker.stop` returns within its bound however `run` ended, start-up failures included."""

from __future__ import annotations

from typing import Any

import anyio
import asyncpg
import pytest

import pgqueue
from tests.helpers import RecordingLogger


class StartingFails(RecordingLogger):
    """A logger that raises on the "worker starting" message."""

    def info(self, msg: str, /, *args: Any, **kwargs: Any) -> None:
        if msg == "worker starting":
            raise RuntimeError("the logger broke")
        super().info(msg, *args, **kwargs)


async def _stop_within(worker: pgqueue.Worker, bound: float = 1.0) -> None:
    """``stop(timeout=bound)`` returns (without raising) well within twice its bound."""
    with anyio.fail_after(2 * bound + 1):
        await worker.stop(timeout=bound)


async def test_stop_returns_after_the_start_up_log_raised(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, logger=StartingFails())
    with anyio.fail_after(10), pytest.raises(RuntimeError, match="the logger broke"):
        await worker.run()
    await _stop_within(worker)
    await _stop_within(worker)  # and again


async def test_the_readiness_idiom_raises_the_start_up_failure_and_stop_returns(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, logger=StartingFails())
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(10), pytest.raises(RuntimeError, match="the logger"):
            await tg.start(worker.run)
    await _stop_within(worker)


async def test_stop_returns_after_run_found_no_schema(dsn: str) -> None:
    # A search path without the schema pgqueue_jobs is in: the table is missing.
    async with asyncpg.create_pool(
        dsn, min_size=1, max_size=2, server_settings={"search_path": "nowhere"}
    ) as pool:
        worker = pgqueue.Worker(pool)
        with anyio.fail_after(10), pytest.raises(pgqueue.SchemaError):
            await worker.run()
        await _stop_within(worker)


async def test_stop_returns_after_run_could_not_build_its_connections(
    dsn: str,
) -> None:
    class NotAPool:
        """Has none of a pool's connect arguments."""

    worker = pgqueue.Worker(NotAPool(), listen=dsn)  # type: ignore[arg-type]
    with anyio.fail_after(10), pytest.raises(TypeError, match="asyncpg Pool"):
        await worker.run()
    await _stop_within(worker)
