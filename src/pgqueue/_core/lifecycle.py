"""A job's lifecycle: each status and what it means, and which outcome writes which status.

The one place statuses are named. The SQL's status tests (the CHECK
constraint, IN lists, partial-index predicates, the stats' filters, the
outcome write's cases) are rendered from these tables (`pgqueue._sql.literals`),
and the dashboards, the CLI, Prometheus and Django iterate them. The values
are the Go module's, which a Go producer or worker writes too.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

__all__ = [
    "CLAIMABLE",
    "ENDED",
    "FAILED",
    "LIFECYCLE",
    "LIVE",
    "OUTCOMES",
    "REQUEUED",
    "UNFINISHED",
    "OutcomeKind",
    "Status",
    "StatusTraits",
    "Transition",
    "traits",
]


class Status(enum.StrEnum):
    """The lifecycle state of a row in ``pgqueue_jobs``.

    A ``StrEnum``: each equals its value (``Status.DEAD == "dead"``). Its
    traits (`ended`, `failed`, ...) come from the lifecycle table.
    """

    PENDING = "pending"
    """Waiting in line; a claim takes it once its ``run_at`` is due."""
    RUNNING = "running"
    """Claimed by a worker, which holds it (the rescue sweep finds a dead worker's)."""
    COMPLETED = "completed"
    """Its handler returned."""
    DEAD = "dead"
    """Dead-lettered, its attempts used up or failed permanently."""
    CANCELLED = "cancelled"
    """Cancelled by request, or because a parent failed (``on_parent_failure="cancel"``)."""
    WAITING = "waiting"
    """Enqueued with ``after=``, some of its parents not finished: no claim takes it (a Go worker's neither)."""
    PARKED = "parked"
    """Its handler waits for a signal or a child job (`Job.wait_for`, `Job.wait_child`): no claim takes it
    (a Go worker's neither) until what it waits for arrives; it holds its unique key."""

    @property
    def label(self) -> str:
        """What the dashboards call it (``"Dead"``)."""
        return LIFECYCLE[self].label

    @property
    def claimable(self) -> bool:
        """Whether a claim takes a job in it (pending)."""
        return LIFECYCLE[self].claimable

    @property
    def live(self) -> bool:
        """Whether a job in it holds its unique key (pending, running)."""
        return LIFECYCLE[self].live

    @property
    def ended(self) -> bool:
        """Whether it is final (completed, dead or cancelled)."""
        return LIFECYCLE[self].ended

    @property
    def failed(self) -> bool:
        """Whether it ended without completing (dead or cancelled); retry takes such jobs back."""
        return LIFECYCLE[self].failed


@dataclass(frozen=True, slots=True)
class StatusTraits:
    """What a status means, for the SQL and for the surfaces that show it.

    Attributes:
        label: what the dashboards call it.
        claimable: a claim takes a job in it.
        live: a job in it holds its unique key; a second enqueue of the key
            gets this one (or waits behind it, with ``on_conflict="replace"``).
        ended: final; the job's parents' results and retention count it done.
        failed: ended without completing; retry takes it back.
        counted: `Admin.stats` counts it exactly, through a partial index (the
            completed jobs of a large table are estimated instead).
    """

    label: str
    claimable: bool = False
    live: bool = False
    ended: bool = False
    failed: bool = False
    counted: bool = True


LIFECYCLE: Final[dict[Status, StatusTraits]] = {
    Status.WAITING: StatusTraits("Waiting"),
    Status.PENDING: StatusTraits("Pending", claimable=True, live=True),
    Status.RUNNING: StatusTraits("Running", live=True),
    Status.PARKED: StatusTraits("Parked", live=True),
    Status.COMPLETED: StatusTraits("Completed", ended=True, counted=False),
    Status.DEAD: StatusTraits("Dead", ended=True, failed=True),
    Status.CANCELLED: StatusTraits("Cancelled", ended=True, failed=True),
}
"""Every status's traits, in the order a job lives them (the dashboards' order)."""


def traits(**wanted: bool) -> tuple[Status, ...]:
    """The statuses whose traits are as ``wanted`` (``traits(ended=True)``), in `Status` order.

    `Status` order is the database's: the CHECK constraint's, the Go module's first.
    """
    return tuple(
        status
        for status in Status
        if all(
            getattr(LIFECYCLE[status], name) is value for name, value in wanted.items()
        )
    )


CLAIMABLE: Final = traits(claimable=True)
"""(pending,): what a claim takes."""
LIVE: Final = traits(live=True)
"""(pending, running, parked): the statuses that hold a unique key."""
ENDED: Final = traits(ended=True)
"""(completed, dead, cancelled): final."""
FAILED: Final = traits(failed=True)
"""(dead, cancelled): ended without completing."""
UNFINISHED: Final = traits(ended=False)
"""(pending, running, waiting, parked): not yet final."""


class OutcomeKind(enum.StrEnum):
    """What one claim of a job ended as: an `Outcome`'s ``status``.

    A ``StrEnum`` whose values are the strings hooks and observers have
    always seen (``outcome.status == "snoozed"``); the final kinds equal the
    `Status` of the same name. ``pgqueue._core.lifecycle.OUTCOMES`` says
    which status each writes.
    """

    COMPLETED = "completed"
    """The handler returned."""
    PENDING = "pending"
    """The handler failed; the job is pending again after ``delay``, its attempt counted (a retry)."""
    DEAD = "dead"
    """Dead-lettered (attempts used up, `pgqueue.Permanent`, or no handler)."""
    CANCELLED = "cancelled"
    """Cancelled by request while it ran."""
    SNOOZED = "snoozed"
    """Snoozed by its handler; pending after ``delay``, its attempt given back."""
    RELEASED = "released"
    """Claimed but never started; pending again at once, its attempt given back."""
    SUSPENDED = "suspended"
    """A durable handler's run ended for a sleep or a wait (or was found superseded):
    the job's row is written already (pending later, or parked), its attempt given
    back; the worker writes nothing more. Not in ``OUTCOMES``: no outcome write carries it."""


@dataclass(frozen=True, slots=True)
class Transition:
    """What writing an outcome of one kind does to its running job.

    Attributes:
        status: the status it writes (cancelled instead, for a job back in
            line whose cancel was requested: see ``requeued``).
        requeued: the job goes back in line (pending); one whose cancel was
            requested is cancelled instead.
        gives_back: its attempt is given back (not counted).
        delayed: its ``run_at`` moves to now plus the outcome's delay.
        failure: a failed attempt, recorded in the job's ``errors`` with its
            error (which becomes ``last_error``).
        keeps_error: ``last_error`` stays as it was.
    """

    status: Status
    requeued: bool = False
    gives_back: bool = False
    delayed: bool = False
    failure: bool = False
    keeps_error: bool = False


OUTCOMES: Final[dict[OutcomeKind, Transition]] = {
    OutcomeKind.COMPLETED: Transition(Status.COMPLETED, keeps_error=True),
    OutcomeKind.PENDING: Transition(
        Status.PENDING, requeued=True, delayed=True, failure=True
    ),
    OutcomeKind.DEAD: Transition(Status.DEAD, failure=True),
    OutcomeKind.CANCELLED: Transition(Status.CANCELLED),
    OutcomeKind.SNOOZED: Transition(
        Status.PENDING, requeued=True, gives_back=True, delayed=True, keeps_error=True
    ),
    OutcomeKind.RELEASED: Transition(
        Status.PENDING, requeued=True, gives_back=True, keeps_error=True
    ),
}
"""Which status each outcome writes, and how (see `Transition`)."""

REQUEUED: Final = tuple(kind for kind, t in OUTCOMES.items() if t.requeued)
"""The outcomes that put a job back in line."""
