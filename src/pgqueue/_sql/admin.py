"""What operators do to jobs and queues: cancel, retry, prune, pause.

On Citus each write names its queue, found first for the calls that give
only ids (QUEUES_OF), and its wakeups are sent from the coordinator
(`pgqueue._sql.channels.NOTIFY`).
"""

from __future__ import annotations

from pgqueue._sql.statuses import (
    CANCELLED,
    COMPLETED,
    DEAD,
    ENDED,
    FAILED,
    LIVE,
    PARKED,
    PENDING,
    RUNNING,
    UNFINISHED,
    WAITING,
)

__all__ = [
    "CANCEL",
    "DEAD_COUNT",
    "DISTRIBUTED_CANCEL",
    "DISTRIBUTED_PRUNE",
    "DISTRIBUTED_PRUNE_BATCH",
    "DISTRIBUTED_RETRY",
    "FINISHED_QUEUES",
    "KEEPS_NO_CHILD",
    "PAUSE",
    "PAUSED",
    "PRUNE",
    "PRUNE_BATCH",
    "PRUNE_BATCH_ANY",
    "PRUNE_ORPHAN_EDGES",
    "QUEUES_OF",
    "REDRIVE",
    "RESUME",
    "RETRY",
    "RETRYABLE_IDS",
    "RETRY_CHILDREN",
]


# Cancel the jobs $1: pending, waiting and parked ones at once (no worker claims
# them, Go's included; a waiting job's own waiting children are cancelled
# by the pgqueue_parent_ended trigger), running ones by request
# (cancel_requested, and a control NOTIFY to the worker running them). Each
# id comes back with what was done: cancelled, requested, finished (already
# completed, dead or cancelled: nothing written) or not_found. Locked
# first, so a claim that commits meanwhile is seen: the row is then
# running. On Citus, the jobs $1 of queue $2, and each row's NOTIFY comes
# back as the channel to send it on; a job cancelled that a durable
# handler waited for comes back ``waited``, for the caller to wake the jobs
# waiting for it.
def _cancel(*, distributed: bool) -> str:
    if distributed:
        found = """MATERIALIZED (
    SELECT id, status, pg_catalog.now() AS now FROM pgqueue_jobs
    WHERE queue = $2 AND id IN (SELECT id FROM wanted) FOR UPDATE
)"""
        now, queue, children = "f.now", "j.queue = $2 AND ", ", j.has_children"
        sent = f"""CASE WHEN c.was = {RUNNING} THEN 'pgqueue_control'
            WHEN c.was = {PENDING} AND c.tracked THEN 'pgqueue_outcomes' END AS channel,
       c.was = {PENDING} AND c.has_children AS waited"""
    else:
        found = "(\n    SELECT id, status FROM pgqueue_jobs WHERE id IN (SELECT id FROM wanted) FOR UPDATE\n)"
        now, queue, children = "pg_catalog.now()", "", ""
        sent = f"""CASE WHEN c.was = {RUNNING} THEN pg_catalog.pg_notify('pgqueue_control', w.id::text)
            WHEN c.was = {PENDING} AND c.tracked THEN pg_catalog.pg_notify('pgqueue_outcomes', w.id::text) END AS notified"""
    return f"""
WITH wanted AS (
    SELECT DISTINCT pg_catalog.unnest($1::text::bigint[]) AS id
), found AS {found}, changed AS (
    UPDATE pgqueue_jobs AS j
    SET status           = CASE WHEN f.status IN ({PENDING}, {WAITING}, {PARKED}) THEN {CANCELLED} ELSE j.status END,
        cancel_requested = j.cancel_requested OR f.status = {RUNNING},
        last_error       = CASE WHEN f.status IN ({PENDING}, {WAITING}, {PARKED}) THEN 'cancelled by request' ELSE j.last_error END,
        updated_at       = CASE WHEN f.status IN ({PENDING}, {WAITING}, {PARKED}) THEN {now} ELSE j.updated_at END
    FROM found AS f
    WHERE {queue}j.id = f.id AND f.status IN ({PENDING}, {WAITING}, {PARKED}, {RUNNING})
    RETURNING j.id, CASE WHEN f.status IN ({WAITING}, {PARKED}) THEN {PENDING} ELSE f.status END AS was, j.tracked{children}
)
SELECT w.id,
       CASE WHEN c.was = {PENDING} THEN {CANCELLED}
            WHEN c.was = {RUNNING} THEN 'requested'
            WHEN f.id IS NOT NULL THEN 'finished'
            ELSE 'not_found' END AS result,
       {sent}
FROM wanted AS w LEFT JOIN found AS f ON f.id = w.id LEFT JOIN changed AS c ON c.id = w.id
"""


