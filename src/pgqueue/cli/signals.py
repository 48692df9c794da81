"""The ``signal`` command: send a signal to a durable handler's job (`pgqueue.Admin.signal`)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from pgqueue import Admin, JobNotFoundError
from pgqueue.cli._common import (
    EXIT_ERROR,
    EXIT_OK,
    UsageError,
    connect,
    job_id,
    print_json,
    reports_database_errors,
)

if TYPE_CHECKING:
    import argparse

    from pgqueue.cli._common import Commands

__all__ = ["add_to"]


def add_to(commands: Commands) -> None:
    """Add ``signal``."""
    parser = commands.add_parser(
        "signal",
        help="send a signal to a durable handler's job",
        description=(
            "Send signal NAME, with the payload JSON (default null), to job ID: "
            "its handler's job.wait_for(NAME) returns the payload, and a job "
            "parked for it is due at once. Exit 1 if no job has the id, or if "
            "the job has ended (completed, dead or cancelled: nothing stored)."
        ),
    )
    parser.add_argument("id", type=job_id, metavar="ID", help="the job's id")
    parser.add_argument("name", metavar="NAME", help="the signal's name")
    parser.add_argument(
        "payload", nargs="?", metavar="JSON", help="its payload, as JSON text"
    )
    parser.add_argument(
        "--json", action="store_true", help='print {"id", "stored"} as JSON'
    )
    parser.set_defaults(run=reports_database_errors(send))


async def send(args: argparse.Namespace) -> int:
    """Send one signal; exit 1 if the job is unknown or has ended."""
    payload = None
    if args.payload is not None:
        try:
            json.loads(args.payload)
        except ValueError as exc:
            msg = f"the payload is not valid JSON: {exc}"
            raise UsageError(msg) from exc
        payload = args.payload.encode("utf-8", "surrogateescape")
    async with connect(args) as connection:
        try:
            stored = await Admin(connection).signal(args.id, args.name, payload)
        except JobNotFoundError:
            print(f"pgqueue: no job has id {args.id}", file=sys.stderr)
            return EXIT_ERROR
        except (TypeError, ValueError) as exc:
            raise UsageError(str(exc)) from exc
    if args.json:
        print_json({"id": args.id, "stored": stored})
    elif stored:
        print(f"{args.id}\tsignalled")
    else:
        print(f"{args.id}\tnot signalled: the job has ended", file=sys.stderr)
    return EXIT_OK if stored else EXIT_ERROR
