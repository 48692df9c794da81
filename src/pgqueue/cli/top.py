"""``pgqueue top``: a live terminal dashboard of every queue (read-only).

Each frame reads, in one read-only snapshot: the per-queue counts and lag
from `pgqueue.Admin.stats`, the newest job id, the jobs enqueued since the
previous frame (a range of the primary key), the jobs running longest (the
rescue index) and the latest dead jobs (`pgqueue.Admin.jobs`). Rates come
from differences between frames over the last `RATE_WINDOW` seconds (at
least the last interval), so the first frame shows none:

* enqueued per second: the rows whose ids are past the newest id of the
  window's first frame (each frame counts those past the previous one's);
* finished per second: those, less the growth of the queue's live jobs
  (ready, scheduled and running). Every job that left the live states
  counts: completed, dead or cancelled; dead jobs put back by a retry count
  against it (it never goes below zero).

Neither depends on the completed count (an estimate on a large table) nor
on pruning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import signal
import sys
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
from anyio import TASK_STATUS_IGNORED

from pgqueue import _sql
from pgqueue._admin import Admin
from pgqueue._checks import check_queue_name
from pgqueue._errors import DATABASE_ERRORS, describe
from pgqueue._schema import check_schema
from pgqueue.cli._common import (
    EXIT_ERROR,
    EXIT_OK,
    Commands,
    UsageError,
    connect,
    dsn_of,
    print_json,
    rich_console,
    seconds_text,
)

if TYPE_CHECKING:
    import argparse
    from datetime import datetime

    from anyio.abc import TaskStatus
    from rich.console import RenderableType

__all__ = ["Frame", "Sampler", "add_to", "render"]

TOP = 5
"""How many longest-running and latest dead jobs a frame shows."""

_FAILURES: tuple[type[Exception], ...] = (*DATABASE_ERRORS, asyncpg.PostgresError)
"""What ends the dashboard with exit code 1 and one line on stderr."""

NARROW = 100
"""Below this many columns, the queues table packs its columns closer."""

RATE_WINDOW = 10.0
"""Seconds over which the rates are averaged (at least one interval)."""


def add_to(commands: Commands) -> None:
    """Add ``pgqueue top``."""
    parser = commands.add_parser(
        "top",
        help="a live dashboard of the queues (read-only)",
        description=(
            "A live dashboard: per queue the jobs ready, scheduled, running, "
            "completed (~ marks an estimate), dead and cancelled, the lag (age of "
            "the oldest ready job), jobs enqueued and finished per second (from "
            "the second frame on), the longest-running jobs and the latest dead "
            "jobs. Read-only. Ctrl-C quits."
        ),
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="seconds between frames (default: 2.0)",
    )
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("--queue", help="show only this queue")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print each frame's data as one JSON document a line",
    )
    parser.set_defaults(run=run)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueLine:
    """One queue's row of a frame."""

    queue: str
    ready: int
    scheduled: int
    running: int
    completed: int
    completed_estimated: bool
    dead: int
    cancelled: int
    lag: float | None
    """Seconds since the oldest ready job was due; None with none ready."""
    enqueued_per_second: float | None
    """None on the first frame."""
    finished_per_second: float | None
    """None on the first frame."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningJob:
    """A running job: seconds since it was due, and since it was last heard from."""

    id: int
    queue: str
    job_type: str
    running_for: float | None
    """Seconds since its ``run_at`` (when this attempt was due)."""
    heard_from: float | None
    """Seconds since it was claimed or its worker's last heartbeat."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadJob:
    """A dead job, when it died, and the first line of its last error."""

    id: int
    queue: str
    job_type: str
    died_at: datetime
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    """What one redraw shows."""

    at: datetime
    """The database's clock when the frame was read."""
    queues: list[QueueLine]
    longest_running: list[RunningJob]
    latest_dead: list[DeadJob]

    def to_json(self) -> dict[str, Any]:
        """The frame as JSON-ready data with stable keys."""
        return dataclasses.asdict(self)


@dataclass(slots=True)
class _Sample:
    at: datetime
    newest: int
    """The newest id then."""
    live: dict[str, int]
    """Ready, scheduled and running jobs per queue then."""
    enqueued: dict[str, int]
    """Jobs enqueued per queue since the sample before."""


