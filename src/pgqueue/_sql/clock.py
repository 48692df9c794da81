"""Tests' time: `ADVANCE` moves what is due forward (`pgqueue.testing.advance`), `JOB_STATUS` reads one job's status (`pgqueue.testing.wait_for`).

Nothing here is used by a worker or a producer: a test moves the jobs,
not the clock, so the workers, the claims and the database's ``now()``
stay as they are.
"""

from __future__ import annotations

from pgqueue._sql.channels import JOBS_CHANNEL
from pgqueue._sql.statuses import PENDING, WAITING

__all__ = ["ADVANCE", "ADVANCE_STARTS", "JOB_STATUS"]

# $1 seconds, $2 the queues (NULL: every queue). Pending jobs (due later:
# delayed, retried after a back-off, snoozed) and waiting ones come $1
# seconds sooner; the grouped ones' heads follow through the trigger
# pgqueue_group_pending (a distributed schema finds them by a skip scan).
# Each queue moved gets a wakeup, as an enqueue would send; returns how
# many jobs moved.
ADVANCE = f"""
WITH moved AS (
    UPDATE pgqueue_jobs SET run_at = run_at - $1::float8 * interval '1 second'
    WHERE status IN ({PENDING}, {WAITING})
      AND ($2::text[] IS NULL OR queue = ANY ($2::text[]))
    RETURNING queue
), queues AS (
    SELECT queue, pg_catalog.count(*) AS jobs FROM moved GROUP BY queue
), woken AS (
    SELECT pg_catalog.pg_notify('{JOBS_CHANNEL}', queue) FROM queues
)
SELECT coalesce(pg_catalog.sum(jobs), 0)::bigint AS moved,
       (SELECT pg_catalog.count(*) FROM woken) AS woken
FROM queues
"""

# The starts of rate-limited queues come $1 seconds sooner too: a window
# the test advanced past holds none of them.
ADVANCE_STARTS = """
UPDATE pgqueue_starts SET started_at = started_at - $1::float8 * interval '1 second'
WHERE $2::text[] IS NULL OR queue = ANY ($2::text[])
"""

JOB_STATUS = "SELECT status FROM pgqueue_jobs WHERE id = $1"
