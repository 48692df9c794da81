"""Hooks for metrics and tracing: what the producer and the worker report.

Middleware sees a handler run; what it cannot see comes through here: an
enqueue as it happens (`EnqueueHook`, given to `Queue`), and what became of
the outcomes the worker wrote and of the jobs its rescue sweep found
(`Observer`, given to `Worker`). `pgqueue.prometheus` and `pgqueue.otel` are
built on them. Nothing here costs a thing when no hook is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pgqueue._core.log import hook_failed

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence

    from pgqueue._core.job import NewJob
    from pgqueue._core.log import Logger
    from pgqueue._core.outcome import Outcome

T = TypeVar("T")

__all__ = [
    "EnqueueEvent",
    "EnqueueHook",
    "Observer",
    "call_observers",
    "told",
]


@dataclass(slots=True, eq=False)
class EnqueueEvent:
    """One `Queue.enqueue` or `Queue.enqueue_many` call, as its hooks see it.

    Hooks see only calls whose input was valid (bad input raises before
    anything is sent, and before any hook runs).

    Attributes:
        queue: the queue's name.
        jobs: the jobs of the call, in input order (`Queue.enqueue` makes one
            `NewJob` of its arguments).
        batch: whether the call was `Queue.enqueue_many`.
        trace_context: set it in `EnqueueHook.before_enqueue` to store text
            with every job of the call (`Job.trace_context`); at most one
            hook should.
        ids: after the call, each job's id in input order; empty if it failed
            before the database answered.
        duplicates: after the call, for each job, whether its unique key gave
            it an existing job's id (or an earlier job's of the same call)
            instead of a new row; a job that replaced an existing one
            (``on_conflict="replace"``, ``debounce``) is one, a job queued
            after a started one is not.
    """

    queue: str
    jobs: Sequence[NewJob]
    batch: bool
    trace_context: str | None = None
    ids: list[int] = field(default_factory=list)
    duplicates: list[bool] = field(default_factory=list)


class EnqueueHook(Protocol):
    """Told of every enqueue of a `Queue` (``Queue(pool, hooks=[...])``).

    Subclass it to inherit the no-op methods, or write both. A hook that
    raises is logged and the enqueue goes on; hooks run in the caller's task,
    so `before_enqueue` may set a context variable (the current span) that
    `after_enqueue` resets.
    """

    def before_enqueue(self, event: EnqueueEvent) -> Any:
        """Called before the statement is sent; returns a state given to `after_enqueue`."""
        return None

    def after_enqueue(
        self, event: EnqueueEvent, state: Any, error: BaseException | None
    ) -> None:
        """Called once the call ended: ``error`` is what it raised, or None.

        ``event.ids`` and ``event.duplicates`` are filled when the database
        answered, even if the call then raised `DuplicateJobError`.
        """
        return


class Observer(Protocol):
    """Told what the worker's writes and rescue sweeps did (``Worker(pool, observers=[...])``).

    Subclass it to inherit no-op methods, or write only those you need. The
    methods run on the worker's event loop, on its hot path: keep them quick
    and never block. One that raises is logged and changes nothing else.
    """

    def on_written(self, written: Sequence[Outcome], fenced: Sequence[Outcome]) -> None:
        """Outcomes were flushed: ``written`` were recorded, ``fenced`` were stale.

        An outcome is fenced off when the job's row was no longer held by
        that run (rescued, and perhaps claimed again): nothing was written.
        ``Outcome.status`` is ``completed``, ``dead``, ``cancelled``,
        ``pending`` (a retry after ``delay`` seconds), ``snoozed`` or
        ``released`` (claimed but never started, given back on stop); a
        retry, snooze or release of a job whose cancel was requested is
        recorded as ``cancelled`` by the database.
        """
        return

    def on_rescued(self, queue: str, statuses: Mapping[str, int]) -> None:
        """The rescue sweep found orphans of ``queue``: how many became each status.

        ``pending`` (back in line), ``dead`` (attempts used up) or
        ``cancelled`` (their cancel was requested).
        """
        return


def call_observers(methods: Sequence[Any], logger: Logger, *args: object) -> None:
    """Call each of ``methods`` with ``args``; log, and otherwise ignore, what one raises."""
    for method in methods:
        try:
            method(*args)
        except Exception as exc:
            hook_failed(logger, method, exc)


def _before(
    hooks: Sequence[EnqueueHook], event: EnqueueEvent, logger: Logger
) -> list[tuple[EnqueueHook, Any]]:
    """Call each hook's `EnqueueHook.before_enqueue`; return those that did not raise, with their states."""
    entered = []
    for hook in hooks:
        try:
            entered.append((hook, hook.before_enqueue(event)))
        except Exception as exc:
            hook_failed(logger, hook, exc)
    return entered


def _after(
    entered: list[tuple[EnqueueHook, Any]],
    event: EnqueueEvent,
    error: BaseException | None,
    logger: Logger,
) -> None:
    """Call `EnqueueHook.after_enqueue` of the hooks `_before` entered, last first."""
    for hook, state in reversed(entered):
        try:
            hook.after_enqueue(event, state, error)
        except Exception as exc:
            hook_failed(logger, hook, exc)


async def told(
    hooks: Sequence[EnqueueHook],
    event: EnqueueEvent,
    logger: Logger,
    call: Callable[[], Awaitable[T]],
) -> T:
    """Await ``call()`` with each hook told of ``event`` before and after it."""
    entered = _before(hooks, event, logger)
    try:
        result = await call()
    except BaseException as exc:
        _after(entered, event, exc, logger)
        raise
    _after(entered, event, None, logger)
    return result
