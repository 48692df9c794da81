"""What the operator surfaces read (the dashboards, ``pgqueue top``, the Prometheus collector): bounded whatever the rows hold.

Read-only, and each statement bounded by an index whatever the table
holds, so that a frame every second costs about the same on a table of a
million retained rows as on an empty one. Any client may have written a
row (a Go producer, SQL by hand): names of megabytes and of any character.
Each name is read cut to one character past the longest pgqueue allows (a
name that long was cut), with substr, which detoasts no more than it
returns; and at most $3 queues, those with the most jobs to do, of the
ones the filter lets through.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgqueue._sql.listings import (
    JOB_PREVIEW,
    JOB_SUMMARY,
    SUMMARY_COLUMNS,
    job_summaries_query,
    status_counts,
)
from pgqueue._sql.statuses import COMPLETED, DEAD, RUNNING

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "DASHBOARD_DEAD_SHOWN",
    "DASHBOARD_ENQUEUED_SHOWN",
    "DASHBOARD_NEWEST",
    "DASHBOARD_RUNNING_SHOWN",
    "JOB_PREVIEW_SHOWN",
    "JOB_SUMMARY_SHOWN",
    "PROGRESS_CHARS",
    "READ_KEY_CHARS",
    "READ_NAME_CHARS",
    "READ_QUEUE_CHARS",
    "STATS_TOP",
    "STATS_TOP_COMPLETED",
    "shown_summaries_query",
]

READ_QUEUE_CHARS = 1025
"""The most characters of a queue name an operator surface reads: one past the longest (1,024 bytes)."""
READ_NAME_CHARS = 256
"""The most characters of a job type an operator surface reads: one past the longest (255)."""
READ_KEY_CHARS = 1025
"""The most characters of a unique key an operator surface reads: one past the longest (1,024)."""
PROGRESS_CHARS = 200
"""The most characters of a running job's progress (or checkpoint) a dashboard frame reads."""

_READ_CHARS = {
    "queue": READ_QUEUE_CHARS,
    "job_type": READ_NAME_CHARS,
    "unique_key": READ_KEY_CHARS,
}

_SUMMARY_NAMES = (
    "id", "queue", "job_type", "status", "attempts", "max_attempts", "priority",
    "run_at", "created_at", "updated_at", "completed_at", "unique_key", "snoozes",
    "cancel_requested", "error_line",
)  # fmt: skip
"""The columns of a summary (SUMMARY_COLUMNS), by name."""
_PREVIEW_NAMES = (
    *_SUMMARY_NAMES[:-1], "payload", "result", "checkpoint", "last_error", "errors", "snoozed",
)  # fmt: skip
"""The columns of JOB_PREVIEW, by name."""


def _names_cut(statement: str, columns: Iterable[str], order: str = "") -> str:
    """``statement``'s rows (``columns``) with the queue, job type and unique key cut to `_READ_CHARS`.

    The cut applies to the rows ``statement`` returns: the names are read
    whole by nothing (a toasted name stays a pointer until substr reads its
    head).
    """
    shown = ", ".join(
        f"pg_catalog.substr(r.{name}, 1, {_READ_CHARS[name]}) AS {name}"
        if name in _READ_CHARS
        else f"r.{name}"
        for name in columns
    )
    return f"SELECT {shown} FROM ({statement}) AS r{order}"


def shown_summaries_query(
    status: str | None, *, newer: bool = False, where: str = "true"
) -> str:
    """`job_summaries_query`, its names cut (`_READ_CHARS`): what a listing shows."""
    order = " ORDER BY r.id" + ("" if newer else " DESC")
    return _names_cut(
        job_summaries_query(status, newer=newer, where=where), _SUMMARY_NAMES, order
    )


# One job's summary and preview, their names cut (the dashboard's job and
# confirmation pages).
JOB_SUMMARY_SHOWN = _names_cut(JOB_SUMMARY, _SUMMARY_NAMES)
JOB_PREVIEW_SHOWN = _names_cut(JOB_PREVIEW, _PREVIEW_NAMES)

# The newest id (a backward step on the primary key) and the database's
# clock, which times the rates.
DASHBOARD_NEWEST = "SELECT coalesce(pg_catalog.max(id), 0)::int8 AS newest, pg_catalog.now() AS now FROM pgqueue_jobs"

# Which queues a frame shows: those named in $1 (NULL: any) whose name holds
# $2 (NULL: any).
_SHOWN_FILTER = (
    "($1::text[] IS NULL OR queue = ANY($1)) "
    "AND ($2::text IS NULL OR pg_catalog.strpos(queue, $2) > 0)"
)


