"""The worker's share of the trend: its written outcomes, counted in memory and added to ``pgqueue_trend`` every few seconds.

Per job this costs an append to a list in the worker's process (the run
time, under the outcome's queue, type and kind) and, at the flush, its
share of a sum (its histogram bucket too, up to `HISTOGRAM_SAMPLES` runs
of a queue, type and kind a flush: past them a sample);
per flush, one statement for every queue and type the worker ran since
the last one, into the minute of the database's clock; per
`TREND_PRUNE_EVERY` flushes, one ``DELETE`` of the worker's queues'
buckets older than `TREND_KEPT`. Counts of a worker killed between two
flushes are lost (at most `TREND_FLUSH_EVERY` seconds of them); a stopping
worker flushes last, after its outcomes are written. Only pgqueue's
workers count: a Go worker's outcomes are not in the trend.
"""

from __future__ import annotations

import json
import math
import operator
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING

import anyio
import asyncpg

from pgqueue._core.lifecycle import OutcomeKind
from pgqueue._core.retry import Failures

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pgqueue._core.log import Logger
    from pgqueue._core.outcome import Outcome
    from pgqueue._store.postgres import TrendCounts
    from pgqueue._wire.dedicated import DedicatedConnection

__all__ = [
    "BUCKETS_PER_DOUBLING",
    "HISTOGRAM_SAMPLES",
    "TREND_FLUSH_EVERY",
    "TREND_KEPT",
    "TREND_PRUNE_EVERY",
    "TrendTally",
    "bucket_of",
    "bucket_value",
]

TREND_FLUSH_EVERY = 10.0
"""Seconds between a worker's flushes of its counts into ``pgqueue_trend``."""

TREND_KEPT = 8 * 86400.0
"""Seconds ``pgqueue_trend``'s buckets are kept (a week and a day)."""

TREND_PRUNE_EVERY = 60
"""Flushes between two prunes of the worker's queues' old buckets (10 minutes)."""

HISTOGRAM_SAMPLES = 256
"""The most run times of a queue, type and kind a flush puts in the histogram: past
them, a systematic sample (every k-th run, counted k times); the sum and
the counts are always exact."""

BUCKETS_PER_DOUBLING = 8
"""The run-time histogram's resolution: bucket ``k`` holds [2^(k/8), 2^((k+1)/8)) ms, 9 % wide."""

_LOWEST = -80  # 1 microsecond and less
_HIGHEST = 8 * 27  # 2^27 ms, 37 hours and more


def bucket_of(seconds: float) -> int:
    """The histogram bucket of a run time."""
    if seconds <= 0:
        return _LOWEST
    k = math.floor(BUCKETS_PER_DOUBLING * math.log2(seconds * 1000.0))
    return min(max(k, _LOWEST), _HIGHEST)


def bucket_value(k: int) -> float:
    """The seconds a bucket stands for: its geometric middle (within 4.4 % of every time in it)."""
    return float(2.0 ** ((k + 0.5) / BUCKETS_PER_DOUBLING) / 1000.0)


