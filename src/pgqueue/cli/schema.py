"""``pgqueue schema``: print, apply and check the ``pgqueue_jobs`` table's schema."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from pgqueue import (
    SCHEMA,
    SCHEMA_DISTRIBUTED,
    SCHEMA_DOWN,
    SCHEMA_UPGRADE,
    Admin,
    SchemaError,
    SchemaState,
    grants,
    install,
)
from pgqueue._extension import GRANT_KINDS, target_of
from pgqueue.cli._common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    connect,
    print_json,
    printable,
    reports_database_errors,
)

if TYPE_CHECKING:
    import argparse

    from pgqueue.cli._common import Commands

__all__ = ["add_to"]

_KINDS = {
    "missing": "there is no table pgqueue_jobs",
    "go": "pgqueue_jobs is the Go module's v1.1.0 table",
    "partial": "pgqueue_jobs is partly up to date",
    "current": "pgqueue_jobs is current",
}


def add_to(commands: Commands) -> None:
    """Add ``schema`` and its subcommands."""
    parser = commands.add_parser(
        "schema",
        help="print, apply or check the schema",
        description="Print, apply or check the pgqueue_jobs table's schema.",
    )
    actions = parser.add_subparsers(title="actions", metavar="ACTION")
    actions.required = True

    printing = actions.add_parser(
        "print",
        help="print the SQL (for your migrations)",
        description=(
            "Print pgqueue.SCHEMA, or SCHEMA_UPGRADE or SCHEMA_DOWN; needs no "
            "database. With --dsn on the command line (PGQUEUE_DSN alone does "
            "not connect), print what that database needs instead: SCHEMA for "
            "a missing table, SCHEMA_UPGRADE for an older one, nothing for a "
            "current one, after a comment naming the database and its state."
        ),
    )
    which = printing.add_mutually_exclusive_group()
    which.add_argument(
        "--upgrade",
        action="store_true",
        help="SCHEMA_UPGRADE: bring a Go module's (or older) table up to date",
    )
    which.add_argument(
        "--down", action="store_true", help="SCHEMA_DOWN: drop the table"
    )
    which.add_argument(
        "--distributed",
        action="store_true",
        help="SCHEMA_DISTRIBUTED: the tables distributed by queue on a Citus coordinator",
    )
    printing.set_defaults(run=reports_database_errors(print_schema))

    apply = actions.add_parser(
        "apply",
        help="apply the schema to the database",
        description=(
            "Create the pgqueue_jobs table (SCHEMA), or with --upgrade bring an "
            "existing one up to date (SCHEMA_UPGRADE). Both are idempotent."
        ),
    )
    applied = apply.add_mutually_exclusive_group()
    applied.add_argument(
        "--upgrade", action="store_true", help="apply SCHEMA_UPGRADE to a table"
    )
    applied.add_argument(
        "--distributed",
        action="store_true",
        help="apply SCHEMA_DISTRIBUTED on a Citus coordinator (the citus extension is required)",
    )
    apply.add_argument("--json", action="store_true", help="print the state as JSON")
    apply.set_defaults(run=reports_database_errors(apply_schema))

    check = actions.add_parser(
        "check",
        help="say whether the table is current (exit 1 if not)",
        description=(
            "Say whether pgqueue_jobs is missing, the Go module's, partly up to "
            "date or current in the database (named user@host:port/database), "
            "naming what is missing; exit 1 unless current."
        ),
    )
    check.add_argument("--json", action="store_true", help="print the state as JSON")
    check.set_defaults(run=reports_database_errors(check_schema))

    granting = actions.add_parser(
        "grants",
        help="print the GRANT statements of a kind of role",
        description=(
            "Print the idempotent GRANT statements that give an existing ROLE "
            "what a KIND of role needs, and nothing more (pgqueue.grants): "
            "producer (enqueue only), worker, operator (Admin's and the "
            "dashboards' actions) or reader (their reads). Run them as the "
            "schema's owner, where the schema was applied; needs no database."
        ),
    )
    granting.add_argument("kind", choices=GRANT_KINDS, help="the kind of role")
    granting.add_argument("role", help="the role's name, as it is")
    granting.set_defaults(run=print_grants)


async def print_grants(args: argparse.Namespace) -> int:
    """Print the GRANT statements of ``args.kind`` for ``args.role``."""
    try:
        print(grants(args.kind, args.role).strip())
    except (TypeError, ValueError) as exc:
        print(f"pgqueue: {printable(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


async def print_schema(args: argparse.Namespace) -> int:
    """Print the SQL asked for; or, given ``--dsn`` alone, what that database needs."""
    if getattr(args, "dsn", None) and not (
        args.upgrade or args.down or args.distributed
    ):
        return await _print_needed(args)
    if args.distributed:
        sql = SCHEMA_DISTRIBUTED
    elif args.upgrade:
        sql = SCHEMA_UPGRADE
    elif args.down:
        sql = SCHEMA_DOWN
    else:
        sql = SCHEMA
    print(sql.strip())
    return EXIT_OK


async def _print_needed(args: argparse.Namespace) -> int:
    async with connect(args) as connection:
        state = await Admin(connection).schema_state()
        where = _where(connection)
    line = _KINDS[state.kind]
    if state.kind in ("go", "partial"):
        line += f"; it lacks {', '.join(state.missing)}"
    print(f"-- {printable(where)}: {line}")
    if state.kind == "current":
        print("-- nothing to apply")
    else:
        print(SCHEMA.strip() if state.kind == "missing" else SCHEMA_UPGRADE.strip())
    return EXIT_OK


def _report(state: SchemaState, where: str, *, as_json: bool) -> None:
    """Print the state of the table in the database ``where``."""
    if as_json:
        print_json({**state.to_json(), "fix": state.fix, "database": where})
        return
    line = f"{printable(where)}: {_KINDS[state.kind]}"
    if state.kind in ("go", "partial"):
        line += f"; it lacks {', '.join(state.missing)}"
    if state.fix is not None:
        line += f": apply {state.fix}"
    print(line)
    if state.kind != "missing" and not state.analyzed:
        print(NEVER_ANALYZED)


NEVER_ANALYZED = (
    "note: pgqueue_jobs has never been analyzed: the planner guesses its size "
    "and contents (pgqueue's statements plan well regardless; queries of your "
    "own may not); autovacuum analyzes it once enough rows change, or run "
    "ANALYZE pgqueue_jobs"
)


async def apply_schema(args: argparse.Namespace) -> int:
    """Apply SCHEMA (a new table) or SCHEMA_UPGRADE (an existing one)."""
    async with connect(args) as connection:
        where = _where(connection)
        admin = Admin(connection)
        if args.distributed:
            try:
                await install(connection, distributed=True)
            except SchemaError as exc:
                print(f"pgqueue: {printable(str(exc))}", file=sys.stderr)
                return EXIT_ERROR
            _report(await admin.schema_state(), where, as_json=args.json)
            return EXIT_OK
        state = await admin.schema_state()
        if args.upgrade and state.kind == "missing":
            print(
                f"pgqueue: {printable(where)}: there is no table pgqueue_jobs to "
                "upgrade: run pgqueue schema apply",
                file=sys.stderr,
            )
            return EXIT_ERROR
        if not args.upgrade and state.kind in ("go", "partial"):
            print(
                f"pgqueue: {printable(where)}: pgqueue_jobs exists but lacks "
                f"{', '.join(state.missing)}: run pgqueue schema apply --upgrade",
                file=sys.stderr,
            )
            return EXIT_ERROR
        await connection.execute(SCHEMA_UPGRADE if args.upgrade else SCHEMA)
        _report(await admin.schema_state(), where, as_json=args.json)
    return EXIT_OK


def _where(connection: object) -> str:
    return target_of(connection) or "the database"


async def check_schema(args: argparse.Namespace) -> int:
    """Report the table's state; exit 1 unless it is current."""
    async with connect(args) as connection:
        state = await Admin(connection).schema_state()
        where = _where(connection)
    _report(state, where, as_json=args.json)
    return EXIT_OK if state.kind == "current" else EXIT_ERROR
