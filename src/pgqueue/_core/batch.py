"""enqueue_many's jobs checked and laid out as its statement's columns, for any driver.

`check_jobs` reads the input (``NewJob`` values or ``(job_type, payload)``
tuples) and refuses a bad job before any SQL runs; `insert_many` gives the
INSERT statement and its arguments (``$n`` placeholders; arrays and JSON
cross as text, which any driver sends as is); `Batch.ids` reads its rows back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgqueue._core.checks import (
    check_bool,
    check_group,
    check_job_id,
    check_job_type,
    check_max_attempts,
    check_priority,
    check_replace,
    check_unique_key,
    check_when,
)
from pgqueue._core.job import NewJob
from pgqueue._sql.enqueue import (
    DISTRIBUTED_MANY_UNIQUE,
    DISTRIBUTED_MANY_UNIQUE_DELAYED,
    ENQUEUE_MANY,
    ENQUEUE_MANY_DELAYED,
    ENQUEUE_MANY_DELAYED_SILENT,
    ENQUEUE_MANY_REPLACE,
    ENQUEUE_MANY_SILENT,
    ENQUEUE_MANY_UNIQUE,
    ENQUEUE_MANY_UNIQUE_DELAYED,
    ENQUEUE_MANY_UNIQUE_DELAYED_SILENT,
    ENQUEUE_MANY_UNIQUE_SILENT,
)
from pgqueue._sql.literals import array, booleans, seconds, timestamps

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from datetime import datetime

__all__ = [
    "MAX_PARENTS",
    "Batch",
    "after_args",
    "check_after",
    "check_jobs",
    "check_on_parent_failure",
    "insert_many",
]


def check_jobs(
    jobs: Iterable[NewJob | tuple[str, Any]],
    max_attempts: int,
    new_jobs: list[NewJob] | None = None,
    on_conflict: str = "return",
) -> Batch:
    """The checked jobs of an enqueue_many call, ``max_attempts`` the default.

    Each job is appended to ``new_jobs``, if given, as a `NewJob` (for
    enqueue hooks). ``on_conflict`` is the call's, checked: with
    ``"replace"`` every job with a key replaces its key's pending job
    (as a job with ``debounce`` does in any call).

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
            batch.add(pair[0], pair[1], max_attempts, None, None, 0, None, False, False)
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
                    after,
                    on_parent_failure,
                    debounce,
                    group,
                ) = _unpack(job)
                if type(job_type) is not str or job_type not in checked_types:
                    checked_types.add(check_job_type(job_type))
                when, seconds = check_when(run_at, delay)
                checked_key = check_unique_key(key)
                replace, debounced = check_replace(
                    checked_key,
                    "raise" if on_conflict == "raise" else "return",
                    debounce,
                    run_at,
                    delay,
                )
                replaces = checked_key is not None and (
                    replace or on_conflict == "replace"
                )
                group_key = None if group is None else check_group(group)
                if group_key is not None and (after or replaces):
                    msg = "a job with a group cannot have parents (after=...), replace or debounce yet"
                    raise ValueError(msg)
                batch.add(
                    job_type,  # type: ignore[arg-type]
                    payload,
                    max_attempts if attempts is None else check_max_attempts(attempts),
                    when,
                    seconds if debounced is None else debounced,
                    check_priority(priority),
                    checked_key,
                    check_bool("track", track),
                    replaces,
                    group_key,
                )
                if after:
                    batch.depend(
                        index,
                        check_after(after, index),
                        check_on_parent_failure(on_parent_failure),
                    )
                else:
                    check_on_parent_failure(on_parent_failure)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"job {index}: {exc}") from exc
        if new_jobs is not None:
            new_jobs.append(job if isinstance(job, NewJob) else NewJob(*job))
    if batch.parents is not None and batch.keyed:
        msg = "jobs with a unique_key cannot be enqueued in a call with dependencies (after=...)"
        raise ValueError(msg)
    return batch


MAX_PARENTS = 10_000
"""The most parents one job may wait for (``after``)."""


