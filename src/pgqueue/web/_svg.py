"""The dashboard's drawings, laid out in Python and drawn by templates (``_svg.html``): the trend's charts and a job's workflow.

Only numbers are computed here: the templates write the SVG elements with
autoescape on, so every label (a queue, a job type: hostile text) is
escaped where it is put, as in every other page. Each drawn step and job
carries its numbers in ``data-`` attributes and a ``<title>``, which a
screen reader (and a test) reads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from pgqueue import JobDependencies, RelatedJob, Status, TrendPoint

__all__ = [
    "CHART_HEIGHT",
    "CHART_WIDTH",
    "GRAPH_PER_ROW",
    "Chart",
    "Graph",
    "counts_chart",
    "run_time_chart",
    "workflow_graph",
]

CHART_WIDTH = 640
CHART_HEIGHT = 160
_LEFT, _RIGHT, _BOTTOM, _TOP = 48, 20, 20, 8  # room for the axes' labels
_PLOT_WIDTH = CHART_WIDTH - _LEFT - _RIGHT
_PLOT_HEIGHT = CHART_HEIGHT - _TOP - _BOTTOM


@dataclass(frozen=True, slots=True)
class Step:
    """One step's bar: its stacked parts (completed, retried, dead) and where they go."""

    at: datetime
    x: float
    width: float
    completed: int
    failed: int
    dead: int
    mean_run_time: float | None
    # (y, height) of each part, bottom up.
    completed_box: tuple[float, float]
    retried_box: tuple[float, float]
    dead_box: tuple[float, float]
    run_time_y: float | None


@dataclass(frozen=True, slots=True)
class Chart:
    """A chart of a window: its steps, its y axis' top value and its x labels."""

    width: int
    height: int
    steps: tuple[Step, ...]
    top: float
    ticks: tuple[tuple[float, str], ...]  # (x, label) along the time axis
    line: str  # the run time's polyline points ("" for none)
    start: datetime
    end: datetime
    step_seconds: float
    plot: tuple[float, float, float, float]  # x, y, width, height of the plot area


def _layout(
    points: Sequence[TrendPoint], window: float, step: float, now: datetime
) -> tuple[datetime, int, float]:
    """The window's first step, its count, and each step's width."""
    epoch = now.timestamp()
    end = math.ceil(epoch / step) * step
    count = max(1, math.ceil(window / step))
    start = datetime.fromtimestamp(end - count * step, UTC)
    return start, count, _PLOT_WIDTH / count


