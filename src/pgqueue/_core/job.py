"""The job record handed to handlers, and the values around it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import KW_ONLY, dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    NamedTuple,
    NoReturn,
    Protocol,
    TypeAlias,
    TypedDict,
    TypeVar,
)

from pgqueue._core.errors import PgQueueError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from typing_extensions import TypeVar as DefaultedTypeVar

    # The default (PEP 696) makes a bare ``Job`` mean ``Job[Any]`` to type
    # checkers, with no "missing type parameters" error under --strict.
    # typing.TypeVar takes a default from Python 3.13 on.
    PayloadT = DefaultedTypeVar("PayloadT", covariant=True, default=Any)
else:
    PayloadT = TypeVar("PayloadT", covariant=True)

__all__ = [
    "PERIODIC_KEY_PREFIX",
    "CheckpointWriter",
    "EnqueueOptions",
    "Job",
    "NewJob",
    "PeriodicKey",
    "Step",
]

PERIODIC_KEY_PREFIX = "periodic:"
"""How the unique keys of periodic jobs start: ``periodic:<name>@<tick>``."""


class _NoParents(Mapping[Any, Any]):
    """The empty ``parent_results`` of a job without parents: immutable and
    hashable, so a frozen dataclass takes it as a plain default."""

    __slots__ = ()

    def __getitem__(self, key: Any) -> Any:
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 0

    def __hash__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "{}"


NO_PARENTS: Mapping[int, Any] = _NoParents()
"""The parent_results of a job without parents (shared: it cannot change)."""

NO_STEPS: Mapping[str, Any] = _NoParents()
"""The steps of a job that has recorded none (shared: it cannot change)."""


class Step(NamedTuple):
    """A step a durable handler recorded (`Job.step`), as ``job.steps`` lists it.

    ``result`` is its stored JSON value (decoded); ``at`` when it was
    recorded, on the database clock. Steps the library records for
    `Job.spawn`, `Job.wait_child` and timed-out waits are named
    ``pgqueue:...``.

    .. versionadded:: 0.1
    """

    name: str
    result: Any
    at: datetime | None


def stored_steps(text: str) -> dict[str, Step]:
    """The steps a job's ``steps`` column holds (JSON text), by name, in the order they were recorded.

    Raises ValueError for JSON that is not an object of recorded steps.
    """
    stored = json.loads(text)
    if not isinstance(stored, dict):
        msg = "steps is not a JSON object"
        raise ValueError(msg)
    steps = {}
    for name, entry in stored.items():
        if not isinstance(entry, dict):
            msg = f"step {name!r:.100} is not a JSON object"
            raise ValueError(msg)
        at = entry.get("at")
        steps[name] = Step(
            name,
            entry.get("result"),
            datetime.fromisoformat(at) if isinstance(at, str) else None,
        )
    # jsonb keeps an object's keys by length, then bytes.
    return dict(sorted(steps.items(), key=_recorded_at))


def _recorded_at(item: tuple[str, Step]) -> datetime:
    return item[1].at or datetime.min.replace(tzinfo=UTC)


class DurableRuns(Protocol):
    """What runs a durable handler's steps, sleeps and waits (`pgqueue._engine.durable`)."""

    async def step(
        self,
        job: Job[Any],
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any: ...

    async def sleep(
        self, job: Job[Any], seconds: float | timedelta | None, until: datetime | None
    ) -> NoReturn: ...

    async def wait_for(self, job: Job[Any], name: str, limit: float | None) -> Any: ...

    async def spawn(
        self,
        job: Job[Any],
        name: str,
        job_type: str,
        payload: Any,
        options: dict[str, Any],
    ) -> int: ...

    async def wait_child(
        self, job: Job[Any], child_id: int, limit: float | None
    ) -> Any: ...

    async def progress(
        self, job: Job[Any], fraction: float, message: str | None
    ) -> None: ...


_DURABLE: ContextVar[DurableRuns | None] = ContextVar("pgqueue_durable", default=None)
"""The durable runs of the worker whose handler runs in this context (see `_CHECKPOINTS`)."""


def durable_through(runs: DurableRuns | None) -> None:
    """Let handlers run from here on use ``runs`` for their steps, sleeps and waits."""
    if _DURABLE.get() is not runs:
        _DURABLE.set(runs)


def _durable(job: Job[Any], what: str) -> DurableRuns:
    runs = _DURABLE.get()
    if runs is None:
        msg = (
            f"job {job.id} is not run by a worker here: call {what} from the "
            "handler a worker runs (or a task it started)"
        )
        raise PgQueueError(msg)
    return runs


CheckpointWriter: TypeAlias = "Callable[[Job[Any], Any], Awaitable[bool]]"
"""What writes the checkpoints of the jobs a worker runs."""

_CHECKPOINTS: ContextVar[CheckpointWriter | None] = ContextVar(
    "pgqueue_checkpoints", default=None
)
"""The checkpoint writer of the worker whose handler runs in this context.

A context variable, not a field of `Job`: a handler's job may be a copy
(`dataclasses.replace`, as a typed handler's is), and the job's signature
stays what users build."""


def checkpoints_through(write: CheckpointWriter | None) -> None:
    """Let handlers run from here on (this task, and tasks it starts) checkpoint through ``write``.

    A worker's writer is the same for every job it runs, so it is set once
    per task that runs jobs (a get costs less than a set and its reset):
    each job's checkpoint is fenced on its own id and attempt.
    """
    if _CHECKPOINTS.get() is not write:
        _CHECKPOINTS.set(write)


@dataclass(frozen=True, slots=True, kw_only=True)
class Job(Generic[PayloadT]):
    """A claimed job as a handler sees it.

    ``attempts`` counts the attempt now running: it is 1 on the first
    delivery (a snooze gives its attempt back). ``payload`` is the decoded
    JSON value. ``snoozes`` counts the times the job was snoozed.
    ``trace_context`` is what an enqueue hook stored with the job (with
    `pgqueue.otel`, the producer span's propagation headers as JSON text);
    ``None`` for jobs enqueued without one, a Go producer's included.

    ``Job`` is generic in its payload: a handler annotated
    ``job: Job[SendWelcome]``, where ``SendWelcome`` is a dataclass or a
    pydantic model, gets the payload as a ``SendWelcome`` (see
    `Worker.handler`). A bare ``Job`` is ``Job[Any]``: plain JSON.

    ``last_checkpoint`` is the value the job's last `checkpoint` stored
    (decoded JSON), from this attempt's start: ``None`` when there is none
    (a job's first attempt, or one whose earlier attempts stored none). A
    handler that checkpoints its progress resumes from it when it is run
    again (after a retry, a rescue or `Admin.retry`); completion clears it.

    ``parent_results`` maps the id of each job this one was enqueued
    ``after`` to that job's stored result (decoded JSON; ``None`` for a
    parent that ended dead or cancelled, or returned nothing, and for one
    whose row a Go worker's Prune deleted before this job ran, which the
    worker's log says): empty for a job without parents.

    ``steps`` maps the name of each step recorded for the job before this
    run began (`step`, and the library's own ``pgqueue:`` records) to its
    `Step`: empty for a job that has recorded none. Durable handlers:
    `step`, `sleep`, `wait_for`, `spawn`, `wait_child` and `progress`
    (:doc:`/howto/durable-handlers`).
    """

    id: int
    queue: str
    type: str
    payload: PayloadT
    attempts: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    last_error: str | None = None
    priority: int = 0
    unique_key: str | None = None
    snoozes: int = 0
    trace_context: str | None = None
    last_checkpoint: Any = None
    parent_results: Mapping[int, Any] = NO_PARENTS
    steps: Mapping[str, Step] = NO_STEPS

    async def step(
        self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> Any:
        """Run ``fn(*args, **kwargs)`` once for this job, ever: its result is recorded as step ``name``.

        The first run of the job that reaches the step calls ``fn`` (an
        ``async def`` is awaited; a plain ``def`` runs in a worker thread,
        as sync handlers do) and stores what it returns, as JSON (the
        library's codec: what a payload may hold), fenced like every outcome
        write. Every later run of the job (a retry, a rescue after a crash,
        a wake from `sleep` or a wait) returns the stored value without
        calling ``fn``. What a step returns is the stored JSON value, the
        first time too (a ``Decimal`` comes back as its JSON number, a
        dataclass as a dict), so every run sees the same value.

        A step that raises is not stored: the exception propagates, and
        fails the attempt as any (retried, then dead). ``fn`` runs again on
        the next attempt: keep what it does idempotent (see
        :doc:`/howto/durable-handlers`).

        Args:
            name: the step's name, unique within the job (1 to 255
                characters, no control character, not starting
                ``pgqueue:``).
            fn: what the step runs; then its arguments.

        Raises:
            ValueError: ``name`` was used already in this run, or is not a
                valid name; ``fn`` returned what cannot be stored as JSON
                (a ``TypeError`` then).
            RunSuperseded: this run no longer holds its attempt; the result
                was not stored (a ``BaseException``: let it propagate).
            PgQueueError: no worker's handler runs here.

        .. versionadded:: 0.1
        """
        return await _durable(self, "step").step(self, name, fn, args, kwargs)

    async def sleep(
        self, seconds: float | timedelta | None = None, *, until: datetime | None = None
    ) -> NoReturn:
        """End this run, and run the job again after ``seconds`` (or at ``until``): a durable sleep.

        The job goes back to pending, due then (on the database clock), its
        attempt given back and its steps kept; the worker's slot is free at
        once and nothing is logged as a failure. The next run replays the
        handler from the top, its recorded steps returning their results
        at once; a sleep of days is a row, not a task. Put a sleep after
        the step it follows, and make it the step's business to be
        recorded: a sleep is not a step itself (a replay that reaches it
        again sleeps again), so guard it with a step's result or with
        ``until`` fixed by a step (see :doc:`/howto/durable-handlers`).

        Never returns: it raises what ends the run (a ``BaseException``
        the worker catches; do not catch it).

        Raises:
            TypeError, ValueError: neither or both of ``seconds`` and
                ``until``, a negative or non-finite ``seconds``, a naive
                ``until`` (nothing is written).
            RunSuperseded: this run no longer holds its attempt.

        .. versionadded:: 0.1
        """
        await _durable(self, "sleep").sleep(self, seconds, until)

    async def wait_for(self, name: str, *, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        """Return the payload of the signal ``name`` sent to this job; until it comes, park the job.

        A signal sent before the wait began counts (signals are kept on the
        job's row); the first signal of a name is the one every wait for it
        returns. While none has come, this run ends (its attempt given back,
        the worker's slot freed) and the job is parked (with ``timeout``:
        pending until then); the signal makes it due at once, and an idle
        worker runs it again, replaying from the top to this wait, which
        then returns the payload. Senders: `Queue.signal`, ``pgqueue_signal``
        in SQL.

        Args:
            name: the signal's name (1 to 255 characters, no control character).
            timeout: seconds to wait at most (from the wait's first run),
                or None for no limit.

        Raises:
            WaitTimeout: the time ran out with no signal (in the run after
                the deadline, and in every later run at this wait).
            RunSuperseded: this run no longer holds its attempt.

        .. versionadded:: 0.1
        """
        return await _durable(self, "wait_for").wait_for(self, name, timeout)

    async def spawn(
        self, name: str, job_type: str, payload: Any = None, **options: Any
    ) -> int:
        """Enqueue a child job once for this job, ever, and return its id.

        Like a step named ``name``: the first run enqueues the child (with
        `Queue.enqueue`'s options; on this job's queue unless ``queue=``
        names another) and records its id in the same transaction; every
        later run returns that id without enqueuing. Wait for it with
        `wait_child`.

        Raises:
            TypeError, ValueError: what `Queue.enqueue` raises for its
                arguments, or a ``name`` used already in this run.
            RunSuperseded: this run no longer holds its attempt (nothing
                was enqueued).

        .. versionadded:: 0.1
        """
        return await _durable(self, "spawn").spawn(
            self, name, job_type, payload, options
        )

    async def wait_child(
        self,
        child_id: int,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> Any:
        """Return the result of job ``child_id`` once it has ended; until then, park this job.

        The job is parked (with ``timeout``: pending until then), its
        attempt given back and the slot freed, until the child ends; then
        it is due at once. How the child ended is recorded as a step, so
        every later run decides alike (even after the child's row is pruned).

        Returns:
            The child's stored result (decoded JSON; None if it returned nothing).

        Raises:
            ChildFailed: the child ended dead or cancelled (naming it and
                its last error).
            WaitTimeout: the time ran out before the child ended.
            JobNotFoundError: no job has that id.
            RunSuperseded: this run no longer holds its attempt.

        .. versionadded:: 0.1
        """
        return await _durable(self, "wait_child").wait_child(self, child_id, timeout)

    async def progress(self, fraction: float, message: str | None = None) -> None:
        """Store how far this run has come (0 to 1, and a message), and announce it.

        Fenced like a step; a `Tracker` follows it
        (`Tracker.progress`). The message is cut to 1000 characters.

        Raises:
            TypeError, ValueError: ``fraction`` not a number from 0 to 1,
                ``message`` not a str (before any SQL).
            RunSuperseded: this run no longer holds its attempt.

        .. versionadded:: 0.1
        """
        await _durable(self, "progress").progress(self, fraction, message)

    async def checkpoint(self, value: Any) -> bool:
        """Store ``value`` on the job's row, for the job's next attempts to resume from.

        ``value`` is any JSON value (as a payload: what ``enqueue`` takes);
        it replaces the job's previous checkpoint. The job's next attempt
        reads it as `last_checkpoint`: after a retry, a rescue or
        `Admin.retry`, so a handler can pick up where it stopped. Completing
        the job clears it; a dead or cancelled job keeps it.

        The write is fenced like every outcome: it lands only while this
        run still holds its attempt. Waits for one statement on the
        worker's upkeep connection (shielded from cancellation: a handler
        cut off meanwhile stops once it returns), and counts as a heartbeat.
        Call it from the handler's task, or a task it started.

        Returns:
            True once the value is stored; False if it was not, because
            this run has been superseded (rescued while it looked
            orphaned, and the job run again) or has ended: the run's own
            outcome will be dropped too, so the handler may as well stop.

        Raises:
            TypeError, ValueError: ``value`` cannot be stored as JSON
                (nothing is written).
            PgQueueError: no worker's handler runs here (a `Job` made by
                hand, or a task the handler did not start).
            Exception: what the write raised when it failed (the database
                unreachable, say): the handler decides what to do (raising
                it fails the attempt, which is retried as any failure).

        .. versionadded:: 0.1
        """
        write = _CHECKPOINTS.get()
        if write is None:
            msg = (
                f"job {self.id} is not run by a worker here: checkpoint from "
                "the handler a worker runs (or a task it started)"
            )
            raise PgQueueError(msg)
        return await write(self, value)

    @property
    def tick(self) -> datetime | None:
        """The tick of the periodic schedule that enqueued this job (aware, UTC), else None.

        Read from the job's ``unique_key``, ``periodic:<name>@<tick>`` (the
        tick in ISO 8601), which stays the same through retries and snoozes.
        Keys starting ``periodic:`` are reserved for schedules.

        .. versionadded:: 0.1
        """
        key = PeriodicKey.parse(self.unique_key)
        return None if key is None else key.tick


class PeriodicKey(NamedTuple):
    """The unique key of a periodic job: ``periodic:<schedule>@<tick>``.

    The one place that writes and reads that format: the scheduler writes
    it (`str`), `Job.tick` and the dashboard read it (`parse`). The tick is
    in ISO 8601, UTC; a schedule's name may itself hold ``@``.
    """

    schedule: str
    tick: datetime

    def __str__(self) -> str:
        return f"{PERIODIC_KEY_PREFIX}{self.schedule}@{self.tick.astimezone(UTC).isoformat()}"

    @classmethod
    def parse(cls, key: str | None) -> PeriodicKey | None:
        """The schedule and tick ``key`` holds; None if it is no periodic job's key."""
        if key is None or not key.startswith(PERIODIC_KEY_PREFIX):
            return None
        schedule, at, stamp = key[len(PERIODIC_KEY_PREFIX) :].rpartition("@")
        if not at:
            return None
        try:
            tick = datetime.fromisoformat(stamp)
        except ValueError:
            return None
        return cls(schedule, tick) if tick.tzinfo is not None else None


def _fix_frozen_slots(cls: type) -> None:
    """Make the frozen ``__setattr__`` and ``__delattr__`` of ``cls`` test against ``cls``.

    ``dataclass(slots=True)`` returns a new class, but their closures still
    hold the class it replaced (CPython gh-105936, unfixed in 3.11 and 3.12):
    setting an attribute that is not a field raised ``TypeError`` rather than
    ``FrozenInstanceError``, so ``Job[X](...)`` failed where ``typing`` sets
    ``__orig_class__`` and ignores only an ``AttributeError``.
    """
    for method in (cls.__setattr__, cls.__delattr__):
        for cell in getattr(method, "__closure__", None) or ():
            held = cell.cell_contents
            if (
                isinstance(held, type)
                and held is not cls
                and held.__qualname__ == cls.__qualname__
                and held.__module__ == cls.__module__
            ):
                cell.cell_contents = cls


_fix_frozen_slots(Job)

# The claim loop builds a Job per claimed row: a frozen dataclass's __init__
# sets each field through object.__setattr__, three times slower than
# writing its slots directly.
(
    _set_id,
    _set_queue,
    _set_type,
    _set_payload,
    _set_attempts,
    _set_max_attempts,
    _set_run_at,
    _set_created_at,
    _set_last_error,
    _set_priority,
    _set_unique_key,
    _set_snoozes,
    _set_trace_context,
    _set_last_checkpoint,
    _set_parent_results,
    _set_steps,
) = (getattr(Job, f.name).__set__ for f in fields(Job))


def claimed_job(
    id: int,
    queue: str,
    type: str,
    payload: Any,
    attempts: int,
    max_attempts: int,
    run_at: datetime,
    created_at: datetime,
    last_error: str | None,
    priority: int,
    unique_key: str | None,
    snoozes: int,
    trace_context: str | None,
    last_checkpoint: Any = None,
    parent_results: Mapping[int, Any] = NO_PARENTS,
    steps: Mapping[str, Step] = NO_STEPS,
) -> Job[Any]:
    """The same `Job` as ``Job(...)`` with these fields, built for the claim loop."""
    job: Job[Any] = object.__new__(Job)
    _set_id(job, id)
    _set_queue(job, queue)
    _set_type(job, type)
    _set_payload(job, payload)
    _set_attempts(job, attempts)
    _set_max_attempts(job, max_attempts)
    _set_run_at(job, run_at)
    _set_created_at(job, created_at)
    _set_last_error(job, last_error)
    _set_priority(job, priority)
    _set_unique_key(job, unique_key)
    _set_snoozes(job, snoozes)
    _set_trace_context(job, trace_context)
    _set_last_checkpoint(job, last_checkpoint)
    _set_parent_results(job, parent_results)
    _set_steps(job, steps)
    return job


class EnqueueOptions(TypedDict, total=False):
    """The options of an enqueue, as every entry point takes them (keyword arguments).

    `Queue.enqueue` says what each does and its default; `NewJob` has the
    same fields (``on_conflict`` aside: `Queue.enqueue_many` takes it once
    for the call). `JobType.enqueue`, `pgqueue.sync.Queue.enqueue`,
    `pgqueue.sqlalchemy.enqueue` and ``pgqueue.django.job_options`` take
    them all, and ``pgqueue_enqueue(...)`` in SQL the same.

    .. versionadded:: 0.1
    """

    run_at: datetime | None
    delay: float | timedelta | None
    max_attempts: int | None
    priority: int
    unique_key: str | None
    on_conflict: Literal["return", "raise", "replace"]
    debounce: float | timedelta | None
    track: bool
    after: Sequence[int]
    on_parent_failure: Literal["cancel", "run"]
    group: str | None


@dataclass(frozen=True, slots=True)
class NewJob:
    """One job for `Queue.enqueue_many`; a ``(job_type, payload)`` tuple works too.

    The options are `Queue.enqueue`'s: ``run_at`` or ``delay`` (seconds or a
    ``timedelta`` from the database's ``now()``; not both), and so on.

    ``after``: the jobs this one waits for, by id; a negative number is a
    job earlier in the same `Queue.enqueue_many` call, counted back from this
    one (``-1`` the job just before it, ``-2`` the one before that).

    ``debounce``: as `Queue.enqueue`'s, the job replaces its key's pending
    job and runs that many seconds after the last enqueue of the key. (A
    whole call's keyed jobs replace with ``enqueue_many(...,
    on_conflict="replace")``.)

    ``group``: the job's group, as `Queue.enqueue`'s (not with ``after``).
    """

    job_type: str
    payload: Any = None
    _: KW_ONLY
    run_at: datetime | None = None
    delay: float | timedelta | None = None
    max_attempts: int | None = None
    priority: int = 0
    unique_key: str | None = None
    track: bool = False
    after: Sequence[int] = ()
    on_parent_failure: Literal["cancel", "run"] = "cancel"
    debounce: float | timedelta | None = None
    group: str | None = None