def check_after(after: object, index: int | None) -> tuple[int, ...]:
    """A job's ``after``: job ids, or (with ``index``, its place in an
    enqueue_many call) negative numbers counting back to earlier jobs of the call.

    Each parent once, in the order given; at most `MAX_PARENTS`.
    """
    if isinstance(after, (str, bytes)) or not hasattr(after, "__iter__"):
        msg = f"after must be a sequence of job ids, not {type(after).__name__}"
        raise TypeError(msg)
    parents: dict[int, None] = {}
    for parent in after:
        if isinstance(parent, int) and not isinstance(parent, bool) and parent < 0:
            if index is None:
                msg = f"after: {parent} counts back to an earlier job of an enqueue_many call; enqueue takes job ids"
                raise ValueError(msg)
            if index + parent < 0:
                msg = f"after: {parent} counts back past the call's first job"
                raise ValueError(msg)
        else:
            check_job_id(parent)
        parents[parent] = None
        if len(parents) > MAX_PARENTS:
            msg = f"after: a job waits for at most {MAX_PARENTS} parents"
            raise ValueError(msg)
    return tuple(parents)


def check_on_parent_failure(value: object) -> str:
    """``on_parent_failure``: ``"cancel"`` or ``"run"``."""
    if value == "cancel" or value == "run":
        return value
    msg = f'on_parent_failure must be "cancel" or "run", got {value!r:.80}'
    raise ValueError(msg)


def insert_many(
    queue: str,
    batch: Batch,
    payloads: str,
    trace_context: str | None,
    *,
    notify: bool,
    distributed: bool = False,
) -> tuple[str, tuple[Any, ...]]:
    """The INSERT of ``batch`` onto ``queue``, and its arguments.

    ``payloads``: the jobs' payloads as one JSON array. With ``notify`` the
    statement wakes the queue's workers (in its transaction). Its answer:
    for a batch with unique keys, rows for `Batch.ids`; without, one value,
    the ids joined by commas. ``distributed`` (Citus, never with
    ``notify``): unique keys are unique per queue.
    """
    args: tuple[Any, ...] = (
        queue,
        batch.types,
        payloads,
        *batch.columns(),
        trace_context,
    )
    if batch.replacing:
        args = (
            *args,
            seconds(batch.delays),
            booleans(batch.replaces),
            notify,
        )
        return ENQUEUE_MANY_REPLACE, args
    args = (*args, batch.group_column())  # (a replacing batch has no groups)
    delayed = batch.delayed
    if delayed:
        args = (*args, seconds(batch.delays))
    if distributed and batch.keyed:
        return (
            DISTRIBUTED_MANY_UNIQUE_DELAYED if delayed else DISTRIBUTED_MANY_UNIQUE
        ), args
    return _MANY[batch.keyed, delayed, notify], args


# insert_many's statement by (unique keys, delays, NOTIFY in the statement).
_MANY = {
    (False, False, True): ENQUEUE_MANY,
    (False, True, True): ENQUEUE_MANY_DELAYED,
    (True, False, True): ENQUEUE_MANY_UNIQUE,
    (True, True, True): ENQUEUE_MANY_UNIQUE_DELAYED,
    (False, False, False): ENQUEUE_MANY_SILENT,
    (False, True, False): ENQUEUE_MANY_DELAYED_SILENT,
    (True, False, False): ENQUEUE_MANY_UNIQUE_SILENT,
    (True, True, False): ENQUEUE_MANY_UNIQUE_DELAYED_SILENT,
}


def _unpack(
    job: object,
) -> tuple[
    object,
    Any,
    object,
    object,
    object,
    object,
    object,
    object,
    object,
    object,
    object,
    object,
]:
    """(job_type, payload, max_attempts, run_at, delay, priority, unique_key, track, after, on_parent_failure, debounce, group) of a job for enqueue_many."""
    if isinstance(job, tuple) and len(job) == 2:
        return (
            job[0],
            job[1],
            None,
            None,
            None,
            0,
            None,
            False,
            (),
            "cancel",
            None,
            None,
        )
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
            job.after,
            job.on_parent_failure,
            job.debounce,
            job.group,
        )
    msg = f"expected a NewJob or a (job_type, payload) tuple, got {job!r:.80}"
    raise TypeError(msg)


