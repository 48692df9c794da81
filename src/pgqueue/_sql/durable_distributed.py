"""Durable handlers on the distributed schema (Citus): sleeps, waits, their wakeups and ``pgqueue_signal``, on the job's shard.

The same decisions as `pgqueue._sql.durable`'s statements, each naming the
job's queue ($5) so that Citus routes it to one shard, the values their
CASEs pick (and what they return) computed first in a CTE or a subquery
it cannot pull up (``OFFSET 0``): Citus refuses functions that are not
immutable there. A wait for a child is two statements (the child marked on
its shard, then the wait decided on the job's); the child's end wakes the
job through the Citus store (CHILD_WAITERS, DISTRIBUTED_WAKE_WAITERS), not
a trigger.
"""

from __future__ import annotations

from pgqueue._sql.durable import (
    _FENCE,
    _NO_JOB,
    _SIGNAL_CHECKS,
    _SIGNALS_HELD,
    _STEPS,
    _WAKE_AT,
    WAIT_KEYS,
    _deadline,
    _recorded,
    _suspend,
)
from pgqueue._sql.settings import FUNCTION_SETTINGS
from pgqueue._sql.statuses import CANCELLED, ENDED, PARKED, PENDING

__all__ = [
    "CHILD_WAITERS",
    "DISTRIBUTED_MARK_CHILD",
    "DISTRIBUTED_SIGNAL_FUNCTION",
    "DISTRIBUTED_SLEEP",
    "DISTRIBUTED_WAIT_CHILD",
    "DISTRIBUTED_WAIT_SIGNAL",
    "DISTRIBUTED_WAKE_WAITERS",
    "LIVE_OF",
    "PARKED_ON_CHILDREN",
]

# On Citus, of queue $5, the values its CASEs pick computed first (see the
# module's docstring): what every suspending statement there returns, the
# announcement of a tracked job cancelled so coming back as ``ended`` for
# the coordinator to send.
_DISTRIBUTED_SUSPENDED = f"""j.status, extract(epoch FROM j.run_at - o.now)::float8 AS due_in,
          j.tracked AND j.status = {CANCELLED} AS ended"""
_ON_SHARD = f"j.queue = $5 AND {_FENCE}"

# SLEEP on Citus.
DISTRIBUTED_SLEEP = f"""
UPDATE pgqueue_jobs AS j
SET {_suspend(PENDING, "o.wake", "o.wait")}
FROM (
    SELECT w.now, w.wake, pg_catalog.jsonb_build_object('until', w.wake) AS wait
    FROM (SELECT pg_catalog.now() AS now, {_WAKE_AT} AS wake) AS w
    OFFSET 0
) AS o
WHERE {_ON_SHARD}
RETURNING {_DISTRIBUTED_SUSPENDED}
"""


def _distributed_wait(key: str, found: str, there: str, returned: str) -> str:
    """A wait on Citus for $3 (``key`` of its record), on the job's row on its shard, decided as WAIT_SIGNAL and WAIT_CHILD decide.

    ``found``: what the row's lock reads besides its steps, deadline and
    time (``signal``, or ``outcome``: how the child ended); ``there``:
    whether what it waits for has come; ``returned``: the columns of it
    that come back.
    """
    came = "'signalled'" if key == "signal" else "'ended'"
    steps = "d.prior"
    timeout = _recorded(
        f"'{WAIT_KEYS['timeout:' + key]}' || $3::text", "'true'::jsonb", steps
    )
    ended = _recorded(f"'{WAIT_KEYS['child']}' || $3::text", "d.outcome", steps)
    recorded = (
        f"\n                WHEN d.state = 'ended' THEN {ended}"
        if key == "child"
        else ""
    )
    cast = "::int8" if key == "child" else "::text"
    suspended = _suspend(
        f"CASE WHEN o.until IS NULL THEN {PARKED} ELSE {PENDING} END",
        "coalesce(o.until, j.run_at)",
        "o.wait",
        waits="o.state = 'wait'",
    )
    return f"""
WITH cur AS MATERIALIZED (
    SELECT j.id, {_STEPS} AS prior, pg_catalog.now() AS now,
           {_deadline(key)} AS until,
           {found}
    FROM pgqueue_jobs AS j
    WHERE {_ON_SHARD}
    FOR UPDATE
), decided AS (
    SELECT cur.*, CASE WHEN {there} THEN {came}
                       WHEN cur.until <= cur.now THEN 'timeout'
                       ELSE 'wait' END AS state
    FROM cur
)
UPDATE pgqueue_jobs AS j
SET steps      = coalesce(o.steps, j.steps),
    {suspended}
FROM (
    SELECT d.*,
           CASE WHEN d.state = 'timeout' THEN {timeout}{recorded}
                END AS steps,
           pg_catalog.jsonb_build_object('{key}', $3{cast}, 'until', d.until) AS wait
    FROM decided AS d
    OFFSET 0
) AS o
WHERE {_ON_SHARD} AND j.id = o.id
RETURNING o.state, {returned}, {_DISTRIBUTED_SUSPENDED}
"""


# WAIT_SIGNAL on Citus, of queue $5 (the signals are on the job's row).
DISTRIBUTED_WAIT_SIGNAL = _distributed_wait(
    "signal",
    """pg_catalog.jsonb_path_query_first(
               CASE WHEN pg_catalog.jsonb_typeof(j.signals) = 'array' THEN j.signals ELSE '[]'::jsonb END,
               '$[*] ? (@.name == $n)', pg_catalog.jsonb_build_object('n', $3::text)) AS signal""",
    "cur.signal IS NOT NULL",
    "(o.signal -> 'payload')::text AS payload",
)

