"""Checking that the database holds what pgqueue needs, saying what is missing, and choosing its store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import asyncpg

from pgqueue._core.dsn import target_of
from pgqueue._core.errors import SchemaError
from pgqueue._core.lifecycle import Status
from pgqueue._sql.schema import (
    CITUS_CHECK,
    DISTRIBUTED_CHECK,
    REQUIRED_COLUMNS,
    REQUIRED_INDEXES,
    SCHEMA_CHECK,
)
from pgqueue._store.citus import CitusStore
from pgqueue._store.postgres import Store

if TYPE_CHECKING:
    from collections.abc import Generator

    from pgqueue._store.plan import Cursor

__all__ = [
    "DEPENDENCIES_MISSING",
    "REPLACE_MISSING",
    "SCHEMA_ERRORS",
    "Row",
    "check_schema",
    "detect",
    "distributed_tables",
    "distribution",
    "forget",
    "missing_pieces",
    "schema_error",
    "schema_failure",
    "store_for",
    "store_named",
    "store_on",
]

SCHEMA_ERRORS: tuple[type[Exception], ...] = (
    asyncpg.UndefinedTableError,
    asyncpg.UndefinedColumnError,
    # ON CONFLICT without the unique index it names.
    asyncpg.InvalidColumnReferenceError,
)
"""What a statement meets when the schema lacks what it needs."""

REPLACE_MISSING = (
    "the function pgqueue_enqueue_replace is missing (unique keys, "
    'on_conflict="replace" and debounce need it)'
)
"""The `SchemaError` of a replacing enqueue on a schema from before it (a table the upgrade has not reached)."""

DEPENDENCIES_MISSING = (
    "the function pgqueue_enqueue_after is missing (enqueues with after= need it)"
)
"""The `SchemaError` of an enqueue with parents on a schema from before its functions."""


class Row(Protocol):
    """A row read by name: an asyncpg ``Record``, or a dict (psycopg's ``dict_row``)."""

    def __getitem__(self, key: str, /) -> Any: ...


class _Fetches(Protocol):
    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None: ...


async def check_schema(executor: _Fetches, *, limits: bool = False) -> bool:
    """Raise `SchemaError` naming what ``pgqueue_jobs`` lacks; else return whether it was ever analyzed.

    With ``limits`` (a worker with a fleet-wide limit), the ``pgqueue_limits``
    and ``pgqueue_leases`` tables are required too.

    The error names the database ``executor`` reaches (`SchemaError.where`).

    Raises whatever the database raises when it cannot answer.
    """
    row = await executor.fetchrow(
        SCHEMA_CHECK, list(REQUIRED_COLUMNS), list(REQUIRED_INDEXES)
    )
    error = schema_error(row, limits=limits, where=target_of(executor))
    if error is not None:
        raise error
    assert row is not None
    return bool(row["analyzed"])


def distribution() -> Generator[str, Row, bool | None]:
    """Whether ``pgqueue_jobs`` is distributed by Citus, without I/O: yields
    each statement to run and is sent its row; returns None while there is
    no such table.

    One statement on plain PostgreSQL (which has no Citus catalog to read),
    two on Citus.
    """
    row = yield CITUS_CHECK
    if not row["jobs"]:
        return None
    if not row["citus"]:
        return False
    row = yield DISTRIBUTED_CHECK
    return bool(row["exists"])


async def distributed_tables(executor: _Fetches) -> bool | None:
    """`distribution`, asked on ``executor``."""
    steps = distribution()
    statement = next(steps)
    while True:
        row = await executor.fetchrow(statement)
        assert row is not None
        try:
            statement = steps.send(row)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def store_on(cursor: Cursor) -> Store | None:
    """`detect` on a DB-API cursor (psycopg's, Django's)."""
    steps = distribution()
    statement = next(steps)
    while True:
        cursor.execute(statement, {})
        names = [column[0] for column in cursor.description or ()]
        row = dict(zip(names, cursor.fetchall()[0], strict=True))
        try:
            statement = steps.send(row)
        except StopIteration as done:
            return store_named(done.value)


def store_named(distributed: bool | None) -> Store | None:
    """A new store for a database whose tables are ``distributed`` (None: no table)."""
    if distributed is None:
        return None
    return CitusStore() if distributed else Store()


async def schema_failure(
    executor: _Fetches, message: str, *, limits: bool = False
) -> SchemaError:
    """The `SchemaError` for a statement that met a missing table or column.

    Raises the one `check_schema` finds, naming what is missing; else
    returns one of ``message`` (the statement's error), naming the database.
    """
    await check_schema(executor, limits=limits)
    return SchemaError(message, where=target_of(executor))


def schema_error(
    row: Row | None, *, limits: bool = False, where: str | None = None
) -> SchemaError | None:
    """The `SchemaError` for an answer of `SCHEMA_CHECK`, or None if nothing is missing.

    The limits' tables count only with ``limits``; ``where`` names the database.
    """
    if row is None or not row["table_exists"]:
        return SchemaError(
            "there is no table pgqueue_jobs on the search_path",
            where=where,
            apply="SCHEMA",
        )
    missing = missing_pieces(row, limits=limits)
    if not missing:
        return None
    lacking = []
    tables = (_LIMITS_TABLE, _PAUSED_TABLE)
    if pieces := [piece for piece in missing if piece not in tables]:
        lacking.append(f"pgqueue_jobs lacks {', '.join(pieces)}")
    if _PAUSED_TABLE in missing:
        lacking.append(f"the {_PAUSED_TABLE} is not on the search_path")
    if _LIMITS_TABLE in missing:
        lacking.append(
            f"the {_LIMITS_TABLE} are not both on the search_path (a worker with a global_limit needs them)"
        )
    return SchemaError("; ".join(lacking), where=where, apply="SCHEMA_UPGRADE")


_LIMITS_TABLE = "tables pgqueue_limits and pgqueue_leases"
_PAUSED_TABLE = "table pgqueue_paused"


def missing_pieces(row: Row, *, limits: bool = True) -> list[str]:
    """What an answer of `SCHEMA_CHECK` on an existing table says is missing, in order.

    ``limits``: whether missing limits' tables count.
    """
    missing = [f"column {name}" for name in row["missing_columns"]]
    missing += [f"index {name}" for name in row["missing_indexes"]]
    if row["old_status_check"]:
        missing.append(f"a status check that allows '{Status.PARKED}'")
    if row["old_unique_index"]:
        missing.append(
            "unique keys per queue (index idx_pgqueue_jobs_unique on queue, job_type, unique_key)"
        )
    if not row["has_paused"]:
        missing.append(_PAUSED_TABLE)
    if limits and not row["has_limits"]:
        missing.append(_LIMITS_TABLE)
    return missing


_STORES: dict[str, Store] = {}
"""The store of each database (user@host:port/db) whose schema was found, for the producers and Admin."""


async def detect(executor: _Fetches) -> Store | None:
    """The store for ``executor``'s database, a new one: Citus's if its tables are distributed.

    None while there is no ``pgqueue_jobs`` table.
    """
    return store_named(await distributed_tables(executor))


async def store_for(executor: _Fetches) -> Store | None:
    """`detect`, looked up once per database (a table's distribution does not change under a running app).

    None while there is no ``pgqueue_jobs`` table (not remembered).
    """
    where = target_of(executor)
    if where is not None and where in _STORES:
        return _STORES[where]
    store = await detect(executor)
    if where is not None and store is not None:
        _STORES[where] = store
    return store


def forget(executor: _Fetches) -> None:
    """Forget the store of ``executor``'s database (its schema was installed or dropped)."""
    where = target_of(executor)
    if where is not None:
        _STORES.pop(where, None)
