"""The filtered commands: ``--where`` on the listings and actions, ``redrive``, ``jobs delete``, ``jobs move``, ``jobs update``.

A filter is ``--where KEY=VALUE``, repeated (`pgqueue.JobFilter.parse`);
every bulk action takes ``--dry-run`` (print how many, change nothing),
``--limit`` and ``--rate`` (jobs a second). Each prints its count, and with
``--json`` one object: ``{"action", "filter", "dry_run", "count"}``, where
``filter`` is the filter's terms as `pgqueue.JobFilter.terms` renders them.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict

from pgqueue import Admin, JobFilter, JobNotFoundError, JobStateError
from pgqueue.cli._common import (
    EXIT_ERROR,
    EXIT_OK,
    UsageError,
    add_json_flag,
    connect,
    job_id,
    positive_int,
    print_json,
    printable,
    reports_database_errors,
)

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from pgqueue.cli._common import Commands

__all__ = [
    "Bulk",
    "add_actions",
    "add_bulk_flags",
    "add_redrive",
    "add_reset_steps",
    "add_where",
    "filter_of",
    "run_bulk",
]

WHERE_HELP = (
    "only jobs matching KEY=VALUE (repeatable; all must match): a field (queue, "
    "job_type, status, group, unique_key, error_contains, created_after, "
    "created_before, due_after, due_before, finished_after, finished_before) or a "
    "path into the payload or result (payload.user_id=42); VALUE is read as JSON, "
    "else as text; times are ISO 8601"
)


def add_where(parser: argparse.ArgumentParser, *, required: bool = False) -> None:
    """Add ``--where TERM`` (repeatable)."""
    parser.add_argument(
        "--where",
        action="append",
        metavar="TERM",
        required=required,
        help=WHERE_HELP,
    )


def add_bulk_flags(parser: argparse.ArgumentParser) -> None:
    """Add ``--dry-run``, ``--limit`` and ``--rate``."""
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print how many jobs would be acted on, and change nothing",
    )
    parser.add_argument(
        "--limit", type=positive_int, help="act on at most this many jobs"
    )
    parser.add_argument(
        "--rate",
        type=_rate,
        metavar="JOBS",
        help="at most this many jobs a second (so the workers are not flooded)",
    )


def _rate(text: str) -> float:
    try:
        rate = float(text)
    except ValueError:
        rate = 0.0
    if not 0 < rate < float("inf"):
        msg = f"not a positive number of jobs a second: {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return rate


def filter_of(args: argparse.Namespace) -> JobFilter | None:
    """The filter of ``--where`` (None without one); a bad term is a usage error."""
    if not args.where:
        return None
    try:
        return JobFilter.parse(args.where)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"--where: {exc}") from exc


class Bulk(TypedDict):
    """The arguments every bulk action of `pgqueue.Admin` takes: the filter and the pace."""

    filter: JobFilter
    limit: int | None
    rate: float | None
    dry_run: bool


async def run_bulk(
    args: argparse.Namespace,
    action: str,
    call: Callable[[Admin, Bulk], Awaitable[int]],
) -> int:
    """Run a bulk action on ``--where``'s filter, at ``--limit``, ``--rate`` and ``--dry-run``; print its count."""
    found = filter_of(args)
    assert found is not None
    bulk = Bulk(filter=found, limit=args.limit, rate=args.rate, dry_run=args.dry_run)
    async with connect(args) as connection:
        try:
            count = await call(Admin(connection), bulk)
        except (TypeError, ValueError) as exc:
            raise UsageError(str(exc)) from exc
    if args.json:
        print_json(
            {
                "action": action,
                "filter": found.terms(),
                "dry_run": args.dry_run,
                "count": count,
            }
        )
    else:
        verb = f"would {action}" if args.dry_run else action
        print(f"{verb}: {count} jobs matching {printable(str(found))}")
    return EXIT_OK


# --- redrive ---------------------------------------------------------------------------


def add_redrive(commands: Commands) -> None:
    """Add ``redrive``."""
    parser = commands.add_parser(
        "redrive",
        help="put the dead and cancelled jobs a filter matches back in line",
        description=(
            "Put the dead and cancelled jobs matching --where back to pending, due "
            "now (as retry does), in their own queue or in --to-queue, whose "
            "workers are woken. In batches, at most --rate jobs a second; run "
            "again after an interruption, it finds the jobs still to do."
        ),
    )
    add_where(parser, required=True)
    parser.add_argument("--to-queue", metavar="QUEUE", help="move them into QUEUE")
    parser.add_argument(
        "--attempts",
        type=positive_int,
        help="more attempts each job gets (default: its max_attempts)",
    )
    add_reset_steps(parser)
    add_bulk_flags(parser)
    add_json_flag(parser)
    parser.set_defaults(run=reports_database_errors(redrive))


