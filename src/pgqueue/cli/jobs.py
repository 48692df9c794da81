"""The data commands: ``stats``, ``jobs``, ``retry``, ``cancel``, ``prune``, ``enqueue``, ``listen``.

Each is a thin layer over `pgqueue.Admin` (or `pgqueue.Queue` and asyncpg's
listener) on one connection. Every command that prints data takes
``--json``: one JSON document (``listen``: one per line) with stable keys.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
from datetime import datetime
from typing import TYPE_CHECKING, TypeVar

import anyio

from pgqueue import (
    Admin,
    JobDependencies,
    JobInfo,
    QueueStats,
    RelatedJob,
    Status,
)
from pgqueue._extension import (
    JOB_STATUSES,
    QUEUE_COUNTS,
    check_channel,
    first_line,
    queue_on,
    seconds_text,
)
from pgqueue.cli._common import (
    EXIT_ERROR,
    EXIT_OK,
    UsageError,
    add_json_flag,
    add_read_dsn,
    connect,
    delay,
    duration,
    job_id,
    positive_int,
    print_json,
    print_table,
    printable,
    reports_database_errors,
    rich_console,
)
from pgqueue.cli._durable import DURABLE_FIELDS, durable_rows, print_durable_tables
from pgqueue.cli.bulk import (
    add_actions,
    add_bulk_flags,
    add_redrive,
    add_reset_steps,
    add_where,
    filter_of,
    run_bulk,
)
from pgqueue.cli.trend import positive_duration, print_trend

if TYPE_CHECKING:
    import argparse
    from collections.abc import Awaitable

    from pgqueue.cli._common import Commands

__all__ = ["add_to"]

_ERROR_WIDTH = 60

T = TypeVar("T")


def add_to(commands: Commands) -> None:
    """Add the data commands."""
    _add_stats(commands)
    _add_jobs(commands)
    _add_retry(commands)
    add_redrive(commands)
    _add_cancel(commands)
    _add_pause(commands)
    _add_prune(commands)
    _add_enqueue(commands)
    _add_listen(commands)


# --- stats -----------------------------------------------------------------------------


def _add_stats(commands: Commands) -> None:
    parser = commands.add_parser(
        "stats",
        help="per-queue counts, lag and the longest running job",
        description=(
            "Count each queue's jobs: waiting (for their parents), ready, scheduled, running, completed (an "
            "estimate on a big table, marked ~), dead and cancelled; the lag (how "
            "long the oldest ready job has waited), the longest running job and, "
            "for a queue with a fleet-wide limit, the slots its workers lease. "
            "A paused queue is marked (paused). With --since: the trend instead, "
            "per queue and job type over that window (attempts completed, failed "
            "and dead, mean and 95th percentile run time), as pgqueue's workers "
            "recorded it."
        ),
    )
    parser.add_argument("--queue", help="only this queue")
    parser.add_argument(
        "--since",
        type=positive_duration,
        help="the trend over this window instead (e.g. 1h, 1d)",
    )
    parser.add_argument(
        "--type", dest="job_type", help="with --since: only this job type"
    )
    add_read_dsn(parser)
    add_json_flag(parser)
    parser.set_defaults(run=reports_database_errors(stats))


async def stats(args: argparse.Namespace) -> int:
    """Print each queue's stats (with ``--since``, the trend)."""
    if args.since is not None:
        return await _checked(print_trend(args))
    if args.job_type is not None:
        raise UsageError("--type goes with --since")
    async with connect(args, read=True) as connection:
        found = await _checked(Admin(connection).stats(args.queue))
    if args.json:
        print_json([s.to_json() for s in found])
        return EXIT_OK
    _print_stats(found)
    return EXIT_OK


def _print_stats(found: list[QueueStats]) -> None:
    columns = ("queue", *QUEUE_COUNTS, "lag", "longest running", "slots")
    rows = [
        (
            f"{s.queue} (paused)" if s.paused else s.queue,
            str(s.waiting),
            str(s.ready),
            str(s.scheduled),
            str(s.running),
            str(s.parked),
            f"~{s.completed}" if s.completed_estimated else str(s.completed),
            str(s.dead),
            str(s.cancelled),
            seconds_text(s.lag),
            seconds_text(s.longest_running),
            "-" if s.global_limit is None else f"{s.slots_in_use}/{s.global_limit}",
        )
        for s in found
    ]
    print_table(columns, rows, empty="no jobs", right=columns[1:])


