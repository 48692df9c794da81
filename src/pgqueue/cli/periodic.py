"""``pgqueue periodic list`` and ``pgqueue periodic remove NAME``: the periodic schedules.

A thin layer over `pgqueue.Admin.schedules` and `pgqueue.Admin.remove_schedule`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from pgqueue import Admin
from pgqueue.cli._common import (
    EXIT_ERROR,
    EXIT_OK,
    UsageError,
    add_json_flag,
    connect,
    print_json,
    print_table,
    printable,
    reports_database_errors,
)

if TYPE_CHECKING:
    import argparse
    from datetime import datetime

    from pgqueue.cli._common import Commands

__all__ = ["add_to"]


def add_to(commands: Commands) -> None:
    """Add ``periodic list`` and ``periodic remove``."""
    parser = commands.add_parser(
        "periodic",
        help="list or remove periodic schedules",
        description="List or remove the periodic schedules workers registered.",
    )
    actions = parser.add_subparsers(title="actions", metavar="ACTION")
    actions.required = True

    listing = actions.add_parser(
        "list",
        help="list the schedules",
        description=(
            "List the schedules: name, expression, last tick run, next tick (as "
            "the worker that last ran the schedule computed it), queue, job type."
        ),
    )
    add_json_flag(listing)
    listing.set_defaults(run=reports_database_errors(list_schedules))

    remove = actions.add_parser(
        "remove",
        help="forget a schedule",
        description=(
            "Delete a schedule's row (its jobs stay); exit 1 if there is none. "
            "A worker that still registers the schedule makes it again at its "
            "next tick: take it out of the workers' code first."
        ),
    )
    remove.add_argument("name", help="the schedule's name")
    remove.set_defaults(run=reports_database_errors(remove_schedule))


async def list_schedules(args: argparse.Namespace) -> int:
    """Print every schedule."""
    async with connect(args) as connection:
        found = await Admin(connection).schedules()
    if args.json:
        print_json([schedule.to_json() for schedule in found])
        return EXIT_OK
    rows = [
        (
            schedule.name,
            schedule.schedule
            if schedule.timezone == "UTC"
            else f"{schedule.schedule} ({schedule.timezone})",
            _time(schedule.last_tick),
            _time(schedule.next_tick),
            schedule.queue,
            schedule.job_type,
        )
        for schedule in found
    ]
    print_table(
        ("name", "schedule", "last tick", "next tick", "queue", "type"),
        rows,
        empty="no schedules",
    )
    return EXIT_OK


async def remove_schedule(args: argparse.Namespace) -> int:
    """Delete one schedule's row; exit 1 if there is none."""
    async with connect(args) as connection:
        try:
            removed = await Admin(connection).remove_schedule(args.name)
        except (TypeError, ValueError) as exc:
            raise UsageError(str(exc)) from exc
    if not removed:
        print(f"pgqueue: no schedule is named {args.name!r}", file=sys.stderr)
        return EXIT_ERROR
    print(f"removed {printable(args.name)}")
    return EXIT_OK


def _time(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(sep=" ", timespec="seconds")