@dataclass(slots=True)
class _Counts:
    completed: int = 0
    failed: int = 0
    dead: int = 0
    runs: int = 0
    run_time_sum: float = 0.0
    histogram: dict[int, int] = field(default_factory=dict)

    def count(self, kind: OutcomeKind, times: list[float | None]) -> None:
        """Count outcomes of ``kind``, one a run time in ``times`` (None where no handler ran)."""
        if kind == _COMPLETED:
            self.completed += len(times)
        else:
            self.failed += len(times)
            if kind == _DEAD:
                self.dead += len(times)
        timed = [t for t in times if t is not None] if None in times else times
        self.runs += len(timed)
        self.run_time_sum += math.fsum(timed)  # type: ignore[arg-type]
        # Past HISTOGRAM_SAMPLES runs, every stride-th counts stride times.
        stride = -(-len(timed) // HISTOGRAM_SAMPLES)
        histogram = self.histogram
        for k in map(bucket_of, timed[::stride] if stride > 1 else timed):  # type: ignore[arg-type]
            histogram[k] = histogram.get(k, 0) + stride

    def merge(self, other: _Counts) -> None:
        self.completed += other.completed
        self.failed += other.failed
        self.dead += other.dead
        self.runs += other.runs
        self.run_time_sum += other.run_time_sum
        for k, n in other.histogram.items():
            self.histogram[k] = self.histogram.get(k, 0) + n


_COMPLETED, _RETRIED, _DEAD = (
    OutcomeKind.COMPLETED,
    OutcomeKind.PENDING,
    OutcomeKind.DEAD,
)
_COUNTED = frozenset((_COMPLETED, _RETRIED, _DEAD))
_KEY = operator.attrgetter("job.queue", "job.type", "status")
_RUN_TIME = operator.attrgetter("run_time")


@dataclass(eq=False)
class TrendTally:
    """Count the worker's written outcomes by queue and job type; flush them to ``pgqueue_trend``.

    ``completed``: attempts that completed; ``failed``: attempts that
    failed, retried or dead-lettered (a job that failed twice and then
    completed counts 2 and 1); ``dead``: those dead-lettered. Run times of
    every attempt a handler ran. Snoozes, releases and cancels are not
    counted; nor are the outcomes the rescue sweep writes.

    The hot path (`add`, for every written batch) appends the run times
    to a list per queue, type and kind (in C for a batch of one, the usual
    one: a few MB for 10 s of 10,000 jobs a second); the counting, the sums
    and the histograms are done at the flush, in bulk (the histogram of at
    most `HISTOGRAM_SAMPLES` runs a flush of each).
    """

    queues: Sequence[str]
    _: KW_ONLY
    logger: Logger
    fields: Mapping[str, object]

    def __post_init__(self) -> None:
        self._times: dict[tuple[str, str, OutcomeKind], list[float | None]] = {}
        self._counts: dict[tuple[str, str], _Counts] = {}  # taken, not yet written
        self._flushes = 0
        self._off = False  # the table is missing or not ours to write

    def add(self, outcomes: Sequence[Outcome], fenced: Sequence[Outcome]) -> None:
        """Note ``outcomes`` (a written flush's), but those ``fenced`` off."""
        if self._off:
            return
        if fenced:
            stale = {o.key for o in fenced}
            outcomes = [o for o in outcomes if o.key not in stale]
        if not outcomes:
            return
        table = self._times
        keys = list(map(_KEY, outcomes))
        key = keys[0]
        if keys.count(key) == len(keys):
            # A batch of one queue, type and kind (the usual one): in C,
            # and compared rather than hashed (each job's names are new
            # strings, whose hashes are not computed yet).
            times = table.get(key)
            if times is None:
                table[key] = list(map(_RUN_TIME, outcomes))
            else:
                times += map(_RUN_TIME, outcomes)
            return
        # Unpacked, not read by name: a named tuple's fields cost a call each.
        for job, kind, _, _, _, run_time in outcomes:
            key = (job.queue, job.type, kind)
            try:
                table[key].append(run_time)
            except KeyError:
                table[key] = [run_time]

    def _take(self) -> dict[tuple[str, str], _Counts]:
        """The counts noted since the last flush (and those a failed flush left), by queue and type."""
        table, self._times = self._times, {}
        counts, self._counts = self._counts, {}
        for (queue, job_type, kind), times in table.items():
            if kind not in _COUNTED:
                continue
            entry = counts.get((queue, job_type))
            if entry is None:
                entry = counts[queue, job_type] = _Counts()
            entry.count(kind, times)
        return counts

    async def run(self, connection: DedicatedConnection) -> None:
        """Flush every `TREND_FLUSH_EVERY` seconds, until cancelled or the table is found missing."""
        failures = Failures.of(self, "writing the trend failed; retrying")
        while not self._off:
            await anyio.sleep(failures.pause(TREND_FLUSH_EVERY))
            try:
                await self.flush(connection)
            except Exception as exc:
                failures.failed(exc)
            else:
                failures.succeeded()

    async def flush(self, connection: DedicatedConnection) -> None:
        """Add the counts since the last flush to ``pgqueue_trend`` (kept for the next one if it fails)."""
        if self._off:
            self._times.clear()
            return
        taken = self._take()
        try:
            if taken:
                await connection.store.add_trend(connection, _flush_rows(taken))
            if self._flushes % TREND_PRUNE_EVERY == 0:
                await connection.store.prune_trend(
                    connection, list(self.queues), TREND_KEPT
                )
            self._flushes += 1
        except (asyncpg.UndefinedTableError, asyncpg.InsufficientPrivilegeError) as exc:
            self._off = True
            self.logger.warning(
                "the trend is not kept: %s (apply pgqueue.SCHEMA_UPGRADE, and grant"
                " the worker's role its privileges on pgqueue_trend)",
                exc,
                extra=dict(self.fields),
            )
        except BaseException:
            for key, counts in taken.items():
                later = self._counts.get(key)
                if later is not None:
                    counts.merge(later)
                self._counts[key] = counts
            raise


def _flush_rows(taken: Mapping[tuple[str, str], _Counts]) -> list[TrendCounts]:
    """One row a (queue, type), sorted (so flushes lock rows in one order)."""
    return [
        (
            queue,
            job_type,
            c.completed,
            c.failed,
            c.dead,
            c.runs,
            c.run_time_sum,
            json.dumps({str(k): n for k, n in c.histogram.items()}),
        )
        for (queue, job_type), c in sorted(taken.items())
    ]