CANCEL = _cancel(distributed=False)
DISTRIBUTED_CANCEL = _cancel(distributed=True)

# Which queue each of the jobs $1 is in (for the calls that give only ids).
QUEUES_OF = "SELECT id, queue FROM pgqueue_jobs WHERE id = ANY($1::text::bigint[])"


# Put dead and cancelled jobs $1 back to pending, due now, with $2 more
# attempts each (NULL: as many as their max_attempts) on top of those they
# used: attempts is never reset, so a stale run of an old attempt stays
# fenced off. A job whose (queue, job_type, unique_key) is held by a live
# job (or by another job of this call: the newest one is retried) is
# skipped. Each id comes back with what was done: retried, duplicate,
# not_retryable (pending, running or completed) or not_found; each queue
# that got jobs back is woken (identical notifications of a transaction are
# sent once). On Citus, the jobs $1 of queue $3, woken by the caller.
# REDRIVE: RETRY into queue $3 (its keys then held in that queue). The
# last parameter ($3 of RETRY, $4 of the others), when true, also clears a
# durable handler's steps, wait and progress (its signals are kept).
def _retry(*, distributed: bool, moving: bool = False) -> str:
    queue_set = ""
    reset = "$4::bool" if distributed or moving else "$3::bool"
    if distributed:
        found, of_queue, live_queue = "found AS MATERIALIZED", "queue = $3 AND ", "$3"
        retried, notified = "j.queue = $3 AND ", ""
        returning = "j.id"
    else:
        found, of_queue, live_queue = (
            "found AS",
            "",
            "$3::text" if moving else "f.queue",
        )
        retried, returning = "", "j.id, j.queue"
        notified = ",\n       CASE WHEN r.id IS NOT NULL THEN pg_catalog.pg_notify('pgqueue_jobs', r.queue) END AS notified"
        if moving:
            queue_set = "\n        queue            = $3,"
    partition = (
        "f.job_type, f.unique_key" if moving else "f.queue, f.job_type, f.unique_key"
    )
    return f"""
WITH wanted AS (
    SELECT DISTINCT pg_catalog.unnest($1::text::bigint[]) AS id
), {found} (
    SELECT id, queue, job_type, status, unique_key
    FROM pgqueue_jobs WHERE {of_queue}id IN (SELECT id FROM wanted)
    FOR UPDATE
), eligible AS (
    SELECT f.id,
           f.unique_key IS NULL OR (
               pg_catalog.row_number() OVER (PARTITION BY {partition} ORDER BY f.id DESC) = 1
               AND NOT EXISTS (
                   SELECT 1 FROM pgqueue_jobs AS live
                   WHERE live.queue = {live_queue} AND live.job_type = f.job_type AND live.unique_key = f.unique_key
                     AND live.unique_key IS NOT NULL AND live.status IN {LIVE}
               )
           ) AS free
    FROM found AS f
    WHERE f.status IN {FAILED}
), retried AS (
    UPDATE pgqueue_jobs AS j
    SET status           = {PENDING},{queue_set}
        run_at           = pg_catalog.now(),
        updated_at       = pg_catalog.now(),
        max_attempts     = least(2147483647,
                                 j.attempts::int8 + coalesce($2::int8, j.max_attempts::int8))::int,
        cancel_requested = false,
        steps            = CASE WHEN {reset} THEN NULL ELSE j.steps END,
        wait             = CASE WHEN {reset} THEN NULL ELSE j.wait END,
        progress         = CASE WHEN {reset} THEN NULL ELSE j.progress END
    FROM eligible AS e
    WHERE {retried}j.id = e.id AND e.free
    RETURNING {returning}
)
SELECT w.id,
       CASE WHEN r.id IS NOT NULL THEN 'retried'
            WHEN e.id IS NOT NULL THEN 'duplicate'
            WHEN f.id IS NOT NULL THEN 'not_retryable'
            ELSE 'not_found' END AS result{notified}
FROM wanted AS w
LEFT JOIN found AS f ON f.id = w.id
LEFT JOIN eligible AS e ON e.id = w.id
LEFT JOIN retried AS r ON r.id = w.id
"""


RETRY = _retry(distributed=False)
DISTRIBUTED_RETRY = _retry(distributed=True)
REDRIVE = _retry(distributed=False, moving=True)