class Sampler:
    """Reads frames from one connection; remembers recent ones for the rates.

    Rates are averaged over about ``window`` seconds: from the oldest
    remembered frame that is at most that old (the previous frame, when the
    interval is longer).
    """

    def __init__(
        self,
        conn: asyncpg.Connection[Any],
        *,
        queue: str | None,
        window: float = RATE_WINDOW,
    ) -> None:
        self._conn = conn
        self._admin = Admin(conn)
        self._queue = queue
        self._window = window
        self._samples: deque[_Sample] = deque()

    def use(self, conn: asyncpg.Connection[Any]) -> None:
        """Read the next frames on ``conn`` (the last one was lost; the caller owns both)."""
        self._conn = conn
        self._admin = Admin(conn)

    async def frame(self) -> Frame:
        """Read one frame, in one read-only snapshot."""
        conn, queue, samples = self._conn, self._queue, self._samples
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            head = await conn.fetchrow(_sql.DASHBOARD_NEWEST)
            assert head is not None  # an aggregate: always one row
            newest, at = head["newest"], head["now"]
            stats = await self._admin.stats(queue=queue)
            enqueued: dict[str, int] = {}
            if samples:
                # Only the rows since the previous frame: each frame reads
                # each new row once, however long the window.
                rows = await conn.fetch(
                    _sql.DASHBOARD_ENQUEUED, samples[-1].newest, newest, queue
                )
                enqueued = {row["queue"]: row["enqueued"] for row in rows}
            running = await conn.fetch(_sql.DASHBOARD_RUNNING, queue, TOP)
            dead = await self._admin.jobs(queue=queue, status="dead", limit=TOP)
        live = {s.queue: s.ready + s.scheduled + s.running for s in stats}
        samples.append(_Sample(at, newest, live, enqueued))
        while len(samples) > 2 and (at - samples[1].at).total_seconds() >= self._window:
            samples.popleft()
        base = samples[0]
        elapsed = (at - base.at).total_seconds()
        lines = []
        for s in stats:
            enqueued_rate = finished_rate = None
            if elapsed > 0:
                new = sum(
                    sample.enqueued.get(s.queue, 0)
                    for sample in itertools.islice(samples, 1, None)
                )
                finished = new - (live[s.queue] - base.live.get(s.queue, 0))
                enqueued_rate = new / elapsed
                finished_rate = max(finished, 0) / elapsed
            lines.append(
                QueueLine(
                    queue=s.queue,
                    ready=s.ready,
                    scheduled=s.scheduled,
                    running=s.running,
                    completed=s.completed,
                    completed_estimated=s.completed_estimated,
                    dead=s.dead,
                    cancelled=s.cancelled,
                    lag=s.lag,
                    enqueued_per_second=enqueued_rate,
                    finished_per_second=finished_rate,
                )
            )
        return Frame(
            at=at,
            queues=lines,
            longest_running=[
                RunningJob(
                    id=row["id"],
                    queue=row["queue"],
                    job_type=row["job_type"],
                    running_for=row["running_for"],
                    heard_from=row["heard_from"],
                )
                for row in running
            ],
            latest_dead=[
                DeadJob(
                    id=job.id,
                    queue=job.queue,
                    job_type=job.job_type,
                    died_at=job.updated_at,
                    error=_first_line(job.last_error),
                )
                for job in dead
            ],
        )


def _first_line(text: str | None) -> str | None:
    if text is None:
        return None
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}"


