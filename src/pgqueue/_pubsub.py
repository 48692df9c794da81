"""Pub/sub over NOTIFY/LISTEN: `publish` and the `Subscriber`.

Delivery is fire-and-forget (PostgreSQL keeps no notification for a listener
that is not connected). Task tree of a running subscriber::

    run()                      host task; stop() cancels its scope; enters a
    │                          Connections of its own when given none
    ├── listener route         LISTEN on every channel; feeds the buffer
    ├── drop reporter          logs dropped notifications, at most once a second
    └── consumer               the host task itself: runs the callbacks, one
                               at a time, in arrival order

The listener's ``on_notify`` callback runs on the event loop and must not
block: it puts each notification into a bounded memory object stream with
``send_nowait`` and counts what does not fit.

Only the subscriber's own cancellation (stop, or the task running `run`
being cancelled) ends it; a ``CancelledError`` a callback raises by itself
(awaiting a task someone else cancelled) is logged like any exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar

import anyio

from pgqueue._core.checks import (
    check_callable,
    check_channel,
    check_dsn_or_pool,
    check_int,
    encode_notify_payload,
)
from pgqueue._core.errors import AlreadyStartedError
from pgqueue._core.log import Logger, default_logger
from pgqueue._core.taskgroup import BlockTaskGroup
from pgqueue._sql.channels import PUBLISH
from pgqueue._wire.connections import (
    Connections,
    check_connections,
    private_connections,
)
from pgqueue._wire.listener import (
    LISTEN_KEEPALIVE,
    LISTEN_PROBE_TIMEOUT,
    ListenerRoute,
)

if TYPE_CHECKING:
    import asyncpg
    from anyio.abc import TaskStatus
    from anyio.streams.memory import (
        MemoryObjectReceiveStream,
        MemoryObjectSendStream,
    )

    from pgqueue._queue import Executor

__all__ = ["DEFAULT_MAX_PENDING", "Callback", "Subscriber", "publish"]

Callback: TypeAlias = Callable[[str], Awaitable[None]]
"""Handles one notification's payload; an exception is logged, never raised."""

C = TypeVar("C", bound=Callback)

DEFAULT_MAX_PENDING = 10_000
"""How many received notifications a `Subscriber` buffers for its callbacks."""

# The shortest pause between two warnings about dropped notifications.
DROP_REPORT_INTERVAL = 1.0

# A buffer entry: a notification, or None for "LISTEN was re-established".
_Item: TypeAlias = tuple[str, str] | None


async def publish(executor: Executor, channel: str, payload: str | bytes) -> None:
    """Send ``payload`` to every session LISTENing on ``channel``.

    One ``pg_notify`` call with bound parameters; the channel name is never
    spliced into SQL, so any name PostgreSQL can hold is fine. On a
    connection inside a transaction, the notification is delivered only if
    that transaction commits, and at commit; PostgreSQL then delivers
    identical (channel, payload) pairs of one transaction only once.
    Delivery is fire-and-forget: a subscriber that is not connected at that
    moment never sees it.

    Args:
        executor: an asyncpg pool, or a connection (or one acquired from a
            pool).
        channel: the channel name, 1 to 63 bytes of UTF-8 without NUL.
        payload: text, or UTF-8 bytes; under 8000 bytes.

    Raises:
        PayloadTooLargeError: the payload is 8000 bytes or more (a
            ``ValueError``).
        ValueError: an empty channel, a channel over 63 bytes, a NUL
            character, or bytes that are not UTF-8.
        TypeError: a channel or payload of the wrong type.
    """
    name = check_channel(channel)
    text = encode_notify_payload(payload)
    await executor.execute(PUBLISH, name, text)


