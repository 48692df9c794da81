"""Wakeups sent after commit, coalesced per queue, on a connection of their own.

A transaction that sends NOTIFY takes a lock of the whole cluster from
before its commit until its commit record is flushed: notifying commits go
one at a time and lose group commit. A lone notifying commit contends with
nobody, though. So an enqueue that commits by itself on a pool (see
`Waker.enqueuing`) keeps the NOTIFY in its own statement when it is alone:
no other such enqueue of the pool is in flight, and the pool's `Waker` has
nothing due and no wakeup in flight. Otherwise it commits without NOTIFY,
and tells the waker, which sends ``pg_notify('pgqueue_jobs', queue)`` (what
Go workers listen for too) after the commit: at once when no wakeup is in
flight, else once the one in flight is done, for every queue enqueued to
meanwhile. However many producers commit at once, at most one notifying
transaction per pool is in flight, plus the lone enqueue that started
before the others, if any.

When enqueues of the pool are in flight as a wakeup becomes due, the
waker first waits for as long as its last wakeup took (about one commit,
at most `MAX_GATHER`): their commits land meanwhile and share the wakeup,
so the server runs fewer notifying transactions (a cost under many
producers) for a wakeup a commit later.

Nothing waits for a wakeup: when it cannot be sent (the database is gone,
the process dies first), the workers' poll finds the job, within one
``poll_interval``.

Lifetime: a waker runs while there are wakeups to send and for `LINGER`
seconds after, keeping its connection open for the next ones; it closes
the connection and ends when that time passes or when its pool closes
(after sending what is due). When the event loop shuts down (which cancels
it), it still sends what is due, for at most `FINAL_SEND` seconds: a
script that enqueues and exits wakes the workers too.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from pgqueue._core.log import Logger, default_logger
from pgqueue._sql.enqueue import WAKE
from pgqueue._wire.opening import connect_like

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    import asyncpg

__all__ = ["FINAL_SEND", "LINGER", "MAX_GATHER", "Waker", "waker_for"]

LINGER = 10.0
"""Seconds a waker keeps its connection open after its last wakeup."""

SEND_TIMEOUT = 5.0
"""Seconds a connect plus NOTIFY may take before that attempt is given up."""

MAX_GATHER = 0.005
"""The longest a waker waits for enqueues in flight before it sends (one commit's time, measured)."""

FINAL_SEND = 2.0
"""Seconds a waker cancelled by the loop's shutdown may take to send what is due."""

_CHECK_EVERY = 0.1  # how often a lingering waker looks whether its pool closed

# The wakers by id(pool): an entry lives while its waker's task runs or an
# enqueue it counts is in flight, and both hold the pool, so an id is not
# reused while its entry stands.
_wakers: dict[int, Waker] = {}


def waker_for(pool: asyncpg.Pool[Any], logger: Logger | None = None) -> Waker:
    """The waker of ``pool`` in this process, made on first use."""
    waker = _wakers.get(id(pool))
    if waker is None or waker.pool is not pool:
        waker = _wakers[id(pool)] = Waker(pool, logger)
    return waker


class Waker:
    """Sends the wakeups of jobs committed through one pool, coalesced per queue."""

    def __init__(self, pool: asyncpg.Pool[Any], logger: Logger | None = None) -> None:
        self.pool = pool
        self._logger = default_logger(logger)
        self._due: dict[str, None] = {}  # queues to wake, in order
        self._more = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._connection: asyncpg.Connection[Any] | None = None
        self._sending = False  # a wakeup transaction is in flight
        self._enqueuing = 0  # self-committing enqueues of the pool in flight
        self._gather = 0.0  # seconds the last wakeup took: about a commit's time
        self.sent = 0
        """How many wakeup transactions were sent (for tests)."""

    @property
    def connection_pid(self) -> int | None:
        """The backend pid of the waker's connection while it is open."""
        connection = self._connection
        return None if connection is None else connection.get_server_pid()

    @contextlib.contextmanager
    def enqueuing(self) -> Iterator[bool]:
        """Count an enqueue that commits by itself on the pool while it runs; yield whether it is alone.

        Alone (no other such enqueue in flight, nothing due, no wakeup in
        flight), its statement sends the NOTIFY itself: its commit contends
        with no notifying commit of this pool, and idle workers wake at the
        commit, a round trip sooner than through the waker. Otherwise its
        statement is silent, and it calls `wake` once it has committed.
        """
        alone = not (self._enqueuing or self._due or self._sending)
        self._enqueuing += 1
        try:
            yield alone
        finally:
            self._enqueuing -= 1
            self._forget_if_idle()

    def wake(self, queues: Iterable[str]) -> None:
        """Wake the workers of ``queues`` soon; call it after the jobs' commit."""
        self._due.update(dict.fromkeys(queues))
        if not self._due:
            return
        self._more.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="pgqueue waker"
            )

    async def _run(self) -> None:
        try:
            while await self._wait_for_more():
                if self._enqueuing:
                    # Enqueues in flight commit within about a commit's time:
                    # one wakeup for them too costs the server less than two.
                    await asyncio.sleep(self._gather)
                await self._send_due()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if self._due:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(FINAL_SEND):
                        await self._send_due()
            raise
        finally:
            self._task = None
            self._forget_if_idle()
            await self._close()

    def _forget_if_idle(self) -> None:
        """Drop the registry's entry once no task runs and no enqueue is counted."""
        idle = self._task is None and not self._enqueuing
        if idle and _wakers.get(id(self.pool)) is self:
            del _wakers[id(self.pool)]

    async def _wait_for_more(self) -> bool:
        """Whether there is something to send, waiting up to LINGER or until the pool closes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LINGER
        while not self._due:
            if self.pool.is_closing() or loop.time() >= deadline:
                return False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_CHECK_EVERY):
                    await self._more.wait()
        return True

    async def _send_due(self) -> None:
        """Send the wakeups due now; put them back if cancelled on the way."""
        queues = list(self._due)
        self._due.clear()
        self._more.clear()
        self._sending = True
        try:
            await self._send(queues)
        except asyncio.CancelledError:
            self._due.update(dict.fromkeys(queues))
            raise
        finally:
            self._sending = False

    async def _send(self, queues: list[str]) -> None:
        """One NOTIFY per queue in one transaction, on a new connection if the last one broke."""
        for attempt in (1, 2):
            try:
                async with asyncio.timeout(SEND_TIMEOUT):
                    if self._connection is None or self._connection.is_closed():
                        self._connection = await connect_like(self.pool)()
                    started = asyncio.get_running_loop().time()
                    await self._connection.execute(WAKE, queues)
                    took = asyncio.get_running_loop().time() - started
                self._gather = min(took, MAX_GATHER)
                self.sent += 1
                return
            except Exception as exc:  # the workers' poll finds the jobs
                self._drop()
                if attempt == 2:
                    self._logger.warning(
                        "could not send a wakeup; workers will find the jobs "
                        "at their next poll",
                        extra={"queues": queues, "error": repr(exc)},
                    )

    def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.terminate()

    async def _close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is None:
            return
        try:
            async with asyncio.timeout(1):
                await connection.close()
        except (Exception, asyncio.CancelledError):  # a broken or slow connection
            connection.terminate()
