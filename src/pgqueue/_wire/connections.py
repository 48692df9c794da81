"""One set of pgqueue's own connections for a whole process.

Every part that needs connections of its own (`Worker`, `Tracker`,
`Subscriber`) uses a `Connections`: the one it is given, shared with the
process's other parts, or else a private one it makes, enters and closes
itself (`private_connections`).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Self, cast

from pgqueue._core.checks import check_dsn_or_pool
from pgqueue._core.dsn import Server, target_of
from pgqueue._core.log import Logger, default_logger
from pgqueue._core.taskgroup import BlockTaskGroup
from pgqueue._wire.dedicated import STATEMENT_TIMEOUT, worker_connections
from pgqueue._wire.listener import (
    LISTEN_KEEPALIVE,
    LISTEN_PROBE_TIMEOUT,
    ListenerRoute,
    SharedListener,
)
from pgqueue._wire.opening import connect_like

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence
    from types import TracebackType

    import asyncpg

    from pgqueue._core.retry import Outage

__all__ = ["Connections", "check_connections", "private_connections"]


class Connections:
    """The connections pgqueue opens besides your pool, shared by every part given them.

    Without it, each `Worker` opens four connections of its own (claims,
    outcome writes, upkeep, LISTEN), each `Subscriber` and `Tracker` one
    LISTEN connection. Give the same ``Connections`` to all of a process's
    workers, subscribers and trackers, and the process opens at most four,
    whatever the number of queues and parts: one LISTEN connection that
    carries every channel (job wakeups, cancel requests, tracked outcomes,
    pub/sub), and one connection each for claims, outcome writes and upkeep
    (heartbeats, sweeps, periodic ticks, a DSN tracker's reads), on which
    the workers' statements take turns. Each opens on first use and
    reconnects by itself. An exception raised in the ``async with`` block
    leaves it as itself; an ``ExceptionGroup`` leaves only when the shared
    LISTEN task failed too (a ``logger`` that raises, say).

    Usage::

        async with pgqueue.Connections(pool) as connections:
            emails = pgqueue.Worker(pool, queue="emails", connections=connections)
            reports = pgqueue.Worker(pool, queue="reports", connections=connections)
            async with anyio.create_task_group() as tg:
                await tg.start(emails.run)
                await tg.start(reports.run)

    Args:
        dsn_or_pool: where to connect: a DSN, or a pool whose connect
            arguments (and ``init`` hook) are used; the connections are never
            taken from nor given back to the pool.
        listen: a DSN for the LISTEN connection instead (when the pool goes
            through a transaction pooler, which cannot LISTEN).
        statement_timeout: seconds a statement on the claim, write or upkeep
            connection may take before the connection is dropped (a worker's
            own setting does not apply to shared connections).
        logger: where the LISTEN connection's failures are logged.
    """

    def __init__(
        self,
        dsn_or_pool: str | asyncpg.Pool[Any],
        *,
        listen: str | None = None,
        statement_timeout: float = STATEMENT_TIMEOUT,
        logger: Logger | None = None,
    ) -> None:
        check_dsn_or_pool(dsn_or_pool)
        if listen is not None and not isinstance(cast("object", listen), str):
            msg = f"listen must be a DSN string, not {type(listen).__name__}"
            raise TypeError(msg)
        self._logger = default_logger(logger)
        # The server each connection is named after until it opens: the one
        # its siblings (on the same target) opened on, else the configured.
        self._server = Server(target_of(dsn_or_pool) or "the database")
        self.claims, self.writes, self.upkeep = worker_connections(
            dsn_or_pool, timeout=statement_timeout, server=self._server
        )
        self._listen_target = dsn_or_pool if listen is None else listen
        self._listen_server = self._server if listen is None else None
        self._keepalive = LISTEN_KEEPALIVE
        self._probe_timeout = LISTEN_PROBE_TIMEOUT
        self._listener: SharedListener | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._entered = False

    @property
    def listener_pid(self) -> int | None:
        """The backend pid of the LISTEN connection while it is up."""
        return None if self._listener is None else self._listener.pid

    def route(
        self,
        channels: Sequence[str],
        on_notify: Callable[[str, str], None],
        *,
        on_connect: Callable[[bool], Awaitable[None]] | None = None,
    ) -> ListenerRoute:
        """A listener of ``channels`` on the shared LISTEN connection (for pgqueue's parts)."""
        self.check_entered()
        assert self._listener is not None
        return self._listener.route(channels, on_notify, on_connect=on_connect)

    def _watch(self, outage: Outage) -> None:
        """Tell ``outage`` of every outage of these connections, until `_unwatch`."""
        self.check_entered()
        assert self._listener is not None
        for part in (self.claims, self.writes, self.upkeep, self._listener):
            part.outages.append(outage)

    def _unwatch(self, outage: Outage) -> None:
        """Stop telling ``outage``."""
        for part in (self.claims, self.writes, self.upkeep, self._listener):
            if part is not None and outage in part.outages:
                part.outages.remove(outage)

    def check_entered(self) -> None:
        """Raise RuntimeError unless these connections are open (entered, not yet left)."""
        if self._stack is None:
            msg = "enter the Connections first: async with pgqueue.Connections(...) as connections"
            raise RuntimeError(msg)

    async def __aenter__(self) -> Self:
        if self._entered:
            msg = "these Connections have already been entered; create new ones"
            raise RuntimeError(msg)
        self._entered = True
        async with contextlib.AsyncExitStack() as stack:
            for connection in (self.claims, self.writes, self.upkeep):
                stack.push_async_callback(connection.aclose)
            tg = await stack.enter_async_context(BlockTaskGroup())
            stack.callback(tg.cancel_scope.cancel)
            self._listener = SharedListener(
                connect_like(self._listen_target),
                logger=self._logger,
                start=tg.start_soon,
                keepalive=self._keepalive,
                probe_timeout=self._probe_timeout,
                where=target_of(self._listen_target) or "the database",
                server=self._listen_server,
            )
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        stack, self._stack = self._stack, None
        if stack is None:
            return False
        return bool(await stack.__aexit__(exc_type, exc, tb))

    def __repr__(self) -> str:
        state = "open" if self._stack is not None else "closed"
        return f"Connections(state={state!r})"


def check_connections(connections: object) -> None:
    """Raise TypeError unless ``connections`` is None or a `Connections`."""
    if connections is not None and not isinstance(connections, Connections):
        msg = f"connections must be a pgqueue.Connections, not {type(connections).__name__}"
        raise TypeError(msg)


def private_connections(
    dsn_or_pool: str | asyncpg.Pool[Any],
    *,
    logger: Logger,
    listen: str | None = None,
    statement_timeout: float = STATEMENT_TIMEOUT,
    keepalive: float = LISTEN_KEEPALIVE,
    probe_timeout: float = LISTEN_PROBE_TIMEOUT,
) -> Connections:
    """The `Connections` a part makes for itself when it is given none.

    ``keepalive`` and ``probe_timeout`` are its LISTEN connection's probe
    (see `pgqueue._wire.listener.Listener`), which tests shorten.
    """
    connections = Connections(
        dsn_or_pool, listen=listen, statement_timeout=statement_timeout, logger=logger
    )
    connections._keepalive = keepalive
    connections._probe_timeout = probe_timeout
    return connections
