"""Running one job: call its handler and turn whatever happens into an outcome."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio

from pgqueue._errors import describe, is_permanent
from pgqueue._job import Job, Status
from pgqueue._outcome import Outcome

if TYPE_CHECKING:
    from pgqueue._backoff import SafeBackoff
    from pgqueue._log import Logger

__all__ = ["Handler", "JobRunner", "job_fields"]

Handler: TypeAlias = Callable[[Job], Awaitable[None]]
"""Runs one job; returning completes it, raising fails the attempt."""


class JobRunner:
    """Run jobs' handlers; every way a run can end becomes its outcome.

    `run` never raises, except the worker's own cancellation of the run
    (``cut_off()`` true: a stop that ran out of time, or a cancel request),
    and ``BaseException``\\ s that end the process (``KeyboardInterrupt``,
    ``SystemExit``). A ``CancelledError`` the handler raised by itself
    (awaiting a task someone else cancelled) fails the attempt like any
    exception. A run that outlives ``job_timeout`` fails with a timeout
    error, even if the handler swallowed the cancellation and returned.
    """

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        job_timeout: float | None,
        backoff: SafeBackoff,
        logger: Logger,
    ) -> None:
        self._handlers = handlers
        self._timeout = job_timeout
        self._backoff = backoff
        self._logger = logger

    async def run(self, job: Job, cut_off: Callable[[], bool]) -> Outcome:
        """Run ``job``'s handler and return its outcome."""
        handler = self._handlers.get(job.type)
        if handler is None:
            return self.dead(job, f"no handler registered for job type {job.type!r}")
        debug = debug_enabled(self._logger)
        if debug:
            self._logger.debug("job started", extra=job_fields(job))
        failure: BaseException | str | None = None
        timeout = self._timeout
        try:
            if timeout is None:
                await handler(job)
            else:
                deadline = anyio.current_time() + timeout
                with anyio.CancelScope(deadline=deadline) as scope:
                    await handler(job)
        except anyio.get_cancelled_exc_class() as exc:
            if cut_off():
                raise
            failure = exc
            _forget_own_cancel()
        except Exception as exc:
            failure = exc
        if timeout is not None and (
            scope.cancel_called or anyio.current_time() >= deadline
        ):
            failure = f"job timed out after {timeout:g} s"
        if failure is None:
            if debug:
                self._logger.debug("job completed", extra=job_fields(job))
            return Outcome(job, Status.COMPLETED)
        return self.failed(job, failure)

    def dead(self, job: Job, error: str) -> Outcome:
        """Dead-letter ``job`` at once, for ``error``."""
        self._logger.error("job dead", extra={**job_fields(job), "error": error})
        return Outcome(job, Status.DEAD, error=error)

    def failed(self, job: Job, failure: BaseException | str) -> Outcome:
        """The outcome of a failed attempt: a retry after the backoff, or dead."""
        fields = job_fields(job)
        if isinstance(failure, str):
            error, exc_info, permanent = failure, None, False
        else:
            error, exc_info = describe(failure), failure
            try:
                permanent = is_permanent(failure)
            except Exception:
                permanent = False
        if permanent or job.attempts >= job.max_attempts:
            self._logger.error(
                "job dead", extra={**fields, "error": error}, exc_info=exc_info
            )
            return Outcome(job, Status.DEAD, error=error)
        delay = self._backoff(job.attempts)
        self._logger.warning(
            "job failed; will retry",
            extra={**fields, "error": error, "retry_in": delay},
            exc_info=exc_info,
        )
        return Outcome(job, Status.PENDING, delay=delay, error=error)


def _forget_own_cancel() -> None:
    """Withdraw a cancel request the handler made of its own task (``current_task().cancel()``)."""
    task = asyncio.current_task()
    while task is not None and task.cancelling():
        task.uncancel()


def job_fields(job: Job) -> dict[str, Any]:
    """What every log record about ``job`` carries."""
    return {
        "job_id": job.id,
        "job_type": job.type,
        "queue": job.queue,
        "attempt": job.attempts,
    }


def debug_enabled(logger: Logger) -> bool:
    """Report whether ``logger`` would emit DEBUG records (assume yes if it cannot say)."""
    is_enabled = getattr(logger, "isEnabledFor", None)
    return bool(is_enabled(logging.DEBUG)) if callable(is_enabled) else True
