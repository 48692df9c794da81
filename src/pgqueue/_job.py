"""The job record handed to handlers, and the values around it."""

from __future__ import annotations

import enum
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from datetime import datetime

__all__ = ["Job", "NewJob", "Status"]


class Status(enum.StrEnum):
    """The lifecycle state of a row in ``pgqueue_jobs``."""

    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    DEAD = "dead"


@dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A claimed job as a handler sees it.

    ``attempts`` counts the attempt now running: it is 1 on the first
    delivery. ``payload`` is the decoded JSON value.
    """

    id: int
    queue: str
    type: str
    payload: Any
    attempts: int
    max_attempts: int
    run_at: datetime
    created_at: datetime
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class NewJob:
    """One job for `Queue.enqueue_many`; a ``(job_type, payload)`` tuple works too."""

    job_type: str
    payload: Any = None
    _: KW_ONLY
    run_at: datetime | None = None
    max_attempts: int | None = None
