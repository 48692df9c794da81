"""The job record handed to handlers, and the values around it."""

from __future__ import annotations

import enum
from dataclasses import KW_ONLY, dataclass, fields
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

if TYPE_CHECKING:
    from typing_extensions import TypeVar as DefaultedTypeVar

    # The default (PEP 696) makes a bare ``Job`` mean ``Job[Any]`` to type
    # checkers, with no "missing type parameters" error under --strict.
    # typing.TypeVar takes a default from Python 3.13 on.
    PayloadT = DefaultedTypeVar("PayloadT", covariant=True, default=Any)
else:
    PayloadT = TypeVar("PayloadT", covariant=True)

__all__ = [
    "PERIODIC_KEY_PREFIX",
    "Job",
    "NewJob",
    "PeriodicKey",
    "Status",
]

PERIODIC_KEY_PREFIX = "periodic:"
"""How the unique keys of periodic jobs start: ``periodic:<name>@<tick>``."""


class Status(enum.StrEnum):
    """The lifecycle state of a row in ``pgqueue_jobs``."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    DEAD = "dead"
    CANCELLED = "cancelled"


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
) = (getattr(Job, field.name).__set__ for field in fields(Job))


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
    return job


@dataclass(frozen=True, slots=True)
class NewJob:
    """One job for `Queue.enqueue_many`; a ``(job_type, payload)`` tuple works too.

    The options are `Queue.enqueue`'s: ``run_at`` or ``delay`` (seconds or a
    ``timedelta`` from the database's ``now()``; not both), and so on.
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
