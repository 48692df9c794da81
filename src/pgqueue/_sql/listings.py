"""What the operators' surfaces read: stats, a job, listings, and the dashboard's frames.

Read-only; every statement that reads many rows goes through a partial
index (or a range of the primary key), so a table holding millions of
completed rows costs it nothing.
"""

from __future__ import annotations

from pgqueue._core.lifecycle import FAILED as FAILED_STATUSES
from pgqueue._core.lifecycle import Status
from pgqueue._sql.filters import STATUS_CONDITIONS
from pgqueue._sql.statuses import (
    COMPLETED,
    FAILED,
    PARKED,
    PENDING,
    RUNNING,
    WAITING,
    quoted,
)
from pgqueue._sql.tables import HISTORY_KEPT

__all__ = [
    "ADMIN_INDEXES",
    "DEPENDENCIES",
    "ERROR_LINE_CHARS",
    "FOREIGN_JOBS_PYFORMAT",
    "JOB",
    "JOB_PREVIEW",
    "JOB_PYFORMAT",
    "JOB_STATUSES",
    "JOB_SUMMARY",
    "STATS",
    "STATS_COMPLETED",
    "STATS_LIMITS",
    "STATS_TABLE",
    "SUMMARY_COLUMNS",
    "job_summaries_query",
    "jobs_query",
    "status_counts",
]

ADMIN_INDEXES = ("idx_pgqueue_jobs_failed",)
"""The indexes the operations use (the worker never needs them)."""


# The count of each failed status (dead, cancelled), in STATS.
_FAILED_COUNTS = ",\n           ".join(
    f"pg_catalog.count(*) FILTER (WHERE status = {quoted(status)}) AS {status}"
    for status in FAILED_STATUSES
)


# Per queue: pending jobs due (ready) and not yet due (scheduled), and how
# long the oldest due job has waited (through the claim index); running
# jobs, the earliest claim among them and their stalest heartbeat (through
# the rescue index); dead and cancelled jobs (through the failed index);
# jobs waiting for their parents (through the waiting index); parked jobs
# (through the parked index).
# $1: one queue, or NULL for every queue. Completed jobs are not counted
# here (see STATS_COMPLETED and STATS_TABLE).
def status_counts(matches: str) -> str:
    """The CTEs of STATS's counts (pending, running, failed, waiting, parked), of the queues ``matches`` lets through."""
    return f"""WITH pending AS (
    SELECT queue,
           pg_catalog.count(*) FILTER (WHERE run_at <= pg_catalog.now()) AS ready,
           pg_catalog.count(*) FILTER (WHERE run_at > pg_catalog.now()) AS scheduled,
           extract(epoch FROM pg_catalog.now() - pg_catalog.min(run_at) FILTER (WHERE run_at <= pg_catalog.now()))::float8 AS lag
    FROM pgqueue_jobs
    WHERE status = {PENDING} AND {matches}
    GROUP BY queue
), running AS (
    SELECT queue, pg_catalog.count(*) AS running,
           extract(epoch FROM pg_catalog.now() - pg_catalog.min(coalesce(claimed_at, run_at)))::float8 AS longest_running,
           extract(epoch FROM pg_catalog.now() - pg_catalog.min(updated_at))::float8 AS oldest_heartbeat
    FROM pgqueue_jobs
    WHERE status = {RUNNING} AND {matches}
    GROUP BY queue
), failed AS (
    SELECT queue,
           {_FAILED_COUNTS}
    FROM pgqueue_jobs
    WHERE status IN {FAILED} AND {matches}
    GROUP BY queue
), waiting AS (
    SELECT queue, pg_catalog.count(*) AS waiting
    FROM pgqueue_jobs
    WHERE status = {WAITING} AND {matches}
    GROUP BY queue
), parked AS (
    SELECT queue, pg_catalog.count(*) AS parked
    FROM pgqueue_jobs
    WHERE status = {PARKED} AND {matches}
    GROUP BY queue
)"""