class Batch:
    """The checked jobs of one enqueue_many call, a list per column.

    Jobs of the call with the same type and unique key are merged into the
    first (a replacing job's payload and options replace its); the columns of priority, tracking, keys and delays stay empty when no job
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
        self.groups: list[str | None] = []
        self.grouped = False
        """Whether a job has a group (the batch then takes the INSERT path)."""
        self._index_of: list[int] = []  # each input job's row
        self._row_of_key: dict[tuple[str, str], int] = {}
        self.keyed = False
        self._special = False
        self.delayed = False
        """Whether a job has a delay (the batch then takes the _DELAYED statements)."""
        self.replaces: list[bool] = []
        """Whether each job replaces its key's pending job."""
        self.replacing = False
        """Whether a job replaces (the batch then takes ENQUEUE_MANY_REPLACE)."""
        self.parents: dict[int, tuple[tuple[int, ...], str]] | None = None
        """Each job with ``after``, by its row: its parents (ids, or negative
        numbers counting back to earlier rows) and on_parent_failure; None
        for a call without dependencies."""

    def depend(
        self, index: int, parents: tuple[int, ...], on_parent_failure: str
    ) -> None:
        """Job ``index`` (a row: calls with dependencies merge no jobs) waits for ``parents``."""
        if self.parents is None:
            self.parents = {}
        self.parents[index] = (parents, on_parent_failure)

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
        replace: bool,
        group: str | None = None,
    ) -> None:
        if key is not None:
            row = self._row_of_key.get((job_type, key))
            if row is not None:
                self._index_of.append(row)
                if replace:
                    self._replace(
                        row, payload, max_attempts, run_at, delay, priority, track
                    )
                return
            self._row_of_key[job_type, key] = len(self.types)
            self.keyed = True
            self.replacing = self.replacing or replace
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
        self.replaces.append(replace)
        self.groups.append(group)
        self.grouped = self.grouped or group is not None
        self._special = self._special or priority != 0 or track

    def _replace(
        self,
        row: int,
        payload: Any,
        max_attempts: int,
        run_at: datetime | None,
        delay: float | None,
        priority: int,
        track: bool,
    ) -> None:
        """A later job of the call with row ``row``'s key replaces it (its tracking is kept)."""
        self.payloads[row] = payload
        self.attempts[row] = max_attempts
        self.run_ats[row] = run_at
        self.delays[row] = delay
        self.delayed = self.delayed or delay is not None
        self.priorities[row] = priority
        self.tracked[row] = self.tracked[row] or track
        self.replaces[row] = True
        self.replacing = True
        self._special = self._special or priority != 0 or track

    def group_column(self) -> list[str | None]:
        """group_key, as a parameter (empty when no job has a group)."""
        return self.groups if self.grouped else []

    def columns(self) -> tuple[str, str, str, str, list[str | None]]:
        """max_attempts, run_at, priority, tracked and unique_key, as parameters."""
        special = self._special
        return (
            array(self.attempts),
            timestamps(self.run_ats),
            array(self.priorities) if special else "{}",
            booleans(self.tracked) if special else "{}",
            self._keys if self.keyed else [],
        )

    def replaced_ids(
        self, rows: Sequence[Mapping[str, Any]]
    ) -> tuple[list[int], list[bool], bool]:
        """From ENQUEUE_MANY_REPLACE's rows (one a row, in order): each input
        job's id, whether each is a duplicate (its job existed and was kept
        or replaced, or an earlier one of the call has its key), and whether
        the queue has a job to claim now."""
        seen: set[int] = set()
        ids: list[int] = []
        duplicates: list[bool] = []
        for index in self._index_of:
            ids.append(rows[index]["id"])
            duplicates.append(
                index in seen
                or rows[index]["outcome"] in ("existed", "replaced", "replaced_next")
            )
            seen.add(index)
        return ids, duplicates, any(row["wake"] for row in rows)

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


def after_args(
    queue: str,
    batch: Batch,
    payloads: str,
    trace_context: str | None,
    *,
    notify: bool,
) -> tuple[Any, ...]:
    """`ENQUEUE_AFTER`'s arguments: ``batch`` (a call with dependencies) onto ``queue``.

    Each edge is a child's row (from 1) and its parent: a job id, or minus
    the row (from 1) of an earlier job of the call.
    """
    assert batch.parents is not None
    children: list[int] = []
    parents: list[int] = []
    failure: list[str | None] = [None] * len(batch.types)
    for row, (after, on_parent_failure) in batch.parents.items():
        failure[row] = on_parent_failure
        for parent in after:
            children.append(row + 1)
            parents.append(parent if parent > 0 else -(row + parent + 1))
    return (
        queue,
        batch.types,
        payloads,
        array(batch.attempts),
        timestamps(batch.run_ats),
        seconds(batch.delays),
        array(batch.priorities),
        booleans(batch.tracked),
        trace_context,
        array(children),
        array(parents),
        failure,
        notify,
    )
