"""Periodic jobs: one row per schedule in ``pgqueue_periodic``, its last tick run.

Every worker that registers a schedule computes its ticks (in Python, from
the database's clock) and runs PERIODIC_TICK for each tick that falls due;
the statement that advances the row inserts the job, so however many
workers race for one tick, one advances the row and inserts the job and
the others change nothing. No leader is elected.
"""

from __future__ import annotations

from pgqueue._sql.statuses import LIVE
from pgqueue._sql.tables import LIVE_KEY

__all__ = [
    "DISTRIBUTED_PERIODIC_REGISTER",
    "DISTRIBUTED_TICK_ADVANCE",
    "DISTRIBUTED_TICK_JOB",
    "DISTRIBUTED_TICK_LIVE",
    "DISTRIBUTED_TICK_NEW",
    "DISTRIBUTED_TICK_SEEN",
    "PERIODIC_LIST",
    "PERIODIC_NOW",
    "PERIODIC_REGISTER",
    "PERIODIC_REMOVE",
    "PERIODIC_TABLE_EXISTS",
    "PERIODIC_TICK",
]

# The database's clock, as the schedulers read it.
PERIODIC_NOW = "SELECT pg_catalog.now() AS now"


# Register schedule $1 (written $2, in zone $3) of jobs of type $5 on queue
# $4: a new row remembers when it was first seen ($7, the schedulers'
# clock), so that no tick before that runs; an existing row keeps its last
# tick and takes the new definition. $6: the next tick, for listings. On
# Citus, which refuses now() in ON CONFLICT DO UPDATE, the update takes the
# row's time.
def _register(updated_at: str) -> str:
    return f"""
INSERT INTO pgqueue_periodic AS p (name, schedule, timezone, queue, job_type, next_tick, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, pg_catalog.now())
ON CONFLICT (name) DO UPDATE
SET schedule = EXCLUDED.schedule, timezone = EXCLUDED.timezone, queue = EXCLUDED.queue,
    job_type = EXCLUDED.job_type, next_tick = EXCLUDED.next_tick, updated_at = {updated_at}
"""


PERIODIC_REGISTER = _register("pg_catalog.now()")
DISTRIBUTED_PERIODIC_REGISTER = _register("EXCLUDED.updated_at")

# Run tick $6 of schedule $1 (defined as in PERIODIC_REGISTER; $7 its next
# tick, $8 the schedulers' clock): advance the schedule's last tick to $6
# and, only if this statement advanced it, insert the job (payload $9,
# max_attempts $10, unique key $12: 'periodic:<name>@<tick>') and wake its
# queue. With $11 (unique), the tick is skipped (advanced, no job) while
# the schedule's last job is pending or running: the job it inserted
# itself (last_job_id, its id reserved before the insert), never another
# job that carries the same key (a schedule's key can be forged by a
# producer with the right to insert rows; only rows of its own count). A
# row from before last_job_id (NULL) is checked by its key, once. A row
# removed meanwhile is made again, with this tick run.
#
# The row is advanced only from the last tick this statement's snapshot
# saw (a compare-and-set): the row lock serializes racing statements, and
# one that waited for another's commit sees a last tick it did not expect
# and changes nothing (the caller runs it again, with a new snapshot, if
# its tick is still after done_until). So the snapshot in which the last
# job's status is read is one in which that job is visible. The unique
# index also refuses a second live job of one tick.
PERIODIC_TICK = f"""
WITH seen AS (
    SELECT last_tick, created_at, last_job_id, last_job_key FROM pgqueue_periodic WHERE name = $1
), live AS (
    SELECT $11 AND coalesce((
        SELECT CASE WHEN s.last_job_id IS NOT NULL
                    THEN EXISTS (SELECT FROM pgqueue_jobs AS j
                                 WHERE j.id = s.last_job_id AND j.status IN {LIVE})
                    ELSE EXISTS (SELECT FROM pgqueue_jobs AS j
                                 WHERE j.queue = $4 AND j.job_type = $5 AND j.unique_key = s.last_job_key
                                   AND j.status IN {LIVE})
               END
        FROM seen AS s
    ), false) AS live
), reserved AS MATERIALIZED (
    SELECT pg_catalog.nextval(pg_catalog.pg_get_serial_sequence('pgqueue_jobs', 'id')) AS id
), advanced AS (
    INSERT INTO pgqueue_periodic AS p
        (name, schedule, timezone, queue, job_type, last_tick, next_tick, last_job_key,
         last_job_id, created_at, updated_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $12, (SELECT id FROM reserved), $8, pg_catalog.now())
    ON CONFLICT (name) DO UPDATE
    SET last_tick = EXCLUDED.last_tick, next_tick = EXCLUDED.next_tick, updated_at = pg_catalog.now(),
        last_job_key = CASE WHEN (SELECT live FROM live) THEN p.last_job_key
                            ELSE EXCLUDED.last_job_key END,
        last_job_id  = CASE WHEN (SELECT live FROM live) THEN p.last_job_id
                            ELSE EXCLUDED.last_job_id END
    WHERE coalesce(p.last_tick, p.created_at) < EXCLUDED.last_tick
      AND p.last_tick IS NOT DISTINCT FROM (SELECT last_tick FROM seen)
    RETURNING last_job_id = (SELECT id FROM reserved) AS enqueue
), job AS (
    INSERT INTO pgqueue_jobs (id, queue, job_type, payload, max_attempts, unique_key)
    SELECT (SELECT id FROM reserved), $4, $5, $9::text::jsonb, $10, $12
    FROM advanced
    WHERE advanced.enqueue
    ON CONFLICT {LIVE_KEY}
    DO NOTHING
    RETURNING id
)
SELECT EXISTS (SELECT FROM advanced) AS advanced,
       (SELECT coalesce(last_tick, created_at) FROM seen) AS done_until,
       (SELECT id FROM job) AS job_id,
       (SELECT pg_catalog.pg_notify('pgqueue_jobs', $4) WHERE EXISTS (SELECT FROM job))
"""

