"""Bulk enqueue through COPY: the ids reserved first, the rows copied with them, one wakeup."""

from __future__ import annotations

import struct
from datetime import timedelta
from itertools import repeat
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

import asyncpg

from pgqueue._sql.enqueue import COPY_COLUMNS, COPY_TABLE, NOTIFY_JOBS, RESERVE_IDS

if TYPE_CHECKING:
    from datetime import datetime

    from asyncpg.pool import PoolConnectionProxy

__all__ = ["COPY_MAX_DELAY", "COPY_MIN_JOBS", "Rows", "copy_jobs"]

_Connection: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"

COPY_MIN_JOBS = 10_000
"""The smallest batch enqueue_many copies (smaller ones take one INSERT)."""
# Measured with `python -m benchmarks.bulk --sweep` (PostgreSQL 15, 2 CPUs;
# two runs, medians of 7 and 9 alternating rounds): the COPY path's jobs/s
# over the INSERT path's is 0.82-0.92 at 1,000 jobs a call, 0.92-0.97 at
# 5,000, 0.99-1.03 at 7,500, 1.03-1.06 at 10,000 and 1.14 at 50,000. Below
# a few thousand rows one INSERT ... SELECT unnest costs the server about
# what COPY does, and the COPY path adds four round trips (BEGIN, the ids,
# the wakeup, COMMIT) and the ids' reservation.

COPY_MAX_DELAY = 1000 * 365.25 * 86400
"""The longest delay enqueue_many copies: run_at crosses the client as a
datetime, whose years end at 9999 (a batch with a longer delay takes the INSERT path)."""

_JSONB_OID = 3802


class Rows(NamedTuple):
    """The jobs to copy, a list per column (an item a job)."""

    job_types: list[str]
    payloads: list[str]
    """JSON text, as `encode_payload` writes it."""
    max_attempts: list[int]
    run_ats: list[datetime | None]
    delays: list[float | None]
    priorities: list[int]
    tracked: list[bool]


async def copy_jobs(
    executor: asyncpg.Pool[Any] | _Connection,
    queue: str,
    rows: Rows,
    trace_context: str | None,
    *,
    notify: bool,
) -> list[int] | None:
    """COPY ``rows`` into ``pgqueue_jobs`` in one transaction; their ids, in order.

    On a connection already in a transaction, the rows ride it; else they
    take one of their own (on a connection of the pool). With ``notify``,
    the queue's workers are woken when it commits.

    Returns None, having written nothing, when the connection encodes
    jsonb with a codec of its own (its encoder would get the JSON text), or
    its role may not insert ids (a producer's grants, `pgqueue.grants`): the
    caller takes the INSERT path.
    """
    if isinstance(executor, asyncpg.Pool):
        async with executor.acquire() as connection:
            return await copy_jobs(
                connection, queue, rows, trace_context, notify=notify
            )
    settings = executor.get_settings()
    if settings.get_data_codec(_JSONB_OID) is not settings.get_data_codec(
        _JSONB_OID, ignore_custom_codec=True
    ):
        return None
    if executor.is_in_transaction():
        return await _copy(executor, queue, rows, trace_context, notify)
    async with executor.transaction():
        return await _copy(executor, queue, rows, trace_context, notify)


async def _copy(
    connection: _Connection,
    queue: str,
    rows: Rows,
    trace_context: str | None,
    notify: bool,
) -> list[int] | None:
    """`copy_jobs` on a connection in a transaction."""
    count = len(rows.job_types)
    reserved = await connection.fetchrow(RESERVE_IDS, count)
    assert reserved is not None
    packed, now, may_copy = reserved
    if not may_copy:
        return None
    ids = list(struct.unpack(f">{count}q", packed))
    records = zip(
        ids,
        repeat(queue),
        rows.job_types,
        rows.payloads,
        rows.max_attempts,
        _run_ats(rows, now),
        rows.priorities,
        rows.tracked,
        repeat(trace_context),
        strict=False,
    )
    await connection.copy_records_to_table(
        COPY_TABLE, records=records, columns=COPY_COLUMNS
    )
    if notify:
        await connection.execute(NOTIFY_JOBS, queue)
    return ids


def _run_ats(rows: Rows, now: datetime) -> list[datetime]:
    """Each job's run_at: its own, or ``now`` plus its delay (as PostgreSQL adds one), or ``now``."""
    if not any(delay is not None for delay in rows.delays):
        return [now if run_at is None else run_at for run_at in rows.run_ats]
    # make_interval(secs => d) is rint(d * 1e6) microseconds.
    return [
        run_at
        if run_at is not None
        else now
        if delay is None
        else now + timedelta(microseconds=round(delay * 1_000_000))
        for run_at, delay in zip(rows.run_ats, rows.delays, strict=True)
    ]