# --- jobs list / show ------------------------------------------------------------------


def _add_jobs(commands: Commands) -> None:
    parser = commands.add_parser(
        "jobs", help="list jobs or show one", description="List jobs or show one."
    )
    actions = parser.add_subparsers(title="actions", metavar="ACTION")
    actions.required = True

    listing = actions.add_parser(
        "list",
        help="list jobs, newest first",
        description=(
            "List jobs, newest (highest id) first. Page with --before-id: pass "
            "the last id of a page to get the next one."
        ),
    )
    listing.add_argument(
        "--status",
        choices=JOB_STATUSES,
        help="only jobs in this state (ready: pending and due; scheduled: not yet due)",
    )
    listing.add_argument("--queue", help="only this queue's jobs")
    listing.add_argument("--type", dest="job_type", help="only jobs of this type")
    listing.add_argument(
        "--limit", type=positive_int, default=50, help="at most this many (default 50)"
    )
    listing.add_argument(
        "--before-id", type=job_id, help="only jobs with a smaller id (the next page)"
    )
    add_where(listing)
    add_read_dsn(listing)
    add_json_flag(listing)
    listing.set_defaults(run=reports_database_errors(list_jobs))

    show = actions.add_parser(
        "show",
        help="show one job",
        description=(
            "Show one job, payload and result, and its parents and children "
            "(the first 50 of each, with their statuses; --json: under "
            '"dependencies"). A durable handler\'s job also shows what it '
            "waits for, its progress, and its steps and signals received (the "
            "first 200 of each: name, when, size)."
        ),
    )
    show.add_argument("id", type=job_id, help="the job's id")
    add_read_dsn(show)
    add_json_flag(show)
    show.set_defaults(run=reports_database_errors(show_job))
    add_actions(actions)


async def list_jobs(args: argparse.Namespace) -> int:
    """Print a page of jobs."""
    where = filter_of(args)
    async with connect(args, read=True) as connection:
        found = await _checked(
            Admin(connection).jobs(
                queue=args.queue,
                status=args.status,
                job_type=args.job_type,
                limit=args.limit,
                before_id=args.before_id,
                filter=where,
            )
        )
    if args.json:
        print_json([job.to_json() for job in found])
        return EXIT_OK
    rows = [
        (
            str(job.id),
            job.queue,
            job.job_type,
            job.status,
            f"{job.attempts}/{job.max_attempts}",
            _time(job.run_at),
            # A completed job's last_error is an earlier attempt's, not its own.
            "-" if job.status == Status.COMPLETED else _first_line(job.last_error),
        )
        for job in found
    ]
    print_table(
        ("id", "queue", "type", "status", "attempts", "run_at", "last error"),
        rows,
        empty="no jobs",
        right=("id",),
    )
    return EXIT_OK


async def show_job(args: argparse.Namespace) -> int:
    """Print one job; exit 1 if there is none."""
    async with connect(args, read=True) as connection:
        admin = Admin(connection)
        job = await _checked(admin.job(args.id))
        if job is None:
            print(f"pgqueue: no job has id {args.id}", file=sys.stderr)
            return EXIT_ERROR
        dependencies = await _checked(admin.dependencies(args.id))
    if args.json:
        print_json({**job.to_json(), "dependencies": dependencies.to_json()})
        return EXIT_OK
    _print_job(job, dependencies)
    return EXIT_OK


def _related(related: tuple[RelatedJob, ...], total: int) -> str:
    """``12 (completed), 13 (waiting)``, and how many more there are; ``-`` for none."""
    if not total:
        return "-"
    text = ", ".join(f"{r.id} ({r.status or 'deleted'})" for r in related)
    if total > len(related):
        text += f", and {total - len(related)} more"
    return text


