"""Enqueue jobs in a SQLAlchemy session's transaction.

``pip install 'pgqueue-asyncio[sqlalchemy]'``. The job is written on the
session's own database connection, inside its transaction: the commit that
writes your rows writes the job and wakes its workers; a rollback writes
neither.

- `enqueue` and `enqueue_many` are awaited, with an ``AsyncSession`` or
  ``AsyncConnection`` of the ``postgresql+asyncpg`` dialect; they hand the
  session's asyncpg connection to `pgqueue.Queue`.
- `enqueue_sync` and `enqueue_many_sync` are not, with a ``Session`` or
  ``Connection`` of the ``postgresql+psycopg`` dialect; they hand the
  session's psycopg connection to `pgqueue.sync.Queue`.

Two names rather than one that is sometimes awaitable: each has one return
type, and a type checker flags an ``enqueue`` that is not awaited. Other
drivers (psycopg2, pg8000, SQLite...) are refused with `TypeError` before
any SQL runs.

.. versionadded:: 0.1
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, NoReturn, Unpack

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session

from pgqueue._extension import (
    check_jobs,
    check_queue_name,
    check_request,
    encode_batch,
    encode_payload,
    enqueue_batch,
    enqueue_request,
    payload_encoder,
    schema_statements,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    import asyncpg
    import psycopg

    import pgqueue
    from pgqueue import EnqueueOptions
    from pgqueue.sync import Queue as SyncQueue

__all__ = ["enqueue", "enqueue_many", "enqueue_many_sync", "enqueue_sync"]


async def enqueue(
    session: AsyncSession | AsyncConnection,
    job_type: str,
    payload: Any = None,
    *,
    queue: str = "default",
    json_encoder: Callable[[Any], Any] | None = None,
    **options: Unpack[EnqueueOptions],
) -> int:
    """Enqueue a job in ``session``'s transaction; its id.

    The options are `pgqueue.Queue.enqueue`'s, with ``queue`` (its name)
    and ``json_encoder`` (as `pgqueue.Queue`'s); ``max_attempts`` is 5 by
    default. A session with no transaction yet begins one, as a query
    would: nothing is written until it commits.

    Usage::

        async with sessionmaker() as session, session.begin():
            session.add(Order(id=42))
            await pgqueue.sqlalchemy.enqueue(session, "ship", {"order": 42})

    Raises:
        TypeError: ``session`` is not asyncpg's, or as `pgqueue.Queue.enqueue`.
        ValueError, DuplicateJobError, JobNotFoundError, SchemaError: as
            `pgqueue.Queue.enqueue`.

    .. versionchanged:: 0.1
       ``after``, ``on_parent_failure`` and ``group``.
    """
    name = check_queue_name(queue)
    request = check_request(job_type, payload, default_attempts=5, **options)
    text = encode_payload(payload, payload_encoder(json_encoder))
    connection = await _asyncpg_connection(session)
    return await enqueue_request(connection, name, request, text)


async def enqueue_many(
    session: AsyncSession | AsyncConnection,
    jobs: Iterable[pgqueue.NewJob | tuple[str, Any]],
    *,
    queue: str = "default",
    on_conflict: Literal["return", "raise", "replace"] = "return",
    json_encoder: Callable[[Any], Any] | None = None,
) -> list[int]:
    """Enqueue many jobs in ``session``'s transaction, as `pgqueue.Queue.enqueue_many`; their ids.

    Raises:
        TypeError: ``session`` is not asyncpg's, or as `pgqueue.Queue.enqueue_many`.
        ValueError, DuplicateJobError, SchemaError: as `pgqueue.Queue.enqueue_many`.
    """
    name = check_queue_name(queue)
    batch = check_jobs(jobs, 5, None, on_conflict)
    if not batch.types:
        return []
    payloads = encode_batch(batch, payload_encoder(json_encoder))
    connection = await _asyncpg_connection(session)
    return await enqueue_batch(connection, name, batch, payloads, on_conflict)


def enqueue_sync(
    session: Session | sa.Connection,
    job_type: str,
    payload: Any = None,
    *,
    queue: str = "default",
    json_encoder: Callable[[Any], Any] | None = None,
    **options: Unpack[EnqueueOptions],
) -> int:
    """`enqueue` for a ``Session`` or ``Connection`` of the psycopg dialect, without await.

    Usage::

        with Session(engine) as session, session.begin():
            session.add(Order(id=42))
            pgqueue.sqlalchemy.enqueue_sync(session, "ship", {"order": 42})

    Raises:
        TypeError: ``session`` is not psycopg's, or as `pgqueue.Queue.enqueue`.
        ValueError, DuplicateJobError, JobNotFoundError, SchemaError: as
            `pgqueue.Queue.enqueue`.

    .. versionchanged:: 0.1
       ``after``, ``on_parent_failure`` and ``group``.
    """
    return _sync_queue(session, queue, json_encoder).enqueue(
        job_type, payload, **options
    )


def enqueue_many_sync(
    session: Session | sa.Connection,
    jobs: Iterable[pgqueue.NewJob | tuple[str, Any]],
    *,
    queue: str = "default",
    on_conflict: Literal["return", "raise", "replace"] = "return",
    json_encoder: Callable[[Any], Any] | None = None,
) -> list[int]:
    """`enqueue_many` for a ``Session`` or ``Connection`` of the psycopg dialect, without await.

    Raises:
        TypeError: ``session`` is not psycopg's, or as `pgqueue.Queue.enqueue_many`.
        ValueError, DuplicateJobError, SchemaError: as `pgqueue.Queue.enqueue_many`.
    """
    return _sync_queue(session, queue, json_encoder).enqueue_many(
        jobs, on_conflict=on_conflict
    )


async def _asyncpg_connection(
    session: AsyncSession | AsyncConnection,
) -> asyncpg.Connection[Any]:
    """The asyncpg connection of ``session``, in its transaction (begun if need be)."""
    given: object = session  # whatever the annotation says
    if not isinstance(given, AsyncSession | AsyncConnection):
        _refuse(session, "an AsyncSession or AsyncConnection", "enqueue_sync")
    dialect = (
        session.dialect
        if isinstance(session, AsyncConnection)
        else session.get_bind().dialect
    )
    _require(dialect, "asyncpg")
    connection = (
        session if isinstance(session, AsyncConnection) else await session.connection()
    )
    raw = (await connection.get_raw_connection()).driver_connection
    assert raw is not None  # a connection checked out of the pool
    driver: asyncpg.Connection[Any] = raw
    if not driver.is_in_transaction():
        await connection.exec_driver_sql(schema_statements.BEGIN_PROBE)
    return driver


def _sync_queue(
    session: Session | sa.Connection,
    name: str,
    json_encoder: Callable[[Any], Any] | None,
) -> SyncQueue:
    """A `pgqueue.sync.Queue` on the psycopg connection of ``session``."""
    given: object = session  # whatever the annotation says
    if not isinstance(given, Session | sa.Connection):
        _refuse(session, "a Session or Connection", "enqueue")
    dialect = (
        session.dialect
        if isinstance(session, sa.Connection)
        else session.get_bind().dialect
    )
    _require(dialect, "psycopg")
    connection = session if isinstance(session, sa.Connection) else session.connection()
    if not connection.in_transaction():
        # As a query would (autobegin): the job then commits with the
        # connection's commit(). psycopg begins at the job's statement.
        connection.begin()
    driver = connection.connection.driver_connection
    assert driver is not None  # a connection checked out of the pool
    raw: psycopg.Connection[Any] = driver
    # Only here: the async side needs asyncpg alone, not psycopg.
    from pgqueue import sync

    return sync.Queue(raw, name, json_encoder=json_encoder)


def _require(dialect: sa.Dialect, driver: str) -> None:
    if dialect.name != "postgresql" or dialect.driver != driver:
        msg = (
            f"pgqueue.sqlalchemy needs the postgresql+{driver} dialect here, "
            f"not {dialect.name}+{dialect.driver}"
        )
        raise TypeError(msg)


def _refuse(session: object, expected: str, other: str) -> NoReturn:
    msg = (
        f"expected {expected}, got {type(session).__name__} "
        f"(pgqueue.sqlalchemy.{other} takes the other kind)"
    )
    raise TypeError(msg)


def __dir__() -> list[str]:
    """The public names: ``__all__``."""
    from pgqueue._extension import public_names  # only when asked

    return public_names(globals(), __all__)
