"""What one claim of a job ended as, before and while it is written."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from pgqueue._job import Status

if TYPE_CHECKING:
    from pgqueue._job import Job

__all__ = [
    "CANCELLED_ERROR",
    "RELEASED",
    "SHUTDOWN_ERROR",
    "SNOOZED",
    "Key",
    "Outcome",
    "shutdown_outcome",
]

RELEASED = "released"
"""An outcome for a job claimed but never started: pending again, attempt given back."""

SNOOZED = "snoozed"
"""An outcome for a job snoozed by its handler: pending after ``delay``, attempt given back."""

SHUTDOWN_ERROR = "worker shut down before the job finished"
CANCELLED_ERROR = "cancelled by request"

Key = tuple[int, int]
"""A claim's identity: (job id, the attempt it claimed)."""


class Outcome(NamedTuple):
    """What one claim of a job ended as; written fenced on ``job.attempts``.

    ``status`` is a final `Status`, ``Status.PENDING`` for a retry after
    ``delay`` seconds, `SNOOZED` or `RELEASED`. ``result`` is the JSON text
    of a completed handler's return value, if it returned one. A named
    tuple: one is built for every job run.
    """

    job: Job
    status: str
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
        return Outcome(job, Status.PENDING, error=SHUTDOWN_ERROR)
    return Outcome(
        job, Status.DEAD, error=f"{SHUTDOWN_ERROR}, and its attempts are used up"
    )