# The child's half of WAIT_CHILD on Citus, on its shard (queue $2): job $1
# marked has_children (a child ending meanwhile holds its row, and this
# then sees it ended; one ending after sees the mark, and the Citus store
# wakes the jobs waiting for it), and how it ended if it has. No row: no
# job $1.
DISTRIBUTED_MARK_CHILD = f"""
UPDATE pgqueue_jobs AS c SET has_children = true
WHERE c.queue = $2 AND c.id = $1
RETURNING c.status IN {ENDED} AS ended, c.status, c.result::text AS result, c.last_error
"""

# The job's half, after DISTRIBUTED_MARK_CHILD in the same transaction:
# WAIT_CHILD on the shard of queue $5, with how the child ended ($6 its
# status, NULL while it has not; $7 its result, JSON text; $8 its last
# error). No edge: the Citus store finds the jobs waiting for a child that
# ends by their ``wait`` (CHILD_WAITERS).
DISTRIBUTED_WAIT_CHILD = _distributed_wait(
    "child",
    """CASE WHEN $6::text IS NOT NULL
                THEN pg_catalog.jsonb_build_object('status', $6::text, 'result', $7::text::jsonb,
                                                   'error', $8::text) END AS outcome""",
    "cur.outcome IS NOT NULL",
    "o.outcome::text AS outcome",
)

# The jobs that wait for any of the jobs $1 (ids as text) to end, parked
# or pending until a deadline: one read of every shard, through the index
# of such waits (idx_pgqueue_jobs_child_waits, on Citus only).
CHILD_WAITERS = f"""
SELECT id, queue, wait ->> 'child' AS child FROM pgqueue_jobs
WHERE wait ? 'child' AND status IN ({PARKED}, {PENDING}) AND wait ->> 'child' = ANY($1::text[])
"""

# The jobs $2 of queue $1 that wait for one of the jobs $3 (ids as text),
# which ended: pending, due now (as pgqueue_parent_ended makes them on
# plain PostgreSQL). Returns those woken, for the coordinator's wakeup.
DISTRIBUTED_WAKE_WAITERS = f"""
UPDATE pgqueue_jobs AS j
SET status = {PENDING}, run_at = LEAST(j.run_at, o.now), updated_at = o.now
FROM (SELECT pg_catalog.now() AS now OFFSET 0) AS o
WHERE j.queue = $1 AND j.id = ANY($2::text::bigint[]) AND j.status IN ({PARKED}, {PENDING})
  AND j.wait ->> 'child' = ANY($3::text[])
RETURNING j.id
"""

# The safety net of those wakeups (the Citus store's rescue sweep): the
# jobs of queue $1 parked for a child, and the child each waits for; then
# which of those children ($1, ids as text) have not ended (a child that
# ended, or whose row is gone, wakes its job).
PARKED_ON_CHILDREN = f"""
SELECT id, wait ->> 'child' AS child FROM pgqueue_jobs
WHERE queue = $1 AND status = {PARKED} AND wait ? 'child'
"""
LIVE_OF = f"""
SELECT id::text AS id FROM pgqueue_jobs
WHERE id = ANY($1::text::bigint[]) AND status NOT IN {ENDED}
"""


# pgqueue_signal on Citus (SCHEMA_DISTRIBUTED), run on the coordinator: the
# same checks and answers, the job's queue read first (one read of every
# shard), then its row updated on its shard, the time read first too
# (Citus refuses now() in the CASEs of a modifying statement). The wakeup
# is the coordinator's, where the workers listen.
DISTRIBUTED_SIGNAL_FUNCTION = f"""
CREATE OR REPLACE FUNCTION pgqueue_signal(job_id bigint, name text, payload jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
{FUNCTION_SETTINGS}AS $pgqueue_signal$
DECLARE
    q       text;
    woken   boolean;
    held    int;
    at      timestamptz := pg_catalog.now();
BEGIN
{_SIGNAL_CHECKS}    SELECT j.queue INTO q FROM pgqueue_jobs AS j WHERE j.id = pgqueue_signal.job_id;
    IF q IS NOT NULL THEN
        UPDATE pgqueue_jobs AS j
        SET signals = CASE WHEN pg_catalog.jsonb_typeof(j.signals) = 'array' THEN j.signals ELSE '[]'::jsonb END
                      || pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
                             'name', pgqueue_signal.name, 'payload', pgqueue_signal.payload, 'at', at)),
            status  = CASE WHEN j.status = {PARKED} AND j.wait ->> 'signal' = pgqueue_signal.name
                           THEN {PENDING} ELSE j.status END,
            run_at  = CASE WHEN j.status IN ({PARKED}, {PENDING}) AND j.wait ->> 'signal' = pgqueue_signal.name
                                AND j.run_at > at
                           THEN at ELSE j.run_at END,
            updated_at = CASE WHEN j.status = {PARKED} AND j.wait ->> 'signal' = pgqueue_signal.name
                              THEN at ELSE j.updated_at END
        WHERE j.queue = q AND j.id = pgqueue_signal.job_id AND j.status NOT IN {ENDED}
        RETURNING j.status = {PENDING} AND j.wait ->> 'signal' = pgqueue_signal.name,
                  pg_catalog.jsonb_array_length(j.signals)
        INTO woken, held;
    END IF;
    IF held IS NULL THEN
        IF q IS NOT NULL AND EXISTS (SELECT FROM pgqueue_jobs AS j
                                     WHERE j.queue = q AND j.id = pgqueue_signal.job_id) THEN
            RETURN false;
        END IF;
{_NO_JOB}    END IF;
{_SIGNALS_HELD}    RETURN true;
END
$pgqueue_signal$;
"""
