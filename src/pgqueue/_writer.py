"""Batches the worker's outcome writes into one fenced statement per flush."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from pgqueue import _sql
from pgqueue._errors import DATABASE_ERRORS, PgQueueError
from pgqueue._job import Status

if TYPE_CHECKING:
    from collections.abc import Callable

    from pgqueue._dedicated import DedicatedConnection
    from pgqueue._job import Job
    from pgqueue._log import Logger

__all__ = ["RELEASED", "Outcome", "OutcomeWriter"]

RELEASED = "released"
"""An outcome for a job claimed but never started: pending again, attempt given back."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one claim of a job ended as; written fenced on ``job.attempts``.

    ``status`` is a final `Status`, ``Status.PENDING`` for a retry after
    ``delay`` seconds, or `RELEASED`.
    """

    job: Job
    status: str
    delay: float = 0.0
    error: str | None = None


class OutcomeWriter:
    """Collect outcomes and write everything collected in one statement.

    A flush starts as soon as an outcome arrives and nothing is being
    written, so an idle worker writes within a round trip, and a busy one
    writes everything that arrived during the previous flush at once.
    """

    def __init__(
        self,
        connection: DedicatedConnection,
        *,
        logger: Logger,
        queue: str,
        on_retry: Callable[[float], None] | None = None,
    ) -> None:
        self._connection = connection
        self._on_retry = on_retry
        self._logger = logger
        self._queue = queue
        self._buffer: list[Outcome] = []
        # asyncio's events: anyio's look up the running library on creation,
        # and these are made once per flush.
        self._arrived = asyncio.Event()
        self._settled = asyncio.Event()
        self._settled.set()
        self._closed = False
        self.flushed = 0
        """Outcomes sent to the database so far (written or dropped as stale)."""

    @property
    def backlog(self) -> int:
        """Outcomes not yet written."""
        return len(self._buffer)

    def put(self, outcome: Outcome) -> None:
        """Queue ``outcome`` for the next flush; never waits."""
        if self._closed:
            msg = "the outcome writer is closed"
            raise PgQueueError(msg)
        self._buffer.append(outcome)
        if self._settled.is_set():
            self._settled = asyncio.Event()
        self._arrived.set()

    async def aclose(self) -> None:
        """Close the writer's connection."""
        self._closed = True
        await self._connection.aclose()

    async def settled(self) -> None:
        """Wait until every outcome put so far has been written (or dropped as stale)."""
        await self._settled.wait()

    async def run(self) -> None:
        """Flush until cancelled; failed flushes are retried with backoff."""
        failures = 0
        while True:
            if not self._buffer:
                self._settled.set()
                self._arrived = asyncio.Event()
                await self._arrived.wait()
            batch, self._buffer = self._buffer, []
            try:
                await self._flush(batch)
            except DATABASE_ERRORS as exc:
                self._buffer[:0] = batch
                failures += 1
                self._logger.error(
                    "pgqueue: writing job outcomes failed; retrying",
                    extra={
                        "error": repr(exc),
                        "count": len(batch),
                        "queue": self._queue,
                    },
                )
                await anyio.sleep(min(5.0, 0.05 * 2**failures))
            else:
                failures = 0
                self.flushed += len(batch)

    async def _flush(self, batch: list[Outcome]) -> None:
        rows = await self._connection.fetch(
            _sql.FINISH,
            [o.job.id for o in batch],
            [o.job.attempts for o in batch],
            [o.status for o in batch],
            [o.delay for o in batch],
            [o.error for o in batch],
        )
        if self._on_retry is not None:
            for delay in {o.delay for o in batch if o.status == Status.PENDING}:
                self._on_retry(delay)
        if len(rows) == len(batch):
            return
        matched = {(row[0], row[1]) for row in rows}
        for outcome in batch:
            job = outcome.job
            if (job.id, job.attempts) not in matched:
                self._logger.warning(
                    "pgqueue: stale run superseded by rescue; result dropped",
                    extra={
                        "job_id": job.id,
                        "job_type": job.type,
                        "queue": job.queue,
                        "attempt": job.attempts,
                        "outcome": outcome.status,
                    },
                )


def debug_enabled(logger: Logger) -> bool:
    """Report whether ``logger`` would emit DEBUG records (assume yes if it cannot say)."""
    is_enabled = getattr(logger, "isEnabledFor", None)
    return bool(is_enabled(logging.DEBUG)) if callable(is_enabled) else True
