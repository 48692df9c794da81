"""The ``pgqueue`` command line (the ``cli`` extra): ``pgqueue --help``.

Each command lives in a module of its own with an ``add_to(commands)``
function that adds its parser and sets ``run``, an async function from the
parsed arguments to an exit code (see `pgqueue.cli._common`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from typing import TYPE_CHECKING

from pgqueue import SchemaError
from pgqueue.cli._common import (
    EXIT_ERROR,
    EXIT_USAGE,
    UsageError,
    password_warning,
    printable,
    schema_message,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["main"]

COMMAND_MODULES = (
    "pgqueue.cli.worker",
    "pgqueue.cli.schema",
    "pgqueue.cli.jobs",
    "pgqueue.cli.signals",
    "pgqueue.cli.periodic",
    "pgqueue.cli.top",
    "pgqueue.cli.web",
)
"""Modules that add commands."""

_DSN_HELP = (
    "PostgreSQL connection string (default: $PGQUEUE_DSN, then PG* variables; "
    "a command line is visible to other users: keep a password in PGQUEUE_DSN)"
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        """A usage error on one line, exit code 2 (argparse prints the usage too)."""
        self.exit(EXIT_USAGE, f"pgqueue: {message} (see pgqueue --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command."""
    parser = _Parser(
        prog="pgqueue",
        description="Run pgqueue workers and look after their queues.",
        epilog=(
            "The connection comes from --dsn, else PGQUEUE_DSN, else libpq's PG* "
            "variables. Exit codes: 0 done, 1 error, 2 bad input, 3 stop timed out."
        ),
    )
    parser.add_argument("--dsn", help=_DSN_HELP)
    commands = parser.add_subparsers(
        title="commands", metavar="COMMAND", parser_class=_Parser
    )
    commands.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_to(commands)
    _dsn_after_the_command(parser)
    return parser


def _dsn_after_the_command(parser: argparse.ArgumentParser) -> None:
    """Let ``--dsn`` come after a command's name too (``pgqueue stats --dsn ...``)."""
    for action in parser._actions:  # argparse has no public walk of its parsers
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if "--dsn" not in sub._option_string_actions:
                    sub.add_argument("--dsn", default=argparse.SUPPRESS, help=_DSN_HELP)
                _dsn_after_the_command(sub)


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; return its exit code (``python -m pgqueue`` exits with it)."""
    given = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(given)
    warning = password_warning(args, given)
    if warning is not None:
        print(f"pgqueue: {warning}", file=sys.stderr, flush=True)
    try:
        code: int = asyncio.run(args.run(args))
    except UsageError as exc:
        print(f"pgqueue: {printable(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except SchemaError as exc:
        print(f"pgqueue: {schema_message(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return code