# STATS of the queues the filter lets through, the $3 with the most jobs to
# do (waiting, ready, scheduled and running; then the most dead; then by
# name), and how many queues the filter let through in all (matched). The
# queues in $4 are counted even without a job (paused queues, queues named
# by the caller, those the planner's statistics say hold completed jobs).
# Every status's rows come through its index, as in STATS; only the $3
# rows leave the server. With ``completed``, each queue's completed jobs
# are counted too, by a scan of the table (a small one: see
# pgqueue.Admin.stats).
def _stats_top(*, completed: bool) -> str:
    count_completed = (
        f""", completed AS (
    SELECT queue, pg_catalog.count(*) AS completed
    FROM pgqueue_jobs
    WHERE status = {COMPLETED} AND {_SHOWN_FILTER}
    GROUP BY queue
)"""
        if completed
        else ""
    )
    return f"""
{status_counts(_SHOWN_FILTER)}{count_completed}, listed AS (
    SELECT DISTINCT queue FROM pg_catalog.unnest($4::text[]) AS x(queue)
    WHERE {_SHOWN_FILTER}
), counted AS (
    SELECT queue,
           coalesce(p.ready, 0)::int8 AS ready, coalesce(p.scheduled, 0)::int8 AS scheduled,
           coalesce(r.running, 0)::int8 AS running, coalesce(f.dead, 0)::int8 AS dead,
           coalesce(f.cancelled, 0)::int8 AS cancelled, coalesce(w.waiting, 0)::int8 AS waiting,
           coalesce(k.parked, 0)::int8 AS parked,
           p.lag, r.longest_running, r.oldest_heartbeat,
           {"coalesce(c.completed, 0)::int8" if completed else "NULL::int8"} AS completed
    FROM pending AS p
    FULL JOIN running AS r USING (queue)
    FULL JOIN failed AS f USING (queue)
    FULL JOIN waiting AS w USING (queue)
    FULL JOIN parked AS k USING (queue)
    {"FULL JOIN completed AS c USING (queue)" if completed else ""}
    FULL JOIN listed AS l USING (queue)
)
SELECT pg_catalog.substr(queue, 1, {READ_QUEUE_CHARS}) AS queue,
       ready, scheduled, running, dead, cancelled, waiting, parked,
       lag, longest_running, oldest_heartbeat, completed,
       pg_catalog.count(*) OVER () AS matched
FROM counted
ORDER BY waiting + ready + scheduled + running DESC, dead DESC, queue
LIMIT $3
"""


STATS_TOP = _stats_top(completed=False)
STATS_TOP_COMPLETED = _stats_top(completed=True)

# Jobs enqueued per queue shown ($3, named as STATS_TOP names them) with ids
# in ($1, $2]: the rows inserted since the previous frame, a range of the
# primary key.
DASHBOARD_ENQUEUED_SHOWN = f"""
SELECT pg_catalog.substr(queue, 1, {READ_QUEUE_CHARS}) AS queue, pg_catalog.count(*)::int8 AS enqueued
FROM pgqueue_jobs
WHERE id > $1 AND id <= $2 AND pg_catalog.substr(queue, 1, {READ_QUEUE_CHARS}) = ANY($3::text[])
GROUP BY 1
"""

# The $3 jobs running longest of the queues the filter lets through: seconds
# since they were claimed (claimed_at; run_at for a job a Go worker claimed,
# as Admin's longest_running) and since they were last heard from (claimed
# or heartbeat, updated_at), names cut, and their progress: a durable
# handler's (Job.progress: "40% message"), else their checkpoint's JSON
# text, its first PROGRESS_CHARS characters, only when $4 (a dashboard that
# hides payloads reads none). The running rows come
# through the rescue index, and are few (no more than the workers'
# concurrency, plus orphans).
DASHBOARD_RUNNING_SHOWN = f"""
SELECT id, pg_catalog.substr(queue, 1, {READ_QUEUE_CHARS}) AS queue,
       pg_catalog.substr(job_type, 1, {READ_NAME_CHARS}) AS job_type,
       CASE WHEN pg_catalog.isfinite(coalesce(claimed_at, run_at))
            THEN greatest(extract(epoch FROM pg_catalog.now() - coalesce(claimed_at, run_at)), 0)::float8
       END AS running_for,
       CASE WHEN pg_catalog.isfinite(updated_at)
            THEN greatest(extract(epoch FROM pg_catalog.now() - updated_at), 0)::float8 END AS heard_from,
       CASE WHEN $4::bool THEN pg_catalog.substr(coalesce(
           CASE WHEN pg_catalog.jsonb_typeof(progress -> 'fraction') = 'number'
                THEN pg_catalog.round((progress ->> 'fraction')::numeric * 100)::text || '%'
                     || coalesce(' ' || (progress ->> 'message'), '') END,
           checkpoint::text), 1, {PROGRESS_CHARS}) END AS progress
FROM pgqueue_jobs
WHERE status = {RUNNING} AND {_SHOWN_FILTER}
ORDER BY coalesce(claimed_at, run_at), id
LIMIT $3
"""

# The $3 latest dead jobs of the queues the filter lets through, as summaries
# (names cut), newest first, through the index of dead and cancelled jobs.
DASHBOARD_DEAD_SHOWN = _names_cut(
    f"""SELECT {SUMMARY_COLUMNS} FROM pgqueue_jobs
    WHERE status = {DEAD} AND {_SHOWN_FILTER}
    ORDER BY id + 0 DESC LIMIT $3""",
    _SUMMARY_NAMES,
    " ORDER BY r.id DESC",
)