class Subscriber:
    """Run async callbacks for the notifications published on some channels.

    Register callbacks with `handle` or the `handler` decorator, then await
    `run`. Several callbacks may be registered for one channel: each gets
    every payload, in registration order. The callbacks of one subscriber run
    one at a time, in the order the notifications arrived; one that raises is
    logged (with the channel, never the payload) and delivery goes on.

    The subscriber LISTENs over a dedicated connection of its own (a pool
    passed in is only used for its connect arguments, and is never closed).
    When that connection drops it reconnects with backoff, LISTENs again,
    logs a warning that notifications may have been missed, and awaits
    ``on_reconnect``. Delivery is fire-and-forget: what is published while
    the subscriber is disconnected is never seen.

    Received notifications wait in a buffer of at most ``max_pending`` for
    the callbacks. When callbacks fall that far behind, newer notifications
    are dropped and counted, and the count is logged at WARNING at most once
    a second (and once more when the subscriber stops).

    Constructing a subscriber does no I/O.

    Args:
        dsn_or_pool: a DSN, or an asyncpg pool whose connect arguments (and
            ``init`` hook) the LISTEN connection reuses.
        logger: where to log; the ``pgqueue`` logger by default.
        on_reconnect: awaited after every reconnect (and after a first
            connection that needed retries), so the application can
            resynchronise after the gap. It runs in the callbacks' turn:
            after the callbacks for every notification received before the
            gap, before those for notifications received after it (which
            are not lost while it runs). An exception is logged.
        max_pending: the most received notifications waiting for callbacks
            (10 000 by default); past it, new ones are dropped.
        connections: a `Connections` shared with the process's workers and
            trackers: the subscriber then LISTENs on its one LISTEN
            connection instead of a connection of its own.

    Usage::

        sub = pgqueue.Subscriber(pool)

        @sub.handler("orders_updated")
        async def on_order(payload: str) -> None: ...

        await sub.run()
    """

    def __init__(
        self,
        dsn_or_pool: str | asyncpg.Pool[Any],
        *,
        logger: Logger | None = None,
        on_reconnect: Callable[[], Awaitable[None]] | None = None,
        max_pending: int = DEFAULT_MAX_PENDING,
        connections: Connections | None = None,
    ) -> None:
        check_dsn_or_pool(dsn_or_pool)
        if on_reconnect is not None:
            check_callable("on_reconnect", on_reconnect)
        check_connections(connections)
        self._target = dsn_or_pool
        self._shared = connections
        self._logger = default_logger(logger)
        self._on_reconnect = on_reconnect
        self._max_pending = check_int("max_pending", max_pending)
        self._callbacks: dict[str, list[Callback]] = {}
        self._state: Literal["new", "running", "stopped"] = "new"
        self._stop_requested = False
        self._listener: ListenerRoute | None = None
        self._listener_keepalive = LISTEN_KEEPALIVE
        self._listener_probe_timeout = LISTEN_PROBE_TIMEOUT
        self._unreported = 0
        # Made in run() (or on first use): anyio primitives need an event loop.
        self._scope: anyio.CancelScope | None = None
        self._send: MemoryObjectSendStream[_Item] | None = None
        self._listening: anyio.Event | None = None
        self._dropping: anyio.Event

    @property
    def channels(self) -> list[str]:
        """The channels with at least one callback, in registration order."""
        return list(self._callbacks)

    @property
    def listener_pid(self) -> int | None:
        """The backend pid of the LISTEN connection while it is up."""
        return None if self._listener is None else self._listener.pid

    @property
    def pending(self) -> int:
        """How many received notifications are waiting for their callbacks."""
        if self._send is None:
            return 0
        return self._send.statistics().current_buffer_used

    def handle(self, channel: str, callback: Callback) -> None:
        """Run ``callback`` with the payload of every notification on ``channel``.

        Raises:
            AlreadyStartedError: the subscriber has started.
            TypeError, ValueError: a bad channel name (empty, over 63 bytes,
                a NUL character) or a callback that is not callable.
        """
        if self._state != "new":
            msg = "handle() called after run() started; register every callback first"
            raise AlreadyStartedError(msg)
        name = check_channel(channel)
        check_callable("callback", callback)
        self._callbacks.setdefault(name, []).append(callback)

    def handler(self, channel: str) -> Callable[[C], C]:
        """Register the decorated async function for ``channel``, as `handle` does.

        The function is returned unwrapped, so it can still be called directly.
        """

        def decorate(fn: C) -> C:
            self.handle(channel, fn)
            return fn

        return decorate

    async def run(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Deliver notifications to the callbacks until `stop` or cancellation.

        Keeps retrying the first connection, and every later one, until it
        succeeds or this task is cancelled. Cancellation is prompt in every
        state; a callback in progress is cancelled with it.
        ``await task_group.start(sub.run)`` returns once the subscriber
        LISTENs on every channel.

        Raises:
            AlreadyStartedError: ``run()`` was called before.
            BaseException: one a callback raised that is not an
                ``Exception`` (``KeyboardInterrupt``, ``SystemExit``), as
                itself; an ``ExceptionGroup`` only when the subscriber's
                background task failed too.
        """
        if self._state != "new":
            msg = "this subscriber has already been started; create a new Subscriber"
            raise AlreadyStartedError(msg)
        self._state = "running"  # not a status
        self._scope = anyio.CancelScope()
        if self._stop_requested:
            self._scope.cancel()
        self._dropping = anyio.Event()
        callbacks = {channel: tuple(fns) for channel, fns in self._callbacks.items()}
        send, receive = anyio.create_memory_object_stream[_Item](self._max_pending)
        self._send = send
        # Given no Connections, it makes one of its own, closed when run() ends.
        private: Connections | None = None
        connections = self._shared
        if connections is None:
            connections = private = private_connections(
                self._target,
                logger=self._logger,
                keepalive=self._listener_keepalive,
                probe_timeout=self._listener_probe_timeout,
            )
        self._logger.info("subscriber starting", extra={"channels": list(callbacks)})
        started = False
        try:
            with self._scope, send, receive:
                async with (
                    private or contextlib.nullcontext(),
                    BlockTaskGroup() as tg,
                ):
                    self._listener = connections.route(
                        list(callbacks), self._on_notify, on_connect=self._on_connect
                    )
                    await tg.start(self._listener.run)
                    task_status.started()
                    started = True
                    tg.start_soon(self._report_drops)
                    await self._consume(receive, callbacks)
        finally:
            self._state = "stopped"
            self._send = None
            self._flush_drops()
            self._logger.info("subscriber stopped", extra={"channels": list(callbacks)})
        if not started:
            task_status.started()

    def stop(self) -> None:
        """Make `run` return, without waiting for it.

        A callback in progress is cancelled and buffered notifications are
        dropped. Safe to call more than once, and before `run` (which then
        returns at once).
        """
        self._stop_requested = True
        if self._scope is not None:
            self._scope.cancel()

    async def wait_listening(self) -> None:
        """Wait until the subscriber is LISTENing on every channel.

        Returns at once if it is. Notifications published after this returns
        reach the callbacks, unless the connection drops in between. Meant
        for tests and readiness checks; it waits for as long as connecting
        takes (forever if `run` is never called or has ended), so bound it
        with a deadline such as ``anyio.fail_after``.
        """
        while self.listener_pid is None:
            event = self._listening_event()
            if event.is_set():  # set by an earlier connection, since lost
                event = self._listening = anyio.Event()
            await event.wait()

    def _listening_event(self) -> anyio.Event:
        if self._listening is None:
            self._listening = anyio.Event()
        return self._listening

    def _on_notify(self, channel: str, payload: str) -> None:
        # Called by asyncpg on the event loop for every notification.
        if self._send is None:
            return
        try:
            self._send.send_nowait((channel, payload))
        except anyio.WouldBlock:
            self._unreported += 1
            self._dropping.set()
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # arrived while stopping

    async def _on_connect(self, reconnected: bool) -> None:
        # Awaited by the listener once it LISTENs on every channel.
        self._listening_event().set()
        if reconnected and self._on_reconnect is not None and self._send is not None:
            # Waits for room rather than drop: on_reconnect must run.
            await self._send.send(None)

    async def _consume(
        self,
        receive: MemoryObjectReceiveStream[_Item],
        callbacks: dict[str, tuple[Callback, ...]],
    ) -> None:
        async for item in receive:
            if item is None:
                await self._call_on_reconnect(list(callbacks))
                continue
            channel, payload = item
            for callback in callbacks.get(channel, ()):
                failed = await self._call(functools.partial(callback, payload))
                if failed is not None:
                    self._logger.error(
                        "subscriber callback failed",
                        exc_info=failed,
                        extra={"channel": channel, "callback": _name(callback)},
                    )

    async def _call_on_reconnect(self, channels: list[str]) -> None:
        if self._on_reconnect is not None:
            failed = await self._call(self._on_reconnect)
            if failed is not None:
                self._logger.error(
                    "subscriber on_reconnect failed",
                    exc_info=failed,
                    extra={"channels": channels},
                )

    async def _call(self, call: Callable[[], Awaitable[None]]) -> BaseException | None:
        """Await ``call()``; its failure, to be logged (the end of `run` propagates)."""
        try:
            await call()
        except BaseException as exc:
            if not self._failed(exc):
                raise
            return exc
        return None

    def _failed(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised by a callback, is its failure rather than the end of `run`."""
        if isinstance(exc, Exception):
            return True
        if not isinstance(exc, anyio.get_cancelled_exc_class()):
            return False
        # Our own cancellation (stop, or the task running run() cancelled)
        # is a cancel request of this very task; one a callback met by
        # awaiting a task someone else cancelled is not.
        task = asyncio.current_task()
        own = task is not None and task.cancelling() > 0
        return not own and not (self._scope is not None and self._scope.cancel_called)

    async def _report_drops(self) -> None:
        while True:
            await self._dropping.wait()
            self._dropping = anyio.Event()
            self._flush_drops()
            await anyio.sleep(DROP_REPORT_INTERVAL)

    def _flush_drops(self) -> None:
        count, self._unreported = self._unreported, 0
        if count:
            self._logger.warning(
                "subscriber fell behind; notifications dropped",
                extra={"count": count, "max_pending": self._max_pending},
            )

    def __repr__(self) -> str:
        return f"Subscriber(channels={self.channels!r}, state={self._state!r})"


def _name(callback: object) -> str:
    name: str = getattr(callback, "__qualname__", type(callback).__name__)
    return name
