"""Checking that the database holds what pgqueue needs, and saying what is missing."""

from __future__ import annotations

from typing import Any, Protocol

import asyncpg

from pgqueue import _sql
from pgqueue._errors import SchemaError

__all__ = ["SCHEMA_ERRORS", "check_schema", "missing_pieces", "schema_error"]

SCHEMA_ERRORS: tuple[type[Exception], ...] = (
    asyncpg.UndefinedTableError,
    asyncpg.UndefinedColumnError,
    # ON CONFLICT without the unique index it names.
    asyncpg.InvalidColumnReferenceError,
)
"""What a statement meets when the schema lacks what it needs."""


class _Fetches(Protocol):
    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None: ...


async def check_schema(executor: _Fetches) -> None:
    """Raise `SchemaError` naming what ``pgqueue_jobs`` lacks; return if nothing.

    Raises whatever the database raises when it cannot answer.
    """
    row = await executor.fetchrow(
        _sql.SCHEMA_CHECK, list(_sql.REQUIRED_COLUMNS), list(_sql.REQUIRED_INDEXES)
    )
    error = schema_error(row)
    if error is not None:
        raise error


def schema_error(row: asyncpg.Record | None) -> SchemaError | None:
    """The `SchemaError` for an answer of `_sql.SCHEMA_CHECK`, or None if nothing is missing."""
    if row is None or not row[0]:
        return SchemaError(
            "there is no table pgqueue_jobs on the search_path: apply "
            "pgqueue.SCHEMA in a migration (or await pgqueue.install(pool))"
        )
    missing = missing_pieces(row)
    if not missing:
        return None
    return SchemaError(
        f"pgqueue_jobs lacks {', '.join(missing)}: apply pgqueue.SCHEMA_UPGRADE "
        "in a migration (or await pgqueue.install(pool))"
    )


def missing_pieces(row: asyncpg.Record) -> list[str]:
    """What an answer of `_sql.SCHEMA_CHECK` on an existing table says is missing, in order."""
    missing = [f"column {name}" for name in row[1]]
    missing += [f"index {name}" for name in row[2]]
    if row[3]:
        missing.append("a status check that allows 'cancelled'")
    return missing
