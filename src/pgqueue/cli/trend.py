"""``pgqueue stats --since 1h``: each queue's and job type's trend (`pgqueue.Admin.trend`)."""

from __future__ import annotations

import argparse

from pgqueue import Admin, TrendRow
from pgqueue._extension import run_time_text, seconds_text
from pgqueue.cli._common import EXIT_OK, connect, duration, print_json, print_table

__all__ = ["positive_duration", "print_trend"]

COLUMNS = (
    "queue",
    "type",
    "completed",  # not a status: a heading (attempts that completed)
    "failed",
    "dead",  # not a status: a heading (jobs dead-lettered)
    "mean run",
    "p95 run",
)


async def print_trend(args: argparse.Namespace) -> int:
    """Print the trend rows of ``--since`` (``--queue``, ``--type``); ``--json``: a list of `TrendRow.to_json`."""
    async with connect(args, read=True) as connection:
        rows = await Admin(connection).trend(
            queue=args.queue, job_type=args.job_type, since=args.since
        )
    if args.json:
        print_json([row.to_json() for row in rows])
        return EXIT_OK
    print_table(
        COLUMNS,
        [_cells(row) for row in rows],
        empty=f"no attempts in the last {seconds_text(args.since)}",
        right=COLUMNS[2:],
    )
    return EXIT_OK


def positive_duration(text: str) -> float:
    """An argparse type: a window (``--since``), a duration above zero."""
    seconds = duration(text, "window")
    if seconds <= 0:
        msg = f"not a window: {text!r} (it must be longer than zero)"
        raise argparse.ArgumentTypeError(msg)
    return seconds


def _cells(row: TrendRow) -> tuple[str, ...]:
    return (
        row.queue,
        row.job_type,
        str(row.completed),
        str(row.failed),
        str(row.dead),
        run_time_text(row.mean_run_time),
        run_time_text(row.p95_run_time),
    )
