"""What every command shares: exit codes, the connection, errors, JSON output."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeAlias

import asyncpg

from pgqueue._extension import (
    CONTROL_CHARACTERS,
    DATABASE_ERRORS,
    check_dsn,
    describe,
    duration,
    holds_password,
    optional_duration,
    optional_int,
    printable,
    seconds_of,
    target,
)

if TYPE_CHECKING:
    from pgqueue import SchemaError

__all__ = [
    "CONNECT_ERRORS",
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_STOP_TIMEOUT",
    "EXIT_USAGE",
    "Commands",
    "PrintableFormatter",
    "Run",
    "UsageError",
    "add_json_flag",
    "add_read_dsn",
    "cannot_connect",
    "connect",
    "delay",
    "dsn_of",
    "dsn_source",
    "duration",
    "first_line",
    "job_id",
    "optional_duration",
    "optional_int",
    "password_warning",
    "place",
    "port",
    "positive_int",
    "print_json",
    "print_table",
    "printable",
    "read_dsn_of",
    "reports_database_errors",
    "rich_console",
    "schema_message",
    "seconds_of",
    "text_log_handler",
]

EXIT_OK = 0
"""The command did what it was asked."""
EXIT_ERROR = 1
"""It failed (the database refused, a schema piece is missing, a child died)."""
EXIT_USAGE = 2
"""Bad input: an unknown command or flag, a bad argument, a DSN that does not connect."""
EXIT_STOP_TIMEOUT = 3
"""``pgqueue worker``: the graceful stop ran out of time and cut jobs off."""

Run = Callable[[argparse.Namespace], Awaitable[int]]
"""A command's body: the parsed arguments in, an exit code out."""

Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""The sub-parsers a command module adds its parser to."""


class UsageError(Exception):
    """Bad input; its message is printed on one line and the exit code is 2."""


CONNECT_ERRORS = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    ValueError,
)
"""What connecting can raise for a reason the user can fix (a bad DSN, a server down)."""


def cannot_connect(exc: BaseException, dsn: str | None, source: str) -> UsageError:
    """The `UsageError` for a failed connection.

    ``cannot connect to <place> (from <source>): <first line>``; ``source``
    says where the DSN came from (`dsn_source`).
    """
    return UsageError(f"cannot connect to {place(dsn, source)}: {first_line(exc)}")


_CLI_FIXES = {
    "SCHEMA": "run pgqueue schema apply (or apply pgqueue.SCHEMA in a migration)",
    "SCHEMA_UPGRADE": (
        "run pgqueue schema apply --upgrade (or apply pgqueue.SCHEMA_UPGRADE "
        "in a migration)"
    ),
}


def schema_message(exc: SchemaError) -> str:
    """``exc``'s message as the command line says it: the fix is a ``pgqueue`` command."""
    fix = None if exc.apply is None else _CLI_FIXES.get(exc.apply)
    return printable(str(exc) if fix is None else exc.fixed_by(fix))


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its type's name if it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def dsn_of(args: argparse.Namespace) -> str | None:
    """``--dsn``, else ``PGQUEUE_DSN``, else None (libpq's ``PG*`` variables)."""
    dsn: str | None = getattr(args, "dsn", None) or os.environ.get("PGQUEUE_DSN")
    return dsn or None


READ_DSN_VARIABLE = "PGQUEUE_READ_DSN"
"""Where listings and counts are read from when ``--read-dsn`` is not given."""


