"""An enqueue's jobs, checked before any SQL runs: one set of rules for every entry point.

`check_request` checks one job's fields (every `NewJob` field, as
`Queue.enqueue` and each other entry point take them) into a `Request`;
`check_jobs` reads an enqueue_many call's jobs into a `Batch`, each job
checked by the same rules. Nothing here knows a driver or a statement:
`pgqueue._store.plan` lays requests out as statements.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, Unpack

from pgqueue._core.checks import (
    check_bool,
    check_group,
    check_job_id,
    check_job_type,
    check_max_attempts,
    check_on_conflict,
    check_priority,
    check_replace,
    check_unique_key,
    check_when,
)
from pgqueue._core.job import EnqueueOptions, NewJob

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime

__all__ = [
    "MAX_PARENTS",
    "OPTIONS",
    "Batch",
    "Conflict",
    "Request",
    "check_after",
    "check_jobs",
    "check_on_parent_failure",
    "check_request",
]

Conflict = Literal["return", "raise", "replace"]
"""What an enqueue does with a duplicate unique key."""

MAX_PARENTS = 10_000
"""The most parents one job may wait for (``after``)."""


@dataclass(frozen=True, slots=True)
class Request:
    """One job to enqueue, checked: every `NewJob` field as its row will hold it."""

    job_type: str
    payload: Any
    """As given; the driver's codec encodes it."""
    max_attempts: int
    run_at: datetime | None
    delay: float | None
    """Seconds from the database's ``now()`` (a debounce's, for a debounced job)."""
    priority: int
    unique_key: str | None
    conflict: Conflict
    """``"replace"`` for a job that replaces its key's pending job (debounced or not)."""
    track: bool
    after: tuple[int, ...]
    on_parent_failure: str
    group: str | None

    @property
    def replaces(self) -> bool:
        """Whether the job replaces its key's pending job."""
        return self.conflict == "replace"


def check_request(
    job_type: object,
    payload: Any = None,
    *,
    default_attempts: int,
    index: int | None = None,
    **options: Unpack[EnqueueOptions],
) -> Request:
    """One job's fields, checked; no ``max_attempts`` means ``default_attempts``.

    ``index``: the job's place in an enqueue_many call (``after`` may then
    count back to earlier jobs of the call); None for a single enqueue.

    Raises:
        TypeError, ValueError: a field no entry point would write, or an
            option that does not exist.
    """
    if not options:  # the common call: every option its default
        return Request(
            check_job_type(job_type),
            payload,
            default_attempts,
            None,
            None,
            0,
            None,
            "return",
            False,
            (),
            "cancel",
            None,
        )
    if not options.keys() <= OPTIONS:
        unknown = min(options.keys() - OPTIONS)
        msg = f"unexpected enqueue option {unknown!r} (the options: {', '.join(sorted(OPTIONS))})"
        raise TypeError(msg)
    run_at = options.get("run_at")
    delay = options.get("delay")
    when, seconds = check_when(run_at, delay)
    key = check_unique_key(options.get("unique_key"))
    conflict = check_on_conflict(options.get("on_conflict", "return"))
    replace, debounced = check_replace(
        key, conflict, options.get("debounce"), run_at, delay
    )
    failure = check_on_parent_failure(options.get("on_parent_failure", "cancel"))
    after = options.get("after", ())
    parents = check_after(after, index) if after else ()
    group = options.get("group")
    group_key = None if group is None else check_group(group)
    if parents and key is not None:
        msg = "a job with a unique_key cannot have parents (after=...)"
        raise ValueError(msg)
    if group_key is not None and (parents or replace):
        msg = "a job with a group cannot have parents (after=...), replace or debounce yet"
        raise ValueError(msg)
    attempts = options.get("max_attempts")
    return Request(
        check_job_type(job_type),
        payload,
        default_attempts if attempts is None else check_max_attempts(attempts),
        when,
        seconds if debounced is None else debounced,
        check_priority(options.get("priority", 0)),
        key,
        "replace" if replace else conflict,  # type: ignore[arg-type]
        check_bool("track", options.get("track", False)),
        parents,
        failure,
        group_key,
    )


OPTIONS = frozenset(EnqueueOptions.__annotations__)
"""The names of the options an enqueue takes."""

