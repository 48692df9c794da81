"""What one claim of a job ended as, before and while it is written."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from pgqueue._core.lifecycle import OutcomeKind

if TYPE_CHECKING:
    from pgqueue._core.job import Job

__all__ = [
    "CANCELLED_ERROR",
    "SHUTDOWN_ERROR",
    "Key",
    "Outcome",
    "shutdown_outcome",
]


SHUTDOWN_ERROR = "worker shut down before the job finished"
CANCELLED_ERROR = "cancelled by request"

Key = tuple[int, int]
"""A claim's identity: (job id, the attempt it claimed)."""


class Outcome(NamedTuple):
    """What one claim of a job ended as; written fenced on ``job.attempts``.

    ``status`` is its `OutcomeKind`: a final one, ``OutcomeKind.PENDING``
    for a retry after ``delay`` seconds, ``OutcomeKind.SNOOZED`` or
    ``OutcomeKind.RELEASED``; ``pgqueue._core.lifecycle.OUTCOMES`` says which
    status each writes. ``result`` is the JSON text
    of a completed handler's return value, if it returned one.
    ``run_time``: the seconds its handler ran, when one ran (the worker's
    trend reads it). A named tuple: one is built for every job run.
    """

    job: Job
    status: OutcomeKind
    delay: float = 0.0
    error: str | None = None
    result: str | None = None
    run_time: float | None = None

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
        return Outcome(job, OutcomeKind.PENDING, error=SHUTDOWN_ERROR)
    return Outcome(
        job, OutcomeKind.DEAD, error=f"{SHUTDOWN_ERROR}, and its attempts are used up"
    )
