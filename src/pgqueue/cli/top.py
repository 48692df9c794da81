"""``pgqueue top``: a live terminal dashboard of every queue (read-only).

What a frame holds and how its rates are computed: `pgqueue._dashboard`
(the web dashboard, `pgqueue.web`, reads the same frames).
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
from anyio import TASK_STATUS_IGNORED

from pgqueue import Status
from pgqueue._extension import (
    DATABASE_ERRORS,
    QUEUE_COUNTS,
    QUEUES_SHOWN,
    SHOWN_NAME_CHARS,
    Frame,
    Sampler,
    check_queue_name,
    check_schema,
    describe,
    seconds_text,
    shown_name,
)
from pgqueue.cli._common import (
    EXIT_ERROR,
    EXIT_OK,
    Commands,
    UsageError,
    add_read_dsn,
    connect,
    duration,
    place,
    positive_int,
    print_json,
    printable,
    read_dsn_of,
    rich_console,
)

if TYPE_CHECKING:
    import argparse

    from anyio.abc import TaskStatus
    from rich.console import RenderableType
    from rich.table import Table

__all__ = ["Frame", "Sampler", "add_to", "render"]

_FAILURES: tuple[type[Exception], ...] = (*DATABASE_ERRORS, asyncpg.PostgresError)
"""What ends the dashboard with exit code 1 and one line on stderr."""

NARROW = 100
"""Below this many columns, the queues table packs its columns closer."""


def add_to(commands: Commands) -> None:
    """Add ``pgqueue top``."""
    parser = commands.add_parser(
        "top",
        help="a live dashboard of the queues (read-only)",
        description=(
            "A live dashboard: per queue the jobs ready, scheduled, running, "
            "completed (~ marks an estimate), dead and cancelled (and waiting for "
            "their parents, while any are), the lag (age of "
            "the oldest ready job), jobs enqueued and finished per second (from "
            "the second frame on), the longest-running jobs and the latest dead "
            f"jobs. The {QUEUES_SHOWN} queues with the most jobs to do are shown "
            "(--limit), and how many more there are; names are cut at "
            f"{SHOWN_NAME_CHARS} characters. Read-only. Ctrl-C quits."
        ),
    )
    parser.add_argument(
        "--interval",
        type=duration,
        default=2.0,
        metavar="DURATION",
        help="time between frames, e.g. 2s, 0.5 or 1m (default: 2 seconds)",
    )
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("--queue", help="show only this queue")
    parser.add_argument(
        "--match",
        metavar="TEXT",
        help="show only the queues whose name holds TEXT",
    )
    parser.add_argument(
        "--limit",
        type=positive_int,
        default=QUEUES_SHOWN,
        metavar="N",
        help=(
            "show at most N queues, those with the most jobs to do "
            f"(default: {QUEUES_SHOWN})"
        ),
    )
    parser.add_argument(
        "--hide-payloads",
        action="store_true",
        help="show no progress or checkpoints of running jobs (they may hold personal data)",
    )
    add_read_dsn(parser)
    parser.add_argument(
        "--json",
        action="store_true",
        help="print each frame's data as one JSON document a line",
    )
    parser.set_defaults(run=run)


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}"


def render(
    frame: Frame, *, interval: float | None = None, width: int = 120
) -> RenderableType:
    """The frame as rich tables: queues, longest running, latest dead.

    Every value from the database is plain text (never markup), `printable`;
    names are cut at `SHOWN_NAME_CHARS` characters (`shown_name`).
    """
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def shown(value: str | None) -> Text:
        return Text(printable(value or ""))

    def named(value: str) -> Text:
        return Text(shown_name(value))

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
    # The waiting column only while some queue has jobs waiting for
    # parents: without it, the table fits 80 columns.
    waiting = any(q.waiting for q in frame.queues)
    parked = any(q.parked for q in frame.queues)  # alike: durable handlers' waits
    queues.add_column("queue", overflow="fold")
    for name in QUEUE_COUNTS:
        if (waiting or name != Status.WAITING) and (parked or name != Status.PARKED):
            queues.add_column(name, justify="right")
    queues.add_column("lag", justify="right")
    queues.add_column("enq/s", justify="right")
    queues.add_column("done/s", justify="right")
    for q in frame.queues:
        queues.add_row(
            named(q.queue) + Text(" paused", style="bold yellow")
            if q.paused
            else named(q.queue),
            *([str(q.waiting)] if waiting else []),
            str(q.ready),
            str(q.scheduled),
            str(q.running),
            *([str(q.parked)] if parked else []),
            f"~{q.completed}" if q.completed_estimated else str(q.completed),
            Text(str(q.dead), style="bold red" if q.dead else ""),
            str(q.cancelled),
            seconds_text(q.lag),
            _rate(q.enqueued_per_second),
            _rate(q.finished_per_second),
        )
    if not frame.queues:
        queues.add_row(Text("no jobs", style="dim"), *[""] * 9)
    if frame.more_queues:
        queues.caption = (
            f"and {frame.more_queues} more (--match TEXT or --queue NAME to see them)"
        )
        queues.caption_justify = "left"

    running = _jobs_table("Longest running")
    running.add_column("running for", justify="right")
    running.add_column("heartbeat", justify="right")
    running.add_column("progress", overflow="ellipsis", no_wrap=True, ratio=1)
    for r in frame.longest_running:
        running.add_row(
            str(r.id),
            named(r.queue),
            named(r.job_type),
            seconds_text(r.running_for),
            f"{seconds_text(r.heard_from)} ago",
            shown(r.progress),
        )
    if not frame.longest_running:
        running.add_row("", Text("none", style="dim"), "", "", "", "")

    dead = _jobs_table("Latest dead")
    dead.add_column("died", justify="right")
    dead.add_column("last error", overflow="ellipsis", no_wrap=True, ratio=1)
    for d in frame.latest_dead:
        ago = seconds_text(max((frame.at - d.died_at).total_seconds(), 0.0))
        dead.add_row(
            str(d.id), named(d.queue), named(d.job_type), f"{ago} ago", shown(d.error)
        )
    if not frame.latest_dead:
        dead.add_row("", Text("none", style="dim"), "", "", "")

    return Group(Text(heading, style="bold"), queues, running, dead)


def _jobs_table(title: str) -> Table:
    """A table of jobs, its first columns their id, queue and type."""
    from rich import box
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("id", justify="right")
    table.add_column("queue", overflow="fold")
    table.add_column("type", overflow="fold")
    return table


async def run(args: argparse.Namespace) -> int:
    """``pgqueue top``: frames until Ctrl-C (or one with ``--once``)."""
    interval: float = args.interval
    if not (interval > 0 and math.isfinite(interval)):
        msg = f"--interval must be more than 0 seconds, not {interval:g}"
        raise UsageError(msg)
    queue: str | None = args.queue
    match: str | None = args.match
    for flag, value in (("--queue", queue), ("--match", match)):
        if value is not None:
            try:
                check_queue_name(value)
            except ValueError as exc:
                msg = f"{flag}: {exc}"
                raise UsageError(msg) from exc
    if queue is not None and match is not None:
        msg = "give --queue or --match, not both"
        raise UsageError(msg)
    console = None if args.json else rich_console()
    async with connect(args, read=True) as conn:
        await check_schema(conn)
        sampler = Sampler(
            conn,
            queue=queue,
            contains=match,
            limit=args.limit,
            progress=not args.hide_payloads,
        )
        try:
            if args.once:
                _show(console, await sampler.frame(), None)
                return EXIT_OK
            async with anyio.create_task_group() as tasks:
                await tasks.start(_until_signal, tasks.cancel_scope)
                await _frames(sampler, console, interval, read_dsn_of(args))
        except _FAILURES as exc:
            print(f"pgqueue: top: {printable(describe(exc))}", file=sys.stderr)
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
    where = place(dsn)
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
                lost = printable(
                    f"database {where} unreachable ({describe(exc)}); connecting again"
                )
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
