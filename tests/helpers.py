"""Shared test helpers: listening for notifications and reading rows."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


class Notifications:
    """Collect NOTIFY payloads on one channel, in arrival order."""

    def __init__(self) -> None:
        self.payloads: list[str] = []
        self._arrived = anyio.Event()

    def __call__(
        self, _conn: object, _pid: int, _channel: str, payload: object
    ) -> None:
        self.payloads.append(str(payload))
        self._arrived.set()

    async def wait_for(self, payload: str, within: float = 5.0) -> list[str]:
        """Wait until ``payload`` arrives; return everything that arrived before it."""
        with anyio.fail_after(within):
            while payload not in self.payloads:
                self._arrived = anyio.Event()
                await self._arrived.wait()
        return self.payloads[: self.payloads.index(payload)]


@contextlib.asynccontextmanager
async def listening(dsn: str, channel: str) -> AsyncIterator[Notifications]:
    """LISTEN on ``channel`` over a connection of its own."""
    notifications = Notifications()
    connection = await asyncpg.connect(dsn)
    try:
        await connection.add_listener(channel, notifications)
        yield notifications
    finally:
        await connection.close()


async def rows(pool: asyncpg.Pool, queue: str) -> list[dict[str, Any]]:
    """Every row of ``queue``, by id."""
    records = await pool.fetch(
        "SELECT * FROM pgqueue_jobs WHERE queue = $1 ORDER BY id", queue
    )
    return [dict(r) for r in records]


async def row(pool: asyncpg.Pool, job_id: int) -> dict[str, Any]:
    """One job's row."""
    record = await pool.fetchrow("SELECT * FROM pgqueue_jobs WHERE id = $1", job_id)
    assert record is not None, f"job {job_id} has no row"
    return dict(record)


async def table_count(pool: asyncpg.Pool) -> int:
    """Rows in the whole table, across queues."""
    count: int = await pool.fetchval("SELECT count(*) FROM pgqueue_jobs")
    return count
