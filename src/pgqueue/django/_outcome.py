"""How a task's outcome is stored in its job's row, and read back.

A run that returns stores ``{"return_value": ..., "started_at": ...,
"worker_id": ...}`` in the ``result`` column. A run that raises fails its
attempt with `TaskFailed`, so the worker stores, in ``last_error``::

    TaskFailed: shop.tasks.PaymentError: card declined
    {"exception_class_path": "shop.tasks.PaymentError", "started_at": "...", "worker_id": "..."}
    Traceback (most recent call last):
    ...

The first line is what a listing of pgqueue's shows; the traceback is cut
at its start to fit pgqueue's 4000 characters of ``last_error``. Any other
``last_error`` (a job timeout, a cancel, a type no worker knew) reads back
as a `JobFailed` error with that text as its traceback.
"""

from __future__ import annotations

import json
import traceback
from typing import TYPE_CHECKING, Any

from pgqueue import PgQueueError

if TYPE_CHECKING:
    from datetime import datetime

__all__ = ["JOB_TYPE", "JobFailed", "Recorded", "TaskFailed", "read_error"]

JOB_TYPE = "django.task"
"""The ``job_type`` of every job the backend enqueues; the payload names the task."""

_TRACEBACK_CHARS = 3000  # leaves room in last_error for the two first lines


class JobFailed(PgQueueError):
    """The worker recorded an error of its own: a timeout, a cancel, an unknown job type."""


class TaskFailed(PgQueueError):
    """A task raised: its error, as the worker stores it in ``last_error``."""

    def __init__(
        self, error: BaseException, *, started_at: datetime, worker_id: str
    ) -> None:
        kind = type(error)
        path = f"{kind.__module__}.{kind.__qualname__}"
        try:
            message = str(error).strip().partition("\n")[0]
        except Exception:  # a broken __str__ must not lose the error
            message = ""
        recorded = {
            "exception_class_path": path,
            "started_at": started_at.isoformat(),
            "worker_id": worker_id,
        }
        text = "".join(traceback.format_exception(error))
        if len(text) > _TRACEBACK_CHARS:
            text = "..." + text[-_TRACEBACK_CHARS:]
        first = f"{path}: {message}" if message else path
        super().__init__(f"{first[:300]}\n{json.dumps(recorded)}\n{text}")


class Recorded:
    """What a row says about its last attempt: error class, traceback, start and worker."""

    __slots__ = ("exception_class_path", "started_at", "traceback", "worker_id")

    def __init__(
        self,
        exception_class_path: str,
        traceback: str,
        started_at: str | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.exception_class_path = exception_class_path
        self.traceback = traceback
        self.started_at = started_at
        self.worker_id = worker_id


def read_error(last_error: str) -> Recorded:
    """The error ``last_error`` records: one `TaskFailed` wrote, or the worker's own."""
    head, _, rest = last_error.partition("\n")
    if head.startswith(f"{TaskFailed.__name__}: "):
        line, _, text = rest.partition("\n")
        try:
            recorded: Any = json.loads(line)
            return Recorded(
                str(recorded["exception_class_path"]),
                text,
                recorded.get("started_at"),
                recorded.get("worker_id"),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            pass  # written by something else: shown as it is
    return Recorded("pgqueue.django.JobFailed", last_error)