STATS = f"""
{status_counts("($1::text IS NULL OR queue = $1)")}
SELECT queue,
       coalesce(p.ready, 0)::int8, coalesce(p.scheduled, 0)::int8, coalesce(r.running, 0)::int8,
       coalesce(f.dead, 0)::int8, coalesce(f.cancelled, 0)::int8, coalesce(w.waiting, 0)::int8,
       coalesce(k.parked, 0)::int8,
       p.lag, r.longest_running, r.oldest_heartbeat
FROM pending AS p
FULL JOIN running AS r USING (queue)
FULL JOIN failed AS f USING (queue)
FULL JOIN waiting AS w USING (queue)
FULL JOIN parked AS k USING (queue)
ORDER BY queue
"""

# The table's size as the planner knows it: its pages now, its live rows
# (the planner's own estimate: rows per page at the last ANALYZE or VACUUM
# times the pages now; the statistics collector's count, which can lag or
# run ahead of an ANALYZE, only for a table never analyzed), and the share
# of its rows each frequent queue holds (from the last ANALYZE), with what
# is left for the other queues and how many distinct queues there are.
STATS_TABLE = """
WITH size AS (
    SELECT pg_catalog.pg_relation_size('pgqueue_jobs'::regclass)
           / pg_catalog.current_setting('block_size')::int8 AS pages
)
SELECT size.pages,
       CASE WHEN c.relpages > 0 AND c.reltuples >= 0
            THEN (c.reltuples / c.relpages * size.pages)::int8
            ELSE coalesce(s.n_live_tup, 0)
       END AS live,
       q.most_common_vals::text::text[] AS common_queues, q.most_common_freqs, q.n_distinct,
       pg_catalog.to_regclass('pgqueue_limits') IS NOT NULL AND pg_catalog.to_regclass('pgqueue_leases') IS NOT NULL AS has_limits,
       pg_catalog.to_regclass('pgqueue_paused') IS NOT NULL AS has_paused
FROM size, pg_class AS c
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
LEFT JOIN pg_stats AS q
    ON q.schemaname = c.relnamespace::regnamespace::text
   AND q.tablename = c.relname AND q.attname = 'queue'
WHERE c.oid = 'pgqueue_jobs'::regclass
"""

# Each queue with a fleet-wide limit: the slots its workers' unexpired
# leases hold (slots in use) and the limit of the worker that started last. Run only when STATS_TABLE
# found pgqueue_limits (a table without schema v2 has none); one row per
# limited queue.
STATS_LIMITS = """
SELECT l.queue,
       (SELECT coalesce(pg_catalog.sum(e.slots), 0) FROM pgqueue_leases AS e
        WHERE e.queue = l.queue AND e.expires_at >= pg_catalog.now())::int8 AS in_use,
       l.global_limit::int8 AS global_limit
FROM pgqueue_limits AS l
WHERE ($1::text IS NULL OR l.queue = $1)
"""

# An exact count of completed jobs per queue: a scan of the whole table,
# run only when the table is small (see pgqueue.Admin.stats).
STATS_COMPLETED = f"""
SELECT queue, pg_catalog.count(*) AS completed
FROM pgqueue_jobs
WHERE status = {COMPLETED} AND ($1::text IS NULL OR queue = $1)
GROUP BY queue
"""


def _readable(column: str) -> str:
    """``column``, a time Python cannot represent (a BC date, year 10000 on) read as -infinity or infinity.

    asyncpg would fail to decode the whole result (a Go producer may have
    written such a row): the listings and the dashboard must still show it.
    """
    return (
        f"CASE WHEN {column} < '0001-01-01 00:00:00+00' THEN '-infinity'::timestamptz"
        f" WHEN {column} > '9999-12-31 23:59:59.999999+00' THEN 'infinity'::timestamptz"
        f" ELSE {column} END AS {column}"
    )


_JOB_COLUMNS = f"""
    id, queue, job_type, status, attempts, max_attempts, priority, {_readable("run_at")},
    {_readable("created_at")}, {_readable("updated_at")}, {_readable("completed_at")},
    last_error, unique_key, snoozes, cancel_requested,
    payload::text AS payload, result::text AS result,
    errors::text AS errors, snoozed::text AS snoozed, checkpoint::text AS checkpoint
"""

