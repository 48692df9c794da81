"""The tasks that run handlers: ``concurrency`` of them, fed from the ledger's ready jobs."""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any

from pgqueue._core.outcome import shutdown_outcome
from pgqueue._engine.runner import job_fields, job_label

if TYPE_CHECKING:
    from collections.abc import Callable

    from pgqueue._core.job import Job
    from pgqueue._core.outcome import Outcome
    from pgqueue._engine.ledger import Claims
    from pgqueue._engine.services import LaneServices

__all__ = ["RUNNING_FOR", "Consumers"]

RUNNING_FOR: contextvars.ContextVar[object] = contextvars.ContextVar("pgqueue_worker")
"""The worker whose handler the current task runs (or a task a handler started)."""


@dataclass(eq=False)
class Consumers:
    """Run ready jobs on long-lived tasks, one job at a time each.

    Long-lived tasks cost far less per job than a task each. A claim wakes
    one idle consumer; a consumer that takes a job wakes the next idle one
    while jobs still wait, so a batch costs a few task switches, not one
    per job.

    Args:
        services: the worker's: handlers run with `RUNNING_FOR` set to its
            ``owner``; each outcome goes to ``put``; ``on_exit`` is called
            with the ``SystemExit`` or ``KeyboardInterrupt`` a handler
            raised (its job's outcome is put first).
        on_ended: called after each job's outcome is put.
    """

    services: LaneServices
    claims: Claims
    _: KW_ONLY
    on_ended: Callable[[], None]

    def __post_init__(self) -> None:
        self._idle: list[asyncio.Future[None]] = []
        self._waking = 0  # consumers woken that have not resumed yet
        self._open = True
        self._taking = True

    def wake(self) -> None:
        """Jobs are ready: wake an idle consumer, unless one is already waking."""
        if not self._waking:
            self._wake_one()

    def stop_taking(self) -> None:
        """Start no more jobs; return once the job in hand is done."""
        self._taking = False
        self.close()

    def close(self) -> None:
        """Let consumers return once no job is ready."""
        self._open = False
        while self._idle:
            self._wake_one()

    async def run(self) -> None:
        """One consumer: run ready jobs until closed (or told to stop taking them)."""
        RUNNING_FOR.set(self.services.owner)
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        claims = self.claims
        ready = claims.ready
        while True:
            while ready and self._taking:
                job = claims.start()
                if ready and not self._waking:
                    self._wake_one()
                await self._execute(job, task)
            if not self._open:
                return
            idle = loop.create_future()
            self._idle.append(idle)
            await idle
            self._waking -= 1

    def _wake_one(self) -> None:
        while self._idle:
            idle = self._idle.pop()
            if not idle.done():
                idle.set_result(None)
                self._waking += 1
                return

    async def _execute(self, job: Job, task: asyncio.Task[Any] | None) -> None:
        claims = self.claims
        started = asyncio.get_running_loop().time() if claims.ahead else 0.0
        try:
            outcome = await self.services.runner.run(job, self.services.cut_off, task)
        except (KeyboardInterrupt, SystemExit) as exc:
            # Raised out of a task, these would stop the event loop itself,
            # before any outcome is written: stop the worker instead.
            self._end(shutdown_outcome(job))
            self.services.on_exit(exc)
            return
        except BaseException:
            outcome = shutdown_outcome(job)
            self.services.logger.warning(
                "%s cut off by shutdown",
                job_label(job),
                extra={**job_fields(job), "outcome": outcome.status},
            )
            self._end(outcome)
            raise
        if claims.ahead:
            claims.ran(asyncio.get_running_loop().time() - started)
        self._end(outcome)

    def _end(self, outcome: Outcome) -> None:
        self.claims.ended()
        self.services.put(outcome)
        self.on_ended()
