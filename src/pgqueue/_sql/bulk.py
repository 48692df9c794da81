"""What operators do to the jobs a filter matches: find them, count them, delete, move, update one.

The bulk actions walk the matches in id order, a batch of ids at a time
(`matching_ids`), and act on each batch by id with a statement that locks
the rows and tests their status again: a job claimed since it was found is
running by then and left alone (running jobs are never moved or deleted).
Retry and cancel reuse `pgqueue._sql.admin`'s statements by id.
"""

from __future__ import annotations

from pgqueue._sql.admin import DELETES_EDGES, KEEPS_NO_CHILD
from pgqueue._sql.statuses import LIVE, PENDING, RUNNING, WAITING

__all__ = [
    "DELETE",
    "DISTRIBUTED_DELETE",
    "DISTRIBUTED_UPDATE",
    "MOVE",
    "UPDATE",
    "matching_count",
    "matching_ids",
]


def matching_ids(condition: str) -> str:
    """The next $2 ids past $1 whose rows match ``condition`` (its parameters from $3), in id order."""
    return f"""
SELECT id FROM pgqueue_jobs
WHERE {condition} AND id > $1
ORDER BY id
LIMIT $2
"""


def matching_count(condition: str) -> str:
    """How many rows match ``condition`` (its parameters from $2), counting at most $1 (NULL: all)."""
    return f"""
SELECT pg_catalog.count(*)::int8 FROM (
    SELECT 1 FROM pgqueue_jobs WHERE {condition} LIMIT $1
) AS matched
"""


def _delete(*, distributed: bool) -> str:
    """Delete the jobs $1 that are not running (on Citus, of queue $2); returns how many went.

    A parent stays while a child of it has not finished (its result is
    that child's ``parent_results``); a deleted child's edges go with it.
    """
    if distributed:
        of_queue, kept, returning, edges = "queue = $2 AND ", "", "id", ""
    else:
        of_queue = ""
        kept = f"\n      AND {KEEPS_NO_CHILD}"
        returning = "id, parents_left"
        edges = DELETES_EDGES
    return f"""
WITH gone AS (
    DELETE FROM pgqueue_jobs
    WHERE {of_queue}id = ANY($1::text::bigint[])
      AND status <> {RUNNING}{kept}
    RETURNING {returning}
){edges}
SELECT pg_catalog.count(*)::int8 FROM gone
"""


DELETE = _delete(distributed=False)
DISTRIBUTED_DELETE = _delete(distributed=True)

# Move the jobs $1 that are not running into queue $2 (run_at is set to
# itself, so that a grouped pending job's head is made in its new queue by
# the pgqueue_group_pending trigger). A job whose live unique key the new
# queue holds already (or another job of this call does: the newest moves)
# stays. The new queue's workers are woken when a pending job came. Returns
# how many moved. Citus distributes by queue: it has no MOVE.
MOVE = f"""
WITH found AS (
    SELECT id, job_type, status, unique_key FROM pgqueue_jobs
    WHERE id = ANY($1::text::bigint[]) AND status <> {RUNNING} AND queue <> $2
    FOR UPDATE
), eligible AS (
    SELECT f.id,
           f.unique_key IS NULL OR f.status NOT IN ({PENDING}, {WAITING}) OR (
               pg_catalog.row_number() OVER (PARTITION BY f.job_type, f.unique_key, f.status ORDER BY f.id DESC) = 1
               AND NOT EXISTS (
                   SELECT 1 FROM pgqueue_jobs AS live
                   WHERE live.queue = $2 AND live.job_type = f.job_type AND live.unique_key = f.unique_key
                     AND CASE WHEN f.status = {WAITING} THEN live.status = {WAITING} ELSE live.status IN {LIVE} END
               )
           ) AS free
    FROM found AS f
), moved AS (
    UPDATE pgqueue_jobs AS j
    SET queue = $2, run_at = j.run_at, updated_at = pg_catalog.now()
    FROM eligible AS e
    WHERE j.id = e.id AND e.free
    RETURNING j.id, j.status
)
SELECT (SELECT pg_catalog.count(*) FROM moved)::int8 AS moved,
       CASE WHEN EXISTS (SELECT 1 FROM moved WHERE status = {PENDING})
            THEN pg_catalog.pg_notify('pgqueue_jobs', $2) END AS notified
"""


# Admin.update: change job $1 if it is pending or waiting, each field given
# (NULL: kept): payload $2 (JSON text), priority $3, run_at $4, group $5,
# max_attempts $6. The row is locked first, so a claim that commits
# meanwhile is seen: the job is then running, and nothing is written.
# run_at is always set (to itself when not given), so that a grouped
# pending job's head follows (pgqueue_group_pending). A job with parents
# takes no group. Returns the status found (no row: no such job), whether it
# was changed, and wakes the queue's workers for a pending job changed.
def _update(*, distributed: bool) -> str:
    """UPDATE; on Citus, of the job $1 in queue $7, its wakeup sent by the caller."""
    if distributed:
        of_queue = "queue = $7 AND "
        notified = f"c.status = {PENDING} AS wake"
    else:
        of_queue = ""
        notified = f"CASE WHEN c.status = {PENDING} THEN pg_catalog.pg_notify('pgqueue_jobs', c.queue) END AS notified"
    return f"""
WITH found AS (
    SELECT id, status, parents_left FROM pgqueue_jobs WHERE {of_queue}id = $1 FOR UPDATE
), changed AS (
    UPDATE pgqueue_jobs AS j
    SET payload      = coalesce($2::text::jsonb, j.payload),
        priority     = coalesce($3::int2, j.priority),
        run_at       = coalesce($4::timestamptz, j.run_at),
        group_key    = coalesce($5::text, j.group_key),
        max_attempts = coalesce($6::int4, j.max_attempts),
        updated_at   = pg_catalog.now()
    FROM found AS f
    WHERE {of_queue.replace("queue", "j.queue")}j.id = f.id AND f.status IN ({PENDING}, {WAITING})
      AND ($5::text IS NULL OR f.parents_left IS NULL)
    RETURNING j.id, j.queue, j.status
)
SELECT f.status, c.id IS NOT NULL AS changed, f.parents_left IS NOT NULL AS has_parents,
       {notified}
FROM found AS f LEFT JOIN changed AS c ON c.id = f.id
"""


UPDATE = _update(distributed=False)
DISTRIBUTED_UPDATE = _update(distributed=True)
