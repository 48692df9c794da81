"""A dedicated LISTEN connection that reconnects by itself.

One implementation serves the worker's wakeups and the `Subscriber`. The
connection is its own, never a pooled one: asyncpg's pool runs ``UNLISTEN *``
when a connection goes back to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from pgqueue._core.dsn import Server
from pgqueue._core.errors import is_outage
from pgqueue._core.retry import MAX_RETRY_WAIT, Failures

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Coroutine, Sequence

    import asyncpg
    from anyio.abc import TaskStatus

    from pgqueue._core.log import Logger
    from pgqueue._core.retry import Outage
    from pgqueue._wire.opening import Connect

__all__ = ["LISTEN_KEEPALIVE", "LISTEN_PROBE_TIMEOUT", "Listener", "SharedListener"]

# A silent LISTEN connection is probed after LISTEN_KEEPALIVE seconds and
# given up when the probe takes LISTEN_PROBE_TIMEOUT: a half-open connection
# is found within their sum.
LISTEN_KEEPALIVE = 15.0
LISTEN_PROBE_TIMEOUT = 5.0


class Listener:
    """LISTEN on channels over one dedicated connection, reconnecting on loss.

    Args:
        connect: opens a new connection.
        channels: the channels to LISTEN on (quoted by asyncpg, never parsed).
        on_notify: called with ``(channel, payload)`` for every notification,
            on the event loop; it must not block.
        on_connect: awaited after every successful LISTEN with ``True`` when
            it follows a lost connection (notifications may have been missed).
        keepalive: seconds of silence after which the connection is probed,
            so that a half-open connection is found.
        probe_timeout: seconds a probe may take before the connection is
            declared dead.
        max_delay: the longest pause between reconnect attempts (see
            `pgqueue._core.retry.retry_delay`).
        where: the server, ``user@host:port/database``, until connected.
        server: names the server until connected instead of ``where`` (one
            shared with the worker's other connections: the server they
            connected to).

    Each `Outage` in ``outages`` is told when connecting fails or the
    connection is lost with an outage, and when LISTEN is back; while
    there is one, the retries and the reconnect are logged at DEBUG (the
    outage says its start and its end, one line each). A reconnect after
    any other loss is logged at INFO when there are outages to tell (a
    worker's: it claims at once, so nothing is missed), else at WARNING
    (a subscriber's: the notifications sent meanwhile are lost).
    """

    def __init__(
        self,
        connect: Connect,
        channels: Sequence[str],
        on_notify: Callable[[str, str], None],
        *,
        logger: Logger,
        on_connect: Callable[[bool], Awaitable[None]] | None = None,
        keepalive: float = LISTEN_KEEPALIVE,
        probe_timeout: float = LISTEN_PROBE_TIMEOUT,
        max_delay: float = MAX_RETRY_WAIT,
        where: str = "the database",
        server: Server | None = None,
    ) -> None:
        self._connect = connect
        self._server = Server(where) if server is None else server
        self._opened_on: str | None = None
        self.outages: list[Outage] = []
        self._channels = list(channels)
        self._connection: asyncpg.Connection[Any] | None = None
        self._listened: set[str] = set()
        self._on_notify = on_notify
        self._on_connect = on_connect
        self._logger = logger
        self._keepalive = keepalive
        self._probe_timeout = probe_timeout
        self._max_delay = max_delay
        self.pid: int | None = None
        """The backend pid of the live connection, if any (tests terminate it)."""

    async def run(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen until cancelled; signals ``task_status`` once first listening.

        Never returns on its own: failures (of the connection, or of the
        pool's ``init`` hook run on it) are logged and retried with the
        retry-delay rule. Cancellation is prompt in every state.
        """
        failures = Failures(
            self._logger,
            "LISTEN connection failed; retrying",
            cap=self._max_delay,
            quiet=lambda: bool(self.outages),
        )
        reconnect = False
        said = False  # an `Outage` was told of this loss: it says the end
        while True:
            try:
                connection = await self._connect()
            except Exception as exc:
                said = self._down(exc) or said
                await anyio.sleep(failures.failed(exc, channels=list(self._channels)))
                reconnect = True
                continue
            try:
                lost = anyio.Event()
                connection.add_termination_listener(_setter(lost))
                self._connection = connection
                self._opened_on = self._server.opened(connection) or self._opened_on
                await self.listen([])
                self.pid = connection.get_server_pid()
                failures.succeeded()
                for outage in self.outages:
                    outage.up(self, self.where)
                if reconnect and said:  # the outage's own line says it is over
                    self._logger.debug(
                        "LISTEN connection re-established; "
                        "notifications sent while it was down were missed",
                        extra={"channels": list(self._channels)},
                    )
                elif reconnect and self.outages:  # a worker's: its claim catches up
                    self._logger.info(
                        "LISTEN connection re-established; "
                        "notifications sent while it was down were missed",
                        extra={"channels": list(self._channels)},
                    )
                elif reconnect:
                    self._logger.warning(
                        "LISTEN connection re-established; "
                        "notifications sent while it was down were missed",
                        extra={"channels": list(self._channels)},
                    )
                said = False
                if self._on_connect is not None:
                    await self._on_connect(reconnect)
                task_status.started()
                task_status = anyio.TASK_STATUS_IGNORED
                await self._watch(connection, lost)
            except Exception as exc:
                said = self._down(exc) or said
                wait = failures.failed(
                    exc,
                    "LISTEN connection lost; reconnecting",
                    channels=list(self._channels),
                )
            finally:
                self.pid = None
                self._connection = None
                self._listened = set()
                connection.terminate()
            reconnect = True
            await anyio.sleep(wait)  # _watch ends only by raising

    @property
    def where(self) -> str:
        """``user@host:port/database`` of the server last connected to, or else ``server``'s."""
        return self._opened_on or self._server.name

    def _down(self, exc: Exception) -> bool:
        """Tell the outages of ``exc`` if it is one; whether any was told."""
        if not is_outage(exc) or not self.outages:
            return False
        for outage in self.outages:
            outage.down(self, exc, self.where)
        return True

    async def listen(self, channels: Sequence[str]) -> None:
        """Add ``channels``; LISTEN at once on each new one if the connection is up."""
        for channel in channels:
            if channel not in self._channels:
                self._channels.append(channel)
        connection = self._connection
        if connection is None:
            return  # the next connection LISTENs on every channel
        for channel in self._channels:
            if channel not in self._listened:
                self._listened.add(channel)
                await connection.add_listener(channel, self._deliver)

    async def _watch(
        self, connection: asyncpg.Connection[Any], lost: anyio.Event
    ) -> None:
        """Return when the connection is lost or stops answering probes."""
        while not lost.is_set():
            with anyio.move_on_after(self._keepalive):
                await lost.wait()
            if lost.is_set():
                break
            with anyio.fail_after(self._probe_timeout):
                await connection.execute("SELECT 1")
        msg = "connection closed"
        raise ConnectionResetError(msg)

    def _deliver(
        self, _connection: object, _pid: int, channel: str, payload: object
    ) -> None:
        self._on_notify(channel, str(payload))


def _setter(event: anyio.Event) -> Callable[[object], None]:
    return lambda _connection: event.set()


class SharedListener:
    """One `Listener` connection for several listeners of a process.

    Each listener (a worker, a subscriber, a tracker given the same
    `pgqueue.Connections`) gets a `ListenerRoute`, used as it would use a
    `Listener` of its own: ``await task_group.start(route.run)`` returns once
    its channels are LISTENed on, its ``on_connect`` is awaited after every
    (re)connect, and notifications of its channels reach its ``on_notify``.
    The connection is opened when the first route runs, by ``start`` (which
    runs the listener in the owner's task group).
    """

    def __init__(
        self,
        connect: Connect,
        *,
        logger: Logger,
        start: Callable[[Callable[[], Coroutine[Any, Any, None]]], object],
        keepalive: float = LISTEN_KEEPALIVE,
        probe_timeout: float = LISTEN_PROBE_TIMEOUT,
        where: str = "the database",
        server: Server | None = None,
    ) -> None:
        self._listener = Listener(
            connect,
            [],
            self._deliver,
            logger=logger,
            on_connect=self._on_connect,
            keepalive=keepalive,
            probe_timeout=probe_timeout,
            where=where,
            server=server,
        )
        self.outages = self._listener.outages
        """The `Outage` objects told of the shared connection's outages."""
        self._start = start
        self._started = False
        self._routes: list[ListenerRoute] = []

    @property
    def pid(self) -> int | None:
        """The backend pid of the live connection, if any."""
        return self._listener.pid

    def route(
        self,
        channels: Sequence[str],
        on_notify: Callable[[str, str], None],
        *,
        on_connect: Callable[[bool], Awaitable[None]] | None = None,
    ) -> ListenerRoute:
        """A listener of ``channels`` on the shared connection."""
        return ListenerRoute(self, tuple(channels), on_notify, on_connect)

    async def _add(self, route: ListenerRoute) -> None:
        self._routes.append(route)
        if not self._started:
            self._started = True
            self._start(self._listener.run)
        await self._listener.listen(route.channels)
        if self._listener.pid is not None:
            await route.connected(False)

    def _remove(self, route: ListenerRoute) -> None:
        # Its channels stay LISTENed on: notifications nobody routes are dropped.
        self._routes.remove(route)

    async def _on_connect(self, reconnected: bool) -> None:
        for route in list(self._routes):
            await route.connected(reconnected)

    def _deliver(self, channel: str, payload: str) -> None:
        for route in self._routes:
            if channel in route.channels:
                route.on_notify(channel, payload)


class ListenerRoute:
    """One listener's share of a `SharedListener` (the interface of a `Listener`)."""

    def __init__(
        self,
        shared: SharedListener,
        channels: tuple[str, ...],
        on_notify: Callable[[str, str], None],
        on_connect: Callable[[bool], Awaitable[None]] | None,
    ) -> None:
        self._shared = shared
        self.channels = channels
        self.on_notify = on_notify
        self._on_connect = on_connect
        self._listening = anyio.Event()  # its channels are LISTENed on
        self._connected = anyio.Event()  # and its on_connect has returned

    @property
    def pid(self) -> int | None:
        """The backend pid of the shared connection while this route listens on it."""
        return self._shared.pid if self._listening.is_set() else None

    async def connected(self, reconnected: bool) -> None:
        # Listening before on_connect runs, as with a Listener of its own.
        self._listening.set()
        if self._on_connect is not None:
            await self._on_connect(reconnected)
        self._connected.set()

    async def run(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen until cancelled; signals ``task_status`` once listening."""
        try:
            await self._shared._add(self)
            await self._connected.wait()
            task_status.started()
            await anyio.sleep_forever()
        finally:
            self._listening = anyio.Event()
            self._connected = anyio.Event()
            self._shared._remove(self)
