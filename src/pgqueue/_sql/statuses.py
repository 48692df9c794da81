"""The lifecycle's statuses and outcome kinds as SQL, for the statements' f-strings.

Rendered from `pgqueue._core.lifecycle`, the one place they are named:
``f"WHERE status IN {ENDED}"``. A single status is a quoted literal
(``'pending'``), a set a parenthesized list in `Status` order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgqueue._core.lifecycle import (
    ENDED as _ENDED,
)
from pgqueue._core.lifecycle import (
    FAILED as _FAILED,
)
from pgqueue._core.lifecycle import (
    LIVE as _LIVE,
)
from pgqueue._core.lifecycle import (
    OUTCOMES,
    OutcomeKind,
    Status,
)
from pgqueue._core.lifecycle import (
    REQUEUED as _REQUEUED,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "CANCELLED",
    "CHECK_ARRAY",
    "COMPLETED",
    "DEAD",
    "DELAYED",
    "ENDED",
    "FAILED",
    "FAILURES",
    "GIVES_BACK",
    "KEEPS_ERROR",
    "LIVE",
    "NOT_RUNNING",
    "PARKED",
    "PENDING",
    "PENDING_AGAIN",
    "REQUEUED",
    "RUNNING",
    "SNOOZED",
    "UNFINISHED",
    "WAITING",
    "in_list",
    "quoted",
]


def quoted(value: str) -> str:
    """``value`` as an SQL string literal (a status or kind: no quote in it)."""
    return f"'{value}'"


def in_list(values: Iterable[str]) -> str:
    """``values`` as an SQL list: ``('completed', 'dead', 'cancelled')``."""
    return "(" + ", ".join(map(quoted, values)) + ")"


PENDING = quoted(Status.PENDING)
RUNNING = quoted(Status.RUNNING)
COMPLETED = quoted(Status.COMPLETED)
DEAD = quoted(Status.DEAD)
CANCELLED = quoted(Status.CANCELLED)
WAITING = quoted(Status.WAITING)
PARKED = quoted(Status.PARKED)

LIVE = in_list(_LIVE)
"""The statuses that hold a unique key: the unique index's predicate."""
ENDED = in_list(_ENDED)
FAILED = in_list(_FAILED)
UNFINISHED = in_list(status for status in Status if status not in _ENDED)
NOT_RUNNING = in_list(status for status in Status if status != Status.RUNNING)
"""Every status but running: "still running" spelled so the primary key drives an outcome write."""
CHECK_ARRAY = "'{" + ",".join(Status) + "}'"
"""Every status, as the array literal of the CHECK constraint (``'{pending,running,...}'``)."""

# Outcome kinds, as FINISH reads them ($3).
SNOOZED = quoted(OutcomeKind.SNOOZED)
REQUEUED = in_list(_REQUEUED)
PENDING_AGAIN = in_list(
    kind
    for kind, t in OUTCOMES.items()
    if t.status == Status.PENDING and kind != OutcomeKind.PENDING
)
"""The kinds other than a retry that put a job back to pending."""
GIVES_BACK = in_list(kind for kind, t in OUTCOMES.items() if t.gives_back)
DELAYED = in_list(kind for kind, t in OUTCOMES.items() if t.delayed)
FAILURES = in_list(kind for kind, t in OUTCOMES.items() if t.failure)
KEEPS_ERROR = in_list(kind for kind, t in OUTCOMES.items() if t.keeps_error)
