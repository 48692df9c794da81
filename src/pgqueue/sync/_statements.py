"""pgqueue's statements run on psycopg: placeholders translated, schema errors named."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row, tuple_row

from pgqueue import JobNotFoundError, SchemaError
from pgqueue._extension import (
    DEPENDENCIES_MISSING,
    REPLACE_MISSING,
    pyformat,
    schema_error,
    schema_statements,
    store_on,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pgqueue._extension import Enqueued, Plan, Store

__all__ = ["fetch", "fetch_dicts", "run", "store_of"]

_SCHEMA_ERRORS = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedColumn,
    # ON CONFLICT without the unique index it names.
    psycopg.errors.InvalidColumnReference,
)

_NAMES = tuple(f"p{n}" for n in range(1, 33))
"""The names of a statement's ``$n`` parameters, as `pyformat` writes them."""


def fetch(
    connection: psycopg.Connection[Any], statement: str, args: Sequence[object]
) -> list[tuple[Any, ...]]:
    """Run ``statement`` (with ``$n`` placeholders) on ``connection``; its rows as tuples.

    Raises:
        SchemaError: the table (or a column, an index) it needs is missing.
    """
    with connection.cursor(row_factory=tuple_row) as cursor:
        _execute(cursor, statement, args)
        return cursor.fetchall()


def fetch_dicts(
    connection: psycopg.Connection[Any], statement: str, args: Sequence[object]
) -> list[dict[str, Any]]:
    """As `fetch`, each row a dict by column name."""
    with connection.cursor(row_factory=dict_row) as cursor:
        _execute(cursor, statement, args)
        return cursor.fetchall()


def run(connection: psycopg.Connection[Any], plan: Plan, queue: str) -> Enqueued:
    """Run an enqueue's ``plan`` on ``connection`` (onto ``queue``).

    Jobs with parents run in a savepoint inside a transaction: an unknown
    parent raises `JobNotFoundError` and leaves the transaction usable.

    Raises:
        SchemaError: the table, or a function of the schema, is missing.
    """
    try:
        idle = connection.info.transaction_status == TransactionStatus.IDLE
        if (plan.dependent and not idle) or (
            plan.then and idle and connection.autocommit
        ):
            # A savepoint; or the transaction of a plan of many statements
            # (without autocommit, psycopg begins the caller's own).
            with connection.transaction(), connection.cursor() as cursor:
                return plan.run(cursor, queue)
        with connection.cursor() as cursor:
            return plan.run(cursor, queue)
    except psycopg.errors.ForeignKeyViolation as exc:
        if not plan.dependent:
            raise
        raise JobNotFoundError(int(exc.diag.message_detail or 0)) from exc
    except _SCHEMA_ERRORS as exc:
        raise _schema_failure(connection, str(exc)) from exc
    except psycopg.errors.UndefinedFunction as exc:
        missing = DEPENDENCIES_MISSING if plan.dependent else REPLACE_MISSING
        raise SchemaError(
            missing, where=_where(connection), apply="SCHEMA_UPGRADE"
        ) from exc


def store_of(connection: psycopg.Connection[Any]) -> Store | None:
    """The store of ``connection``'s database; None while it has no ``pgqueue_jobs``."""
    with connection.cursor() as cursor:
        return store_on(cursor)


def _where(connection: psycopg.Connection[Any]) -> str:
    info = connection.info
    return f"{info.user}@{info.host}:{info.port}/{info.dbname}"


def _execute(
    cursor: psycopg.Cursor[Any], statement: str, args: Sequence[object]
) -> None:
    try:
        cursor.execute(
            pyformat(statement, _NAMES), dict(zip(_NAMES, args, strict=False))
        )
    except _SCHEMA_ERRORS as exc:
        raise _schema_failure(cursor.connection, str(exc)) from exc
    except psycopg.errors.UndefinedFunction as exc:
        raise SchemaError(
            REPLACE_MISSING, where=_where(cursor.connection), apply="SCHEMA_UPGRADE"
        ) from exc


def _schema_failure(connection: psycopg.Connection[Any], message: str) -> SchemaError:
    """The `SchemaError` for a statement that met a missing table, column or index.

    Names what is missing when the connection can still ask (autocommit);
    a transaction the error aborted cannot, and gets the statement's error.
    """
    where = _where(connection)
    if connection.info.transaction_status == TransactionStatus.IDLE:
        rows = fetch_dicts(
            connection,
            schema_statements.SCHEMA_CHECK,
            (
                list(schema_statements.REQUIRED_COLUMNS),
                list(schema_statements.REQUIRED_INDEXES),
            ),
        )
        error = schema_error(rows[0] if rows else None, where=where)
        if error is not None:
            return error
    return SchemaError(message.strip(), where=where)