def add_json_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--json``: print JSON (stable keys) instead of text."""
    parser.add_argument(
        "--json", action="store_true", help="print JSON (stable keys) instead of text"
    )


def add_read_dsn(parser: argparse.ArgumentParser) -> None:
    """Add ``--read-dsn`` to a command that only reads (or reads for its listings)."""
    parser.add_argument(
        "--read-dsn",
        metavar="DSN",
        help=(
            "read listings and counts from this server instead, a standby say "
            f"(default: ${READ_DSN_VARIABLE}, else the --dsn server); "
            "actions still go to --dsn"
        ),
    )


_LIBPQ = "libpq's PG* variables and defaults: no --dsn or PGQUEUE_DSN"


def dsn_source(args: argparse.Namespace, *, read: bool = False) -> str:
    """Where the DSN `dsn_of` (with ``read``, `read_dsn_of`) gives came from, for a message."""
    if read and getattr(args, "read_dsn", None):
        return "--read-dsn"
    if read and os.environ.get(READ_DSN_VARIABLE):
        return READ_DSN_VARIABLE
    if getattr(args, "dsn", None):
        return "--dsn"
    return "PGQUEUE_DSN" if os.environ.get("PGQUEUE_DSN") else _LIBPQ


def read_dsn_of(args: argparse.Namespace) -> str | None:
    """``--read-dsn``, else ``PGQUEUE_READ_DSN``, else `dsn_of`."""
    dsn: str | None = getattr(args, "read_dsn", None) or os.environ.get(
        READ_DSN_VARIABLE
    )
    return dsn or dsn_of(args)


_DSN_FLAGS = (
    ("dsn", "--dsn", "PGQUEUE_DSN"),
    ("read_dsn", "--read-dsn", READ_DSN_VARIABLE),
    ("listen", "--listen", None),
)
"""The flags that take a DSN: the argument's name, the flag, the variable that takes it instead."""


def password_warning(args: argparse.Namespace, argv: Sequence[str]) -> str | None:
    """The warning for DSNs with a password given on the command line ``argv``, or None.

    Every user of the machine can read a command line (``ps``) for as long
    as the command runs. The warning names the flags, never the password.
    """
    flags, variables = [], []
    for name, flag, variable in _DSN_FLAGS:
        value = getattr(args, name, None)
        # Given on the command line, not read from the environment (a child
        # of --processes reads --listen's from there).
        if (
            isinstance(value, str)
            and holds_password(value)
            and any(arg == value or arg.endswith(f"={value}") for arg in argv)
        ):
            flags.append(flag)
            if variable is not None:
                variables.append(variable)
    if not flags:
        return None
    one = len(flags) == 1
    instead = (
        f"give {'it' if one else 'them'} in {' and '.join(variables)}, or "
        if variables
        else ""
    )
    return (
        f"warning: {' and '.join(flags)} {'holds' if one else 'hold'} a password, "
        "which any user of this machine can read on the command line (ps) while "
        f"pgqueue runs: {instead}keep the password in a password file (~/.pgpass) "
        "or a service file (PGSERVICEFILE)"
    )


def place(dsn: str | None, source: str | None = None) -> str:
    """Where a connection goes, ``user@host:port/database`` (no password), for a message.

    With ``source`` (`dsn_source`), followed by ``(from <source>)``.

    Raises:
        UsageError: a DSN that cannot be parsed (saying to percent-encode the
            password, and quoting nothing of it).
    """
    if dsn is None:
        return f"{target()} (from {source or _LIBPQ})"
    try:
        check_dsn(dsn)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return target(dsn) if source is None else f"{target(dsn)} (from {source})"


@asynccontextmanager
async def connect(
    args: argparse.Namespace, *, connect_timeout: float = 10.0, read: bool = False
) -> AsyncIterator[asyncpg.Connection[Any]]:
    """One connection from ``--dsn``/``PGQUEUE_DSN``/``PG*``; `UsageError` if it fails.

    With ``read``, from `read_dsn_of` (``--read-dsn``, ``PGQUEUE_READ_DSN``) first.
    """
    dsn = read_dsn_of(args) if read else dsn_of(args)
    place(dsn)  # a DSN asyncpg would misread fails here, quoting nothing of it
    try:
        conn: asyncpg.Connection[Any] = await asyncpg.connect(
            dsn, timeout=connect_timeout
        )
    except CONNECT_ERRORS as exc:
        raise cannot_connect(exc, dsn, dsn_source(args, read=read)) from exc
    try:
        yield conn
    finally:
        await conn.close()


# In JSON text these characters can only stand inside strings, where an
# escape means the same character: the document decodes to the same values.
_JSON_SAFE = str.maketrans(
    {char: f"\\u{ord(char):04x}" for char in CONTROL_CHARACTERS if ord(char) >= 0x20}
)


