"""Enqueues that commit by themselves, gathered into one statement while others are in flight.

Each enqueue on a pool (no ``connection=``) pays a pool acquire, a
statement, a commit and the reset the pool runs as it takes the
connection back. When many are awaited at once (a web service's
handlers), they can share all of it: an enqueue that arrives while a
write of its pool is under way joins a line of its queue; the first in
line lets the others that arrive in the same turn of the loop join it
(the callers of a write that just ended), waits for room (at most
`MAX_IN_FLIGHT` writes at once), then writes every job in line as one
multi-row statement in one transaction (`Gatherer.submit`), and each
caller gets its own id, its own duplicate and its own error. An enqueue
that finds no write under way goes at once, alone, as before: gathering
adds no wait when nothing is in flight.

While writes follow one another (another under way or lined up as one
ends), a write keeps the pool's connection it ran on for the next, which
then needs no acquire, and the pool no reset between them (the writes
leave no session state behind). The last write of a burst gives its
connection back at once, as a lone enqueue does; one kept that no write
took within two turns of the loop goes back too: none is held idle, and
``Pool.close`` never waits for one. A connection a write broke or left
mid-statement (its caller cancelled) goes back at once, and the pool deals
with it.

A statement the server refuses rolls back whole: its jobs are then written
one by one, so that each caller gets the error of its own job. A
connection lost during the statement may have committed it or not; every
caller of the batch gets that error, as a lone enqueue would.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar

import asyncpg

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

__all__ = ["MAX_IN_FLIGHT", "RELEASE_TIMEOUT", "Gatherer", "gatherer_for"]

MAX_IN_FLIGHT = 2
"""Writes of one pool's enqueues under way at once (an enqueue that finds one under way is gathered)."""

RELEASE_TIMEOUT = 10.0
"""Seconds the pool's reset of a connection given back may take (a half-open socket)."""

T = TypeVar("T")
R = TypeVar("R")

# The gatherers by id(pool); an entry holds its pool, so an id is not reused
# while its entry stands. A pool is rarely dropped for another.
_gatherers: dict[int, Gatherer[Any, Any]] = {}


def gatherer_for(pool: asyncpg.Pool[Any]) -> Gatherer[Any, Any]:
    """The gatherer of ``pool`` in this process, made on first use."""
    gatherer = _gatherers.get(id(pool))
    if gatherer is None or gatherer.pool is not pool:
        gatherer = _gatherers[id(pool)] = Gatherer(pool)
    return gatherer


_LEAD: Any = object()
"""What a caller in line is handed when it becomes the first: it writes the line."""


@dataclass(eq=False)
class _Entry(Generic[T, R]):
    item: T
    turn: asyncio.Future[R] = field(default_factory=lambda: _future())
    """`_LEAD` once the caller leads; else its result or its error."""

    @property
    def leads(self) -> bool:
        return (
            self.turn.done()
            and not self.turn.cancelled()
            and self.turn.result() is _LEAD
        )


def _future() -> asyncio.Future[Any]:
    """A future whose error counts as seen: a caller cancelled in line never awaits it."""
    future = asyncio.get_running_loop().create_future()
    future.add_done_callback(lambda f: f.cancelled() or f.exception())
    return future


Held: TypeAlias = "asyncpg.pool.PoolConnectionProxy[Any]"
"""A connection of the pool, held by the gatherer for a write."""
Alone: TypeAlias = "Callable[[T, Held], Awaitable[R]]"
"""Write one item on the connection given."""
Together: TypeAlias = (
    "Callable[[Sequence[T], Held], Awaitable[Sequence[R | BaseException]]]"
)
"""Write items of one queue in one statement on the connection given: each its result or error."""