PERIODIC_LIST = """
SELECT name, schedule, timezone, queue, job_type, last_tick, next_tick, created_at, updated_at
FROM pgqueue_periodic
ORDER BY name
"""

PERIODIC_REMOVE = "DELETE FROM pgqueue_periodic WHERE name = $1 RETURNING name"

PERIODIC_TABLE_EXISTS = "SELECT pg_catalog.to_regclass('pgqueue_periodic') IS NOT NULL"

# PERIODIC_TICK on Citus, in steps in one transaction (pgqueue_periodic is a
# reference table, the job lives on its queue's shard): the schedule's row
# $1, locked (none: it is made, as PERIODIC_REGISTER with last_tick $6 and
# no last job, or another scheduler made it first); whether its last job
# (id $4 on queue $1; for a row from before last_job_id, type $2 and key
# $3) is still pending or running; the job inserted (as the tick's: queue
# $1, type $2, payload $3, attempts $4, key $5) unless one with its key is
# live; the row advanced to tick $2 (next $3) with its last job's key $4
# and id $5 (NULL keeps them).
DISTRIBUTED_TICK_SEEN = """
SELECT last_tick, created_at, last_job_key, last_job_id FROM pgqueue_periodic WHERE name = $1 FOR UPDATE
"""
DISTRIBUTED_TICK_NEW = """
INSERT INTO pgqueue_periodic
    (name, schedule, timezone, queue, job_type, last_tick, next_tick, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, pg_catalog.now())
ON CONFLICT (name) DO NOTHING
RETURNING true
"""
DISTRIBUTED_TICK_LIVE = f"""
SELECT EXISTS (SELECT FROM pgqueue_jobs
               WHERE queue = $1 AND status IN {LIVE}
                 AND (id = $4 OR $4::int8 IS NULL AND job_type = $2 AND unique_key = $3))
"""
DISTRIBUTED_TICK_ADVANCE = """
UPDATE pgqueue_periodic
SET last_tick = $2, next_tick = $3, last_job_key = coalesce($4, last_job_key),
    last_job_id = coalesce($5, last_job_id), updated_at = pg_catalog.now()
WHERE name = $1
"""
DISTRIBUTED_TICK_JOB = f"""
INSERT INTO pgqueue_jobs (queue, job_type, payload, max_attempts, unique_key)
VALUES ($1, $2, $3::text::jsonb, $4, $5)
ON CONFLICT {LIVE_KEY}
DO NOTHING
RETURNING id
"""
