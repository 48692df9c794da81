"""What one claim of a job ended as, before and while it is written."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from pgqueue._core.job import Job

__all__ = [
    "CANCELLED_ERROR",
    "SHUTDOWN_ERROR",
    "Key",
    "Kind",
    "Outcome",
    "shutdown_outcome",
]


class Kind(enum.StrEnum):
    """What a claim ended as: the ``status`` of an `Outcome`.

    A ``StrEnum`` whose values are the strings hooks and observers have
    always seen, so ``outcome.status == "snoozed"`` keeps working; the
    final kinds equal the `pgqueue.Status` of the same name.
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


SHUTDOWN_ERROR = "worker shut down before the job finished"
CANCELLED_ERROR = "cancelled by request"

Key = tuple[int, int]
"""A claim's identity: (job id, the attempt it claimed)."""


class Outcome(NamedTuple):
    """What one claim of a job ended as; written fenced on ``job.attempts``.

    ``status`` is its `Kind`: a final one, ``Kind.PENDING`` for a retry
    after ``delay`` seconds, ``Kind.SNOOZED`` or ``Kind.RELEASED``. ``result`` is the JSON text
    of a completed handler's return value, if it returned one. A named
    tuple: one is built for every job run.
    """

    job: Job
    status: Kind
    delay: float = 0.0
    error: str | None = None
    result: str | None = None

    @property
    def key(self) -> Key:
        """The claim this outcome ends."""
        return self.job.id, self.job.attempts


def shutdown_outcome(job: Job) -> Outcome:
    """The outcome of a run cut off by the worker's shutdown.

    The job goes back to pending at once, its attempt counted; with its
    attempts used up it is dead, as the rescue sweep would make it.
    """
    if job.attempts < job.max_attempts:
        return Outcome(job, Kind.PENDING, error=SHUTDOWN_ERROR)
    return Outcome(
        job, Kind.DEAD, error=f"{SHUTDOWN_ERROR}, and its attempts are used up"
    )
