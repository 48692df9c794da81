"""Running one job: call its handler and turn whatever happens into an outcome."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import time
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any, cast

import anyio
import anyio.to_thread

from pgqueue._core.backoff import MAX_BACKOFF
from pgqueue._core.codec import encode_payload
from pgqueue._core.errors import (
    RetryAfter,
    RunSuperseded,
    Snooze,
    Suspended,
    describe,
    is_permanent,
    storable,
)
from pgqueue._core.job import checkpoints_through, durable_through
from pgqueue._core.lifecycle import OutcomeKind
from pgqueue._core.outcome import CANCELLED_ERROR, Outcome
from pgqueue._core.text import clip

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from pgqueue._core.backoff import SafeBackoff
    from pgqueue._core.handler import Handler, SyncHandler
    from pgqueue._core.job import CheckpointWriter, Job
    from pgqueue._core.log import Logger
    from pgqueue._engine.durable import Durable

__all__ = [
    "TRACEBACK_INTERVAL",
    "JobRunner",
    "in_thread",
    "job_fields",
    "job_label",
]

TRACEBACK_INTERVAL = 60.0
"""Seconds between two tracebacks of retried attempts of one job type (below DEBUG)."""


_IN_THREAD: set[asyncio.Task[Any]] = set()
"""Tasks waiting for a sync handler's thread. A cancel request does not
cancel them (it would abandon the thread, still running, and free its slot):
the run ends when the thread returns."""


def in_thread(
    handler: SyncHandler, limiter: Callable[[], anyio.CapacityLimiter | None]
) -> Handler:
    """``handler`` as an async handler that runs it in a worker thread.

    ``limiter()`` bounds the threads running at once (anyio's default
    limiter if it gives None). The thread cannot be cancelled: a run the
    worker cancels (``job_timeout``, a stop cut off) waits for it to return.
    What the handler returns is awaited if it is awaitable (a ``def`` that
    returns a coroutine, such as a ``lambda`` calling an async function).
    """

    @functools.wraps(handler)
    async def threaded(job: Job) -> Any:
        task = cast("asyncio.Task[Any]", asyncio.current_task())
        _IN_THREAD.add(task)
        try:
            value = await anyio.to_thread.run_sync(handler, job, limiter=limiter())
        finally:
            _IN_THREAD.discard(task)
        if inspect.isawaitable(value):
            value = await value
        return value

    return threaded


@dataclass(eq=False)
class JobRunner:
    """Run jobs' handlers; every way a run can end becomes its outcome.

    `run` never raises, except the worker's own cancellation of the run
    (``cut_off()`` true: a stop that ran out of time), and
    exceptions that end the process (``KeyboardInterrupt``,
    ``SystemExit``). A ``CancelledError`` the handler raised by itself
    (awaiting a task someone else cancelled) fails the attempt like any
    exception. A run that outlives ``job_timeout`` fails with a timeout
    error, even if the handler swallowed the cancellation and returned. A run
    cancelled by request (`cancel`) ends cancelled, unless the handler
    finished its work and returned anyway (a sync handler's thread cannot
    be interrupted: its run ends when the thread returns).

    Each message names its job (`job_label`). A failed attempt that will be
    retried logs its traceback once per job type every
    `TRACEBACK_INTERVAL` seconds (every time when the logger is enabled for
    DEBUG), so a flood of retries does not flood the log; a dead job always
    logs its traceback.
    """

    handlers: Mapping[str, Handler]
    _: KW_ONLY
    job_timeout: float | None
    backoff: SafeBackoff
    logger: Logger
    checkpoints: CheckpointWriter | None = None
    durable: Durable | None = None

    def __post_init__(self) -> None:
        self._running: dict[int, asyncio.Task[Any]] = {}
        self._cancelled: set[int] = set()
        self._traceback_at: dict[str, float] = {}  # job type: when last logged

    def running(self, job_id: int) -> bool:
        """Whether a handler of job ``job_id`` is running here."""
        return job_id in self._running

    def cancel(self, job_id: int, *, ready: bool = False) -> bool:
        """Cancel the run of job ``job_id`` if it is running here; return whether it was.

        With ``ready``, the job is held but not started: it will end
        cancelled without running.
        """
        task = self._running.get(job_id)
        if task is None and not ready:
            return False
        self._cancelled.add(job_id)
        if task is not None and task not in _IN_THREAD:
            task.cancel()
        return True

    async def run(
        self,
        job: Job,
        cut_off: Callable[[], bool],
        task: asyncio.Task[Any] | None = None,
    ) -> Outcome:
        """Run ``job``'s handler and return its outcome.

        ``task`` is the task running it (looked up if not given): `cancel`
        cancels it.
        """
        if job.id in self._cancelled:
            self._cancelled.discard(job.id)
            return self._cancelled_outcome(job)
        handler = self.handlers.get(job.type)
        if handler is None:
            return self.dead(
                job,
                "no handler registered for job type"
                f" {clip(job.type, LOGGED_NAME_CHARS)!r}",
            )
        debug = debug_enabled(self.logger)
        if debug:
            self.logger.debug("%s started", job_label(job), extra=job_fields(job))
        failure: BaseException | str | None = None
        value: Any = None
        timeout = self.job_timeout
        running = self._running
        running[job.id] = task or asyncio.current_task()  # type: ignore[assignment]
        checkpoints_through(self.checkpoints)
        durable_through(self.durable)
        try:
            if timeout is None:
                value = await handler(job)
            else:
                deadline = anyio.current_time() + timeout
                with anyio.CancelScope(deadline=deadline) as scope:
                    value = await handler(job)
        except (Suspended, RunSuperseded) as exc:
            return self._suspended(job, exc)
        except BaseExceptionGroup as group:
            # A sleep or a wait in a task group the handler started ends the
            # run; any other group fails it, as any exception (or, holding
            # what is not an Exception, propagates, as before).
            ended = _suspension(group)
            if ended is not None:
                return self._suspended(job, ended)
            if not isinstance(group, Exception):
                raise
            failure = group
        except anyio.get_cancelled_exc_class() as exc:
            if cut_off():
                raise
            failure = exc
            _forget_own_cancel()
        except Exception as exc:
            failure = exc
        finally:
            running.pop(job.id, None)
            if self.durable is not None:
                self.durable.ended(job)
        if self._cancelled and job.id in self._cancelled:
            self._cancelled.discard(job.id)
            _forget_own_cancel()
            if failure is not None:
                return self._cancelled_outcome(job)
        if timeout is not None and (
            scope.cancel_called or anyio.current_time() >= deadline
        ):
            failure = f"job timed out after {timeout:g} s"
        if failure is not None:
            return self.failed(job, failure)
        if debug:
            self.logger.debug("%s completed", job_label(job), extra=job_fields(job))
        if value is None:
            return Outcome(job, OutcomeKind.COMPLETED)
        try:
            result = encode_payload(value)
        except (TypeError, ValueError) as exc:
            return self.dead(
                job,
                storable(f"the handler returned what cannot be stored as JSON: {exc}"),
            )
        return Outcome(job, OutcomeKind.COMPLETED, result=result)

    def _suspended(self, job: Job, exc: Suspended | RunSuperseded) -> Outcome:
        """The outcome of a run a durable sleep or wait ended, or found superseded: nothing to write."""
        self._cancelled.discard(job.id)
        if isinstance(exc, RunSuperseded):
            self.logger.warning(
                "%s: stale run superseded by rescue; its writes were refused",
                job_label(job),
                extra=job_fields(job),
            )
            return Outcome(job, OutcomeKind.SUSPENDED, delay=math.inf)
        self.logger.info(
            "%s ended for now: %s",
            job_label(job),
            exc.what,
            extra={**job_fields(job), "wait": exc.what, "delay": exc.seconds},
        )
        delay = math.inf if exc.seconds is None else exc.seconds
        return Outcome(job, OutcomeKind.SUSPENDED, delay=delay)

    def dead(self, job: Job, error: str) -> Outcome:
        """Dead-letter ``job`` at once, for ``error``."""
        self.logger.error(
            "%s dead: %s",
            job_label(job),
            error,
            extra={**job_fields(job), "error": error},
        )
        return Outcome(job, OutcomeKind.DEAD, error=error)

    def failed(self, job: Job, failure: BaseException | str) -> Outcome:
        """The outcome of a failed attempt: a retry, a snooze, or dead."""
        fields = job_fields(job)
        if isinstance(failure, Snooze):
            self.logger.info(
                "%s snoozed for %ss",
                job_label(job),
                _seconds(failure.seconds),
                extra={**fields, "delay": failure.seconds},
            )
            return Outcome(job, OutcomeKind.SNOOZED, delay=failure.seconds)
        if isinstance(failure, str):
            error, exc_info, permanent = failure, None, False
        else:
            error, exc_info = describe(failure), failure
            try:
                permanent = is_permanent(failure)
            except Exception:
                permanent = False
        if permanent or job.attempts >= job.max_attempts:
            self.logger.error(
                "%s dead: %s",
                job_label(job),
                error,
                extra={**fields, "error": error},
                exc_info=exc_info,
            )
            return Outcome(job, OutcomeKind.DEAD, error=error)
        if isinstance(failure, RetryAfter):
            delay = min(failure.seconds, MAX_BACKOFF)
        else:
            delay = self.backoff(job.attempts)
        if exc_info is not None and not self._traceback_due(job.type):
            exc_info = None
        self.logger.warning(
            "%s failed; will retry in %ss: %s",
            job_label(job),
            _seconds(delay),
            error,
            extra={**fields, "error": error, "retry_in": delay},
            exc_info=exc_info,
        )
        return Outcome(job, OutcomeKind.PENDING, delay=delay, error=error)

    def _traceback_due(self, job_type: str) -> bool:
        """Whether a retried attempt of ``job_type`` logs its traceback now."""
        if debug_enabled(self.logger):
            return True
        now = time.monotonic()
        last = self._traceback_at.get(job_type)
        if last is not None and now - last < TRACEBACK_INTERVAL:
            return False
        self._traceback_at[job_type] = now
        return True

    def _cancelled_outcome(self, job: Job) -> Outcome:
        self.logger.info(
            "%s cancelled by request", job_label(job), extra=job_fields(job)
        )
        return Outcome(job, OutcomeKind.CANCELLED, error=CANCELLED_ERROR)


def _suspension(group: BaseExceptionGroup[Any]) -> Suspended | RunSuperseded | None:
    """The sleep, wait or superseded write a group holds, if that is all it holds."""
    matched, rest = group.split((Suspended, RunSuperseded))
    if matched is None or rest is not None:
        return None
    first: BaseException = matched
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return cast("Suspended | RunSuperseded", first)


def _forget_own_cancel() -> None:
    """Withdraw a cancel request the handler made of its own task (``current_task().cancel()``)."""
    task = asyncio.current_task()
    while task is not None and task.cancelling():
        task.uncancel()


LOGGED_NAME_CHARS = 200
"""The most characters of a job's type or queue a log record carries (a
producer other than pgqueue may write names of any length)."""


def job_fields(job: Job) -> dict[str, Any]:
    """What every log record about ``job`` carries."""
    return {
        "job_id": job.id,
        "job_type": clip(job.type, LOGGED_NAME_CHARS),
        "queue": clip(job.queue, LOGGED_NAME_CHARS),
        "attempt": job.attempts,
    }


def job_label(job: Job) -> str:
    """How log messages name ``job``: ``job 12 (send_email on emails, attempt 2/25)``."""
    return (
        f"job {job.id} ({clip(job.type, LOGGED_NAME_CHARS)} on"
        f" {clip(job.queue, LOGGED_NAME_CHARS)}, "
        f"attempt {job.attempts}/{job.max_attempts})"
    )


def _seconds(value: float) -> str:
    """A delay for a message: ``4``, ``0.5``, ``2.31``, ``86400``."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def debug_enabled(logger: Logger) -> bool:
    """Report whether ``logger`` would emit DEBUG records (assume yes if it cannot say)."""
    is_enabled = getattr(logger, "isEnabledFor", None)
    return bool(is_enabled(logging.DEBUG)) if callable(is_enabled) else True
