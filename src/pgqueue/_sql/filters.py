"""A `JobFilter` as SQL: a condition on ``pgqueue_jobs`` and its bound parameters.

Every value the operator typed is a parameter; only the statuses, checked
against the lifecycle when the filter was made, are part of the text (so
that the planner can use the partial index that serves one, even with a
generic plan).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from pgqueue._core.lifecycle import LIFECYCLE, Status
from pgqueue._sql.statuses import ENDED, PENDING, in_list, quoted

if TYPE_CHECKING:
    from collections.abc import Collection

    from pgqueue._core.filter import JobFilter

__all__ = ["STATUS_CONDITIONS", "Condition", "condition"]

STATUS_CONDITIONS: dict[str | None, str] = {None: "true"}
"""Each status a filter or listing takes, as SQL: pending also by whether it is due."""
for _status in LIFECYCLE:
    STATUS_CONDITIONS[_status.value] = f"status = {quoted(_status)}"
    if _status == Status.PENDING:
        STATUS_CONDITIONS["ready"] = (
            f"status = {PENDING} AND run_at <= pg_catalog.now()"
        )
        STATUS_CONDITIONS["scheduled"] = (
            f"status = {PENDING} AND run_at > pg_catalog.now()"
        )

_EQUALS = {
    "queue": "queue",
    "job_type": "job_type",
    "group": "group_key",
    "unique_key": "unique_key",
}
_WINDOWS = {
    "created_after": "created_at >= {}",
    "created_before": "created_at < {}",
    "due_after": "run_at >= {}",
    "due_before": "run_at < {}",
    "finished_after": f"status IN {ENDED} AND updated_at >= {{}}",
    "finished_before": f"status IN {ENDED} AND updated_at < {{}}",
}


class Condition:
    """A filter's condition: SQL text whose parameters are numbered from ``first``, and their values."""

    __slots__ = ("args", "text")

    def __init__(self, text: str, args: list[object]) -> None:
        self.text = text
        self.args = args


def condition(
    found: JobFilter,
    first: int,
    *,
    skip: Collection[str] = (),
    statuses: Collection[Status] | None = None,
) -> Condition:
    """``found`` as an SQL condition whose parameters are ``$first`` on.

    ``skip``: fields the caller binds itself (a listing's queue and type);
    ``statuses``: only jobs in these (a bulk action's), besides the filter's own.
    """
    parts: list[str] = []
    args: list[object] = []

    def bind(value: object, cast: str) -> str:
        args.append(value)
        return f"${first + len(args) - 1}::{cast}"

    if "status" not in skip and found.status is not None:
        parts.append(STATUS_CONDITIONS[found.status])
    if statuses is not None:
        parts.append(f"status IN {in_list(statuses)}" if statuses else "false")
    for name, column in _EQUALS.items():
        value = getattr(found, name)
        if value is not None and name not in skip:
            parts.append(f"{column} = {bind(value, 'text')}")
    for name, template in _WINDOWS.items():
        value = getattr(found, name)
        if value is not None:
            parts.append(template.format(bind(value, "timestamptz")))
    if found.error_contains is not None:
        parts.append(
            f"pg_catalog.strpos(last_error, {bind(found.error_contains, 'text')}) > 0"
        )
    for column in ("payload", "result"):
        value = getattr(found, column)
        if value is not None:
            # text, then jsonb: whatever codec the caller's pool set for jsonb.
            parts.append(f"{column} @> {bind(json.dumps(value), 'text')}::jsonb")
    return Condition(" AND ".join(parts) or "true", args)