class PrintableFormatter(logging.Formatter):
    """A `logging.Formatter` whose lines show control characters escaped (`printable`).

    The message is one line whatever it holds; a traceback keeps its line feeds.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        """The line, with the message made `printable`."""
        record.message = printable(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        """The traceback, `printable` but for its line feeds."""
        return printable(super().formatException(ei), newlines=True)

    def formatStack(self, stack_info: str) -> str:
        """The stack, `printable` but for its line feeds."""
        return printable(super().formatStack(stack_info), newlines=True)


def text_log_handler(fmt: str) -> logging.Handler:
    """A handler writing ``fmt`` lines on stderr through a `PrintableFormatter`."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(PrintableFormatter(fmt))
    return handler


def print_json(value: Any) -> None:
    """Print ``value`` as one JSON document (stable keys, ISO times) on stdout.

    The values are exact; DEL, C1 and bidi controls are written as ``\\u``
    escapes (JSON escapes the C0 ones), so the text is safe on a terminal.
    """
    text = json.dumps(value, default=_json_default, ensure_ascii=False)
    sys.stdout.write(text.translate(_JSON_SAFE))
    sys.stdout.write("\n")


def _json_default(value: object) -> Any:
    isoformat = getattr(value, "isoformat", None)
    if callable(isoformat):
        return isoformat()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    msg = f"{type(value).__name__} is not JSON"
    raise TypeError(msg)


PIPED_WIDTH = 1_000
"""Columns of output that is not a terminal's (without ``COLUMNS``): whole lines."""


def rich_console() -> Any:
    """A `rich.console.Console` on stdout; `UsageError` saying how to install rich if missing.

    Piped or redirected (and ``COLUMNS`` unset), lines are as long as their
    cells, not cut at rich's 80 columns: a script reads every id and type.
    """
    try:
        from rich.console import Console
    except ModuleNotFoundError as exc:
        msg = "this command renders with rich: pip install 'pgqueue-asyncio[cli]'"
        raise UsageError(msg) from exc
    console = Console()
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(width=PIPED_WIDTH)
    return console


def print_table(
    columns: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    empty: str,
    right: Collection[str] = (),
) -> None:
    """Print ``rows`` under ``columns`` with rich (``right``: columns aligned right), or ``empty``.

    Cells are plain text, never markup, and shown `printable`.
    """
    console = rich_console()
    if not rows:
        console.print(empty, markup=False, highlight=False)
        return
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False)
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left")
    for row in rows:
        table.add_row(*(Text(printable(cell)) for cell in row))
    console.print(table)


def delay(text: str) -> float:
    """An argparse type: how long from now (``enqueue --in``), a duration as `duration` reads it."""
    return duration(text, "delay")


def job_id(text: str) -> int:
    """An argparse type: a job id, a positive 64-bit integer."""
    return _counted(text, 2**63, f"not a job id: {text!r} (a positive integer)")


def positive_int(text: str) -> int:
    """An argparse type: a count, from 1 to 2**31 - 1 (a PostgreSQL int)."""
    return _counted(
        text, 2**31, f"not a positive integer (up to {2**31 - 1}): {text!r}"
    )


def port(text: str) -> int:
    """An argparse type: a TCP port, from 1 to 65535."""
    return _counted(text, 65536, f"not a port: {text!r}")


def _counted(text: str, below: int, error: str) -> int:
    """``text`` as a whole number from 1 to ``below - 1``; else ``error``."""
    try:
        value = int(text, 10)
    except ValueError:
        value = 0
    if not 0 < value < below:
        raise argparse.ArgumentTypeError(error)
    return value


_DATABASE_ERRORS: tuple[type[Exception], ...] = (
    asyncpg.PostgresError,
    *DATABASE_ERRORS,
)


def reports_database_errors(run: Run) -> Run:
    """``run``, with an error from the database printed on one line and exit code 1."""

    @functools.wraps(run)
    async def reporting(args: argparse.Namespace) -> int:
        try:
            return await run(args)
        except _DATABASE_ERRORS as exc:
            line = describe(exc).splitlines()[0]
            print(f"pgqueue: {printable(line)}", file=sys.stderr)
            return EXIT_ERROR

    return reporting