JOB = f"SELECT {_JOB_COLUMNS} FROM pgqueue_jobs WHERE id = $1"

# The same row for DB-API drivers (psycopg, psycopg2 through Django), with a
# pyformat placeholder; times as they are (the driver decodes every year).
JOB_PYFORMAT = """
SELECT id, queue, job_type, status, attempts, max_attempts, priority, run_at,
       created_at, updated_at, completed_at, last_error,
       payload::text AS payload, result::text AS result
FROM pgqueue_jobs WHERE id = CAST(%(id)s AS bigint)
"""

# Whether pgqueue_jobs holds a job of a type other than %(job_type)s: the
# Django migration's reverse drops the table only when it holds none.
FOREIGN_JOBS_PYFORMAT = """
SELECT EXISTS (SELECT 1 FROM pgqueue_jobs WHERE job_type <> CAST(%(job_type)s AS text))
"""

ERROR_LINE_CHARS = 300
"""The most characters of an error's first line a summary carries."""

_SCALAR_COLUMNS = f"""
    id, queue, job_type, status, attempts, max_attempts, priority, {_readable("run_at")},
    {_readable("created_at")}, {_readable("updated_at")}, {_readable("completed_at")},
    unique_key, snoozes, cancel_requested"""

# A job without its payload and result, and only the first line of its
# last error (past leading blank space, with no carriage return), cut to
# ERROR_LINE_CHARS characters: what a listing shows. The error is sliced
# before it is split, so a huge error costs no more than its head to read.
SUMMARY_COLUMNS = f"""{_SCALAR_COLUMNS},
    pg_catalog.left(pg_catalog.rtrim(pg_catalog.split_part(pg_catalog.ltrim(pg_catalog.substr(last_error, 1, 4096), E' \\t\\r\\n'), E'\\n', 1), E'\\r'),
         {ERROR_LINE_CHARS}) AS error_line
"""

# One job's summary (the dashboard's confirmation pages).
JOB_SUMMARY = f"SELECT {SUMMARY_COLUMNS} FROM pgqueue_jobs WHERE id = $1"

# A job's parents and children (Admin.dependencies): the first $2 of each by
# id, each with its status (NULL for a job since deleted), and how many it
# has. Parents through the child index, children through the primary key of
# pgqueue_dependencies; each one's status by the jobs' primary key, so a
# fan-out or fan-in of any size costs $2 lookups and two index-only counts.
# No row when the job $1 has neither.
DEPENDENCIES = """
WITH parents AS (
    SELECT parent_id AS id FROM pgqueue_dependencies
    WHERE child_id = $1
    ORDER BY parent_id
    LIMIT $2
), children AS (
    SELECT child_id AS id FROM pgqueue_dependencies
    WHERE parent_id = $1
    ORDER BY child_id
    LIMIT $2
), related AS (
    SELECT true AS parent, id FROM parents
    UNION ALL
    SELECT false, id FROM children
)
SELECT r.parent, r.id, j.status,
       (SELECT pg_catalog.count(*) FROM pgqueue_dependencies WHERE child_id = $1) AS parents_total,
       (SELECT pg_catalog.count(*) FROM pgqueue_dependencies WHERE parent_id = $1) AS children_total
FROM related AS r
LEFT JOIN pgqueue_jobs AS j ON j.id = r.id
ORDER BY r.parent DESC, r.id
"""