# Admin.retry(..., children=True): the cancelled children ($1: jobs just
# retried, or children brought back) of those jobs that were cancelled for
# a parent's failure (on_parent_failure 'cancel') and have no parent dead or
# cancelled now go back to waiting, counting the parents not completed
# (their edges unsettled again). Returns their ids, for the next round.
RETRY_CHILDREN = f"""
WITH kids AS MATERIALIZED (
    SELECT DISTINCT c.id
    FROM pgqueue_dependencies AS d JOIN pgqueue_jobs AS c ON c.id = d.child_id
    WHERE d.parent_id = ANY($1::text::bigint[])
      AND c.status = {CANCELLED} AND c.on_parent_failure = 'cancel'
      AND NOT EXISTS (
          SELECT FROM pgqueue_dependencies AS e JOIN pgqueue_jobs AS p ON p.id = e.parent_id
          WHERE e.child_id = c.id AND p.status IN {FAILED})
), unsettled AS (
    UPDATE pgqueue_dependencies AS e SET settled = false
    FROM kids AS k, pgqueue_jobs AS p
    WHERE e.child_id = k.id AND p.id = e.parent_id AND p.status <> {COMPLETED}
    RETURNING e.child_id
)
UPDATE pgqueue_jobs AS c
SET status       = CASE WHEN n.left_ > 0 THEN {WAITING} ELSE {PENDING} END,
    parents_left = n.left_,
    last_error   = NULL,
    run_at       = pg_catalog.now(),
    updated_at   = pg_catalog.now()
FROM (SELECT k.id, (SELECT pg_catalog.count(*) FROM unsettled AS u WHERE u.child_id = k.id)::int AS left_
      FROM kids AS k) AS n
WHERE c.id = n.id
RETURNING c.id, c.queue, c.status, CASE WHEN c.status = {PENDING} THEN pg_catalog.pg_notify('pgqueue_jobs', c.queue) END
"""

# The next $4 dead (or cancelled: $1) jobs past id $5, of queue $2 and type
# $3 when given, in id order: what retry_all retries next.
RETRYABLE_IDS = f"""
SELECT id FROM pgqueue_jobs
WHERE status IN {FAILED} AND status = $1
  AND ($2::text IS NULL OR queue = $2)
  AND ($3::text IS NULL OR job_type = $3)
  AND id > $5
ORDER BY id
LIMIT $4
"""

# How many dead jobs of queue $1 and type $2 (when given) there are: what
# a retry_all of them would take (the web dashboard's confirmation), read
# through the partial index of dead and cancelled jobs.
DEAD_COUNT = f"""
SELECT pg_catalog.count(*)::int8 FROM pgqueue_jobs
WHERE status IN {FAILED} AND status = {DEAD}
  AND ($1::text IS NULL OR queue = $1)
  AND ($2::text IS NULL OR job_type = $2)
"""

# A row that may go: not a parent of a child that has not finished (its
# result is that child's parent_results). Scalar subqueries, not EXISTS or
# a join: PostgreSQL may run an EXISTS as one hashed pass over every job not
# finished, or a join from the jobs to the edges; this reads the row's
# edges, then each child by its id.
KEEPS_NO_CHILD = f"""NOT (has_children AND coalesce((
          SELECT true FROM pgqueue_dependencies AS d
          WHERE d.parent_id = pgqueue_jobs.id
            AND (SELECT c.status FROM pgqueue_jobs AS c WHERE c.id = d.child_id)
                IN {UNFINISHED}
          LIMIT 1), false))"""

# After a CTE gone (id, parents_left) of deleted rows: the edges of those
# that were children go with them.
DELETES_EDGES = """, edges AS (
    DELETE FROM pgqueue_dependencies
    WHERE child_id IN (SELECT id FROM gone WHERE parents_left IS NOT NULL)
)"""

# The rows retention deletes: finished before $2 seconds ago.
_FINISHED_BEFORE = f"""status IN {ENDED}
          AND updated_at < pg_catalog.now() - pg_catalog.make_interval(secs => $2)"""


# A parent stays while a child of it has not finished (see KEEPS_NO_CHILD);
# a child's edges go with it. Returns how many rows went.
def _prune(*, distributed: bool = False) -> str:
    """Retention of queue $1: its rows finished over $2 seconds ago.

    ``distributed``: on Citus, which has no dependencies, no parent is kept
    for its children and no edge is deleted.
    """
    kept, returning, edges = (
        ("", "id", "")
        if distributed
        else (
            f"\n      AND {KEEPS_NO_CHILD}",
            "id, parents_left",
            DELETES_EDGES,
        )
    )
    return f"""
WITH gone AS (
    DELETE FROM pgqueue_jobs
    WHERE queue = $1
      AND status IN {ENDED}
      AND updated_at < pg_catalog.now() - pg_catalog.make_interval(secs => $2){kept}
    RETURNING {returning}
){edges}
SELECT pg_catalog.count(*)::int FROM gone
"""


PRUNE = _prune()
DISTRIBUTED_PRUNE = _prune(distributed=True)


