"""The dashboard's trend page (``/trend``: every queue, a queue's, or a job type's) and the job page's workflow graph."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

from starlette.exceptions import HTTPException

from pgqueue._extension import check_job_type, check_queue_name, shown_name, trend_step
from pgqueue.web._svg import counts_chart, run_time_chart, workflow_graph

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from pgqueue import Admin, JobDependencies, Status
    from pgqueue.web._svg import Graph

__all__ = ["TREND_ROWS_SHOWN", "WINDOWS", "graph_of", "trend_context"]

WINDOWS = {"1h": ("the last hour", 3600.0), "1d": ("the last day", 86400.0)}
"""The windows the page offers (``?since=``)."""

TREND_ROWS_SHOWN = 200
"""The most queue and type rows the page lists (the charts sum them all)."""

_POINTS = 60


async def trend_context(admin: Admin, params: Mapping[str, str]) -> dict[str, Any]:
    """What trend.html draws for ``?queue=&type=&since=``; 400 for a bad one."""
    queue, job_type = params.get("queue") or None, params.get("type") or None
    since = params.get("since") or "1h"
    try:
        if queue is not None:
            check_queue_name(queue)
        if job_type is not None:
            check_job_type(job_type)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None
    if since not in WINDOWS:
        raise HTTPException(400, f"since must be one of {', '.join(WINDOWS)}")
    window = WINDOWS[since][1]
    rows = await admin.trend(queue=queue, job_type=job_type, since=window)
    points = await admin.trend_points(
        queue=queue, job_type=job_type, since=window, points=_POINTS
    )
    now = datetime.now(UTC)
    step = trend_step(window, _POINTS)
    label = "every queue" if queue is None else f"queue {shown_name(queue)}"
    if job_type is not None:
        label += f", type {shown_name(job_type)}"
    return {
        "queue": queue,
        "job_type": job_type,
        "since": since,
        "windows": [(key, text) for key, (text, _) in WINDOWS.items()],
        "label": label,
        "rows": rows[:TREND_ROWS_SHOWN],
        "more": max(0, len(rows) - TREND_ROWS_SHOWN),
        "counts": counts_chart(points, window, step, now),
        "run_times": run_time_chart(points, window, step, now),
    }


def graph_of(
    job_id: int, status: Status, dependencies: JobDependencies
) -> Graph | None:
    """The job page's workflow graph; None for a job with neither parents nor children."""
    if not (dependencies.parents_total or dependencies.children_total):
        return None
    return workflow_graph(job_id, status, dependencies)
