"""A connection of the worker's own, outside the pool, reopened after a failure."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import anyio

from pgqueue import _sql
from pgqueue._errors import DATABASE_ERRORS

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import asyncpg

    from pgqueue._listener import Connect

__all__ = ["DedicatedConnection"]


class DedicatedConnection:
    """Run statements, one at a time, on one connection opened on first use.

    The worker's claims, its outcome writes and its upkeep (heartbeats and
    sweeps) each get one, so a busy worker pays no pool acquire and reset
    per batch, and handlers that hold every pool connection can neither
    stall it nor make its live jobs look dead. A statement that fails with
    a database error drops the connection; the next one opens a new one.
    """

    def __init__(self, connect: Connect) -> None:
        self._connect = connect
        self._connection: asyncpg.Connection[Any] | None = None
        # Not anyio's Lock: it yields to the event loop even when free, and a
        # claim should reach the socket before the caller's next job runs.
        self._lock = asyncio.Lock()

    async def fetch(self, query: str, *args: object) -> list[asyncpg.Record]:
        """Run ``query`` and return its rows; raise what the database raised."""
        async with self._use() as connection:
            return await connection.fetch(query, *args)

    async def execute(self, query: str, *args: object) -> str:
        """Run ``query`` and return its status (such as ``DELETE 3``)."""
        async with self._use() as connection:
            return await connection.execute(query, *args)

    @contextlib.asynccontextmanager
    async def _use(self) -> AsyncIterator[asyncpg.Connection[Any]]:
        async with self._lock:
            connection = self._connection
            if connection is None or connection.is_closed():
                connection = await self._connect()
                try:
                    await connection.execute(_sql.WORKER_SESSION)
                except BaseException:
                    connection.terminate()
                    raise
                self._connection = connection
            try:
                yield connection
            except DATABASE_ERRORS:
                self._connection = None
                connection.terminate()
                raise

    async def aclose(self) -> None:
        """Close the connection politely, or drop it if the server does not answer."""
        connection, self._connection = self._connection, None
        if connection is None or connection.is_closed():
            return
        with anyio.move_on_after(2, shield=True):
            await connection.close()
        if not connection.is_closed():
            connection.terminate()
