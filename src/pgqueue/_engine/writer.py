"""Batches the worker's outcome writes into one fenced statement per flush."""

from __future__ import annotations

import asyncio
import operator
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING

import anyio

from pgqueue._core.errors import is_transient
from pgqueue._core.lifecycle import OutcomeKind
from pgqueue._core.log import safe_repr
from pgqueue._core.outcome import Outcome
from pgqueue._core.retry import Failures
from pgqueue._engine.runner import job_fields, job_label

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from pgqueue._core.log import Logger
    from pgqueue._core.outcome import Key
    from pgqueue._wire.dedicated import DedicatedConnection

__all__ = ["OutcomeWriter"]


@dataclass(eq=False)
class OutcomeWriter:
    """Collect outcomes and write everything collected in one statement.

    A flush starts as soon as an outcome arrives and nothing is being
    written, so an idle worker writes within a round trip, and a busy one
    writes everything that arrived during the previous flush at once.

    A flush that fails because the database is unavailable (unreachable,
    shutting down, or read-only: `pgqueue._core.errors.is_transient`) is
    retried with the retry-delay rule, on a new connection. One the server refuses for its data never blocks
    the others: the batch is split until the refused outcomes are found;
    each is written again with a placeholder error, then as dead with one,
    and given up (left to the rescue sweep) only if even that is refused.
    Every outcome written, fenced off as stale, or given up is settled
    (``settle`` is called with the outcomes and their keys: the worker
    forgets those claims); ``on_written`` is told of each flush's outcomes,
    and of those among them fenced off. Outcomes are written by id, so one
    writer serves every queue of a worker.
    """

    connection: DedicatedConnection
    settle: Callable[[Sequence[Outcome], list[Key]], None]
    _: KW_ONLY
    logger: Logger
    fields: Mapping[str, object]
    on_written: Callable[[Sequence[Outcome], Sequence[Outcome]], None]

    def __post_init__(self) -> None:
        self._buffer: list[Outcome] = []
        self._suspended: list[Outcome] = []
        # asyncio's event: anyio's looks up the running library on creation.
        self._arrived = asyncio.Event()

    def put(self, outcome: Outcome) -> None:
        """Queue ``outcome`` for the next flush; never waits.

        A `SUSPENDED` outcome (a durable handler's sleep or wait: its row
        is written already) is settled at the next flush without a write.
        """
        if outcome.status is _SUSPENDED:
            self._suspended.append(outcome)
        else:
            self._buffer.append(outcome)
        self._arrived.set()

    async def run(self) -> None:
        """Flush until cancelled."""
        failures = Failures.of(self, "writing job outcomes failed; retrying")
        while True:
            if self._suspended:
                self._settle_suspended()
            if not self._buffer:
                self._arrived.clear()
                await self._arrived.wait()
                if self._suspended:
                    self._settle_suspended()
                if not self._buffer:
                    continue
            batch, self._buffer = self._buffer, []
            try:
                await self._write(batch)
            except Exception as exc:
                await anyio.sleep(failures.failed(exc, count=len(self._buffer)))
            else:
                failures.succeeded()

    def _settle_suspended(self) -> None:
        suspended, self._suspended = self._suspended, []
        self.settle(suspended, [o.key for o in suspended])
        self.on_written(suspended, ())

    async def _write(self, batch: list[Outcome]) -> None:
        """Write ``batch``; on a transient failure, put back what is unwritten and raise."""
        parts = self.connection.store.parts(batch)
        while parts:
            part = parts.pop()
            try:
                await self._finish(part)
            except Exception as exc:
                if is_transient(exc):
                    for unwritten in parts:
                        part.extend(unwritten)
                    self._buffer[:0] = part
                    raise
                if len(part) > 1:
                    middle = len(part) // 2
                    parts += (part[middle:], part[:middle])
                else:
                    parts += self._instead_of(part[0], exc)

    async def _finish(self, part: list[Outcome]) -> None:
        rows = await self.connection.store.finish(self.connection, part)
        stale: Sequence[Outcome] = ()
        if len(rows) < len(part):
            stale = self._log_stale(
                part, {(row["id"], row["attempts"]) for row in rows}
            )
        self.settle(part, [o.key for o in part])
        self.on_written(part, stale)

    def _instead_of(self, outcome: Outcome, exc: Exception) -> list[list[Outcome]]:
        """What to write instead of ``outcome``, which the server refused; [] to give up."""
        job = outcome.job
        reason = safe_repr(exc)
        placeholder = (
            f"pgqueue could not record this outcome ({type(exc).__name__}); "
            "see the worker's log"
        )
        if outcome.error != placeholder:
            status = outcome.status if outcome.error is not None else OutcomeKind.DEAD
            self.logger.error(
                "database refused a job outcome; writing a placeholder error",
                extra={**job_fields(job), "outcome": outcome.status, "error": reason},
            )
            return [[Outcome(job, status, outcome.delay, placeholder)]]
        if outcome.status != OutcomeKind.DEAD:
            return [[Outcome(job, OutcomeKind.DEAD, error=placeholder)]]
        self.logger.error(
            "database refused a job outcome; giving up (the rescue sweep will find the job)",
            extra={**job_fields(job), "error": reason},
        )
        self.settle([outcome], [outcome.key])
        return []

    def _log_stale(
        self, part: list[Outcome], matched: set[tuple[int, int]]
    ) -> list[Outcome]:
        """Log the outcomes of ``part`` the write did not match (fenced off); return them."""
        stale = [outcome for outcome in part if outcome.key not in matched]
        for outcome in stale:
            self.logger.warning(
                "%s: stale run superseded by rescue; result dropped",
                job_label(outcome.job),
                extra={**job_fields(outcome.job), "outcome": outcome.status},
            )
        return stale


_KEY = operator.attrgetter("key")
_SUSPENDED = OutcomeKind.SUSPENDED