_NEW_JOB_OPTIONS = tuple(
    field.name for field in fields(NewJob) if field.name not in ("job_type", "payload")
)


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
        TypeError, ValueError: as `check_request`, naming the bad job's index.
    """
    call = check_on_conflict(on_conflict)
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
            batch.add_plain(pair[0], pair[1], max_attempts)
        else:
            try:
                request = _check_one(job, index, max_attempts, call)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"job {index}: {exc}") from exc
            checked_types.add(request.job_type)
            batch.add(request, index)
        if new_jobs is not None:
            new_jobs.append(job if isinstance(job, NewJob) else NewJob(*job))
    if batch.parents is not None and batch.keyed:
        msg = "jobs with a unique_key cannot be enqueued in a call with dependencies (after=...)"
        raise ValueError(msg)
    return batch


def _check_one(job: object, index: int, max_attempts: int, call: str) -> Request:
    """One job of an enqueue_many call: a `NewJob` or a ``(job_type, payload)`` tuple."""
    if isinstance(job, tuple) and len(job) == 2:
        return check_request(job[0], job[1], default_attempts=max_attempts)
    if not isinstance(job, NewJob):
        msg = f"expected a NewJob or a (job_type, payload) tuple, got {job!r:.80}"
        raise TypeError(msg)
    options: dict[str, Any] = {name: getattr(job, name) for name in _NEW_JOB_OPTIONS}
    # The call's "raise" holds for each key; its "replace" for each job with one.
    options["on_conflict"] = "raise" if call == "raise" else "return"
    if call == "replace" and job.unique_key is not None:
        options["on_conflict"] = "replace"
    return check_request(
        job.job_type, job.payload, default_attempts=max_attempts, index=index, **options
    )


class Batch:
    """The checked jobs of one enqueue_many call, a list per column.

    Jobs of the call with the same type and unique key are merged into the
    first (a replacing job's payload and options replace its); the columns
    of priority, tracking, keys and delays stay empty when no job uses them
    (the statement pads them with defaults).
    """

    def __init__(self) -> None:
        self.types: list[str] = []
        self.payloads: list[Any] = []
        self.attempts: list[int] = []
        self.run_ats: list[datetime | None] = []
        self.delays: list[float | None] = []
        self.priorities: list[int] = []
        self.tracked: list[bool] = []
        self.keys: list[str | None] = []
        self.groups: list[str | None] = []
        self.grouped = False
        """Whether a job has a group."""
        self.index_of: list[int] = []
        """Each input job's row."""
        self._row_of_key: dict[tuple[str, str], int] = {}
        self.keyed = False
        self.special = False
        """Whether a job has a priority or is tracked (else those columns stay empty)."""
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

    @classmethod
    def of(cls, request: Request) -> Batch:
        """The batch of one job (a single enqueue that takes the batch's statements)."""
        batch = cls()
        batch.add(request, 0)
        return batch

    def add_plain(self, job_type: str, payload: Any, max_attempts: int) -> None:
        """A job with a checked type and no options."""
        self.index_of.append(len(self.types))
        self.types.append(job_type)
        self.payloads.append(payload)
        self.attempts.append(max_attempts)
        self.run_ats.append(None)
        self.delays.append(None)
        self.priorities.append(0)
        self.tracked.append(False)
        self.keys.append(None)
        self.replaces.append(False)
        self.groups.append(None)

    def add(self, request: Request, index: int) -> None:
        """The job ``request``, the call's ``index``-th."""
        key = request.unique_key
        if key is not None:
            row = self._row_of_key.get((request.job_type, key))
            if row is not None:
                self.index_of.append(row)
                if request.replaces:
                    self._replace(row, request)
                return
            self._row_of_key[request.job_type, key] = len(self.types)
            self.keyed = True
            self.replacing = self.replacing or request.replaces
        if request.after:
            if self.parents is None:
                self.parents = {}
            # Calls with dependencies merge no jobs: the index is the row.
            self.parents[index] = (request.after, request.on_parent_failure)
        self.index_of.append(len(self.types))
        self.types.append(request.job_type)
        self.payloads.append(request.payload)
        self.attempts.append(request.max_attempts)
        self.run_ats.append(request.run_at)
        self.delays.append(request.delay)
        self.delayed = self.delayed or request.delay is not None
        self.priorities.append(request.priority)
        self.tracked.append(request.track)
        self.keys.append(key)
        self.replaces.append(request.replaces)
        self.groups.append(request.group)
        self.grouped = self.grouped or request.group is not None
        self.special = self.special or request.priority != 0 or request.track

    def _replace(self, row: int, request: Request) -> None:
        """A later job of the call with row ``row``'s key replaces it (its tracking is kept)."""
        self.payloads[row] = request.payload
        self.attempts[row] = request.max_attempts
        self.run_ats[row] = request.run_at
        self.delays[row] = request.delay
        self.delayed = self.delayed or request.delay is not None
        self.priorities[row] = request.priority
        self.tracked[row] = self.tracked[row] or request.track
        self.replaces[row] = True
        self.replacing = True
        self.special = self.special or request.priority != 0 or request.track