def add_reset_steps(parser: argparse.ArgumentParser) -> None:
    """``--reset-steps``, of ``retry`` and ``redrive``."""
    parser.add_argument(
        "--reset-steps",
        action="store_true",
        help=(
            "clear a durable handler's recorded steps, wait and progress: its "
            "next run starts over (by default it replays the steps it recorded)"
        ),
    )


async def redrive(args: argparse.Namespace) -> int:
    """Redrive the jobs ``--where`` matches."""
    return await run_bulk(
        args,
        "redrive",
        lambda admin, bulk: admin.redrive(
            **bulk,
            to_queue=args.to_queue,
            attempts=args.attempts,
            reset_steps=args.reset_steps,
        ),
    )


# --- jobs delete / move / update -------------------------------------------------------


def add_actions(actions: Any) -> None:
    """Add ``jobs delete``, ``jobs move`` and ``jobs update`` to the ``jobs`` command's actions."""
    delete = actions.add_parser(
        "delete",
        help="delete the jobs a filter matches (never running ones)",
        description=(
            "Delete the jobs matching --where, never a running one (nor a parent "
            "whose child has not finished), in batches."
        ),
    )
    add_where(delete, required=True)
    add_bulk_flags(delete)
    add_json_flag(delete)
    delete.set_defaults(run=reports_database_errors(delete_jobs))

    move = actions.add_parser(
        "move",
        help="move the jobs a filter matches to another queue (never running ones)",
        description=(
            "Move the jobs matching --where into --to-queue, never a running one; "
            "its workers are woken. In batches."
        ),
    )
    add_where(move, required=True)
    move.add_argument(
        "--to-queue", metavar="QUEUE", required=True, help="the queue they go to"
    )
    add_bulk_flags(move)
    add_json_flag(move)
    move.set_defaults(run=reports_database_errors(move_jobs))

    update = actions.add_parser(
        "update",
        help="change a job that has not started",
        description=(
            "Change a pending or waiting job: each field given, the others kept. "
            "A job a worker has claimed is refused (exit 1, naming its status)."
        ),
    )
    update.add_argument("id", type=job_id, help="the job's id")
    update.add_argument("--payload", metavar="JSON", help="its new payload")
    update.add_argument("--priority", type=int, help="from -5 to 5")
    update.add_argument(
        "--run-at",
        metavar="ISO8601",
        help="when it is due, with its offset (e.g. 2026-12-03T10:00:00+00:00)",
    )
    update.add_argument("--group", help="its group")
    update.add_argument(
        "--max-attempts", type=positive_int, help="attempts before it is dead"
    )
    add_json_flag(update)
    update.set_defaults(run=reports_database_errors(update_job))


async def delete_jobs(args: argparse.Namespace) -> int:
    """Delete the jobs ``--where`` matches."""
    return await run_bulk(
        args,
        "delete",
        lambda admin, bulk: admin.delete(**bulk),
    )


async def move_jobs(args: argparse.Namespace) -> int:
    """Move the jobs ``--where`` matches."""
    return await run_bulk(
        args,
        "move",
        lambda admin, bulk: admin.move(**bulk, to_queue=args.to_queue),
    )


async def update_job(args: argparse.Namespace) -> int:
    """Change one job; exit 1 if it has no row or has started."""
    fields: dict[str, Any] = {}
    if args.payload is not None:
        try:
            fields["payload"] = json.loads(args.payload)
        except ValueError as exc:
            msg = f"the payload is not valid JSON: {exc}"
            raise UsageError(msg) from exc
    if args.run_at is not None:
        try:
            fields["run_at"] = datetime.fromisoformat(args.run_at)
        except ValueError as exc:
            msg = f"--run-at is not an ISO 8601 time: {args.run_at!r}"
            raise UsageError(msg) from exc
    for name in ("priority", "group", "max_attempts"):
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    async with connect(args) as connection:
        try:
            job = await Admin(connection).update(args.id, **fields)
        except (JobNotFoundError, JobStateError) as exc:
            print(f"pgqueue: {printable(str(exc))}", file=sys.stderr)
            return EXIT_ERROR
        except (TypeError, ValueError) as exc:
            raise UsageError(str(exc)) from exc
    if args.json:
        print_json(job.to_json())
    else:
        print(f"job {job.id} updated ({job.status})")
    return EXIT_OK
