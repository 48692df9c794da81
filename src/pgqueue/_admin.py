"""The operations API: stats, listing, retry, cancel, prune and the schema's state.

The ``pgqueue`` command line is a thin layer over `Admin`; a script or a web
dashboard calls it the same way.
"""

from __future__ import annotations

import dataclasses
import json
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, overload

import asyncpg

from pgqueue._actions import FilterActions
from pgqueue._bulk import (
    SEARCH_TIMEOUT,
    check_filter,
    eligible,
    retry_each,
)
from pgqueue._core.checks import (
    check_bool,
    check_duration,
    check_group,
    check_int,
    check_job_id,
    check_max_attempts,
    check_name,
    check_priority,
    check_queue_name,
    check_run_at,
    check_signal,
)
from pgqueue._core.codec import encode_payload
from pgqueue._core.dsn import target_of
from pgqueue._core.errors import JobNotFoundError, JobStateError, SchemaError
from pgqueue._core.lifecycle import FAILED, LIFECYCLE, Status
from pgqueue._queue import send_signal
from pgqueue._sql.admin import (
    DEAD_COUNT,
    PAUSE,
    PAUSED,
    RESUME,
    RETRY_CHILDREN,
    RETRYABLE_IDS,
)
from pgqueue._sql.dashboard import (
    JOB_PREVIEW_SHOWN,
    JOB_SUMMARY_SHOWN,
    STATS_TOP,
    STATS_TOP_COMPLETED,
    shown_summaries_query,
)
from pgqueue._sql.durable_view import JOB_DURABLE
from pgqueue._sql.filters import condition
from pgqueue._sql.listings import (
    ADMIN_INDEXES,
    DEPENDENCIES,
    JOB,
    JOB_STATUSES,
    STATS,
    STATS_COMPLETED,
    STATS_LIMITS,
    STATS_TABLE,
    jobs_query,
)
from pgqueue._sql.literals import array
from pgqueue._sql.periodic import PERIODIC_LIST, PERIODIC_REMOVE, PERIODIC_TABLE_EXISTS
from pgqueue._sql.schema import REQUIRED_COLUMNS, REQUIRED_INDEXES, SCHEMA_CHECK
from pgqueue._sql.tables import HISTORY_KEPT
from pgqueue._sql.trend import TREND_TABLE_EXISTS
from pgqueue._store.postgres import Store, bounded_fetch
from pgqueue._store.schema import (
    Row,
    missing_pieces,
)
from pgqueue._trend import (
    TREND_POINTS,
    TrendPoint,
    TrendRow,
    read_points,
    read_trend,
)

if TYPE_CHECKING:
    from collections.abc import (
        AsyncIterator,
        Callable,
        Collection,
        Iterable,
        Mapping,
        Sequence,
    )

    from pgqueue._core.filter import JobFilter

__all__ = [
    "Admin",
    "FailedAttempt",
    "JobDependencies",
    "JobInfo",
    "JobPreview",
    "JobSummary",
    "ProgressInfo",
    "QueueStats",
    "RelatedJob",
    "ScheduleInfo",
    "SchemaState",
    "SignalInfo",
    "SnoozedAttempt",
    "StepInfo",
    "TopQueues",
    "WaitInfo",
]

PREVIEW_CHARS = 50_000
"""How many characters of a payload, result and error `Admin.job_preview` reads by default."""

EXACT_COMPLETED_PAGES = 1280
"""Up to this many pages (10 MB), `Admin.stats` counts completed jobs exactly."""

RETRY_BATCH = 1000

QUEUES_SHOWN = 50
"""How many queues `Admin.top_queues` returns by default: what a dashboard shows."""

DEPENDENCIES_SHOWN = 50
"""How many parents and children `Admin.dependencies` reads by default."""
"""The most ids one retry statement of `Admin.retry_all` carries."""


_CANCELLABLE = tuple(status for status in LIFECYCLE if not status.ended)
"""What a cancel acts on: pending and waiting jobs at once, running ones by request."""
_CANCELLED = frozenset({"cancelled", "requested"})  # not a status: cancel results
_UPDATABLE = frozenset({Status.PENDING, Status.WAITING})

_GO_COLUMNS = REQUIRED_COLUMNS[: REQUIRED_COLUMNS.index("completed_at") + 1]
_V2_COLUMNS = frozenset(REQUIRED_COLUMNS) - frozenset(_GO_COLUMNS)


def _json_value(value: object) -> Any:
    if isinstance(value, tuple):
        return [_json_value(item) for item in value]
    if isinstance(value, _JSONShape):
        return value.to_json()
    isoformat = getattr(value, "isoformat", None)
    return isoformat() if callable(isoformat) else value