def _ticks(
    start: datetime, count: int, width: float, step: float
) -> tuple[tuple[float, str], ...]:
    every = max(1, count // 6)
    labels = []
    for index in range(0, count + 1, every):
        at = start + timedelta(seconds=index * step)
        text = at.strftime("%H:%M") if step < 3600 * 6 else at.strftime("%m-%d %H:%M")
        labels.append((_LEFT + index * width, text))
    return tuple(labels)


def _nice(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``value`` (1 for nothing)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    for factor in (1, 2, 5, 10):
        if factor * power >= value:
            return float(factor * power)
    return 10 * power  # pragma: no cover


def _placed(
    points: Sequence[TrendPoint], start: datetime, step: float, count: int
) -> Iterator[tuple[int, TrendPoint]]:
    """Each point inside the window of ``count`` steps from ``start``, with its step's index."""
    for point in points:
        index = int((point.at - start).total_seconds() // step)
        if 0 <= index < count:
            yield index, point


def _step(
    point: TrendPoint,
    x: float,
    width: float,
    boxes: Sequence[tuple[float, float]],
    run_time_y: float | None,
) -> Step:
    """``point``'s step drawn at ``x``: its parts' ``boxes`` (completed, retried, dead)."""
    return Step(
        at=point.at,
        x=x,
        width=width,
        completed=point.completed,
        failed=point.failed,
        dead=point.dead,
        mean_run_time=point.mean_run_time,
        completed_box=boxes[0],
        retried_box=boxes[1],
        dead_box=boxes[2],
        run_time_y=run_time_y,
    )


def _chart(
    start: datetime,
    count: int,
    width: float,
    step: float,
    steps: list[Step],
    top: float,
    line: str = "",
) -> Chart:
    """The chart of ``steps`` over ``count`` steps of ``step`` seconds from ``start``."""
    return Chart(
        width=CHART_WIDTH,
        height=CHART_HEIGHT,
        steps=tuple(steps),
        top=top,
        ticks=_ticks(start, count, width, step),
        line=line,
        start=start,
        end=start + timedelta(seconds=count * step),
        step_seconds=step,
        plot=(_LEFT, _TOP, _PLOT_WIDTH, _PLOT_HEIGHT),
    )


def counts_chart(
    points: Sequence[TrendPoint], window: float, step: float, now: datetime
) -> Chart:
    """Stacked bars a step: completed (bottom), failed and retried, dead (top)."""
    start, count, width = _layout(points, window, step, now)
    top = _nice(max((p.completed + p.failed for p in points), default=0))
    scale = _PLOT_HEIGHT / top
    base = CHART_HEIGHT - _BOTTOM
    steps = []
    for index, point in _placed(points, start, step, count):
        parts = (point.completed, point.failed - point.dead, point.dead)
        boxes = []
        y = float(base)
        for part in parts:
            height = part * scale
            y -= height
            boxes.append((round(y, 2), round(height, 2)))
        x = round(_LEFT + index * width + width * 0.1, 2)
        bar = round(max(width * 0.8, 1.0), 2)
        steps.append(_step(point, x, bar, boxes, None))
    return _chart(start, count, width, step, steps, top)


def run_time_chart(
    points: Sequence[TrendPoint], window: float, step: float, now: datetime
) -> Chart:
    """The mean run time a step, as a line through the steps that ran a handler."""
    start, count, width = _layout(points, window, step, now)
    timed = [p for p in points if p.mean_run_time is not None]
    top = _nice(max((p.mean_run_time or 0.0 for p in timed), default=0.0))
    base = CHART_HEIGHT - _BOTTOM
    steps = []
    for index, point in _placed(timed, start, step, count):
        y = round(base - (point.mean_run_time or 0.0) / top * _PLOT_HEIGHT, 2)
        x = round(_LEFT + index * width + width / 2, 2)
        steps.append(_step(point, x, round(width, 2), ((0, 0),) * 3, y))
    line = " ".join(f"{s.x},{s.run_time_y}" for s in steps)
    return _chart(start, count, width, step, steps, top, line)


# --- a job's workflow -------------------------------------------------------------------

GRAPH_PER_ROW = 10
"""Jobs a row of the workflow graph holds: a fan-in of 50 is five rows of parents."""

_NODE_W, _NODE_H, _GAP_X, _GAP_Y, _RANK_GAP = 84, 28, 8, 8, 40


@dataclass(frozen=True, slots=True)
class Node:
    """A job of the graph: its box, its id and status (None: deleted), its role."""

    x: float
    y: float
    width: float
    height: float
    job_id: int | None  # None: the "and N more" box
    status: Status | None
    role: str  # "parent", "job", "child", "more-parents", "more-children"
    more: int = 0


@dataclass(frozen=True, slots=True)
class Edge:
    x1: float
    y1: float
    x2: float
    y2: float


@dataclass(frozen=True, slots=True)
class Graph:
    """The job between its parents (above) and children (below), with the edges."""

    width: float
    height: float
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    parents_total: int
    children_total: int


def _rows(count: int) -> int:
    return math.ceil(count / GRAPH_PER_ROW)


def _place(
    jobs: Sequence[RelatedJob], more: int, role: str, top: float, width: float
) -> list[Node]:
    """Boxes for ``jobs`` (and a box for ``more``) in rows of GRAPH_PER_ROW, centred, from ``top``."""
    items: list[tuple[int | None, Status | None]] = [(j.id, j.status) for j in jobs]
    if more:
        items.append((None, None))
    nodes = []
    for index, (job_id, status) in enumerate(items):
        row, column = divmod(index, GRAPH_PER_ROW)
        in_row = min(GRAPH_PER_ROW, len(items) - row * GRAPH_PER_ROW)
        row_width = in_row * _NODE_W + (in_row - 1) * _GAP_X
        x = (width - row_width) / 2 + column * (_NODE_W + _GAP_X)
        y = top + row * (_NODE_H + _GAP_Y)
        nodes.append(
            Node(
                x=x,
                y=y,
                width=_NODE_W,
                height=_NODE_H,
                job_id=job_id,
                status=status,
                role=role if job_id is not None else f"more-{role}s",
                more=more if job_id is None else 0,
            )
        )
    return nodes


def workflow_graph(job_id: int, status: Status, dependencies: JobDependencies) -> Graph:
    """``job_id`` with its parents and children as `Admin.dependencies` read them (the rest as "and N more")."""
    parents, children = dependencies.parents, dependencies.children
    more_parents = dependencies.parents_total - len(parents)
    more_children = dependencies.children_total - len(children)
    widest = min(
        GRAPH_PER_ROW,
        max(len(parents) + (more_parents > 0), len(children) + (more_children > 0), 1),
    )
    width = widest * _NODE_W + (widest - 1) * _GAP_X + 2 * _GAP_X
    parent_rows = _rows(len(parents) + (more_parents > 0))
    child_rows = _rows(len(children) + (more_children > 0))
    y = float(_GAP_Y)
    above = _place(parents, more_parents, "parent", y, width)
    if parent_rows:
        y += parent_rows * (_NODE_H + _GAP_Y) - _GAP_Y + _RANK_GAP
    center = Node(
        x=(width - _NODE_W) / 2,
        y=y,
        width=_NODE_W,
        height=_NODE_H,
        job_id=job_id,
        status=status,
        role="job",
    )
    y += _NODE_H + _RANK_GAP
    below = _place(children, more_children, "child", y, width)
    height = (
        y
        + (child_rows * (_NODE_H + _GAP_Y) if child_rows else 0)
        - (_RANK_GAP if not child_rows else 0)
    )
    middle = center.x + _NODE_W / 2
    edges = [
        Edge(n.x + _NODE_W / 2, n.y + _NODE_H, middle, center.y) for n in above
    ] + [Edge(middle, center.y + _NODE_H, n.x + _NODE_W / 2, n.y) for n in below]
    return Graph(
        width=width,
        height=height + _GAP_Y,
        nodes=(*above, center, *below),
        edges=tuple(edges),
        parents_total=dependencies.parents_total,
        children_total=dependencies.children_total,
    )
