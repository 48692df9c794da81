"""The worker's periodic upkeep: heartbeats, the rescue sweep, the retention sweep."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import anyio

from pgqueue._core.job import Status
from pgqueue._core.retry import Failures
from pgqueue._sql.admin import DISTRIBUTED_PRUNE_BATCH, PRUNE_BATCH
from pgqueue._sql.channels import ANNOUNCE
from pgqueue._sql.literals import array
from pgqueue._sql.outcomes import DISTRIBUTED_RESCUE, DISTRIBUTED_TOUCH, RESCUE, TOUCH
from pgqueue._sql.settings import NO_JIT

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    import asyncpg

    from pgqueue._core.log import Logger
    from pgqueue._core.outcome import Key
    from pgqueue._wire.dedicated import DedicatedConnection

__all__ = ["HEARTBEATS_PER_RESCUE", "SWEEP_BATCH", "Upkeep"]

HEARTBEATS_PER_RESCUE = 3
"""Heartbeats sent per ``rescue_after``: a live job's row is never older than
``rescue_after / 3`` (plus a round trip), far from being taken for an orphan."""

SWEEP_BATCH = 1000
"""The most rows one rescue or prune statement touches."""


class Upkeep:
    """Keep the worker's claims alive, rescue orphans, prune old rows.

    All three share one connection. No statement on it waits for long:
    each has the connection's deadline, and the sweeps work in batches of
    `SWEEP_BATCH` rows that skip rows other sessions hold, so a heartbeat
    waits at most for one batch. Each sweep covers every queue of the
    worker in one statement.

    Args:
        keys: the claims to heartbeat (every claim not yet durable).
        queues: the worker's queues, which the sweeps cover.
        fields: the worker's log fields (its queue, or its queues).
        on_swept: called, for each queue a rescue batch found orphans of,
            with how many became each status.
        queue_keys: the claims to heartbeat by queue; on Citus (a
            distributed table) each queue's are touched on its shard, and
            each sweep is one statement per queue.
    """

    def __init__(
        self,
        connection: DedicatedConnection,
        keys: Callable[[], list[Key]],
        *,
        queues: Sequence[str],
        fields: Mapping[str, object],
        rescue_after: float,
        interval: float,
        logger: Logger,
        on_rescued: Callable[[Sequence[str]], None],
        on_cancel_requested: Callable[[int], None],
        on_swept: Callable[[str, Mapping[str, int]], None] | None = None,
        queue_keys: Callable[[], Mapping[str, list[Key]]] | None = None,
    ) -> None:
        self._connection = connection
        self._queue_keys = queue_keys
        self._keys = keys
        self._queues = list(queues)
        self._fields = fields
        self._rescue_after = rescue_after
        self._interval = interval
        self._logger = logger
        self._on_rescued = on_rescued
        self._on_cancel_requested = on_cancel_requested
        self._on_swept = on_swept

    async def heartbeats(self) -> None:
        """Refresh ``updated_at`` of every claim not yet durable, every ``rescue_after / 3``.

        Rescue then measures liveness, not runtime: a long handler on a live
        worker keeps its row fresh, a dead worker's rows go stale. Outcomes
        not yet written are refreshed too, so a worker cut off from the
        database keeps its jobs as long as its heartbeats get through. A
        heartbeat also finds the jobs whose cancel was requested (in case
        the NOTIFY was missed).
        """
        interval = self._rescue_after / HEARTBEATS_PER_RESCUE
        failures = Failures(
            self._logger, "heartbeat failed", fields=self._fields, quiet=True
        )
        while True:
            await anyio.sleep(failures.pause(interval))
            if self._connection.distributed and self._queue_keys is not None:
                try:
                    rows = await self._touch_routed(self._queue_keys())
                except Exception as exc:
                    failures.failed(exc)
                else:
                    failures.succeeded()
                    for row in rows:
                        self._on_cancel_requested(row["id"])
                continue
            keys = sorted(self._keys())  # in id order, as outcome writes lock rows
            if not keys:
                continue
            try:
                rows = await self._connection.fetch(
                    TOUCH,
                    array(key[0] for key in keys),
                    array(key[1] for key in keys),
                )
            except Exception as exc:
                failures.failed(exc)
            else:
                failures.succeeded()
                for row in rows:
                    self._on_cancel_requested(row["id"])

    async def _touch_routed(
        self, keys_by_queue: Mapping[str, list[Key]]
    ) -> list[asyncpg.Record]:
        """The heartbeat on Citus: one statement per queue, on its shard."""
        rows: list[asyncpg.Record] = []
        for queue, unsorted in keys_by_queue.items():
            keys = sorted(unsorted)
            if keys:
                rows += await self._connection.fetch(
                    DISTRIBUTED_TOUCH,
                    array(key[0] for key in keys),
                    array(key[1] for key in keys),
                    queue,
                )
        return rows

    async def rescue(self) -> None:
        """Put orphaned jobs back (or dead-letter them), at once and then every interval."""
        failures = Failures(
            self._logger, "rescue sweep failed", fields=self._fields, quiet=True
        )
        while True:
            try:
                self._report(await self._rescue_all())
            except Exception as exc:
                failures.failed(exc)
            else:
                failures.succeeded()
            await anyio.sleep(failures.pause(self._interval))

    def _report(self, swept: Mapping[str, Counter[str]]) -> None:
        rescued = []
        for queue, statuses in swept.items():
            back = statuses[Status.PENDING]
            ended = statuses.total() - back
            if back:
                rescued.append(queue)
                self._logger.warning(
                    "rescued stuck jobs", extra={"count": back, "queue": queue}
                )
            if ended:
                self._logger.error(
                    "ended stuck jobs: dead (attempts used up) or cancelled (by request)",
                    extra={"count": ended, "queue": queue},
                )
        if rescued:
            self._on_rescued(rescued)

    async def _rescue_all(self) -> dict[str, Counter[str]]:
        """Rescue every orphan of the worker's queues; how many became each status, by queue."""
        swept: dict[str, Counter[str]] = {}
        if self._connection.distributed:
            for queue in self._queues:
                await self._rescue_queue(queue, swept)
            return swept
        while True:
            rows = await self._connection.fetch(
                RESCUE, self._queues, self._rescue_after, SWEEP_BATCH
            )
            batch: dict[str, Counter[str]] = {}
            for row in rows:
                batch.setdefault(row["queue"], Counter())[row["status"]] += 1
            for queue, statuses in batch.items():
                swept.setdefault(queue, Counter()).update(statuses)
                if self._on_swept is not None:
                    self._on_swept(queue, statuses)
            if len(rows) < SWEEP_BATCH:
                return swept

    async def _rescue_queue(self, queue: str, swept: dict[str, Counter[str]]) -> None:
        """The rescue sweep of one queue on Citus; tracked jobs that ended are announced after."""
        while True:
            rows = await self._connection.fetch(
                DISTRIBUTED_RESCUE, queue, self._rescue_after, SWEEP_BATCH
            )
            statuses: Counter[str] = Counter(row["status"] for row in rows)
            if statuses:
                swept.setdefault(queue, Counter()).update(statuses)
                if self._on_swept is not None:
                    self._on_swept(queue, statuses)
            ended = [str(row["id"]) for row in rows if row["ended"]]
            if ended:
                await self._connection.fetch(ANNOUNCE, ended)
            if len(rows) < SWEEP_BATCH:
                return

    async def retention(self, retain: float) -> None:
        """Delete the worker's queues' finished (completed, dead, cancelled) rows older than ``retain`` s, every interval."""
        failures = Failures(
            self._logger, "retention sweep failed", fields=self._fields, quiet=True
        )
        while True:
            try:
                removed = await self._prune_all(retain)
            except Exception as exc:
                failures.failed(exc)
            else:
                failures.succeeded()
                if removed:
                    self._logger.info(
                        "pruned finished jobs",
                        extra={"count": removed, **self._fields},
                    )
            await anyio.sleep(failures.pause(self._interval))

    async def _prune_all(self, retain: float) -> int:
        if self._connection.distributed:
            removed = 0
            for queue in self._queues:
                removed += await self._prune_queue(queue, retain)
            return removed
        removed, after = 0, 0
        while True:
            _, (row,) = await self._connection.transaction(
                [
                    (NO_JIT, ()),
                    (PRUNE_BATCH, (self._queues, retain, after, SWEEP_BATCH)),
                ]
            )
            count: int = row["removed"]
            after = row["last_id"]
            removed += count
            if count < SWEEP_BATCH:
                return removed

    async def _prune_queue(self, queue: str, retain: float) -> int:
        """The retention sweep of one queue on Citus."""
        removed, after = 0, 0
        while True:
            row = await self._connection.fetchrow(
                DISTRIBUTED_PRUNE_BATCH, queue, retain, after, SWEEP_BATCH
            )
            assert row is not None
            count: int = row["removed"]
            after = row["last_id"]
            removed += count
            if count < SWEEP_BATCH:
                return removed