class Gatherer(Generic[T, R]):
    """One pool's enqueues: alone while none is under way, else gathered by queue."""

    def __init__(self, pool: asyncpg.Pool[Any]) -> None:
        self.pool = pool
        self._in_flight = 0
        self._room = asyncio.Event()
        self._lines: dict[str, list[_Entry[T, R]]] = {}
        self._kept: list[Held] = []
        self._acquiring = 0  # writes waiting for a connection of the pool
        self._sweep_due = False
        self._releases: set[asyncio.Task[None]] = set()
        self._writes: set[asyncio.Task[None]] = set()
        self.acquired = 0
        """How many connections the writes took from the pool (for tests)."""

    @property
    def acquiring(self) -> int:
        """How many writes wait for a connection of the pool (for tests)."""
        return self._acquiring

    async def submit(
        self,
        queue: str,
        item: T,
        alone: Alone[T, R],
        together: Together[T, R],
    ) -> R:
        """``alone(item)`` at once if no write is under way, else ``item``'s share of a gathered ``together``.

        ``together`` writes items of ``queue`` in one statement and returns,
        for each, its result or the error its caller raises.
        """
        line = self._lines.get(queue)
        if line is None and not self._in_flight:
            self._in_flight += 1
            try:
                async with self._connection() as connection:
                    return await alone(item, connection)
            finally:
                self._release()
        entry: _Entry[T, R] = _Entry(item)
        if line is None:
            line = self._lines[queue] = []
            entry.turn.set_result(_LEAD)
        line.append(entry)
        try:
            got = await entry.turn
        except BaseException:
            self._leave(queue, entry)
            raise
        if got is _LEAD:
            return await self._lead(queue, entry, alone, together)
        return got

    async def _lead(
        self,
        queue: str,
        entry: _Entry[T, R],
        alone: Alone[T, R],
        together: Together[T, R],
    ) -> R:
        """As the first in ``queue``'s line: wait a turn and for room, write the whole line; its own result."""
        try:
            # Those that arrive in this turn of the loop (the callers of a
            # write just ended) join the line first.
            await asyncio.sleep(0)
            while self._in_flight >= MAX_IN_FLIGHT:
                self._room.clear()
                await self._room.wait()
        except BaseException:
            self._leave(queue, entry)  # the next in line leads
            raise
        entries = self._lines.pop(queue)
        self._in_flight += 1
        entry.turn = _future()
        # A task of its own: the others in line wait for what it writes,
        # whether or not the leader waits too.
        task = asyncio.get_running_loop().create_task(
            self._write(entries, alone, together)
        )
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return await entry.turn

    async def _write(
        self,
        entries: list[_Entry[T, R]],
        alone: Alone[T, R],
        together: Together[T, R],
    ) -> None:
        """Write ``entries`` (one in flight, counted); hand each its result, then make room.

        Results first: the callers resume in one turn of the loop, and
        those that enqueue again join the line that waits for this room.
        """
        items = [entry.item for entry in entries]
        try:
            results = await self._results(items, alone, together)
            for entry, result in zip(entries, results, strict=True):
                if entry.turn.done():  # a caller that left
                    continue
                if isinstance(result, BaseException):
                    entry.turn.set_exception(result)
                else:
                    entry.turn.set_result(result)
        finally:
            for entry in entries:
                entry.turn.cancel()  # the write was cancelled (the loop shuts down)
            self._release()

    async def _results(
        self, items: list[T], alone: Alone[T, R], together: Together[T, R]
    ) -> list[R | BaseException]:
        """Write ``items`` on a connection of the pool: each its result or error."""
        try:
            async with self._connection() as connection:
                if len(items) == 1:
                    return [await _result(alone(items[0], connection))]
                try:
                    return list(await together(items, connection))
                except asyncpg.PostgresError:
                    if connection.is_closed():  # committed or not: unknown
                        raise
                    # Refused and rolled back whole: each job alone, for its own error.
                    return [await _result(alone(item, connection)) for item in items]
        except Exception as exc:  # no connection, or it broke
            return [exc] * len(items)

    def _leave(self, queue: str, entry: _Entry[T, R]) -> None:
        """A caller cancelled in line: out of it (its job is not written)."""
        line = self._lines.get(queue)
        if line is None or entry not in line:
            return  # taken: the write goes on without its caller
        line.remove(entry)
        if not line:
            del self._lines[queue]
        elif not any(other.leads for other in line):
            # The next caller still waiting leads (one cancelled too leaves
            # by this way in its turn).
            waiting = next((o for o in line if not o.turn.done()), None)
            if waiting is not None:
                waiting.turn.set_result(_LEAD)

    def _release(self) -> None:
        self._in_flight -= 1
        self._room.set()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[Held]:
        """A connection of the pool for one write: one kept from the last write, or acquired."""
        # No other write under way, none lined up: a lone enqueue, so far.
        lone = self._in_flight == 1 and not self._lines
        if self._kept:
            connection = self._kept.pop()
        else:
            self._acquiring += 1
            try:
                connection = await self.pool.acquire()
            finally:
                self._acquiring -= 1
            self.acquired += 1
        try:
            yield connection
        except asyncpg.PostgresError:
            self._done_with(connection, reusable=True, lone=lone)
            raise
        except BaseException:
            self._done_with(connection, reusable=False, lone=lone)
            raise
        self._done_with(connection, reusable=True, lone=lone)

    def _done_with(self, connection: Held, *, reusable: bool, lone: bool) -> None:
        """After a write: keep its connection for the next while writes follow one another.

        A lone enqueue's (``lone`` as it started, and the last as it ends)
        goes back to the pool at once, as a plain pool's would: it costs
        what it did, and the pool's reset runs before the worker it woke
        claims, not during the claim. So does one a write waits for the
        pool for (a small pool, or one busy elsewhere), one broken, or one
        left mid-statement (``reusable`` false: its caller was cancelled);
        with any kept, when this write was the last.
        """
        last = self._in_flight == 1 and not self._lines  # this write's count
        if (
            (lone and last)
            or not reusable
            or self._acquiring
            or connection.is_closed()
            or connection.is_in_transaction()
        ):
            self._give_back(connection)
            while last and self._kept:
                self._give_back(self._kept.pop())
            return
        self._kept.append(connection)
        if not self._sweep_due:
            self._sweep_due = True
            # Two turns of the loop: the callers of the write resume in the
            # first, and one that enqueues again at once takes it.
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, self._sweep)

    def _sweep(self) -> None:
        """Give back the kept connections, unless a write is under way or lined up."""
        self._sweep_due = False
        if self._in_flight or self._lines:
            return  # the last write of the burst gives them back as it ends
        while self._kept:
            self._give_back(self._kept.pop())

    def _give_back(self, connection: Held) -> None:
        """Release ``connection`` to the pool in the background (its reset is a round trip)."""
        task = asyncio.get_running_loop().create_task(self._released(connection))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _released(self, connection: Held) -> None:
        # The pool closes a connection it cannot reset; nothing is lost here.
        with contextlib.suppress(Exception):
            await self.pool.release(connection, timeout=RELEASE_TIMEOUT)


async def _result(call: Awaitable[R]) -> R | BaseException:
    """What ``call`` returns, or the error it raises."""
    try:
        return await call
    except Exception as exc:
        return exc
