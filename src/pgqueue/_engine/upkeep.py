"""The worker's periodic upkeep: heartbeats, the rescue sweep, the retention sweep."""

from __future__ import annotations

from collections import Counter
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING

import anyio

from pgqueue._core.lifecycle import Status
from pgqueue._core.options import queue_specs
from pgqueue._core.retry import Failures

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from pgqueue._core.log import Logger
    from pgqueue._core.options import WorkerOptions
    from pgqueue._core.outcome import Key
    from pgqueue._wire.dedicated import DedicatedConnection

__all__ = ["HEARTBEATS_PER_RESCUE", "SWEEP_BATCH", "Upkeep"]

HEARTBEATS_PER_RESCUE = 3
"""Heartbeats sent per ``rescue_after``: a live job's row is never older than
``rescue_after / 3`` (plus a round trip), far from being taken for an orphan."""

SWEEP_BATCH = 1000
"""The most rows one rescue or prune statement touches."""


@dataclass(eq=False)
class Upkeep:
    """Keep the worker's claims alive, rescue orphans, prune old rows.

    All three share one connection. No statement on it waits for long:
    each has the connection's deadline, and the sweeps work in batches of
    `SWEEP_BATCH` rows that skip rows other sessions hold, so a heartbeat
    waits at most for one batch. Each sweep covers every queue of the
    worker in one statement.

    The rescue sweep runs every ``max(poll_interval, rescue_after / 2)``.

    Args:
        keys: the claims to heartbeat (every claim not yet durable), by queue.
        options: the worker's options; the sweeps cover its queues.
        fields: the worker's log fields (its queue, or its queues).
        on_swept: called, for each queue a rescue batch found orphans of,
            with how many became each status.
    """

    connection: DedicatedConnection
    keys: Callable[[], Mapping[str, list[Key]]]
    options: WorkerOptions
    _: KW_ONLY
    fields: Mapping[str, object]
    logger: Logger
    on_rescued: Callable[[Sequence[str]], None]
    on_cancel_requested: Callable[[int], None]
    on_swept: Callable[[str, Mapping[str, int]], None] | None = None

    async def heartbeats(self) -> None:
        """Refresh ``updated_at`` of every claim not yet durable, every ``rescue_after / 3``.

        Rescue then measures liveness, not runtime: a long handler on a live
        worker keeps its row fresh, a dead worker's rows go stale. Outcomes
        not yet written are refreshed too, so a worker cut off from the
        database keeps its jobs as long as its heartbeats get through. A
        heartbeat also finds the jobs whose cancel was requested (in case
        the NOTIFY was missed).
        """
        interval = self.options.rescue_after / HEARTBEATS_PER_RESCUE
        failures = Failures.of(self, "heartbeat failed")
        while True:
            await anyio.sleep(failures.pause(interval))
            keys = self.keys()
            if not any(keys.values()):
                continue
            try:
                cancelled = await self.connection.store.touch(self.connection, keys)
            except Exception as exc:
                failures.failed(exc)
            else:
                failures.succeeded()
                for job_id in cancelled:
                    self.on_cancel_requested(job_id)

    async def rescue(self) -> None:
        """Put orphaned jobs back (or dead-letter them), at once and then every interval."""
        failures = Failures.of(self, "rescue sweep failed")
        while True:
            try:
                self._report(await self._rescue_all())
            except Exception as exc:
                failures.failed(exc)
            else:
                failures.succeeded()
            await anyio.sleep(failures.pause(self._interval()))

    def _report(self, swept: Mapping[str, Counter[str]]) -> None:
        rescued = []
        for queue, statuses in swept.items():
            back = statuses[Status.PENDING]
            ended = statuses.total() - back
            if back:
                rescued.append(queue)
                self.logger.warning(
                    "rescued stuck jobs", extra={"count": back, "queue": queue}
                )
            if ended:
                self.logger.error(
                    "ended stuck jobs: dead (attempts used up) or cancelled (by request)",
                    extra={"count": ended, "queue": queue},
                )
        if rescued:
            self.on_rescued(rescued)

    async def _rescue_all(self) -> dict[str, Counter[str]]:
        """Rescue every orphan of the worker's queues; how many became each status, by queue."""
        swept: dict[str, Counter[str]] = {}
        batches = self.connection.store.rescue(
            self.connection,
            self._queues(),
            self.options.rescue_after,
            SWEEP_BATCH,
        )
        async for batch in batches:
            for queue, statuses in batch.items():
                swept.setdefault(queue, Counter()).update(statuses)
                if self.on_swept is not None:
                    self.on_swept(queue, statuses)
        return swept

    async def retention(self) -> None:
        """Delete the worker's queues' finished (completed, dead, cancelled) rows older than ``retain`` s, every interval."""
        retain = self.options.retain
        if retain is None:
            return
        failures = Failures.of(self, "retention sweep failed")
        while True:
            try:
                removed = await self._prune_all(retain)
            except Exception as exc:
                failures.failed(exc)
            else:
                failures.succeeded()
                if removed:
                    self.logger.info(
                        "pruned finished jobs",
                        extra={"count": removed, **self.fields},
                    )
            await anyio.sleep(failures.pause(self._interval()))

    async def _prune_all(self, retain: float) -> int:
        return await self.connection.store.sweep(
            self.connection, self._queues(), retain, SWEEP_BATCH
        )

    def _queues(self) -> list[str]:
        """The worker's queues, which the sweeps cover."""
        return list(queue_specs(self.options))

    def _interval(self) -> float:
        """Seconds between two sweeps."""
        options = self.options
        return max(options.poll_interval, options.rescue_after / 2)