def _print_job(job: JobInfo, dependencies: JobDependencies) -> None:
    from rich.table import Table
    from rich.text import Text

    console = rich_console()
    table = Table(box=None, pad_edge=False, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for name, value in job.to_json().items():
        if name in ("errors", "snoozed") or name in DURABLE_FIELDS:
            continue  # tables of their own, below
        if name in ("payload", "result"):
            text = printable(
                json.dumps(value, indent=2, ensure_ascii=False), newlines=True
            )
        else:
            text = "-" if value is None else printable(str(value), newlines=True)
        label = name
        if (
            name == "last_error"
            and job.status == Status.COMPLETED
            and value is not None
        ):
            label = "earlier attempt's error"
        table.add_row(label, Text(text))
    for label, text in durable_rows(job):
        table.add_row(label, Text(text))
    table.add_row(
        "parents", Text(_related(dependencies.parents, dependencies.parents_total))
    )
    table.add_row(
        "children",
        Text(_related(dependencies.children, dependencies.children_total)),
    )
    console.print(table, markup=False, highlight=False)
    if job.errors:
        errors = Table(title="failed attempts, oldest first", title_justify="left")
        for column in ("attempt", "at", "error"):
            errors.add_column(column)
        for failed in job.errors:
            errors.add_row(
                _number(failed.attempt),
                _time(failed.at),
                Text(printable(failed.error or "-", newlines=True)),
            )
        console.print(errors, markup=False, highlight=False)
    if job.snoozed:
        snoozed = Table(title="snoozes, oldest first", title_justify="left")
        for column in ("attempt", "at", "delay (s)"):
            snoozed.add_column(column)
        for snooze in job.snoozed:
            snoozed.add_row(
                _number(snooze.attempt), _time(snooze.at), _number(snooze.delay)
            )
        console.print(snoozed, markup=False, highlight=False)
    print_durable_tables(console, job)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _time(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(timespec="seconds")


def _first_line(text: str | None) -> str:
    line = first_line(text) or ""
    return line if len(line) <= _ERROR_WIDTH else line[: _ERROR_WIDTH - 1] + "…"


# --- retry / cancel --------------------------------------------------------------------


def _add_retry(commands: Commands) -> None:
    parser = commands.add_parser(
        "retry",
        help="put dead or cancelled jobs back in line",
        description=(
            "Put dead or cancelled jobs back to pending, due now, with as many "
            "more attempts as their max_attempts (or --attempts). Their attempts "
            "are never reset. A job whose unique key is held by a live job is "
            "skipped (duplicate); each id left alone is printed with why. Exit 1 "
            "if an id has no job or none of the ids was retried."
        ),
    )
    parser.add_argument("ids", nargs="*", type=job_id, metavar="ID", help="job ids")
    parser.add_argument(
        "--all-dead",
        action="store_true",
        help="every dead job (of --queue and --type, if given)",
    )
    parser.add_argument("--queue", help="with --all-dead: only this queue")
    parser.add_argument("--type", dest="job_type", help="with --all-dead: this type")
    parser.add_argument(
        "--attempts",
        type=positive_int,
        help="more attempts each job gets (default: its max_attempts)",
    )
    add_reset_steps(parser)
    add_where(parser)
    add_bulk_flags(parser)
    add_json_flag(parser)
    parser.set_defaults(run=reports_database_errors(retry))


async def retry(args: argparse.Namespace) -> int:
    """Retry the given jobs, every dead one, or the dead and cancelled ones ``--where`` matches."""
    if [args.all_dead, bool(args.ids), bool(args.where)].count(True) != 1:
        msg = "retry takes job ids, --all-dead or --where (one of them)"
        raise UsageError(msg)
    if not args.all_dead and (args.queue is not None or args.job_type is not None):
        msg = "--queue and --type go with --all-dead"
        raise UsageError(msg)
    _bulk_flags_need_where(args)
    if args.where:
        return await run_bulk(
            args,
            "retry",
            lambda admin, bulk: admin.retry(
                **bulk, attempts=args.attempts, reset_steps=args.reset_steps
            ),
        )
    async with connect(args) as connection:
        admin = Admin(connection)
        if args.all_dead:
            done = await _checked(
                admin.retry_all(
                    queue=args.queue,
                    job_type=args.job_type,
                    attempts=args.attempts,
                    reset_steps=args.reset_steps,
                )
            )
        else:
            done = await _checked(
                admin.retry(
                    *args.ids, attempts=args.attempts, reset_steps=args.reset_steps
                )
            )
        reasons = await _reasons(admin, done, "retry")
    return _print_results(done, reasons, as_json=args.json)


def _add_cancel(commands: Commands) -> None:
    parser = commands.add_parser(
        "cancel",
        help="cancel jobs",
        description=(
            "Cancel jobs: a pending one at once (cancelled), a running one by "
            "request to its worker (requested); a finished one is left alone "
            "(finished), printed with why. Exit 1 if an id has no job or none "
            "of the ids was cancelled."
        ),
    )
    parser.add_argument("ids", nargs="*", type=job_id, metavar="ID", help="job ids")
    add_where(parser)
    add_bulk_flags(parser)
    add_json_flag(parser)
    parser.set_defaults(run=reports_database_errors(cancel))


async def cancel(args: argparse.Namespace) -> int:
    """Cancel the given jobs, or the pending, waiting and running ones ``--where`` matches."""
    if bool(args.ids) == bool(args.where):
        msg = "cancel takes job ids or --where (one of them)"
        raise UsageError(msg)
    _bulk_flags_need_where(args)
    if args.where:
        return await run_bulk(
            args,
            "cancel",
            lambda admin, bulk: admin.cancel(**bulk),
        )
    async with connect(args) as connection:
        admin = Admin(connection)
        done = await _checked(admin.cancel(*args.ids))
        reasons = await _reasons(admin, done, "cancel")
    return _print_results(done, reasons, as_json=args.json)


def _bulk_flags_need_where(args: argparse.Namespace) -> None:
    if not args.where and (
        args.dry_run or args.limit is not None or args.rate is not None
    ):
        msg = "--dry-run, --limit and --rate go with --where"
        raise UsageError(msg)


_DONE = frozenset({"retried", "cancelled", "requested"})  # not a status: results
"""The results of ``retry`` and ``cancel`` that changed the job."""

_CAN = {
    "retry": "only dead and cancelled jobs are retried",
    "cancel": "only pending, waiting and running jobs are cancelled",
}


async def _reasons(admin: Admin, done: dict[int, str], action: str) -> dict[int, str]:
    """Why each id that was left alone was: its job's status, read after the refusal."""
    reasons = {}
    for key, result in done.items():
        if result in _DONE:
            continue
        if result == "not_found":
            reasons[key] = "no job has this id (never enqueued, or pruned)"
        elif result == "duplicate":
            reasons[key] = (
                "another job of its type and unique key is pending or running"
            )
        else:
            summary = await admin.job_summary(key)
            status = "gone" if summary is None else summary.status
            reasons[key] = f"it is {status}: {_CAN[action]}"
    return reasons


def _print_results(
    done: dict[int, str], reasons: dict[int, str], *, as_json: bool
) -> int:
    """Print what became of each id and why one was left alone; the exit code.

    JSON: ``[{"id", "result", "reason"}]`` (``reason`` null for a job
    changed). Exit 1 if an id has no job, or if ids were given and none
    was changed (``--all-dead`` finding none is not a failure).
    """
    if as_json:
        print_json(
            [
                {"id": key, "result": result, "reason": reasons.get(key)}
                for key, result in done.items()
            ]
        )
    else:
        for key, result in done.items():
            why = reasons.get(key)
            print(f"{key}\t{result}" if why is None else f"{key}\t{result}: {why}")
        if not done:
            print("no jobs")
    acted = any(result in _DONE for result in done.values())
    refused = bool(done) and not acted
    return EXIT_ERROR if "not_found" in done.values() or refused else EXIT_OK


# --- pause / resume --------------------------------------------------------------------


def _add_pause(commands: Commands) -> None:
    pause = commands.add_parser(
        "pause",
        help="pause a queue: no worker starts another of its jobs",
        description=(
            "Pause a queue across the fleet: claims that begin after this take "
            "nothing from it (running jobs finish; jobs are still enqueued), until "
            "'pgqueue resume'. The state is in the database, for workers started "
            "later too. Go workers do not know of it."
        ),
    )
    pause.add_argument("queue", metavar="QUEUE", help="the queue to pause")
    add_json_flag(pause)
    pause.set_defaults(run=reports_database_errors(pause_queue))
    resume = commands.add_parser(
        "resume",
        help="resume a paused queue and wake its workers",
        description="Resume a paused queue; its workers are woken at once.",
    )
    resume.add_argument("queue", metavar="QUEUE", help="the queue to resume")
    add_json_flag(resume)
    resume.set_defaults(run=reports_database_errors(resume_queue))


async def pause_queue(args: argparse.Namespace) -> int:
    """Pause a queue."""
    async with connect(args) as connection:
        changed = await _checked(Admin(connection).pause(args.queue))
    return _print_pause(args, "paused" if changed else "already paused")


async def resume_queue(args: argparse.Namespace) -> int:
    """Resume a queue."""
    async with connect(args) as connection:
        changed = await _checked(Admin(connection).resume(args.queue))
    return _print_pause(args, "resumed" if changed else "not paused")


def _print_pause(args: argparse.Namespace, result: str) -> int:
    if args.json:
        print_json({"queue": args.queue, "result": result})
    else:
        print(f"queue {printable(repr(args.queue))} {result}")
    return EXIT_OK


# --- prune -----------------------------------------------------------------------------


def _add_prune(commands: Commands) -> None:
    parser = commands.add_parser(
        "prune",
        help="delete old completed, dead and cancelled jobs",
        description=(
            "Delete completed, dead and cancelled jobs last updated longer ago "
            "than --older-than, in short batches (never a long lock)."
        ),
    )
    parser.add_argument(
        "--older-than",
        type=duration,
        required=True,
        metavar="DURATION",
        help="e.g. 90s, 15m, 12h, 7d, 1h30m, or seconds",
    )
    parser.add_argument("--queue", help="only this queue")
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        default=10_000,
        help="rows per batch (default 10000)",
    )
    add_json_flag(parser)
    parser.set_defaults(run=reports_database_errors(prune))


async def prune(args: argparse.Namespace) -> int:
    """Delete old finished jobs."""
    async with connect(args) as connection:
        deleted = await _checked(
            Admin(connection).prune(
                args.older_than, queue=args.queue, batch_size=args.batch_size
            )
        )
    if args.json:
        print_json({"deleted": deleted})
    else:
        print(f"deleted {deleted} jobs")
    return EXIT_OK


# --- enqueue ---------------------------------------------------------------------------


def _add_enqueue(commands: Commands) -> None:
    parser = commands.add_parser(
        "enqueue",
        help="enqueue a job",
        description="Enqueue a job and print its id.",
    )
    parser.add_argument("job_type", metavar="TYPE", help="the job's type")
    parser.add_argument("payload", metavar="JSON", help="the payload, as JSON text")
    parser.add_argument(
        "--queue", default="default", help="the queue (default: default)"
    )
    when = parser.add_mutually_exclusive_group()
    when.add_argument(
        "--run-at",
        metavar="ISO8601",
        help="not before this time, with its offset (e.g. 2026-12-03T10:00:00+00:00)",
    )
    when.add_argument(
        "--in",
        dest="delay",
        type=delay,
        metavar="DURATION",
        help="not before this long from the database's now: 30s, 10m, 2h, 1d, 1h30m or seconds",
    )
    parser.add_argument("--priority", type=int, default=0, help="from -5 to 5")
    parser.add_argument(
        "--unique-key",
        help="while a job of this type and key is pending or running, print its id instead",
    )
    parser.add_argument(
        "--replace",
        action="store_true",
        help=(
            "with --unique-key: give the key's pending job this payload and these "
            "options (or, if it has started, run this job after it); print the "
            "id of the job that runs with this payload"
        ),
    )
    parser.add_argument(
        "--debounce",
        type=delay,
        metavar="DURATION",
        help=(
            "with --unique-key: run once, this long after the last enqueue of "
            "the key, with the last payload (--replace with --in)"
        ),
    )
    parser.add_argument(
        "--max-attempts", type=int, default=5, help="attempts before it is dead (5)"
    )
    add_json_flag(parser)
    parser.set_defaults(run=reports_database_errors(enqueue))


async def enqueue(args: argparse.Namespace) -> int:
    """Enqueue one job."""
    try:
        json.loads(args.payload)
    except ValueError as exc:
        msg = f"the payload is not valid JSON: {exc}"
        raise UsageError(msg) from exc
    run_at = None
    if args.run_at is not None:
        try:
            run_at = datetime.fromisoformat(args.run_at)
        except ValueError as exc:
            msg = f"--run-at is not an ISO 8601 time: {args.run_at!r}"
            raise UsageError(msg) from exc
        if run_at.tzinfo is None:
            msg = f"--run-at needs a UTC offset (e.g. +00:00 or Z): {args.run_at!r}"
            raise UsageError(msg)
    payload = args.payload.encode("utf-8", "surrogateescape")
    async with connect(args) as connection:
        try:
            queue = queue_on(connection, args.queue, args.max_attempts)
            new_id = await queue.enqueue(
                args.job_type,
                payload,
                run_at=run_at,
                delay=args.delay,
                priority=args.priority,
                unique_key=args.unique_key,
                on_conflict="replace" if args.replace else "return",
                debounce=args.debounce,
            )
        except (TypeError, ValueError) as exc:
            raise UsageError(str(exc)) from exc
    if args.json:
        print_json({"id": new_id})
    else:
        print(new_id)
    return EXIT_OK


# --- listen ----------------------------------------------------------------------------


def _add_listen(commands: Commands) -> None:
    parser = commands.add_parser(
        "listen",
        help="print notifications as they arrive",
        description=(
            "LISTEN on channels and print each notification as a line "
            "(CHANNEL<TAB>PAYLOAD, control characters and line feeds shown "
            "escaped as \\n, \\x1b..., or an exact JSON object with --json) until "
            "interrupted (SIGINT or SIGTERM: exit 0), or until --count of them."
        ),
    )
    parser.add_argument("channels", nargs="+", metavar="CHANNEL", help="channels")
    parser.add_argument(
        "--count", type=positive_int, help="exit after this many notifications"
    )
    add_json_flag(parser)
    parser.set_defaults(run=reports_database_errors(listen))


async def listen(args: argparse.Namespace) -> int:
    """Print notifications until a signal or ``--count``."""
    try:
        channels = list(dict.fromkeys(check_channel(c) for c in args.channels))
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
    send, receive = anyio.create_memory_object_stream[tuple[str, str, int]](
        max_buffer_size=1000
    )

    def arrived(_connection: object, pid: int, channel: str, payload: object) -> None:
        # A terminal that cannot keep up loses notifications, as LISTEN may.
        with contextlib.suppress(anyio.WouldBlock):
            send.send_nowait((channel, str(payload), pid))

    seen = 0
    async with connect(args) as connection, anyio.create_task_group() as tasks:
        for channel in channels:
            await connection.add_listener(channel, arrived)
        tasks.start_soon(_stop_on_signal, tasks.cancel_scope)
        shown = ", ".join(printable(channel) for channel in channels)
        print(f"listening on {shown}", file=sys.stderr, flush=True)
        async for channel, payload, pid in receive:
            if args.json:
                print_json({"channel": channel, "payload": payload, "pid": pid})
            else:
                print(f"{printable(channel)}\t{printable(payload)}")
            sys.stdout.flush()
            seen += 1
            if args.count is not None and seen >= args.count:
                tasks.cancel_scope.cancel()
                break
    return EXIT_OK


async def _stop_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            scope.cancel()
            return


async def _checked(call: Awaitable[T]) -> T:
    """Await an Admin call; its refusal of an argument is a usage error (exit 2)."""
    try:
        return await call
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from exc
