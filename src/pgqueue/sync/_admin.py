"""`Admin`: the read side of `pgqueue.Admin`, on a psycopg connection."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from pgqueue import JobInfo, JobSummary
from pgqueue._extension import (
    STEPS_SHOWN,
    admin_statements,
    check_job_id,
    check_name,
    check_queue_name,
    completed_estimated,
    dashboard_statements,
    durable_details,
    durable_view_statements,
    job_info,
    listing,
    listing_statements,
    queue_stats,
)
from pgqueue.sync._statements import fetch, fetch_dicts

if TYPE_CHECKING:
    import psycopg

    from pgqueue import QueueStats

__all__ = ["Admin"]


class Admin:
    """Read the jobs of every queue: stats, listings, one job, the dead.

    The synchronous twin of `pgqueue.Admin`'s read side: the same
    statements, checks and dataclasses. Calls run on ``connection`` (in its
    transaction, if one is open); it is borrowed, never closed.

    Usage::

        admin = pgqueue.sync.Admin(conn)
        for stats in admin.stats():
            print(stats.queue, stats.ready, stats.dead)

    .. versionadded:: 0.1
    """

    __slots__ = ("_connection",)

    def __init__(self, connection: psycopg.Connection[Any]) -> None:
        self._connection = connection

    def stats(self, queue: str | None = None) -> list[QueueStats]:
        """Count each queue's jobs by state, sorted by queue name: `pgqueue.Admin.stats`.

        Raises:
            SchemaError: the table is missing or lacks a column.
        """
        name = None if queue is None else check_queue_name(queue)
        conn = self._connection
        rows = fetch(conn, listing_statements.STATS, (name,))
        table = fetch_dicts(conn, listing_statements.STATS_TABLE, ())[0]
        completed = (
            None
            if completed_estimated(table)
            else fetch_dicts(conn, listing_statements.STATS_COMPLETED, (name,))
        )
        slots = (
            fetch_dicts(conn, listing_statements.STATS_LIMITS, (name,))
            if table["has_limits"]
            else []
        )
        paused = (
            fetch_dicts(conn, admin_statements.PAUSED, (name,))
            if table["has_paused"]
            else []
        )
        return queue_stats(name, rows, table, completed, slots, paused)

    def jobs(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        job_type: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
        after_id: int | None = None,
    ) -> list[JobInfo]:
        """List jobs, newest first, every column read: `pgqueue.Admin.jobs`.

        Raises:
            TypeError, ValueError: as `pgqueue.Admin.jobs`.
            SchemaError: the table is missing or lacks a column.
        """
        statement, args = listing(
            listing_statements.jobs_query,
            queue,
            status,
            job_type,
            limit,
            before_id,
            after_id,
        )
        rows = fetch_dicts(self._connection, statement, args)
        if after_id is not None:
            rows.reverse()
        return [job_info(row) for row in rows]

    def job_summaries(
        self,
        *,
        queue: str | None = None,
        status: str | None = None,
        job_type: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
        after_id: int | None = None,
    ) -> list[JobSummary]:
        """List jobs as `jobs` does, without their payloads and results: `pgqueue.Admin.job_summaries`."""
        statement, args = listing(
            dashboard_statements.shown_summaries_query,
            queue,
            status,
            job_type,
            limit,
            before_id,
            after_id,
        )
        rows = fetch_dicts(self._connection, statement, args)
        if after_id is not None:
            rows.reverse()
        return [JobSummary(**row) for row in rows]

    def job(self, job_id: int) -> JobInfo | None:
        """One job, or None if no job has that id: `pgqueue.Admin.job`.

        With a durable handler's steps, signals, wait and progress, as
        `pgqueue.Admin.job` reads them.

        Raises:
            TypeError, ValueError: an id that is not a positive int.
            SchemaError: the table is missing or lacks a column.
        """
        checked = check_job_id(job_id)
        rows = fetch_dicts(self._connection, listing_statements.JOB, (checked,))
        if not rows:
            return None
        durable = fetch_dicts(
            self._connection,
            durable_view_statements.JOB_DURABLE,
            (checked, STEPS_SHOWN),
        )
        return dataclasses.replace(
            job_info(rows[0]), **durable_details(durable[0] if durable else None)
        )

    def dead_count(
        self, *, queue: str | None = None, job_type: str | None = None
    ) -> int:
        """Count the dead jobs, of a queue and type if given: `pgqueue.Admin.dead_count`.

        Raises:
            TypeError, ValueError: an empty or NUL-holding name.
            SchemaError: the table is missing or lacks a column.
        """
        name = None if queue is None else check_queue_name(queue)
        kind = None if job_type is None else check_name("job type", job_type)
        count: int = fetch(self._connection, admin_statements.DEAD_COUNT, (name, kind))[
            0
        ][0]
        return count

    def __repr__(self) -> str:
        return "pgqueue.sync.Admin()"