def _history_preview(column: str, detail: str) -> str:
    """The last `HISTORY_KEPT` entries of ``column`` as JSON text, each bounded.

    ``attempt`` is kept only if it is a number and ``at`` cut to 40
    characters; ``detail`` is the entry's own field (its error cut to the
    preview's size). A history written by hand costs no more to read.
    """
    return f"""(
           SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                      'attempt', CASE WHEN pg_catalog.jsonb_typeof(e->'attempt') = 'number' THEN e->'attempt' END,
                      'at', pg_catalog.substr(e->>'at', 1, 40), {detail}) ORDER BY x.n)::text
           FROM pg_catalog.jsonb_array_elements(CASE WHEN pg_catalog.jsonb_typeof({column}) = 'array' THEN {column} END)
                WITH ORDINALITY AS x(e, n)
           WHERE x.n > pg_catalog.jsonb_array_length({column}) - {HISTORY_KEPT} AND pg_catalog.jsonb_typeof(e) = 'object'
       )"""


# One job with its payload and result as JSON text, and its last error,
# each cut to $2 + 1 characters in the database (one more than shown, which
# says it was cut), so a job of any size costs a bounded read.
JOB_PREVIEW = f"""
SELECT {_SCALAR_COLUMNS},
       pg_catalog.substr(payload::text, 1, c.chars) AS payload,
       pg_catalog.substr(result::text, 1, c.chars) AS result,
       pg_catalog.substr(checkpoint::text, 1, c.chars) AS checkpoint,
       pg_catalog.substr(last_error, 1, c.chars) AS last_error,
       {_history_preview("errors", "'error', CASE WHEN pg_catalog.jsonb_typeof(e->'error') = 'string' THEN pg_catalog.substr(e->>'error', 1, c.chars - 1) END")} AS errors,
       {_history_preview("snoozed", "'delay', CASE WHEN pg_catalog.jsonb_typeof(e->'delay') = 'number' THEN e->'delay' END")} AS snoozed
FROM pgqueue_jobs, (SELECT least($2::int8 + 1, 2147483647)::int AS chars) AS c
WHERE id = $1
"""

# Newest first, at most $4 jobs below id $3 (keyset pagination), of queue
# $1 and type $2 when given; or, for the page just newer, oldest first, at
# most $4 jobs above id $3 (always given, so that the primary key is read
# from it on; the caller reverses them). The status is part of the
# statement's text (see `jobs_query`) so that the planner can use the
# partial index that serves it even with a generic plan. For those statuses
# the order is spelled "id + 0", which no index provides: the planner then
# reads the status's rows through its partial index and sorts them, rather
# than walking the primary key through every completed row in the hope of
# meeting a few (with no such row, it would walk the whole table).
_JOBS = """
SELECT {columns}
FROM pgqueue_jobs
WHERE {status}
  AND ($1::text IS NULL OR queue = $1)
  AND ($2::text IS NULL OR job_type = $2)
  AND {where}
  AND {cursor}
ORDER BY {order}{direction}
LIMIT $4
"""
# The listings' filters: by status (pending also by whether it is due).
_STATUS_FILTERS = STATUS_CONDITIONS
JOB_STATUSES = tuple(status for status in _STATUS_FILTERS if status is not None)
"""What `jobs_query` accepts: every status, ``ready`` and ``scheduled`` (pending ones due, or not yet)."""


def jobs_query(status: str | None, *, newer: bool = False, where: str = "true") -> str:
    """The listing of jobs of ``status`` (one of `JOB_STATUSES`, or None for any).

    With ``newer``, the jobs just above a cursor, oldest first. ``where``:
    a filter's further condition (`pgqueue._sql.filters.condition`), its
    parameters from $5.
    """
    return _listing(_JOB_COLUMNS, status, newer=newer, where=where)


def _listing(columns: str, status: str | None, *, newer: bool, where: str) -> str:
    return _JOBS.format(
        columns=columns,
        where=where,
        status=_STATUS_FILTERS[status],
        order="id" if status is None or status == Status.COMPLETED else "id + 0",
        cursor="id > $3::int8" if newer else "($3::int8 IS NULL OR id < $3)",
        direction="" if newer else " DESC",
    )


def job_summaries_query(
    status: str | None, *, newer: bool = False, where: str = "true"
) -> str:
    """`jobs_query`, reading summaries: no payload or result, an error's first line."""
    return _listing(SUMMARY_COLUMNS, status, newer=newer, where=where)