class _JSONShape:
    """``to_json()``: the fields as a dict of JSON values (times in ISO 8601), in field order."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        """The fields, in their order, as JSON values (times as ISO 8601 text)."""
        return {
            field.name: _json_value(getattr(self, field.name))
            for field in dataclasses.fields(self)  # type: ignore[arg-type]
        }


class _WithStatus(_JSONShape):
    """A record with a ``status``: a `Status`, whatever text the row gave."""

    __slots__ = ()
    status: Status | None

    def __post_init__(self) -> None:
        given: object = self.status  # a row's text
        if isinstance(given, str) and not isinstance(given, Status):
            object.__setattr__(self, "status", Status(given))


@dataclass(frozen=True, slots=True, kw_only=True)
class FailedAttempt(_JSONShape):
    """One failed attempt of a job, in `JobInfo.errors`.

    Attributes:
        attempt: the attempt that failed (1 for the first).
        at: when its failure was written (the database's clock).
        error: its error, as ``last_error`` held it then (capped alike);
            ``no heartbeat for N s`` for a run the rescue sweep found
            orphaned.

    .. versionadded:: 0.1
    """

    attempt: int | None
    at: datetime | None
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SnoozedAttempt(_JSONShape):
    """One snooze of a job (its handler raised `pgqueue.Snooze`), in `JobInfo.snoozed`.

    A snooze gives its attempt back, so it is no failure: snoozes are kept
    apart from `JobInfo.errors`, with a history of their own.

    Attributes:
        attempt: the attempt that snoozed (and was given back).
        at: when the snooze was written (the database's clock).
        delay: the seconds the job was put off.

    .. versionadded:: 0.1
    """

    attempt: int | None
    at: datetime | None
    delay: float | None


def _history(text: str | None, detail: str) -> tuple[Any, ...]:
    """The entries of a history column's JSON text, oldest first.

    ``detail`` names the entry's own field: ``error`` (`FailedAttempt`) or
    ``delay`` (`SnoozedAttempt`). pgqueue writes them; a field that is
    missing or of the wrong type (written by hand) reads as None rather
    than failing the read.
    """
    if text is None:
        return ()
    entries = json.loads(text)
    if not isinstance(entries, list):
        return ()
    found: list[FailedAttempt | SnoozedAttempt] = []
    for entry in entries[-HISTORY_KEPT:]:
        if not isinstance(entry, dict):
            continue
        attempt = entry.get("attempt")
        if not isinstance(attempt, int) or isinstance(attempt, bool):
            attempt = None
        at = _moment(entry.get("at"))
        value = entry.get(detail)
        if detail == "error":
            error = value if isinstance(value, str) else None
            found.append(FailedAttempt(attempt=attempt, at=at, error=error))
        else:
            delay = None
            if isinstance(value, int | float) and not isinstance(value, bool):
                delay = float(value)
            found.append(SnoozedAttempt(attempt=attempt, at=at, delay=delay))
    return tuple(found)


def _moment(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


@dataclass(frozen=True, slots=True, kw_only=True)
class StepInfo(_JSONShape):
    """A step a durable handler recorded (`pgqueue.Job.step`), in `JobInfo.steps`.

    Its result is not read: ``size`` says how large it is.

    Attributes:
        name: its name, cut to its first 256 characters. The library's own
            records (a spawned child's id, a waited-for child's end, a wait
            that timed out) are named ``pgqueue:...``.
        at: when it was recorded (the database's clock).
        size: the bytes of its result's JSON text; None if a hand-written
            entry has none.

    .. versionadded:: 0.1
    """

    name: str | None
    at: datetime | None
    size: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class SignalInfo(_JSONShape):
    """A signal sent to a job (`pgqueue.Queue.signal`), in `JobInfo.signals`.

    Its payload is not read: ``size`` says how large it is.

    Attributes:
        name: the signal's name, cut to its first 256 characters.
        at: when it was stored (the database's clock).
        size: the bytes of its payload's JSON text (``null``: 4).

    .. versionadded:: 0.1
    """

    name: str | None
    at: datetime | None
    size: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class WaitInfo(_JSONShape):
    """What a durable handler's job waits for, in `JobInfo.wait`.

    A sleep has only ``until``; a wait for a signal its ``signal``, one for
    a child job its ``child``, each with ``until`` if it has a timeout.

    Attributes:
        signal: the name of the signal it waits for (`pgqueue.Job.wait_for`).
        child: the id of the job it waits for (`pgqueue.Job.wait_child`).
        until: when it wakes (a sleep's end, a wait's timeout); None for a
            wait without a timeout (the job is ``parked``).

    .. versionadded:: 0.1
    """

    signal: str | None = None
    child: int | None = None
    until: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressInfo(_JSONShape):
    """A durable handler's last progress (`pgqueue.Job.progress`), in `JobInfo.progress`.

    Attributes:
        fraction: from 0 to 1.
        message: what the handler said with it (at most 1000 characters),
            or None.
        at: when it was stored (the database's clock).

    .. versionadded:: 0.1
    """

    fraction: float | None
    message: str | None
    at: datetime | None


STEPS_SHOWN = 200
"""How many steps and signals of a job `Admin.job` and `Admin.job_preview` read (the first recorded)."""


def _number(value: object) -> int | float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _records(text: str | None, kind: type[StepInfo | SignalInfo]) -> tuple[Any, ...]:
    """The entries of `JOB_DURABLE`'s ``steps`` or ``signals`` (JSON text), first recorded first."""
    entries = [] if text is None else json.loads(text)
    found = [
        kind(
            name=_text(entry.get("name")),
            at=_moment(entry.get("at")),
            size=None if (size := _number(entry.get("size"))) is None else int(size),
        )
        for entry in entries
        if isinstance(entry, dict)
    ]
    if kind is StepInfo:  # jsonb keeps an object's keys by length, then bytes
        found.sort(key=lambda step: (step.at is None, step.at or datetime.min))
    return tuple(found)


def _wait(text: str | None) -> WaitInfo | None:
    wait = None if text is None else json.loads(text)
    if not isinstance(wait, dict):
        return None
    child = _number(wait.get("child"))
    return WaitInfo(
        signal=_text(wait.get("signal")),
        child=child if isinstance(child, int) else None,
        until=_moment(wait.get("until")),
    )


def _progress(text: str | None) -> ProgressInfo | None:
    progress = None if text is None else json.loads(text)
    if not isinstance(progress, dict):
        return None
    fraction = _number(progress.get("fraction"))
    return ProgressInfo(
        fraction=None if fraction is None else float(fraction),
        message=_text(progress.get("message")),
        at=_moment(progress.get("at")),
    )


def durable_details(row: Row | None) -> dict[str, Any]:
    """The durable fields of `JobInfo` and `JobPreview` from a row of `JOB_DURABLE` (None: none)."""
    if row is None:
        return {}
    return {
        "steps": _records(row["steps"], StepInfo),
        "steps_total": row["steps_total"],
        "signals": _records(row["signals"], SignalInfo),
        "signals_total": row["signals_total"],
        "wait": _wait(row["wait"]),
        "progress": _progress(row["progress"]),
    }


QUEUE_COUNTS = tuple(
    count
    for status in LIFECYCLE
    for count in (("ready", "scheduled") if status.claimable else (status.value,))
)
"""The job counts of `QueueStats`, in the order the dashboards show them: each status's
in the lifecycle's order, pending jobs as ``ready`` (due) and ``scheduled``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueStats(_JSONShape):
    """One queue's counts, from `Admin.stats`.

    Attributes:
        queue: the queue's name.
        ready: pending jobs that are due (``run_at <= now()``).
        scheduled: pending jobs not yet due.
        running: jobs a worker holds.
        completed: completed jobs still in the table; an estimate when
            ``completed_estimated`` is true.
        dead: dead-lettered jobs.
        cancelled: cancelled jobs.
        waiting: jobs waiting for their parents (``after=``) to finish.
        parked: durable handlers' jobs waiting for a signal or a child job
            (`pgqueue.Job.wait_for`, `pgqueue.Job.wait_child`).
        lag: seconds the oldest ready job has waited since its ``run_at``,
            or None when no job is ready.
        longest_running: seconds since the longest running job was
            claimed (its ``claimed_at``), or None when none runs. A job a
            Go worker claimed has no ``claimed_at``: its ``run_at`` stands
            in (an upper bound, with the time it waited in line).
        oldest_heartbeat: seconds since the least recently seen running job
            was seen alive (claimed or heartbeated): what the rescue sweep
            compares with ``rescue_after``. None when none runs.
        completed_estimated: whether ``completed`` is an estimate.
        slots_in_use: for a queue with a fleet-wide limit (a worker's
            ``global_limit``), how many of its slots its workers' leases
            hold now (their jobs run within them); None for a queue
            without one.
        global_limit: for such a queue, how many slots it has (the largest
            ``global_limit`` its workers started with); None without one.
        paused: whether the queue is paused (`Admin.pause`).

    .. versionchanged:: 0.1
        ``slots_in_use``, ``global_limit`` and ``waiting``.

    .. versionchanged:: 0.1
        ``paused``.
    """

    queue: str
    ready: int
    scheduled: int
    running: int
    completed: int
    dead: int
    cancelled: int
    lag: float | None
    longest_running: float | None
    oldest_heartbeat: float | None
    completed_estimated: bool
    slots_in_use: int | None = None
    global_limit: int | None = None
    waiting: int = 0
    parked: int = 0
    paused: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TopQueues(_JSONShape):
    """The queues with the most jobs to do, from `Admin.top_queues`.

    Attributes:
        queues: their stats, the queue with the most jobs to do (waiting,
            ready, scheduled and running) first, then the one with the most
            dead jobs, then by name.
        more: how many other queues there are (of those the filters let
            through), left out.

    .. versionadded:: 0.1
    """

    queues: tuple[QueueStats, ...]
    more: int


@dataclass(frozen=True, slots=True, kw_only=True)
class _JobHead(_WithStatus):
    """The fields every view of a job starts with, in this order."""

    id: int
    queue: str
    job_type: str
    status: Status
    attempts: int
    max_attempts: int
    priority: int
    run_at: datetime
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobInfo(_JobHead):
    """A job's row, from `Admin.jobs` and `Admin.job`.

    ``payload`` and ``result`` are the decoded JSON values (``result`` is
    None until a handler returns one).

    Attributes:
        errors: the job's failed attempts, oldest first, the newest 20
            kept. Each retried or dead-lettered attempt is one, and so is
            each run the rescue sweep found orphaned. Attempts a Go worker failed are not there (it
            sets ``last_error`` only).
        snoozed: the job's snoozes, oldest first, the newest 20 kept
            (``snoozes`` counts them all).
        checkpoint: the value the job's handler last stored with
            `Job.checkpoint` (decoded JSON), which its next attempt resumes
            from; None when there is none. Completion clears it.
        steps: a durable handler's recorded steps (`pgqueue.Job.step`),
            first recorded first: the first 200 (``steps_total`` counts
            them all). Read by `Admin.job` and `Admin.job_preview` only: a
            listing leaves these six fields empty.
        steps_total: how many steps the job has recorded.
        signals: the signals sent to the job, oldest first; the first 200
            (``signals_total`` counts them all).
        signals_total: how many signals the job holds.
        wait: what the job waits for while it is parked or sleeps (pending
            until a time still ahead); None otherwise.
        progress: its handler's last `pgqueue.Job.progress`, or None.

    .. versionchanged:: 0.1
        ``steps``, ``steps_total``, ``signals``, ``signals_total``,
        ``wait`` and ``progress``.
    """

    last_error: str | None
    unique_key: str | None
    snoozes: int
    cancel_requested: bool
    payload: Any
    result: Any
    errors: tuple[FailedAttempt, ...] = ()
    snoozed: tuple[SnoozedAttempt, ...] = ()
    checkpoint: Any = None
    steps: tuple[StepInfo, ...] = ()
    steps_total: int = 0
    signals: tuple[SignalInfo, ...] = ()
    signals_total: int = 0
    wait: WaitInfo | None = None
    progress: ProgressInfo | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSummary(_JobHead):
    """A job without its payload and result, from `Admin.job_summaries`.

    What a listing shows, at a cost that does not grow with the job's
    payload, result or error: the fields of `JobInfo` but those three, and
    ``error_line``. Its names are read cut one character past the longest
    pgqueue allows, which only another client can exceed: ``queue`` and
    ``unique_key`` to 1,025 characters, ``job_type`` to 256.

    Attributes:
        error_line: the first line of ``last_error`` (past leading blank
            space), cut to its first 300 characters in the database; None
            when the job has no error. For a completed job, it is the error
            of an earlier attempt.

    .. versionadded:: 0.1
    """

    unique_key: str | None
    snoozes: int
    cancel_requested: bool
    error_line: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobPreview(_JobHead):
    """A job with its payload, result and last error cut short, from `Admin.job_preview`.

    The fields of `JobInfo`, but ``payload`` and ``result`` are JSON text
    (not decoded: a cut one is no longer JSON), and these three are cut to
    the ``max_chars`` first characters in the database, so reading a job of
    any size costs a bounded read. Its names are cut as `JobSummary`'s.

    Attributes:
        payload: the payload's JSON text, at most ``max_chars`` characters.
        payload_truncated: whether ``payload`` was cut.
        result: the result's JSON text, at most ``max_chars`` characters,
            or None.
        result_truncated: whether ``result`` was cut.
        last_error: the last error, at most ``max_chars`` characters, or
            None. For a completed job, it is the error of an earlier
            attempt.
        last_error_truncated: whether ``last_error`` was cut.
        errors: `JobInfo.errors`, each error cut to its first
            ``max_chars`` characters in the database.
        snoozed: `JobInfo.snoozed`.
        checkpoint: the checkpoint's JSON text, at most ``max_chars``
            characters, or None.
        checkpoint_truncated: whether ``checkpoint`` was cut.
        steps, steps_total, signals, signals_total, wait, progress: as
            `JobInfo`'s.

    .. versionadded:: 0.1"""

    unique_key: str | None
    snoozes: int
    cancel_requested: bool
    payload: str
    payload_truncated: bool
    result: str | None
    result_truncated: bool
    last_error: str | None
    last_error_truncated: bool
    errors: tuple[FailedAttempt, ...] = ()
    snoozed: tuple[SnoozedAttempt, ...] = ()
    checkpoint: str | None = None
    checkpoint_truncated: bool = False
    steps: tuple[StepInfo, ...] = ()
    steps_total: int = 0
    signals: tuple[SignalInfo, ...] = ()
    signals_total: int = 0
    wait: WaitInfo | None = None
    progress: ProgressInfo | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RelatedJob(_WithStatus):
    """A parent or child of a job, in `JobDependencies`.

    Attributes:
        id: its id.
        status: its status, or None when it was deleted since (a finished
            parent pruned after its children finished).

    .. versionadded:: 0.1
    """

    id: int
    status: Status | None


@dataclass(frozen=True, slots=True, kw_only=True)
class JobDependencies(_JSONShape):
    """A job's parents (the jobs it waits for) and children, from `Admin.dependencies`.

    Attributes:
        parents: its first parents by id, at most the ``limit`` asked for.
        parents_total: how many parents it has.
        children: its first children by id, at most the ``limit`` asked for.
        children_total: how many children it has.

    .. versionadded:: 0.1
    """

    parents: tuple[RelatedJob, ...] = ()
    parents_total: int = 0
    children: tuple[RelatedJob, ...] = ()
    children_total: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleInfo(_JSONShape):
    """A periodic schedule's row, from `Admin.schedules`.

    Attributes:
        name: the schedule's name.
        schedule: its cron expression, or ``@every <seconds>s``.
        timezone: the zone the cron expression is read in.
        queue: the queue of its jobs.
        job_type: the type of its jobs.
        last_tick: the last tick run (its job enqueued, or skipped because
            the previous one was still pending or running); None before
            the first.
        next_tick: the next tick, as the worker that last ran or
            registered the schedule computed it.
        created_at: when a worker first registered it (the first tick run
            is after this).
        updated_at: when a worker last registered it or ran a tick.
    """

    name: str
    schedule: str
    timezone: str
    queue: str
    job_type: str
    last_tick: datetime | None
    next_tick: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class SchemaState(_JSONShape):
    """What `Admin.schema_state` found.

    Attributes:
        kind: ``"missing"`` (no ``pgqueue_jobs`` table on the search path),
            ``"go"`` (the Go module's v1.1.0 table: none of the columns
            pgqueue added), ``"partial"`` (some pieces are missing) or
            ``"current"`` (everything is there).
        missing: what is missing, e.g. ``"column priority"``, ``"index
            idx_pgqueue_jobs_failed"``, ``"a status check that allows
            'cancelled'"``, ``"function pgqueue_depend"``; empty when current.
        analyzed: whether ``pgqueue_jobs`` has been analyzed (by ``ANALYZE``
            or autovacuum, since the server's statistics were last reset);
            False for a missing table. Until it is, the planner guesses the
            table's contents; pgqueue's own statements plan well either way
            (:doc:`/explanation/performance`), yours may not.
    """

    kind: Literal["missing", "go", "partial", "current"]
    missing: tuple[str, ...]
    analyzed: bool = False

    @property
    def fix(self) -> str | None:
        """What to apply to bring the table up to date, or None when it is."""
        if self.kind == "current":
            return None
        if self.kind == "missing":
            return "pgqueue.SCHEMA (pgqueue schema apply)"
        return "pgqueue.SCHEMA_UPGRADE (pgqueue schema apply --upgrade)"


def job_info(row: Row) -> JobInfo:
    """The `JobInfo` of a row of `JOB` (or of a `jobs` listing)."""
    result, checkpoint = row["result"], row["checkpoint"]
    return JobInfo(
        id=row["id"],
        queue=row["queue"],
        job_type=row["job_type"],
        status=row["status"],
        attempts=row["attempts"],
        max_attempts=row["max_attempts"],
        priority=row["priority"],
        run_at=row["run_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        completed_at=row["completed_at"],
        last_error=row["last_error"],
        unique_key=row["unique_key"],
        snoozes=row["snoozes"],
        cancel_requested=row["cancel_requested"],
        payload=json.loads(row["payload"]),
        result=None if result is None else json.loads(result),
        errors=_history(row["errors"], "error"),
        snoozed=_history(row["snoozed"], "delay"),
        checkpoint=None if checkpoint is None else json.loads(checkpoint),
    )


_SCALARS = tuple(
    field.name for field in dataclasses.fields(JobSummary) if field.name != "error_line"
)
"""The columns a summary and a preview share."""


def _cut(text: str | None, size: int) -> tuple[str | None, bool]:
    """``text``'s first ``size`` characters, and whether it had more."""
    if text is None or len(text) <= size:
        return text, False
    return text[:size], True


def _job_preview(row: asyncpg.Record, size: int) -> JobPreview:
    scalars = {name: row[name] for name in _SCALARS}
    payload, payload_cut = _cut(row["payload"], size)
    result, result_cut = _cut(row["result"], size)
    error, error_cut = _cut(row["last_error"], size)
    checkpoint, checkpoint_cut = _cut(row["checkpoint"], size)
    return JobPreview(
        **scalars,
        payload=payload or "",
        payload_truncated=payload_cut,
        result=result,
        result_truncated=result_cut,
        last_error=error,
        last_error_truncated=error_cut,
        errors=_history(row["errors"], "error"),
        snoozed=_history(row["snoozed"], "delay"),
        checkpoint=checkpoint,
        checkpoint_truncated=checkpoint_cut,
    )


class Admin(FilterActions):
    """Look after the jobs of every queue: stats, listing, retry, cancel, prune.

    Works over an asyncpg pool (each call borrows a connection) or a
    connection (calls ride it, and its transaction if one is open). The pool
    is borrowed, never closed; constructing an admin does no I/O. Every
    method checks its arguments before any SQL runs: bad input raises
    `TypeError` or `ValueError` and writes nothing.

    Args:
        executor: the pool (or connection) of the database holding
            ``pgqueue_jobs``.
        logger: where to log; the ``pgqueue`` logger by default.

    Usage::

        admin = pgqueue.Admin(pool)
        for stats in await admin.stats():
            print(stats.queue, stats.ready, stats.dead)
        await admin.retry_all(queue="default")

    .. versionadded:: 0.1
    """

    __slots__ = ()

    async def stats(self, queue: str | None = None) -> list[QueueStats]:
        """Count each queue's jobs by state; sorted by queue name.

        Every count but ``completed`` is exact and read through a partial
        index, so the call costs what the pending, running, dead, cancelled
        and waiting jobs cost, however many completed jobs the table retains.
        ``completed`` is counted exactly while the table is small (up to 10
        MB); beyond that it is estimated from the planner's statistics (the
        table's live rows as the planner estimates them, rows per page at the
        last ``ANALYZE`` or ``VACUUM`` times its pages now, and each queue's
        share of rows as of the last ``ANALYZE``, less the queue's
        exact other counts) and ``completed_estimated`` is true. The
        estimate is only as fresh as those statistics, and a queue holding
        only completed jobs is listed only if ``ANALYZE`` saw it among the
        table's most common queues. A queue with a fleet-wide limit also
        gets its slots in use and its limit (read from ``pgqueue_limits`` and ``pgqueue_leases``).

        Args:
            queue: one queue's stats (always one entry, zeros included),
                instead of every queue with jobs.

        Raises:
            SchemaError: the table is missing or lacks a column.
        """
        name = None if queue is None else check_queue_name(queue)
        async with self._schema_checked():
            rows = await self._executor.fetch(STATS, name)
            table = await self._executor.fetchrow(STATS_TABLE)
            assert table is not None
            completed = (
                None
                if completed_estimated(table)
                else await self._executor.fetch(STATS_COMPLETED, name)
            )
            slots = (
                await self._executor.fetch(STATS_LIMITS, name)
                if table["has_limits"]
                else []
            )
            paused = (
                await self._executor.fetch(PAUSED, name) if table["has_paused"] else []
            )
        return queue_stats(name, rows, table, completed, slots, paused)

    async def top_queues(
        self,
        limit: int = QUEUES_SHOWN,
        *,
        contains: str | None = None,
        queues: Iterable[str] | None = None,
    ) -> TopQueues:
        """`stats` of the ``limit`` queues with the most jobs to do, and how many were left out.

        What a dashboard of any number of queues shows: the queues are
        counted, ranked and chosen in the database (the most waiting,
        ready, scheduled and running jobs first, then the most dead, then
        by name), so only ``limit`` rows are read however many queues the
        table holds. A queue name longer than pgqueue allows (written by
        another client) comes cut to its first 1,025 characters.

        Args:
            limit: at most this many queues.
            contains: only the queues whose name holds this text.
            queues: only these queues; each is listed, jobs or not.

        Raises:
            TypeError, ValueError: a bad argument (before any SQL runs).
            SchemaError: the table is missing or lacks a column.

        .. versionadded:: 0.1
        """
        count = check_int("limit", limit)
        text = None if contains is None else check_queue_name(contains)
        if isinstance(queues, str):
            msg = "queues must be an iterable of queue names, not a str"
            raise TypeError(msg)
        names = None if queues is None else sorted(set(map(check_queue_name, queues)))
        executor = self._executor
        async with self._schema_checked():
            table = await executor.fetchrow(STATS_TABLE)
            assert table is not None
            slots = (
                await executor.fetch(STATS_LIMITS, None) if table["has_limits"] else []
            )
            paused = await executor.fetch(PAUSED, None) if table["has_paused"] else []
            rows = await executor.fetch(
                STATS_TOP if completed_estimated(table) else STATS_TOP_COMPLETED,
                names,
                text,
                count,
                _listed_without_jobs(table, paused, names or ()),
            )
        return top_queues(rows, table, slots, paused)

    async def jobs(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        job_type: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
        after_id: int | None = None,
        filter: JobFilter | None = None,
    ) -> list[JobInfo]:
        """List jobs, newest (highest id) first, every column read and decoded.

        `job_summaries` lists the same jobs without reading their payloads
        and results, for a listing whose jobs may be large.

        Pages with ``before_id``: pass the last id of a page to get the
        next one (never an offset, so a page costs the same however deep);
        ``after_id``, the first id of a page, goes back to the one before.
        A listing by status goes through that status's partial index where
        there is one (pending, ready, scheduled, running, dead, cancelled).

        Args:
            queue: only this queue's jobs.
            status: one of the six statuses (pending, waiting, running,
                completed, dead, cancelled), ``ready`` (pending and due) or
                ``scheduled`` (pending, not yet due).
            job_type: only jobs of this type.
            limit: at most this many jobs.
            before_id: only jobs with a smaller id.
            after_id: only jobs with a greater id: the ``limit`` lowest of
                them (still listed newest first).
            filter: only the jobs this `JobFilter` matches (with the
                keywords above, which must not contradict it). Its search
                is cancelled by the server after 30 s
                (asyncpg's ``QueryCanceledError``): a payload or result
                containment reads the ``payload`` GIN index where the
                operator made one (:doc:`/howto/operate`), else a window
                (``created_after``, a queue's dead jobs...) bounds the scan.

        Raises:
            TypeError, ValueError: an unknown status, a limit below 1, an
                id that is not a positive int, both ``before_id`` and
                ``after_id``, an empty or NUL-holding name, a keyword that
                contradicts ``filter``.
            SchemaError: the table is missing or lacks a column.

        .. versionchanged:: 0.1
            ``filter``.
        """
        rows = await self._listing(
            jobs_query, queue, status, job_type, limit, before_id, after_id, filter
        )
        return [job_info(row) for row in rows]

    async def job_summaries(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        job_type: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
        after_id: int | None = None,
        filter: JobFilter | None = None,
    ) -> list[JobSummary]:
        """List jobs as `jobs` does, without their payloads and results.

        The same filters, order, pages and indexes as `jobs`, but each job
        is a `JobSummary`: no payload or result is read, and of the last
        error only the first line, cut to 300 characters in the database.
        A page costs the same whatever size the jobs' payloads, results and
        errors are: what a dashboard should list.

        Raises:
            TypeError, ValueError: as `jobs`.
            SchemaError: the table is missing or lacks a column.

        .. versionadded:: 0.1
        """
        rows = await self._listing(
            shown_summaries_query,
            queue,
            status,
            job_type,
            limit,
            before_id,
            after_id,
            filter,
        )
        return [JobSummary(**dict(row)) for row in rows]

    async def _listing(
        self,
        query: Callable[..., str],
        queue: str | None,
        status: str | None,
        job_type: str | None,
        limit: int,
        before_id: int | None,
        after_id: int | None,
        found: JobFilter | None,
    ) -> list[asyncpg.Record]:
        """Check a listing's arguments, then run it (newest first); a filtered one under a timeout."""
        statement, args = listing(
            query, queue, status, job_type, limit, before_id, after_id, found
        )
        async with self._schema_checked():
            if found is None:
                rows = await self._executor.fetch(statement, *args)
            else:
                rows = await bounded_fetch(
                    self._executor, SEARCH_TIMEOUT, statement, *args
                )
        if after_id is not None:
            rows.reverse()
        return rows

    async def job(self, job_id: int) -> JobInfo | None:
        """One job, or None if no job has that id.

        With a durable handler's steps and signals (the first 200 of each:
        their names, times and sizes, not their values), what it waits for
        and its progress, read by a second statement.

        Raises:
            TypeError, ValueError: an id that is not a positive int.
            SchemaError: the table is missing or lacks a column.
        """
        checked = check_job_id(job_id)
        async with self._schema_checked():
            row = await self._executor.fetchrow(JOB, checked)
            durable = await self._executor.fetchrow(JOB_DURABLE, checked, STEPS_SHOWN)
        if row is None:
            return None
        return dataclasses.replace(job_info(row), **durable_details(durable))

    async def signal(self, job_id: int, name: str, payload: Any = None) -> bool:
        """Send the signal ``name``, with ``payload``, to job ``job_id``: `Queue.signal` for operators.

        The same statement and answers: the handler's `pgqueue.Job.wait_for`
        of ``name`` returns ``payload`` (a parked job waiting for it is due
        at once, and an idle worker woken). Over a connection inside a
        transaction, the signal exists only if it commits.

        Returns:
            True once stored; False if the job has ended (completed, dead
            or cancelled): nothing is stored.

        Raises:
            JobNotFoundError: no job has that id.
            TypeError, ValueError: as `Queue.signal`'s (before any SQL).
            SchemaError: the schema lacks ``pgqueue_signal``.

        .. versionadded:: 0.1
        """
        text = "null" if payload is None else encode_payload(payload)
        checked, checked_name = check_signal(job_id, name, text)
        store = await self._store()
        sent = await send_signal(self._executor, store, checked, checked_name, text)
        self._logger.info(
            "signal sent" if sent else "signal not sent: the job has ended",
            extra={"job_id": checked, "signal": checked_name},
        )
        return sent

    async def dependencies(
        self, job_id: int, *, limit: int = DEPENDENCIES_SHOWN
    ) -> JobDependencies:
        """A job's parents and children (``after=``), each with its status.

        Reads the first ``limit`` of each by id and counts them all, through
        the indexes of ``pgqueue_dependencies`` and the jobs' primary key:
        a fan-out or fan-in of any size costs ``limit`` lookups and two
        index counts. A job with neither, or no job with that id, has none.

        Raises:
            TypeError, ValueError: an id that is not a positive int, or
                ``limit`` below 1.
            SchemaError: the table is missing or lacks a column (a schema
                before dependencies: apply `pgqueue.SCHEMA_UPGRADE`).

        .. versionadded:: 0.1
        """
        checked = check_job_id(job_id)
        size = check_int("limit", limit)
        async with self._schema_checked():
            rows = await self._executor.fetch(DEPENDENCIES, checked, size)
        if not rows:
            return JobDependencies()
        return JobDependencies(
            parents=tuple(
                RelatedJob(id=row["id"], status=row["status"])
                for row in rows
                if row["parent"]
            ),
            parents_total=rows[0]["parents_total"],
            children=tuple(
                RelatedJob(id=row["id"], status=row["status"])
                for row in rows
                if not row["parent"]
            ),
            children_total=rows[0]["children_total"],
        )

    async def job_summary(self, job_id: int) -> JobSummary | None:
        """One job without its payload and result, or None if no job has that id.

        Raises:
            TypeError, ValueError: an id that is not a positive int.
            SchemaError: the table is missing or lacks a column.

        .. versionadded:: 0.1
        """
        checked = check_job_id(job_id)
        async with self._schema_checked():
            row = await self._executor.fetchrow(JOB_SUMMARY_SHOWN, checked)
        return None if row is None else JobSummary(**dict(row))

    async def job_preview(
        self, job_id: int, *, max_chars: int = PREVIEW_CHARS
    ) -> JobPreview | None:
        """One job with its payload, result and last error cut short; None if no job has that id.

        Each of the three is cut to its first ``max_chars`` characters in
        the database (the payload and result as JSON text), so however
        large they are, at most about ``3 * max_chars`` characters are
        read; the ``*_truncated`` fields say which were cut. Use `job` for
        the whole decoded values. A durable handler's steps, signals, wait
        and progress come as `job` reads them.

        Raises:
            TypeError, ValueError: an id that is not a positive int, or
                ``max_chars`` below 1.
            SchemaError: the table is missing or lacks a column.

        .. versionadded:: 0.1
        """
        checked = check_job_id(job_id)
        size = check_int("max_chars", max_chars)
        async with self._schema_checked():
            row = await self._executor.fetchrow(JOB_PREVIEW_SHOWN, checked, size)
            durable = await self._executor.fetchrow(JOB_DURABLE, checked, STEPS_SHOWN)
        if row is None:
            return None
        return dataclasses.replace(_job_preview(row, size), **durable_details(durable))

    @overload
    async def retry(
        self,
        *job_ids: int,
        attempts: int | None = None,
        children: bool = False,
        reset_steps: bool = False,
    ) -> dict[int, str]: ...

    @overload
    async def retry(
        self,
        *,
        filter: JobFilter,
        dry_run: bool = False,
        limit: int | None = None,
        rate: float | None = None,
        attempts: int | None = None,
        reset_steps: bool = False,
    ) -> int: ...

    async def retry(
        self,
        *job_ids: int,
        attempts: int | None = None,
        children: bool = False,
        reset_steps: bool = False,
        filter: JobFilter | None = None,
        dry_run: bool = False,
        limit: int | None = None,
        rate: float | None = None,
    ) -> dict[int, str] | int:
        """Put dead and cancelled jobs back in line, due now; return what became of each id.

        Given a ``filter`` instead of ids: `redrive` of its matches in
        their own queues, returning how many were retried.

        One statement for all ids. A retried job is ``pending`` with
        ``run_at = now()``, its cancel request cleared, its ``last_error``
        and checkpoint kept (its next attempt resumes from it), and ``max_attempts`` raised to ``attempts + N``: its
        ``attempts`` are never reset, so a stale run still holding an old
        attempt number stays fenced off and can overwrite nothing. Workers
        of its queue are woken at once (a NOTIFY on ``pgqueue_jobs``).

        - ``"retried"``: it was dead or cancelled and is pending now.
        - ``"duplicate"``: it was dead or cancelled, but another job of its
          type and ``unique_key`` is pending or running (or is retried by
          the same call: the newest one is), so it stays as it was.
        - ``"not_retryable"``: it is pending, running or completed.
        - ``"not_found"``: no job has that id.

        Args:
            job_ids: the jobs to retry, of any queue.
            attempts: how many more attempts each job gets (N). By default
                its ``max_attempts``: a job that died after using all of
                them gets as many again (and one retried again after that
                gets twice as many, its ``max_attempts`` having doubled).
            children: also bring back to ``waiting`` the children (and
                their descendants) that a retried job cancelled when it
                ended dead or cancelled (enqueued ``after`` it with
                ``on_parent_failure="cancel"``), unless another parent of
                theirs is still dead or cancelled. Off by default: those
                cancellations were outcomes, announced to trackers and
                shown as final, and retrying one job to look at it should
                not silently restart a tree of others.
            reset_steps: also clear a durable handler's recorded steps, its
                wait and its progress, so that its next run starts over
                (its steps run again, its children are spawned again). By
                default they are kept: the next run replays the steps that
                completed and resumes at the one that failed. Its signals
                are kept either way.

        Raises:
            TypeError, ValueError: an id that is not a positive int, or
                ``attempts`` below 1; ids and a filter both, or ``children``
                with a filter.

        .. versionchanged:: 0.1
            ``filter``, ``dry_run``, ``limit``, ``rate`` and
            ``reset_steps``.
        """
        check_bool("reset_steps", reset_steps)
        if filter is not None:
            if job_ids or children:
                msg = "retry takes job ids or a filter, not both (and children= only with ids)"
                raise ValueError(msg)
            return await self.redrive(
                filter=filter,
                limit=limit,
                rate=rate,
                dry_run=dry_run,
                attempts=attempts,
                reset_steps=reset_steps,
            )
        ids = [check_job_id(job_id) for job_id in job_ids]
        extra = None if attempts is None else check_int("attempts", attempts)
        if not ids:
            return {}
        async with self._schema_checked():
            store = await self._store()
            done = await retry_each(
                self._executor, store, ids, extra, None, reset_steps=reset_steps
            )
        if children:
            parents = [job_id for job_id, result in done.items() if result == "retried"]
            while parents:
                rows = await self._executor.fetch(RETRY_CHILDREN, array(parents))
                parents = [row["id"] for row in rows]
        self._logger.debug("retry", extra={"results": done})
        return {job_id: done[job_id] for job_id in ids}

    async def retry_all(
        self,
        *,
        queue: str | None = None,
        job_type: str | None = None,
        status: Literal["dead", "cancelled"] = "dead",
        attempts: int | None = None,
        reset_steps: bool = False,
    ) -> dict[int, str]:
        """Retry every dead (or cancelled) job, of a queue and type if given.

        Walks the jobs in id order through the partial index of dead and
        cancelled jobs, a bounded batch of ids per `retry` statement, so no
        statement grows with the number of jobs. Returns what `retry`
        returns for each job seen (``"retried"`` or ``"duplicate"``, unless
        another session changed the job meanwhile).

        ``reset_steps``: as `retry`'s (durable handlers start over).

        Raises:
            TypeError, ValueError: as `jobs` and `retry`, or a status other
                than dead and cancelled.

        .. versionchanged:: 0.1
            ``reset_steps``.
        """
        check_bool("reset_steps", reset_steps)
        if status not in FAILED:
            choices = " or ".join(f'"{failed}"' for failed in FAILED)
            msg = f"status must be {choices}, not {status!r}"
            raise ValueError(msg)
        name = None if queue is None else check_queue_name(queue)
        kind = None if job_type is None else check_name("job type", job_type)
        extra = None if attempts is None else check_int("attempts", attempts)
        done: dict[int, str] = {}
        after = 0
        while True:
            async with self._schema_checked():
                ids = [
                    row["id"]
                    for row in await self._executor.fetch(
                        RETRYABLE_IDS, status, name, kind, RETRY_BATCH, after
                    )
                ]
            if not ids:
                return done
            done.update(await self.retry(*ids, attempts=extra, reset_steps=reset_steps))
            if len(ids) < RETRY_BATCH:
                return done
            after = ids[-1]

    async def dead_count(
        self, *, queue: str | None = None, job_type: str | None = None
    ) -> int:
        """Count the dead jobs, of a queue and type if given: those `retry_all` would retry.

        Counts through the partial index of dead and cancelled jobs.

        Raises:
            TypeError, ValueError: an empty or NUL-holding name.
            SchemaError: the table is missing or lacks a column.

        .. versionadded:: 0.1
        """
        name = None if queue is None else check_queue_name(queue)
        kind = None if job_type is None else check_name("job type", job_type)
        async with self._schema_checked():
            count: int = await self._executor.fetchval(DEAD_COUNT, name, kind)
        return count

    @overload
    async def cancel(self, *job_ids: int) -> dict[int, str]: ...

    @overload
    async def cancel(
        self,
        *,
        filter: JobFilter,
        dry_run: bool = False,
        limit: int | None = None,
        rate: float | None = None,
    ) -> int: ...

    async def cancel(
        self,
        *job_ids: int,
        filter: JobFilter | None = None,
        dry_run: bool = False,
        limit: int | None = None,
        rate: float | None = None,
    ) -> dict[int, str] | int:
        """Cancel jobs of any queue; the same statement and answers as `Queue.cancel`.

        Given a ``filter`` instead of ids: its pending, waiting and running
        matches, batched, paced and resumable as `redrive`, returning how
        many were cancelled or asked to stop (running ones).

        ``"cancelled"`` (it was pending or waiting; its waiting children
        that cancel on a parent's failure are cancelled too), ``"requested"`` (it was running:
        its worker cancels the handler), ``"finished"`` (completed, dead or
        cancelled already: nothing written) or ``"not_found"``.

        Raises:
            TypeError, ValueError: an id that is not a positive int; ids
                and a filter both; a filter on finished jobs.

        .. versionchanged:: 0.1
            ``filter``, ``dry_run``, ``limit`` and ``rate``.
        """
        if filter is not None:
            if job_ids:
                msg = "cancel takes job ids or a filter, not both"
                raise ValueError(msg)
            found = check_filter(filter)

            async def act(store: Store, ids: list[int]) -> int:
                done = await store.cancel(self._executor, ids)
                return sum(result in _CANCELLED for result in done.values())

            statuses = eligible("cancel", _CANCELLABLE, found)
            return await self._bulk(
                "cancel", found, statuses, act, dry_run, limit, rate
            )
        ids = [check_job_id(job_id) for job_id in job_ids]
        if not ids:
            return {}
        async with self._schema_checked():
            store = await self._store()
            done = await store.cancel(self._executor, ids)
        self._logger.debug("cancel", extra={"results": done})
        return {job_id: done[job_id] for job_id in ids}

    async def update(
        self,
        job_id: int,
        *,
        payload: Any = None,
        priority: int | None = None,
        run_at: datetime | None = None,
        group: str | None = None,
        max_attempts: int | None = None,
    ) -> JobInfo:
        """Change a job that has not started: its payload, priority, run_at, group or max_attempts.

        One statement, on the job's row locked: only a ``pending`` or
        ``waiting`` job is changed, with every field given (the others
        kept); a job a worker claimed meanwhile is refused, and nothing is
        written. A pending job changed wakes its queue's workers (a sooner
        ``run_at``). Returns the job as read just after. A field left at
        None is kept.

        Args:
            job_id: the job.
            payload: its new payload, checked and encoded as an enqueue's
                (bytes as JSON text; a dataclass or pydantic model as its
                fields).
            priority: from -5 to 5.
            run_at: when it is due (timezone-aware).
            group: its group; a job with parents (``after=``) takes none.
            max_attempts: attempts before it is dead (its attempts so far
                count).

        Raises:
            TypeError, ValueError: a bad field, or none given (before any
                SQL runs); a group for a job with parents.
            JobNotFoundError: no job has that id.
            JobStateError: the job is neither pending nor waiting
                (``status`` says what it is).

        .. versionadded:: 0.1
        """
        checked = check_job_id(job_id)
        values = (
            None if payload is None else encode_payload(payload),
            None if priority is None else check_priority(priority),
            check_run_at(run_at),
            None if group is None else check_group(group),
            None if max_attempts is None else check_max_attempts(max_attempts),
        )
        if all(value is None for value in values):
            msg = "update needs a field to change: payload, priority, run_at, group or max_attempts"
            raise ValueError(msg)
        async with self._schema_checked():
            store = await self._store()
            row = await store.update(self._executor, checked, values)
            if row is None:
                raise JobNotFoundError(checked)
            if not row["changed"]:
                if row["status"] in _UPDATABLE:
                    msg = f"job {checked} has parents (after=): it takes no group"
                    raise ValueError(msg)
                raise JobStateError(
                    checked, row["status"], "only pending and waiting jobs are updated"
                )
            changed = await self._executor.fetchrow(JOB, checked)
        if changed is None:  # deleted since, by another session
            raise JobNotFoundError(checked)
        self._logger.debug("job updated", extra={"job_id": checked})
        return job_info(changed)

    async def pause(self, queue: str) -> bool:
        """Pause ``queue``: no worker in the fleet starts another of its jobs until `resume`.

        Every claim checks the queue's row in ``pgqueue_paused``, so claims
        that begin after this commits take nothing (within a claim's time:
        well under a second); running jobs finish, and jobs a worker had
        already claimed beyond its concurrency (``prefetch``) may still
        start. Jobs are still enqueued. The state is in the database: it
        holds for workers started later and across restarts. Go workers do
        not know of it and keep claiming. Returns whether the queue was
        running (False: it was paused already, since `paused` says when).

        Raises:
            TypeError, ValueError: a bad queue name (nothing is written).
            SchemaError: ``pgqueue_paused`` is missing (apply
                `SCHEMA_UPGRADE`).

        .. versionadded:: 0.1
        """
        name = check_queue_name(queue)
        async with self._schema_checked():
            row = await self._executor.fetchrow(PAUSE, name)
        self._logger.info(
            "queue paused" if row else "queue already paused", extra={"queue": name}
        )
        return row is not None

    async def resume(self, queue: str) -> bool:
        """Resume a paused ``queue`` and wake its workers at once (a NOTIFY on ``pgqueue_jobs``).

        Returns whether it was paused.

        Raises:
            TypeError, ValueError: a bad queue name (nothing is written).
            SchemaError: ``pgqueue_paused`` is missing.

        .. versionadded:: 0.1
        """
        name = check_queue_name(queue)
        async with self._schema_checked():
            row = await self._executor.fetchrow(RESUME, name)
        self._logger.info(
            "queue resumed" if row else "queue was not paused", extra={"queue": name}
        )
        return row is not None

    async def paused(self) -> dict[str, datetime]:
        """The paused queues, each with when it was paused, by name.

        Raises:
            SchemaError: ``pgqueue_paused`` is missing.

        .. versionadded:: 0.1
        """
        async with self._schema_checked():
            rows = await self._executor.fetch(PAUSED, None)
        return {row["queue"]: row["paused_at"] for row in rows}

    async def prune(
        self, older_than: float, *, queue: str | None = None, batch_size: int = 10_000
    ) -> int:
        """Delete completed, dead and cancelled jobs last updated over ``older_than`` seconds ago.

        Of every queue, or of ``queue``. Deletes in batches of at most
        ``batch_size`` rows, walking the table once in id order; over a
        pool each batch is a short transaction of its own, so a prune of a
        big table never holds its locks for long (over a connection inside
        a transaction, the batches ride it). Rows another session has
        locked are skipped, never waited for. Pending and running jobs are
        never touched. Each batch runs with ``jit`` off (on a big table the
        planner would compile it for longer than it takes); inside the
        caller's transaction the setting is put back after each batch.
        Then the dependency edges whose child row is gone (a Go worker's
        Prune deletes rows and leaves their edges) are deleted, walked
        ``batch_size`` at a time. Returns how many rows were deleted.

        Raises:
            TypeError, ValueError: ``older_than`` negative or not a finite
                number, ``batch_size`` below 1.
        """
        seconds = check_duration("older_than", older_than)
        name = None if queue is None else check_queue_name(queue)
        size = check_int("batch_size", batch_size)
        removed = 0
        async with self._schema_checked():
            store = await self._store()
            scopes = await store.prune_scopes(self._executor, name)
        for scope in scopes:
            after = 0
            while True:
                async with self._schema_checked():
                    count, after = await store.prune_batch(
                        self._executor, scope, seconds, after, size
                    )
                removed += count
                if count < size:
                    break
        async with self._schema_checked():
            await store.prune_orphan_edges(self._executor, size)
        if removed:
            self._logger.debug(
                "pruned finished jobs", extra={"count": removed, "queue": name}
            )
        return removed

    async def trend(
        self,
        queue: str | None = None,
        job_type: str | None = None,
        since: timedelta | float = timedelta(hours=1),
    ) -> list[TrendRow]:
        """Each queue's and job type's completions, failures, dead jobs and run times over ``since``.

        Read from ``pgqueue_trend``, which pgqueue's workers keep (a Go
        worker's outcomes are not in it): a row a minute per queue and type,
        so the call costs the window's minutes, never the jobs' rows. The
        window is the last ``since`` to the minute (the minute it began in
        included); the newest ten seconds or so may not be in yet (each
        worker adds its counts every 10 seconds, and when it stops). Sorted by queue, then type; only pairs
        with attempts in the window.

        Args:
            queue: one queue's rows only.
            job_type: one job type's rows only.
            since: the window, a timedelta or seconds.

        Raises:
            TypeError, ValueError: a bad name or window.
            SchemaError: ``pgqueue_trend`` is missing (apply
                `pgqueue.SCHEMA_UPGRADE`).

        .. versionadded:: 0.1
        """
        async with self._schema_checked():
            return await read_trend(self._executor, queue, job_type, since)

    async def trend_points(
        self,
        queue: str | None = None,
        job_type: str | None = None,
        since: timedelta | float = timedelta(hours=1),
        *,
        points: int = TREND_POINTS,
    ) -> list[TrendPoint]:
        """The window of `trend` in about ``points`` steps, oldest first, summed over the rows asked for.

        A step is a whole number of minutes (one at least, so an hour is 60
        steps of a minute and a day 60 of 24 minutes). Only steps with
        attempts are returned; the dashboard's charts draw them.

        .. versionadded:: 0.1
        """
        size = check_int("points", points)
        async with self._schema_checked():
            return await read_points(self._executor, queue, job_type, since, size)

    async def schedules(self) -> list[ScheduleInfo]:
        """Every periodic schedule workers have registered, by name.

        Raises:
            SchemaError: the table ``pgqueue_periodic`` is missing.
        """
        async with self._periodic_checked():
            rows = await self._executor.fetch(PERIODIC_LIST)
        return [ScheduleInfo(**dict(row)) for row in rows]

    async def remove_schedule(self, name: str) -> bool:
        """Forget periodic schedule ``name``; return whether it was there.

        Its jobs stay. A worker that still registers the schedule makes its
        row again at its next tick (and runs that tick, even with
        ``unique=True`` while an earlier job of the schedule is still
        pending or running: the row that remembered that job is gone).
        Remove the schedule from the workers' code first.

        Raises:
            TypeError, ValueError: an empty or NUL-holding name.
            SchemaError: the table ``pgqueue_periodic`` is missing.
        """
        checked = check_name("schedule name", name)
        async with self._periodic_checked():
            row = await self._executor.fetchrow(PERIODIC_REMOVE, checked)
        return row is not None

    @asynccontextmanager
    async def _periodic_checked(self) -> AsyncIterator[None]:
        try:
            yield
        except asyncpg.UndefinedTableError as exc:
            raise SchemaError(
                "there is no table pgqueue_periodic on the search_path",
                where=target_of(self._executor),
                apply="SCHEMA_UPGRADE",
            ) from exc

    async def schema_state(self) -> SchemaState:
        """Say whether ``pgqueue_jobs`` is missing, the Go module's, partly upgraded or current.

        Checks the columns and indexes pgqueue's statements use, the
        indexes of these operations (``idx_pgqueue_jobs_failed``), the
        status check, the tables of periodic schedules (``pgqueue_periodic``)
        and of the trend (``pgqueue_trend``) and the producers' functions, and whether the table has ever been
        analyzed; reads the catalog only.
        """
        row = await self._executor.fetchrow(
            SCHEMA_CHECK,
            list(REQUIRED_COLUMNS),
            list(REQUIRED_INDEXES + ADMIN_INDEXES),
        )
        if row is None or not row["table_exists"]:
            return SchemaState(kind="missing", missing=("table pgqueue_jobs",))
        missing = tuple(missing_pieces(row))
        if not await self._executor.fetchval(PERIODIC_TABLE_EXISTS):
            missing += ("table pgqueue_periodic",)
        if not await self._executor.fetchval(TREND_TABLE_EXISTS):
            missing += ("table pgqueue_trend",)
        functions = row["missing_functions"]
        if functions:
            functions = [f for f in functions if f in (await self._store()).functions]
        missing += tuple(
            f"function {signature.partition('(')[0]}" for signature in functions
        )
        analyzed = row["analyzed"]
        if not missing:
            return SchemaState(kind="current", missing=(), analyzed=analyzed)
        absent = set(row["missing_columns"])
        if absent >= _V2_COLUMNS and not absent & set(_GO_COLUMNS):
            return SchemaState(kind="go", missing=missing, analyzed=analyzed)
        return SchemaState(kind="partial", missing=missing, analyzed=analyzed)

    def __repr__(self) -> str:
        return f"Admin({type(self._executor).__name__})"


def _estimate_completed(
    counts: dict[str, list[Any]],
    live: int,
    table: Row,
    only: str | None,
    *,
    spread: int | None = None,
) -> dict[str, int]:
    """Each queue's completed jobs, estimated (see `Admin.stats`).

    Without statistics, the table's rows are split evenly between ``spread``
    queues (by default those of ``counts``).
    """
    values: list[str] | None = table["common_queues"]
    freqs: list[float] | None = table["most_common_freqs"]
    distinct: float | None = table["n_distinct"]
    shares: dict[str, float] = {}
    if values is not None and freqs is not None:
        shares = dict(zip(values, freqs, strict=False))
        rest = max(0.0, 1.0 - sum(freqs))
        known = -distinct * live if distinct is not None and distinct < 0 else distinct
        others = max(1.0, (known or 1.0) - len(values))
        fallback = rest / others
    else:
        fallback = 1.0 / max(1, len(counts) if spread is None else spread)
    queues: Iterable[str] = (
        [only] if only is not None else counts.keys() | shares.keys()
    )
    completed = {}
    for name in queues:
        other = sum(int(n) for n in counts.get(name, [0] * 6)[:6])
        completed[name] = max(0, round(live * shares.get(name, fallback)) - other)
    return completed


def completed_estimated(table: Row) -> bool:
    """Whether `Admin.stats` estimates completed jobs, from a row of `STATS_TABLE`."""
    return int(table["pages"]) > EXACT_COMPLETED_PAGES


def queue_stats(
    name: str | None,
    rows: Iterable[Sequence[Any]],
    table: Row,
    completed_rows: Iterable[Row] | None,
    slot_rows: Iterable[Row],
    paused_rows: Iterable[Row] = (),
) -> list[QueueStats]:
    """`Admin.stats` from its statements' rows.

    ``name``: the one queue asked for, or None; ``rows``: `STATS`'s;
    ``table``: `STATS_TABLE`'s; ``completed_rows``: `STATS_COMPLETED`'s,
    None when `completed_estimated`; ``slot_rows``: `STATS_LIMITS`'s;
    ``paused_rows``: `PAUSED`'s (a paused queue is listed, jobs or not).
    """
    estimated = completed_rows is None
    counts = {row[0]: list(row[1:]) for row in rows}
    if name is not None:
        counts.setdefault(name, [0, 0, 0, 0, 0, 0, 0, None, None, None])
    if completed_rows is None:
        completed = _estimate_completed(counts, int(table["live"]), table, name)
    else:
        completed = {row["queue"]: int(row["completed"]) for row in completed_rows}
    slots = {
        row["queue"]: (int(row["in_use"]), int(row["global_limit"]))
        for row in slot_rows
    }
    for extra in completed.keys() - counts.keys():
        if completed[extra]:
            counts[extra] = [0, 0, 0, 0, 0, 0, 0, None, None, None]
    paused = {row["queue"] for row in paused_rows}
    for extra in paused - counts.keys():
        counts[extra] = [0, 0, 0, 0, 0, 0, 0, None, None, None]
    return [
        _queue_stat(queue_name, values, completed, estimated, slots, paused)
        for queue_name, values in sorted(counts.items())
    ]


def _queue_stat(
    name: str,
    values: Sequence[Any],
    completed: Mapping[str, int],
    estimated: bool,
    slots: Mapping[str, tuple[int, int]],
    paused: Collection[str],
) -> QueueStats:
    """One `QueueStats` from ``values``: ready, scheduled, running, dead, cancelled, waiting, parked, lag, longest running, oldest heartbeat."""
    (
        ready,
        scheduled,
        running,
        dead,
        cancelled,
        waiting,
        parked,
        lag,
        longest,
        heartbeat,
    ) = values
    return QueueStats(
        queue=name,
        ready=ready,
        scheduled=scheduled,
        running=running,
        completed=completed.get(name, 0),
        dead=dead,
        cancelled=cancelled,
        lag=None if lag is None else max(lag, 0.0),
        longest_running=None if longest is None else max(longest, 0.0),
        oldest_heartbeat=None if heartbeat is None else max(heartbeat, 0.0),
        completed_estimated=estimated,
        slots_in_use=slots[name][0] if name in slots else None,
        global_limit=slots[name][1] if name in slots else None,
        waiting=waiting,
        parked=parked,
        paused=name in paused,
    )


def _listed_without_jobs(
    table: Row, paused_rows: Iterable[Row], names: Iterable[str]
) -> list[str]:
    """The queues `Admin.top_queues` counts even without a job of theirs.

    The paused ones, those asked for, and, while completed jobs are
    estimated, those the planner's statistics give an estimate of one or
    more (as `Admin.stats` lists them).
    """
    listed = {row["queue"] for row in paused_rows} | set(names)
    if completed_estimated(table):
        estimates = _estimate_completed({}, int(table["live"]), table, None)
        listed |= {name for name, count in estimates.items() if count}
    return sorted(listed)


def top_queues(
    rows: Sequence[asyncpg.Record],
    table: Row,
    slot_rows: Iterable[Row],
    paused_rows: Iterable[Row],
) -> TopQueues:
    """`Admin.top_queues` from its statements' rows.

    ``rows``: `STATS_TOP`'s (`STATS_TOP_COMPLETED`'s on a small
    table); ``table``: `STATS_TABLE`'s;
    ``slot_rows``: `STATS_LIMITS`'s; ``paused_rows``: `PAUSED`'s.
    """
    matched = int(rows[0]["matched"]) if rows else 0
    estimated = completed_estimated(table)
    counts = {row["queue"]: list(row[1:11]) for row in rows}
    if estimated:
        completed = _estimate_completed(
            counts, int(table["live"]), table, None, spread=matched
        )
    else:
        completed = {row["queue"]: int(row["completed"]) for row in rows}
    slots = {
        row["queue"]: (int(row["in_use"]), int(row["global_limit"]))
        for row in slot_rows
    }
    paused = {row["queue"] for row in paused_rows}
    return TopQueues(
        queues=tuple(
            _queue_stat(row["queue"], row[1:11], completed, estimated, slots, paused)
            for row in rows
        ),
        more=matched - len(rows),
    )


def listing(
    query: Callable[..., str],
    queue: str | None,
    status: str | None,
    job_type: str | None,
    limit: int,
    before_id: int | None,
    after_id: int | None,
    found: JobFilter | None = None,
) -> tuple[str, tuple[object, ...]]:
    """A listing's statement (of ``query``) and arguments, checked as `Admin.jobs` checks them.

    With ``after_id``, its rows come oldest first: the caller reverses them.
    ``found``: a filter, its queue, type and status merged with those given.
    """
    name = None if queue is None else check_queue_name(queue)
    if status is not None and status not in JOB_STATUSES:
        msg = f"status must be one of {', '.join(JOB_STATUSES)}, not {status!r}"
        raise ValueError(msg)
    kind = None if job_type is None else check_name("job type", job_type)
    count = check_int("limit", limit)
    before = None if before_id is None else check_job_id(before_id)
    after = None if after_id is None else check_job_id(after_id)
    if before is not None and after is not None:
        msg = "give before_id or after_id, not both"
        raise ValueError(msg)
    newer = after is not None
    where, extra = "true", tuple[object, ...]()
    if found is not None:
        found = _merged(check_filter(found), queue=name, job_type=kind, status=status)
        name, kind, status = found.queue, found.job_type, found.status
        matched = condition(found, 5, skip=("queue", "job_type", "status"))
        where, extra = matched.text, tuple(matched.args)
    return query(status, newer=newer, where=where), (
        name,
        kind,
        after if newer else before,
        count,
        *extra,
    )


def _merged(found: JobFilter, **given: Any) -> JobFilter:
    """``found`` with the fields ``given`` (not None) set; a field it sets otherwise raises ValueError."""
    changes = {}
    for field, value in given.items():
        if value is None:
            continue
        theirs = getattr(found, field)
        if theirs is not None and theirs != value:
            msg = (
                f"{field}={value!r:.80} contradicts the filter's {field}={theirs!r:.80}"
            )
            raise ValueError(msg)
        changes[field] = value
    return dataclasses.replace(found, **changes) if changes else found
