"""The trend's reads: `TrendRow` and `TrendPoint`, what `pgqueue.Admin.trend` and `Admin.trend_points` return.

The workers keep ``pgqueue_trend`` (`pgqueue._engine.trend`): per minute,
queue and job type, the attempts that completed, failed and ended dead,
and their run times (a sum, and a histogram from which the 95th
percentile is read within 4.4 %). A read sums the minutes of its window:
its cost is one row a minute per queue and type, never a job's row.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pgqueue._core.checks import check_duration, check_job_type, check_queue_name
from pgqueue._engine.trend import bucket_value
from pgqueue._sql.trend import TREND_HISTOGRAM, TREND_ROWS, TREND_SERIES

if TYPE_CHECKING:
    from collections.abc import Mapping

    from pgqueue._store.executor import Executor

__all__ = [
    "TREND_POINTS",
    "TrendPoint",
    "TrendRow",
    "percentile",
    "read_points",
    "read_trend",
    "trend_window",
]

TREND_POINTS = 60
"""How many steps `Admin.trend_points` cuts a window into by default (a minute is the least)."""


class _Shape:
    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        """The fields, in their order, as JSON values (times as ISO 8601 text)."""
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            out[field.name] = (
                value.isoformat() if isinstance(value, datetime) else value
            )
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class TrendRow(_Shape):
    """A queue's and job type's attempts over a window, from `Admin.trend`.

    Attributes:
        queue: the queue.
        job_type: the job type.
        completed: attempts that completed.
        failed: attempts that failed, whether retried or dead-lettered (a
            job that failed twice and then completed counts 2 here, 1 in
            ``completed``).
        dead: jobs dead-lettered by a worker.
        mean_run_time: the mean seconds a handler ran, over every attempt
            counted that ran one; None when none did.
        p95_run_time: their 95th percentile, in seconds, within 4.4 % (read
            from a histogram); None when none did.

    .. versionadded:: 0.1
    """

    queue: str
    job_type: str
    completed: int
    failed: int
    dead: int
    mean_run_time: float | None
    p95_run_time: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class TrendPoint(_Shape):
    """One step of a window, summed over the queues and types asked for, from `Admin.trend_points`.

    Attributes:
        at: when the step starts.
        completed: attempts that completed in it.
        failed: attempts that failed in it (retried or dead-lettered).
        dead: jobs dead-lettered in it.
        mean_run_time: the mean seconds a handler ran in it; None if none ran.

    .. versionadded:: 0.1
    """

    at: datetime
    completed: int
    failed: int
    dead: int
    mean_run_time: float | None


def trend_window(since: timedelta | float) -> float:
    """``since`` (a timedelta or seconds) as positive seconds."""
    if isinstance(since, timedelta):
        since = since.total_seconds()
    return check_duration("since", since, positive=True)


def percentile(histogram: Mapping[int, int], fraction: float) -> float | None:
    """The run time below which ``fraction`` of a histogram's runs fall (its bucket's middle); None if empty."""
    total = sum(histogram.values())
    if not total:
        return None
    rank = math.ceil(fraction * total)
    seen = 0
    for k in sorted(histogram):
        seen += histogram[k]
        if seen >= rank:
            return bucket_value(k)
    return bucket_value(max(histogram))  # pragma: no cover: the loop always returns


async def read_trend(
    executor: Executor,
    queue: str | None,
    job_type: str | None,
    since: timedelta | float,
) -> list[TrendRow]:
    """`Admin.trend`'s rows (its arguments checked here)."""
    args = _args(queue, job_type, since)
    rows = await executor.fetch(TREND_ROWS, *args)
    if not rows:
        return []
    histograms: dict[tuple[str, str], dict[int, int]] = {}
    for row in await executor.fetch(TREND_HISTOGRAM, *args):
        histograms.setdefault((row["queue"], row["job_type"]), {})[row["k"]] = row["n"]
    return [
        TrendRow(
            queue=row["queue"],
            job_type=row["job_type"],
            completed=row["completed"],
            failed=row["failed"],
            dead=row["dead"],
            mean_run_time=_mean_run_time(row),
            p95_run_time=percentile(
                histograms.get((row["queue"], row["job_type"]), {}), 0.95
            ),
        )
        for row in rows
    ]


async def read_points(
    executor: Executor,
    queue: str | None,
    job_type: str | None,
    since: timedelta | float,
    points: int,
) -> list[TrendPoint]:
    """`Admin.trend_points`'s steps (its arguments checked here): only steps with counts."""
    args = _args(queue, job_type, since)
    step = step_of(args[2], points)
    rows = await executor.fetch(TREND_SERIES, *args, step)
    return [
        TrendPoint(
            at=row["at"],
            completed=row["completed"],
            failed=row["failed"],
            dead=row["dead"],
            mean_run_time=_mean_run_time(row),
        )
        for row in rows
    ]


def _mean_run_time(row: Mapping[str, Any]) -> float | None:
    """A summed row's mean run time, None where no handler ran."""
    runs: int = row["runs"]
    total: float = row["run_time_sum"]
    return total / runs if runs else None


def step_of(window: float, points: int) -> float:
    """The seconds of a step: a window cut into ``points``, in whole minutes (one at least)."""
    return float(max(1, math.ceil(window / points / 60.0)) * 60)


def _args(
    queue: str | None, job_type: str | None, since: timedelta | float
) -> tuple[str | None, str | None, float]:
    return (
        None if queue is None else check_queue_name(queue),
        None if job_type is None else check_job_type(job_type),
        trend_window(since),
    )
