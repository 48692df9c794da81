"""enqueue_many's jobs checked and laid out as its statement's columns, for any driver.

`check_jobs` reads the input (``NewJob`` values or ``(job_type, payload)``
tuples) and refuses a bad job before any SQL runs; `insert_many` gives the
INSERT statement and its arguments (``$n`` placeholders; arrays and JSON
cross as text, which any driver sends as is); `Batch.ids` reads its rows back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgqueue._core import sql as _sql
from pgqueue._core.checks import (
    check_bool,
    check_max_attempts,
    check_name,
    check_priority,
    check_unique_key,
    check_when,
)
from pgqueue._core.job import NewJob

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from datetime import datetime

__all__ = ["Batch", "check_jobs", "insert_many"]


def check_jobs(
    jobs: Iterable[NewJob | tuple[str, Any]],
    max_attempts: int,
    new_jobs: list[NewJob] | None = None,
) -> Batch:
    """The checked jobs of an enqueue_many call, ``max_attempts`` the default.

    Each job is appended to ``new_jobs``, if given, as a `NewJob` (for
    enqueue hooks).

    Raises:
        TypeError, ValueError: as `Queue.enqueue`, naming the bad job's index.
    """
    batch = Batch()
    checked_types: set[str] = set()
    for index, job in enumerate(jobs):
        pair: object = job  # whatever the annotation says
        if (
            type(pair) is tuple
            and len(pair) == 2
            and type(pair[0]) is str
            and pair[0] in checked_types
        ):
            # (job_type, payload) of a type already checked: nothing to check.
            batch.add(pair[0], pair[1], max_attempts, None, None, 0, None, False)
        else:
            try:
                (
                    job_type,
                    payload,
                    attempts,
                    run_at,
                    delay,
                    priority,
                    key,
                    track,
                ) = _unpack(job)
                if type(job_type) is not str or job_type not in checked_types:
                    checked_types.add(check_name("job type", job_type))
                batch.add(
                    job_type,  # type: ignore[arg-type]
                    payload,
                    max_attempts if attempts is None else check_max_attempts(attempts),
                    *check_when(run_at, delay),
                    check_priority(priority),
                    check_unique_key(key),
                    check_bool("track", track),
                )
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"job {index}: {exc}") from exc
        if new_jobs is not None:
            new_jobs.append(job if isinstance(job, NewJob) else NewJob(*job))
    return batch


def insert_many(
    queue: str,
    batch: Batch,
    payloads: str,
    trace_context: str | None,
    *,
    notify: bool,
) -> tuple[str, tuple[Any, ...]]:
    """The INSERT of ``batch`` onto ``queue``, and its arguments.

    ``payloads``: the jobs' payloads as one JSON array. With ``notify`` the
    statement wakes the queue's workers (in its transaction). Its answer:
    for a batch with unique keys, rows for `Batch.ids`; without, one value,
    the ids joined by commas.
    """
    args: tuple[Any, ...] = (
        queue,
        batch.types,
        payloads,
        *batch.columns(),
        trace_context,
    )
    delayed = batch.delayed
    if delayed:
        args = (*args, _sql.seconds(batch.delays))
    return _MANY[batch.keyed, delayed, notify], args


# insert_many's statement by (unique keys, delays, NOTIFY in the statement).
_MANY = {
    (False, False, True): _sql.ENQUEUE_MANY,
    (False, True, True): _sql.ENQUEUE_MANY_DELAYED,
    (True, False, True): _sql.ENQUEUE_MANY_UNIQUE,
    (True, True, True): _sql.ENQUEUE_MANY_UNIQUE_DELAYED,
    (False, False, False): _sql.ENQUEUE_MANY_SILENT,
    (False, True, False): _sql.ENQUEUE_MANY_DELAYED_SILENT,
    (True, False, False): _sql.ENQUEUE_MANY_UNIQUE_SILENT,
    (True, True, False): _sql.ENQUEUE_MANY_UNIQUE_DELAYED_SILENT,
}


def _unpack(
    job: object,
) -> tuple[object, Any, object, object, object, object, object, object]:
    """(job_type, payload, max_attempts, run_at, delay, priority, unique_key, track) of a job for enqueue_many."""
    if isinstance(job, tuple) and len(job) == 2:
        return job[0], job[1], None, None, None, 0, None, False
    if isinstance(job, NewJob):
        return (
            job.job_type,
            job.payload,
            job.max_attempts,
            job.run_at,
            job.delay,
            job.priority,
            job.unique_key,
            job.track,
        )
    msg = f"expected a NewJob or a (job_type, payload) tuple, got {job!r:.80}"
    raise TypeError(msg)


class Batch:
    """The checked jobs of one enqueue_many call, a list per column.

    Jobs of the call with the same type and unique key are merged into the
    first; the columns of priority, tracking, keys and delays stay empty when no job
    uses them (the statement pads them with defaults).
    """

    def __init__(self) -> None:
        self.types: list[str] = []
        self.payloads: list[Any] = []
        self.attempts: list[int] = []
        self.run_ats: list[datetime | None] = []
        self.delays: list[float | None] = []
        self.priorities: list[int] = []
        self.tracked: list[bool] = []
        self._keys: list[str | None] = []
        self._index_of: list[int] = []  # each input job's row
        self._row_of_key: dict[tuple[str, str], int] = {}
        self.keyed = False
        self._special = False
        self.delayed = False
        """Whether a job has a delay (the batch then takes the _DELAYED statements)."""

    def add(
        self,
        job_type: str,
        payload: Any,
        max_attempts: int,
        run_at: datetime | None,
        delay: float | None,
        priority: int,
        key: str | None,
        track: bool,
    ) -> None:
        if key is not None:
            row = self._row_of_key.get((job_type, key))
            if row is not None:
                self._index_of.append(row)
                return
            self._row_of_key[job_type, key] = len(self.types)
            self.keyed = True
        self._index_of.append(len(self.types))
        self.types.append(job_type)
        self.payloads.append(payload)
        self.attempts.append(max_attempts)
        self.run_ats.append(run_at)
        self.delays.append(delay)
        self.delayed = self.delayed or delay is not None
        self.priorities.append(priority)
        self.tracked.append(track)
        self._keys.append(key)
        self._special = self._special or priority != 0 or track

    def columns(self) -> tuple[str, str, str, str, list[str | None]]:
        """max_attempts, run_at, priority, tracked and unique_key, as parameters."""
        special = self._special
        return (
            _sql.array(self.attempts),
            _sql.timestamps(self.run_ats),
            _sql.array(self.priorities) if special else "{}",
            _sql.booleans(self.tracked) if special else "{}",
            self._keys if self.keyed else [],
        )

    def ids(
        self, rows: Sequence[Mapping[str, Any]]
    ) -> tuple[list[int], tuple[int, str] | None, list[bool]]:
        """From ENQUEUE_MANY_UNIQUE's rows: each input job's id, the first
        duplicate, and whether each input job is a duplicate (of a job that
        existed, or of an earlier one of the call)."""
        by_key = {
            (row["job_type"], row["unique_key"]): row
            for row in rows
            if row["unique_key"] is not None
        }
        unkeyed = iter(sorted(row["id"] for row in rows if row["unique_key"] is None))
        row_ids: list[int] = []
        existed: list[bool] = []
        duplicate = None
        for job_type, key in zip(self.types, self._keys, strict=True):
            if key is None:
                row_ids.append(next(unkeyed))
                existed.append(False)
                continue
            row = by_key[job_type, key]
            row_ids.append(row["id"])
            existed.append(row["existed"])
            if row["existed"] and duplicate is None:
                duplicate = (row["id"], key)
        seen: set[int] = set()
        duplicates = []
        for index in self._index_of:
            duplicates.append(existed[index] or index in seen)
            seen.add(index)
        return [row_ids[row] for row in self._index_of], duplicate, duplicates
