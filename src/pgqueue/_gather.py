"""Enqueues that commit by themselves, gathered into one statement while others are in flight.

Each enqueue on a pool (no ``connection=``) pays a pool acquire, a
statement and a commit of its own. When many are awaited at once (a web
service's handlers), they can share all three: an enqueue that arrives
while `MAX_IN_FLIGHT` writes of its pool are under way joins a line of its
queue; the first in line waits for a write to end, then writes every job
in line as one multi-row statement in one transaction (`Gatherer.submit`),
and each caller gets its own id, its own duplicate and its own error. An
enqueue that finds room goes at once, alone, as before: gathering adds no
wait when nothing is in flight.

A statement the server refuses rolls back whole: its jobs are then written
one by one, so that each caller gets the error of its own job. A
connection lost during the statement may have committed it or not; every
caller of the batch gets that error, as a lone enqueue would.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import asyncpg

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

__all__ = ["MAX_IN_FLIGHT", "Gatherer", "gatherer_for"]

MAX_IN_FLIGHT = 2
"""Writes of one pool's enqueues under way before the next ones are gathered."""

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


class Gatherer(Generic[T, R]):
    """One pool's enqueues: at most `MAX_IN_FLIGHT` writes at once, the rest gathered by queue."""

    def __init__(self, pool: asyncpg.Pool[Any]) -> None:
        self.pool = pool
        self._in_flight = 0
        self._room = asyncio.Event()
        self._lines: dict[str, list[_Entry[T, R]]] = {}

    async def submit(
        self,
        queue: str,
        item: T,
        alone: Callable[[T], Awaitable[R]],
        together: Callable[[Sequence[T]], Awaitable[Sequence[R | BaseException]]],
    ) -> R:
        """``alone(item)`` at once if there is room, else ``item``'s share of a gathered ``together``.

        ``together`` writes items of ``queue`` in one statement and returns,
        for each, its result or the error its caller raises.
        """
        line = self._lines.get(queue)
        if line is None and self._in_flight < MAX_IN_FLIGHT:
            self._in_flight += 1
            try:
                return await alone(item)
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
        alone: Callable[[T], Awaitable[R]],
        together: Callable[[Sequence[T]], Awaitable[Sequence[R | BaseException]]],
    ) -> R:
        """As the first in ``queue``'s line: wait for room, write the whole line; its own result."""
        try:
            while self._in_flight >= MAX_IN_FLIGHT:
                self._room.clear()
                await self._room.wait()
        except BaseException:
            self._leave(queue, entry)  # the next in line leads
            raise
        entries = self._lines.pop(queue)
        self._in_flight += 1
        # Shielded: the others in line wait for what it writes.
        results = await asyncio.shield(self._write(entries, alone, together))
        result = results[entries.index(entry)]
        if isinstance(result, BaseException):
            raise result
        return result

    async def _write(
        self,
        entries: list[_Entry[T, R]],
        alone: Callable[[T], Awaitable[R]],
        together: Callable[[Sequence[T]], Awaitable[Sequence[R | BaseException]]],
    ) -> list[R | BaseException]:
        """Write ``entries`` (one in flight, counted); hand each in line its result."""
        try:
            items = [entry.item for entry in entries]
            if len(items) == 1:
                results = [await _result(alone(items[0]))]
            else:
                try:
                    results = list(await together(items))
                except asyncpg.PostgresError:
                    # Refused and rolled back whole: each job alone, for its own error.
                    results = [await _result(alone(item)) for item in items]
                except Exception as exc:
                    results = [exc] * len(items)
        finally:
            self._release()
        for entry, result in zip(entries, results, strict=True):
            if entry.turn.done():  # the leader's, or a caller that left
                continue
            if isinstance(result, BaseException):
                entry.turn.set_exception(result)
            else:
                entry.turn.set_result(result)
        return results

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


async def _result(call: Awaitable[R]) -> R | BaseException:
    """What ``call`` returns, or the error it raises."""
    try:
        return await call
    except Exception as exc:
        return exc