def _prune_batch(queue_matches: str, *, distributed: bool = False) -> str:
    """PRUNE in a batch: at most $4 rows past id $3 whose queue matches, in id order.

    A sweep walks the table once however many batches it takes, and no batch
    holds a connection (the worker's upkeep, and its heartbeats) for long.
    Rows another session has locked are skipped (the next sweep gets them),
    never waited for. A parent stays while a child of it has not finished
    (its result is the child's ``parent_results``); a child's edges go
    with it. Returns how many rows went and the last id among them.
    ``distributed``: of one queue on Citus ($1), without dependencies.
    """
    if distributed:
        delete, kept, returning, edges = "queue = $1 AND id", "", "id", ""
    else:
        delete, kept, returning = (
            "id",
            f"\n          AND {KEEPS_NO_CHILD}",
            "id, parents_left",
        )
        edges = DELETES_EDGES
    return f"""
WITH gone AS (
    DELETE FROM pgqueue_jobs
    WHERE {delete} = ANY(ARRAY(
        SELECT id
        FROM pgqueue_jobs
        WHERE id > $3 AND {queue_matches}
          AND {_FINISHED_BEFORE}{kept}
        ORDER BY id
        LIMIT $4
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING {returning}
){edges}
SELECT pg_catalog.count(*)::int AS removed, coalesce(pg_catalog.max(id), $3) AS last_id FROM gone
"""


# The retention sweep's, over the worker's queues ($1, a text[]: the one
# array type asyncpg binds without looking it up).
PRUNE_BATCH = _prune_batch("queue = ANY($1::text[])")
# PRUNE_BATCH for one queue ($1) or every queue (NULL).
PRUNE_BATCH_ANY = _prune_batch("($1::text IS NULL OR queue = $1)")
# Retention of one queue ($1, text) on Citus.
DISTRIBUTED_PRUNE_BATCH = _prune_batch("queue = $1", distributed=True)

# Edges whose child row is gone: a Go worker's Prune (Queue.Prune,
# WorkerConfig.Retain) deletes completed and dead rows and knows nothing of
# the edges, which pgqueue's retention deletes with their child. The next
# $2 edges past child id $1, in child id order (the index on child_id), are
# walked; those of them whose child row is gone are deleted, with any other
# edge of those children past the window. Edges other sessions hold (a
# parent's end settling them) are skipped, never waited for: the next sweep
# gets them. An edge whose parent is gone but whose child is not stays: the
# child's parent_results lists that parent (see PARENT_RESULTS). Returns how
# many edges went, how many were walked, and the last child id walked, for
# the next window. A sweep walks every edge once, $2 at a time: with
# pgqueue's retention, the edges of the jobs it keeps.
PRUNE_ORPHAN_EDGES = """
WITH walked AS MATERIALIZED (
    SELECT child_id FROM pgqueue_dependencies
    WHERE child_id > $1
    ORDER BY child_id
    LIMIT $2
), orphans AS MATERIALIZED (
    SELECT d.parent_id, d.child_id
    FROM pgqueue_dependencies AS d
    WHERE d.child_id IN (SELECT DISTINCT w.child_id FROM walked AS w)
      AND NOT EXISTS (SELECT FROM pgqueue_jobs AS j WHERE j.id = d.child_id)
    FOR UPDATE OF d SKIP LOCKED
), gone AS (
    DELETE FROM pgqueue_dependencies AS d
    USING orphans AS o
    WHERE d.parent_id = o.parent_id AND d.child_id = o.child_id
    RETURNING d.child_id
)
SELECT (SELECT pg_catalog.count(*) FROM gone)::int AS removed,
       (SELECT pg_catalog.count(*) FROM walked)::int AS walked,
       coalesce((SELECT pg_catalog.max(child_id) FROM walked), $1) AS last_id
"""

# The queues with finished jobs (Admin.prune of every queue on Citus, which
# then prunes queue by queue).
FINISHED_QUEUES = f"""
SELECT DISTINCT queue FROM pgqueue_jobs WHERE status IN {ENDED}
"""

# Pause and resume a queue ($1). Resuming wakes the queue's workers (they
# listen on pgqueue_jobs); pausing needs no wakeup: every claim checks.
PAUSE = """
INSERT INTO pgqueue_paused (queue) VALUES ($1)
ON CONFLICT (queue) DO NOTHING
RETURNING paused_at
"""
RESUME = """
WITH gone AS (DELETE FROM pgqueue_paused WHERE queue = $1 RETURNING queue)
SELECT g.queue FROM gone AS g, pg_catalog.pg_notify('pgqueue_jobs', g.queue)
"""
# The paused queues ($1: one, or NULL for all) and since when.
PAUSED = """
SELECT queue, paused_at FROM pgqueue_paused
WHERE ($1::text IS NULL OR queue = $1)
ORDER BY queue
"""
