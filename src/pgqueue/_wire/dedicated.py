"""A connection of the worker's own, outside the pool, with a deadline on every statement."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from pgqueue._core.dsn import Server, target_of
from pgqueue._core.errors import ends_session, is_outage
from pgqueue._store.postgres import Store
from pgqueue._store.schema import detect
from pgqueue._wire.opening import connect_like

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    import asyncpg

    from pgqueue._core.retry import Outage
    from pgqueue._wire.opening import Connect

__all__ = [
    "CLOSE_TIMEOUT",
    "STATEMENT_TIMEOUT",
    "DedicatedConnection",
    "Mode",
    "worker_connections",
]

T = TypeVar("T")

CLOSE_TIMEOUT = 2.0
"""Seconds a polite close may take before the connection is dropped."""

STATEMENT_TIMEOUT = 10.0
"""Seconds any statement on a dedicated connection may take (connecting
included) before the connection is dropped and replaced."""


class Mode:
    """What a worker's connections learned of the database at start (shared by the three).

    ``store``: the operations for its kind of server (plain PostgreSQL until
    the schema says otherwise); ``settings``: the startup parameters of
    connections opened from now on (the store's).
    """

    __slots__ = ("settings", "store")

    def __init__(self) -> None:
        self.store = Store()
        self.settings = self.store.settings


class DedicatedConnection:
    """Run statements, one at a time, on one connection opened on first use.

    The worker's claims, its outcome writes and its upkeep (heartbeats and
    sweeps) each get one, so a busy worker pays no pool acquire and reset
    per batch, and handlers that hold every pool connection can neither
    stall it nor make its live jobs look dead.

    Opening the connection and every statement must finish within
    ``timeout`` seconds, or ``TimeoutError`` is raised: a half-open
    connection (a dead peer the kernel has not noticed) is found that way
    instead of after the kernel's own timeout. A statement that times out,
    is cancelled or loses its session drops the connection (closing the
    socket at once); the next statement opens a new one. A statement the
    server refuses for its data keeps it.

    Each `Outage` in ``outages`` is told when a statement (or opening the
    connection) fails with an outage, and when one succeeds again after it;
    ``where`` names the server last connected to (or else ``server``'s: the
    one its siblings connected to, or the one configured):
    ``user@host:port/database``.

    With ``spare``, a statement that would wait for another in flight runs
    on a second connection (opened on first need) instead: the claims of a
    worker's queues share one, and a flooded queue's claims must not delay
    another queue's by their round trips.
    """

    def __init__(
        self,
        connect: Connect,
        *,
        timeout: float,
        where: str = "the database",
        mode: Mode | None = None,
        server: Server | None = None,
        spare: bool = False,
    ) -> None:
        self._connect = connect
        self.mode = Mode() if mode is None else mode
        self._connection: asyncpg.Connection[Any] | None = None
        self.timeout = timeout
        self._server = Server(where) if server is None else server
        self._opened_on: str | None = None
        self.outages: list[Outage] = []
        self._down = False
        # Not anyio's Lock: it yields to the event loop even when free, and a
        # claim should reach the socket before the caller's next job runs.
        self._lock = asyncio.Lock()
        self._spare = (
            DedicatedConnection(
                connect, timeout=timeout, mode=self.mode, server=self._server
            )
            if spare
            else None
        )
        if self._spare is not None:
            self._spare.outages = self.outages

    async def fetch(self, query: str, *args: object) -> list[asyncpg.Record]:
        """Run ``query`` and return its rows; raise what the database raised."""
        rows: list[asyncpg.Record] = await self._run("fetch", query, args)
        return rows

    async def fetchrow(self, query: str, *args: object) -> asyncpg.Record | None:
        """Run ``query`` and return its first row."""
        row: asyncpg.Record | None = await self._run("fetchrow", query, args)
        return row

    async def transaction(
        self,
        statements: Sequence[tuple[str, tuple[object, ...]]],
        *,
        stop_if_empty: bool = False,
    ) -> list[list[asyncpg.Record]]:
        """Run ``statements`` (query, args) in one transaction; the rows of each.

        With ``stop_if_empty``, a statement that returns no row is the last
        one run (the transaction still commits).
        """

        async def run(
            connection: asyncpg.Connection[Any],
        ) -> list[list[asyncpg.Record]]:
            results = []
            async with connection.transaction():
                for query, args in statements:
                    rows = await connection.fetch(query, *args)
                    results.append(rows)
                    if stop_if_empty and not rows:
                        break
            return results

        results: list[list[asyncpg.Record]] = await self._run_with(run)
        return results

    async def run_in_transaction(
        self, work: Callable[[asyncpg.Connection[Any]], Awaitable[T]]
    ) -> T:
        """Run ``work`` with the connection, in one transaction (the steps of a statement Citus refuses whole)."""

        async def run(connection: asyncpg.Connection[Any]) -> T:
            async with connection.transaction():
                return await work(connection)

        result: T = await self._run_with(run)
        return result

    async def _run(self, method: str, query: str, args: tuple[object, ...]) -> Any:
        return await self._run_with(lambda c: getattr(c, method)(query, *args))

    async def _run_with(
        self, call: Callable[[asyncpg.Connection[Any]], Awaitable[Any]]
    ) -> Any:
        spare = self._spare
        if spare is not None and self._lock.locked():
            return await spare._run_with(call)
        # asyncio's timeout, not anyio's fail_after: this is every claim's and
        # every outcome write's path, and a cancel scope costs several times
        # as much to set up.
        try:
            async with self._lock, asyncio.timeout(self.timeout):
                connection = self._connection
                if connection is None or connection.is_closed():
                    connection = self._connection = await self._connect()
                    self._opened_on = self._server.opened(connection) or self._opened_on
                try:
                    result = await call(connection)
                except BaseException as exc:
                    if ends_session(exc) or connection.is_closed():
                        self._connection = None
                        connection.terminate()
                    raise
        except Exception as exc:
            if is_outage(exc):
                self._down = True
                for outage in self.outages:
                    outage.down(self, exc, self.where)
            raise
        if self._down:
            self._down = False
            for outage in self.outages:
                outage.up(self, self.where)
        return result

    @property
    def where(self) -> str:
        """``user@host:port/database`` of the server last connected to, or else ``server``'s."""
        return self._opened_on or self._server.name

    @property
    def store(self) -> Store:
        """The operations for the database's kind of server: see `Mode`."""
        return self.mode.store

    async def detect_store(self) -> Store:
        """Look once which store the schema needs; reconnect if its settings differ (Citus: no generic plans)."""
        found = await detect(self)
        if found is not None:
            self.mode.store = found
            if found.settings != self.mode.settings:
                self.mode.settings.clear()
                self.mode.settings.update(found.settings)
                # Opened with the settings of before: open a new one.
                async with self._lock:
                    await self.aclose()
        return self.mode.store

    async def aclose(self) -> None:
        """Close the connection (and its spare) politely, or drop it; never raises, never waits long."""
        if self._spare is not None:
            await self._spare.aclose()
        connection, self._connection = self._connection, None
        if connection is None or connection.is_closed():
            return
        with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
            with contextlib.suppress(Exception):
                await connection.close()
        if not connection.is_closed():
            connection.terminate()


def worker_connections(
    pool_or_dsn: asyncpg.Pool[Any] | str,
    *,
    timeout: float,
    server: Server | None = None,
) -> tuple[DedicatedConnection, DedicatedConnection, DedicatedConnection]:
    """A worker's claim, outcome-write and upkeep connections (opened on first use).

    They name ``server`` (shared with the LISTEN connection, say) until each
    opens; by default one of their own, on ``pool_or_dsn``'s target.
    """

    mode = Mode()
    if server is None:
        server = Server(target_of(pool_or_dsn) or "the database")

    def dedicated(*, spare: bool = False) -> DedicatedConnection:
        return DedicatedConnection(
            connect_like(pool_or_dsn, mode.settings, shared=True),
            timeout=timeout,
            mode=mode,
            server=server,
            spare=spare,
        )

    return dedicated(spare=True), dedicated(), dedicated()
