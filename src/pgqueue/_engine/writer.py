"""Batches the worker's outcome writes into one fenced statement per flush."""

from __future__ import annotations

import asyncio
import operator
from typing import TYPE_CHECKING

import anyio

from pgqueue._core.errors import is_transient
from pgqueue._core.outcome import Kind, Outcome
from pgqueue._core.retry import Failures, safe_repr
from pgqueue._engine.runner import job_fields, job_label
from pgqueue._sql.channels import ANNOUNCE
from pgqueue._sql.literals import array
from pgqueue._sql.outcomes import (
    COMPLETE,
    DISTRIBUTED_COMPLETE,
    DISTRIBUTED_FINISH,
    FINISH,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    import asyncpg

    from pgqueue._core.log import Logger
    from pgqueue._core.outcome import Key
    from pgqueue._wire.dedicated import DedicatedConnection

__all__ = ["OutcomeWriter"]


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

    def __init__(
        self,
        connection: DedicatedConnection,
        settle: Callable[[Sequence[Outcome], list[Key]], None],
        *,
        logger: Logger,
        fields: Mapping[str, object],
        on_written: Callable[[Sequence[Outcome], Sequence[Outcome]], None],
    ) -> None:
        self._connection = connection
        self._settle = settle
        self._on_written = on_written
        self._logger = logger
        self._fields = fields
        self._buffer: list[Outcome] = []
        # asyncio's event: anyio's looks up the running library on creation.
        self._arrived = asyncio.Event()

    def put(self, outcome: Outcome) -> None:
        """Queue ``outcome`` for the next flush; never waits."""
        self._buffer.append(outcome)
        self._arrived.set()

    async def run(self) -> None:
        """Flush until cancelled."""
        failures = Failures(
            self._logger,
            "writing job outcomes failed; retrying",
            fields=self._fields,
            quiet=True,
        )
        while True:
            if not self._buffer:
                self._arrived.clear()
                await self._arrived.wait()
            batch, self._buffer = self._buffer, []
            try:
                await self._write(batch)
            except Exception as exc:
                await anyio.sleep(failures.failed(exc, count=len(self._buffer)))
            else:
                failures.succeeded()

    async def _write(self, batch: list[Outcome]) -> None:
        """Write ``batch``; on a transient failure, put back what is unwritten and raise."""
        parts = [batch]
        if self._connection.distributed:
            # On Citus, one statement per queue: each runs on its queue's shard.
            by_queue: dict[str, list[Outcome]] = {}
            for outcome in batch:
                by_queue.setdefault(outcome.job.queue, []).append(outcome)
            parts = list(by_queue.values())
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
        # Rows are locked in id order, as the heartbeat locks them: two
        # statements locking the same rows in different orders deadlock,
        # and the loser waits deadlock_timeout before it fails.
        part.sort(key=_KEY)
        keys = [o.key for o in part]
        ids = array([key[0] for key in keys])
        attempts = array([key[1] for key in keys])
        results = [o.result for o in part]
        statuses = [o.status for o in part]
        args: tuple[object, ...]
        if self._connection.distributed:
            rows = await self._finish_routed(part, ids, attempts, results, statuses)
        elif all(status == Kind.COMPLETED for status in statuses):
            query, args = COMPLETE, (ids, attempts, results)
        else:
            query = FINISH
            args = (
                ids,
                attempts,
                statuses,
                array([o.delay for o in part]),
                [o.error for o in part],
                results,
            )
        if not self._connection.distributed:
            rows = await self._connection.fetch(query, *args)
        stale: Sequence[Outcome] = ()
        if len(rows) < len(part):
            stale = self._log_stale(
                part, {(row["id"], row["attempts"]) for row in rows}
            )
        self._settle(part, keys)
        self._on_written(part, stale)

    async def _finish_routed(
        self,
        part: list[Outcome],
        ids: str,
        attempts: str,
        results: list[str | None],
        statuses: list[Kind],
    ) -> list[asyncpg.Record]:
        """The outcomes of one queue's runs on Citus; tracked jobs that ended are announced after."""
        queue = part[0].job.queue
        if all(status == Kind.COMPLETED for status in statuses):
            rows = await self._connection.fetch(
                DISTRIBUTED_COMPLETE, ids, attempts, results, queue
            )
        else:
            rows = await self._connection.fetch(
                DISTRIBUTED_FINISH,
                ids,
                attempts,
                statuses,
                array([o.delay for o in part]),
                [o.error for o in part],
                results,
                queue,
            )
        ended = [str(row["id"]) for row in rows if row["ended"]]
        if ended:
            await self._connection.fetch(ANNOUNCE, ended)
        return rows

    def _instead_of(self, outcome: Outcome, exc: Exception) -> list[list[Outcome]]:
        """What to write instead of ``outcome``, which the server refused; [] to give up."""
        job = outcome.job
        reason = safe_repr(exc)
        placeholder = (
            f"pgqueue could not record this outcome ({type(exc).__name__}); "
            "see the worker's log"
        )
        if outcome.error != placeholder:
            status = outcome.status if outcome.error is not None else Kind.DEAD
            self._logger.error(
                "database refused a job outcome; writing a placeholder error",
                extra={**job_fields(job), "outcome": outcome.status, "error": reason},
            )
            return [[Outcome(job, status, outcome.delay, placeholder)]]
        if outcome.status != Kind.DEAD:
            return [[Outcome(job, Kind.DEAD, error=placeholder)]]
        self._logger.error(
            "database refused a job outcome; giving up (the rescue sweep will find the job)",
            extra={**job_fields(job), "error": reason},
        )
        self._settle([outcome], [outcome.key])
        return []

    def _log_stale(
        self, part: list[Outcome], matched: set[tuple[int, int]]
    ) -> list[Outcome]:
        """Log the outcomes of ``part`` the write did not match (fenced off); return them."""
        stale = [outcome for outcome in part if outcome.key not in matched]
        for outcome in stale:
            self._logger.warning(
                "%s: stale run superseded by rescue; result dropped",
                job_label(outcome.job),
                extra={**job_fields(outcome.job), "outcome": outcome.status},
            )
        return stale


_KEY = operator.attrgetter("key")