def render(
    frame: Frame, *, interval: float | None = None, width: int = 120
) -> RenderableType:
    """The frame as rich tables: queues, longest running, latest dead."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    clock = frame.at.astimezone().strftime("%Y-%m-%d %H:%M:%S")
    heading = f"pgqueue top  {clock}"
    if interval is not None:
        heading += f"  every {interval:g}s  (Ctrl-C quits)"

    queues = Table(
        title="Queues",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        # Columns one space apart where 80 columns are all there is.
        padding=(0, 1) if width >= NARROW else (0, 0),
    )
    queues.add_column("queue", overflow="fold")
    for name in ("ready", "scheduled", "running", "completed", "dead", "cancelled"):
        queues.add_column(name, justify="right")
    queues.add_column("lag", justify="right")
    queues.add_column("enq/s", justify="right")
    queues.add_column("done/s", justify="right")
    for q in frame.queues:
        queues.add_row(
            q.queue,
            str(q.ready),
            str(q.scheduled),
            str(q.running),
            f"~{q.completed}" if q.completed_estimated else str(q.completed),
            Text(str(q.dead), style="bold red" if q.dead else ""),
            str(q.cancelled),
            seconds_text(q.lag),
            _rate(q.enqueued_per_second),
            _rate(q.finished_per_second),
        )
    if not frame.queues:
        queues.add_row(Text("no jobs", style="dim"), *[""] * 9)

    running = Table(title="Longest running", title_justify="left", box=box.SIMPLE_HEAD)
    running.add_column("id", justify="right")
    running.add_column("queue", overflow="fold")
    running.add_column("type", overflow="fold")
    running.add_column("running for", justify="right")
    running.add_column("heartbeat", justify="right")
    for r in frame.longest_running:
        running.add_row(
            str(r.id),
            r.queue,
            r.job_type,
            seconds_text(r.running_for),
            f"{seconds_text(r.heard_from)} ago",
        )
    if not frame.longest_running:
        running.add_row("", Text("none", style="dim"), "", "", "")

    dead = Table(title="Latest dead", title_justify="left", box=box.SIMPLE_HEAD)
    dead.add_column("id", justify="right")
    dead.add_column("queue", overflow="fold")
    dead.add_column("type", overflow="fold")
    dead.add_column("died", justify="right")
    dead.add_column("last error", overflow="ellipsis", no_wrap=True, ratio=1)
    for d in frame.latest_dead:
        ago = seconds_text(max((frame.at - d.died_at).total_seconds(), 0.0))
        dead.add_row(str(d.id), d.queue, d.job_type, f"{ago} ago", d.error or "")
    if not frame.latest_dead:
        dead.add_row("", Text("none", style="dim"), "", "", "")

    return Group(Text(heading, style="bold"), queues, running, dead)


async def run(args: argparse.Namespace) -> int:
    """``pgqueue top``: frames until Ctrl-C (or one with ``--once``)."""
    interval: float = args.interval
    if not (interval > 0 and math.isfinite(interval)):
        msg = f"--interval must be more than 0 seconds, not {interval:g}"
        raise UsageError(msg)
    queue: str | None = args.queue
    if queue is not None:
        try:
            check_queue_name(queue)
        except ValueError as exc:
            msg = f"--queue: {exc}"
            raise UsageError(msg) from exc
    console = None if args.json else rich_console()
    async with connect(args) as conn:
        await check_schema(conn)
        sampler = Sampler(conn, queue=queue)
        try:
            if args.once:
                _show(console, await sampler.frame(), None)
                return EXIT_OK
            async with anyio.create_task_group() as tasks:
                await tasks.start(_until_signal, tasks.cancel_scope)
                await _frames(sampler, console, interval, dsn_of(args))
        except _FAILURES as exc:
            print(f"pgqueue: top: {describe(exc)}", file=sys.stderr)
            return EXIT_ERROR
    return EXIT_OK


def _show(console: Any, frame: Frame, interval: float | None) -> None:
    """One frame on stdout: JSON on one line, or the tables."""
    if console is None:
        print_json(frame.to_json())
    else:
        console.print(render(frame, interval=interval, width=console.width))
    sys.stdout.flush()


async def _until_signal(
    scope: anyio.CancelScope, *, task_status: TaskStatus[None] = TASK_STATUS_IGNORED
) -> None:
    """Cancel ``scope`` on the first SIGINT or SIGTERM: a clean exit, code 0."""
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for _ in signals:
            scope.cancel()
            return


async def _frames(
    sampler: Sampler, console: Any, interval: float, dsn: str | None
) -> None:
    """Redraw every ``interval`` seconds (in place on a terminal) until cancelled.

    A lost connection does not end the dashboard: it says so and connects
    again on each following tick; the rates carry on from the frames before.
    """
    live = None
    if console is not None and console.is_terminal:
        from rich.live import Live

        # The alternate screen, as top(1) does: the dashboard owns the
        # terminal while it runs and the shell's screen comes back after.
        live = Live(console=console, screen=True, auto_refresh=False)
    with contextlib.ExitStack() as owned:
        if live is not None:
            owned.enter_context(live)
        last: Frame | None = None
        lost: str | None = None
        while True:
            deadline = anyio.current_time() + interval
            try:
                if lost is not None:
                    fresh = await asyncpg.connect(dsn, timeout=max(interval, 5.0))
                    # A replacement is dropped, not closed, on the way out:
                    # the way out is a cancellation, and it holds no writes.
                    owned.callback(fresh.terminate)
                    sampler.use(fresh)
                last, lost = await sampler.frame(), None
            except DATABASE_ERRORS as exc:
                lost = f"database unreachable ({describe(exc)}); connecting again"
            if live is None:
                if lost is not None:
                    print(f"pgqueue: top: {lost}", file=sys.stderr)
                elif last is not None:
                    _show(console, last, interval)
            else:
                live.update(_screen(last, lost, interval, console.width), refresh=True)
            await anyio.sleep_until(deadline)


def _screen(
    frame: Frame | None, lost: str | None, interval: float, width: int
) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    parts: list[RenderableType] = []
    if lost is not None:
        parts.append(Text(lost, style="bold red"))
    if frame is not None:
        parts.append(render(frame, interval=interval, width=width))
    return Group(*parts)
