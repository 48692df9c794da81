"""Durable handlers: their steps, sleeps, waits, signals, child jobs and progress, all on the job's row.

What a durable job keeps is in four columns of ``pgqueue_jobs`` (NULL for
every other job, so they cost the claim and the outcome writes nothing):

- ``steps``: a JSON object, one entry per recorded step,
  ``{"<name>": {"result": <JSON>, "at": <time>}}``. `Job.step` records its
  steps under their names; the library records its own under names that
  start ``pgqueue:`` (``pgqueue:spawn:<name>``: a spawned child's id;
  ``pgqueue:child:<id>``: how a waited-for child ended;
  ``pgqueue:timeout:signal:<name>`` and ``pgqueue:timeout:child:<id>``:
  a wait that timed out), so a replay decides as the first run did.
- ``signals``: a JSON array of the signals sent to the job, oldest first,
  ``{"name", "payload", "at"}``; the first of a name is the one a wait
  returns, later ones are history.
- ``wait``: what the job waits for, or waited for last:
  ``{"signal": <name>, "until": <time or null>}``, ``{"child": <id>,
  "until": ...}``, or ``{"until": <time>}`` (a sleep).
- ``progress``: ``{"fraction", "message", "at"}``, the last `Job.progress`.

A sleep, and a wait with a timeout, leave the job ``pending`` with its
``run_at`` at the wake time (no claim takes it before: the Go module's
neither); a wait without one leaves it ``parked``, a status no claim takes,
until the signal or the child's end makes it pending, due now, with a
wakeup on ``pgqueue_jobs`` (as an enqueue's). Each gives its attempt back,
as a snooze does.

Every write of a run (a step, a sleep, a wait, progress) is fenced like the
outcome writes: on the job's id, the attempt the run claimed, and status
running. A stale run's matches nothing, and the run is told so.

On the distributed schema (Citus) every write of a run names its queue, so
that Citus routes it to the job's shard (the ``DISTRIBUTED_*`` forms). Citus
refuses functions that are not immutable (``now()``, ``jsonb_build_object``)
inside a CASE of a modifying statement and anywhere in its RETURNING: those
forms compute the values first, in a CTE or a subquery it cannot pull up
(``OFFSET 0``), and their CASEs pick them. A wait for a child there is two
statements (the child marked on its shard, then the wait decided on the
job's), and no trigger wakes the job when the child ends: the Citus store
does (`pgqueue._store.citus`). ``pgqueue_signal`` there looks the job's
queue up first, then updates the row on its shard. The sleeps, waits and
``pgqueue_signal`` of Citus are in `pgqueue._sql.durable_distributed`.
"""

from __future__ import annotations

from pgqueue._core.checks import MAX_SIGNAL_BYTES
from pgqueue._sql.settings import FUNCTION_SETTINGS
from pgqueue._sql.statuses import (
    CANCELLED,
    ENDED,
    NOT_RUNNING,
    PARKED,
    PENDING,
)

__all__ = [
    "DISTRIBUTED_PROGRESS",
    "DISTRIBUTED_SPAWN_LOCK",
    "DISTRIBUTED_STEP",
    "FUNCTIONS",
    "JOB_STATE",
    "PROGRESS",
    "PROGRESS_CHANNEL",
    "SIGNAL",
    "SIGNAL_FUNCTION",
    "SLEEP",
    "SPAWN_LOCK",
    "STEP",
    "STEPS",
    "WAIT_CHILD",
    "WAIT_KEYS",
    "WAIT_SIGNAL",
]

PROGRESS_CHANNEL = "pgqueue_progress"
"""Where `Job.progress` is announced: the job's id, fraction and message as JSON."""

# The fence of every write of a run: the job's id ($1), the attempt its run
# claimed ($2), still running (spelled as the outcome writes spell it, so
# the primary key drives the update).
_FENCE = f"j.id = $1 AND j.attempts = $2 AND j.status NOT IN {NOT_RUNNING}"

# The steps object, or an empty one when the column holds anything else
# (written by hand).
_STEPS = "CASE WHEN pg_catalog.jsonb_typeof(j.steps) = 'object' THEN j.steps ELSE '{}'::jsonb END"


def _recorded(name: str, result: str, steps: str = _STEPS) -> str:
    """The steps object (``steps``) with step ``name`` recorded as ``result`` (JSON), now."""
    return (
        f"{steps} || pg_catalog.jsonb_build_object({name}, "
        f"pg_catalog.jsonb_build_object('result', {result}, 'at', pg_catalog.now()))"
    )


# A step's result ($4, JSON text) recorded as step $3 of job $1's run $2.
# It counts as a heartbeat of that run. Returns the time it was recorded.
# On Citus, of queue $5 (and the time read back from the row: it refuses
# now() in a RETURNING).
def _step(queue: str = "") -> str:
    at = "j.updated_at" if queue else "pg_catalog.now()"
    return f"""
UPDATE pgqueue_jobs AS j
SET steps = {_recorded("$3::text", "$4::text::jsonb")},
    updated_at = pg_catalog.now()
WHERE {queue}{_FENCE}
RETURNING {at} AS at
"""


STEP = _step()
DISTRIBUTED_STEP = _step("j.queue = $5 AND ")

# The steps of many runs in one statement (the worker gathers those that
# arrive while one is written): each run's job id ($1), attempt ($2), step
# name ($3) and result ($4, JSON text), a job's several steps merged into
# one update of its row. Rows that still hold their attempt come back with
# when their steps were recorded; a stale run's match nothing.
STEPS = f"""
UPDATE pgqueue_jobs AS j
SET steps = {_STEPS} || o.recorded, updated_at = pg_catalog.now()
FROM (
    SELECT u.id, u.attempts,
           pg_catalog.jsonb_object_agg(u.name, pg_catalog.jsonb_build_object(
               'result', u.result::jsonb, 'at', pg_catalog.now())) AS recorded
    FROM ROWS FROM (pg_catalog.unnest($1::text::bigint[]), pg_catalog.unnest($2::text::int[]),
                    pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::text[]))
        AS u(id, attempts, name, result)
    GROUP BY u.id, u.attempts
) AS o
WHERE j.id = o.id AND j.attempts = o.attempts AND j.status NOT IN {NOT_RUNNING}
RETURNING j.id, o.attempts, pg_catalog.now() AS at
"""


# A step recorded in a transaction that first locked the row with
# SPAWN_LOCK (a child's enqueue and its id, committed together): as STEP.
# On Citus, of queue $4.
def _spawn_lock(queue: str = "") -> str:
    return f"""
SELECT j.steps -> $3::text -> 'result' AS child
FROM pgqueue_jobs AS j
WHERE {queue}{_FENCE}
FOR UPDATE
"""


SPAWN_LOCK = _spawn_lock()
DISTRIBUTED_SPAWN_LOCK = _spawn_lock("j.queue = $4 AND ")


# What a run that ends now for a while writes, whatever it waits for: its
# attempt given back (as a snooze's), unless its cancel was requested: then
# it is cancelled, as its outcome would have been. {status} and {run_at}
# are what it becomes otherwise.
def _suspend(status: str, run_at: str, wait: str, *, waits: str = "") -> str:
    """The SET of a run that ends now for a while (``waits``: the test that it does; always if empty)."""
    keep = f"WHEN NOT ({waits}) THEN " if waits else ""
    return f"""status     = CASE {keep.format() + "j.status " if waits else ""}WHEN j.cancel_requested THEN {CANCELLED} ELSE {status} END,
    attempts   = CASE {keep + "j.attempts " if waits else ""}WHEN j.cancel_requested THEN j.attempts ELSE j.attempts - 1 END,
    run_at     = CASE {keep + "j.run_at " if waits else ""}WHEN j.cancel_requested THEN j.run_at ELSE {run_at} END,
    last_error = CASE {keep + "j.last_error " if waits else ""}WHEN j.cancel_requested THEN 'cancelled by request' ELSE j.last_error END,
    wait       = CASE {keep + "j.wait " if waits else ""}WHEN j.cancel_requested THEN j.wait ELSE {wait} END,
    updated_at = pg_catalog.now()"""


# What every suspending statement returns: the job's new status, the
# seconds until it is due (for a pending one), and, for a tracked job
# cancelled so, its announcement.
_SUSPENDED = f"""j.status, extract(epoch FROM j.run_at - pg_catalog.now())::float8 AS due_in,
          CASE WHEN j.tracked AND j.status = {CANCELLED}
               THEN pg_catalog.pg_notify('pgqueue_outcomes', j.id::text) END AS announced"""

# A durable sleep of job $1's run $2: pending again at $4 (a time), or else
# after $3 seconds on the database clock.
_WAKE_AT = "coalesce($4::timestamptz, pg_catalog.now() + pg_catalog.make_interval(secs => $3::float8))"
SLEEP = f"""
UPDATE pgqueue_jobs AS j
SET {_suspend(PENDING, _WAKE_AT, f"pg_catalog.jsonb_build_object('until', {_WAKE_AT})")}
WHERE {_FENCE}
RETURNING {_SUSPENDED}
"""


def _deadline(key: str) -> str:
    """The deadline of a wait for $3 (``key`` of its record), $4 seconds at most.

    A run resuming the same wait keeps the deadline recorded; NULL: no limit.
    """
    return f"""CASE WHEN j.wait ->> '{key}' = $3::text AND j.wait ->> 'until' IS NOT NULL
                THEN (j.wait ->> 'until')::timestamptz
                WHEN $4::float8 IS NOT NULL
                THEN pg_catalog.now() + pg_catalog.make_interval(secs => $4::float8) END"""


def _waits(what: str) -> str:
    """A run that waits (state 'wait') parks, or is pending until d.until; its record names ``what``."""
    return _suspend(
        f"CASE WHEN d.until IS NULL THEN {PARKED} ELSE {PENDING} END",
        "coalesce(d.until, j.run_at)",
        f"pg_catalog.jsonb_build_object({what}, 'until', d.until)",
        waits="d.state = 'wait'",
    )


# Job $1's run $2 waits for signal $3, for at most $4 seconds (NULL: no
# limit). One statement decides, on the row it locks (a signal sent
# meanwhile is an update of the same row: the one waits for the other, and
# then sees it):
# - the first signal of the name is there: the row is left running, and
#   the signal comes back (state 'signalled');
# - the wait's time is up (the same wait's deadline, recorded when it
#   parked, has passed): recorded as the step pgqueue:timeout:signal:<name>
#   (state 'timeout'), the row left running;
# - else the job is parked (no limit) or pending until the deadline, its
#   attempt given back, its wait recorded.
WAIT_SIGNAL = f"""
WITH cur AS MATERIALIZED (
    SELECT j.id,
           pg_catalog.jsonb_path_query_first(
               CASE WHEN pg_catalog.jsonb_typeof(j.signals) = 'array' THEN j.signals ELSE '[]'::jsonb END,
               '$[*] ? (@.name == $n)', pg_catalog.jsonb_build_object('n', $3::text)) AS signal,
           {_deadline("signal")} AS until
    FROM pgqueue_jobs AS j
    WHERE {_FENCE}
    FOR UPDATE
), decided AS (
    SELECT cur.*, CASE WHEN cur.signal IS NOT NULL THEN 'signalled'
                       WHEN cur.until <= pg_catalog.now() THEN 'timeout'
                       ELSE 'wait' END AS state
    FROM cur
)
UPDATE pgqueue_jobs AS j
SET steps      = CASE WHEN d.state = 'timeout'
                      THEN {
    _recorded("'pgqueue:timeout:signal:' || $3::text", "'true'::jsonb")
}
                      ELSE j.steps END,
    {_waits("'signal', $3::text")}
FROM decided AS d
WHERE j.id = d.id
RETURNING d.state, (d.signal -> 'payload')::text AS payload, {_SUSPENDED}
"""

# Job $1's run $2 waits for job $3 (a child it spawned, or any job) to end,
# for at most $4 seconds (NULL: no limit). The child's row is marked first
# (has_children, by an update: a child ending meanwhile holds it, and this
# statement then sees it ended; one ending after waits for this one's
# commit, and its trigger, pgqueue_parent_ended, then finds the edge and
# wakes the job). Then, as WAIT_SIGNAL: the child ended (recorded as the
# step pgqueue:child:<id>, its status, result and last error; state
# 'ended'), the time is up (pgqueue:timeout:child:<id>; 'timeout'), or the
# job parks, or waits pending until the deadline, with the edge from the
# child to it in pgqueue_dependencies. No row for $3: no row back.
WAIT_CHILD = f"""
WITH child AS MATERIALIZED (
    UPDATE pgqueue_jobs AS c SET has_children = true
    WHERE c.id = $3
    RETURNING c.id, c.status, c.status IN {ENDED} AS ended,
              pg_catalog.jsonb_build_object('status', c.status, 'result', c.result,
                                            'error', c.last_error) AS outcome
), cur AS MATERIALIZED (
    SELECT j.id,
           {_deadline("child")} AS until
    FROM pgqueue_jobs AS j
    WHERE {_FENCE}
    FOR UPDATE
), decided AS (
    SELECT cur.*, child.outcome,
           CASE WHEN child.ended THEN 'ended'
                WHEN cur.until <= pg_catalog.now() THEN 'timeout'
                ELSE 'wait' END AS state
    FROM cur, child
), edge AS (
    INSERT INTO pgqueue_dependencies (parent_id, child_id)
    SELECT $3, d.id FROM decided AS d WHERE d.state = 'wait'
    ON CONFLICT (parent_id, child_id) DO NOTHING
)
UPDATE pgqueue_jobs AS j
SET steps      = CASE WHEN d.state = 'timeout'
                      THEN {
    _recorded("'pgqueue:timeout:child:' || $3::text", "'true'::jsonb")
}
                      WHEN d.state = 'ended'
                      THEN {_recorded("'pgqueue:child:' || $3::text", "d.outcome")}
                      ELSE j.steps END,
    {_waits("'child', $3::int8")}
FROM decided AS d
WHERE j.id = d.id
RETURNING d.state, (d.outcome)::text AS outcome, {_SUSPENDED}
"""

# Which of the waits above recorded what: the step names of their records.
WAIT_KEYS = {
    "timeout:signal": "pgqueue:timeout:signal:",
    "timeout:child": "pgqueue:timeout:child:",
    "child": "pgqueue:child:",
    "spawn": "pgqueue:spawn:",
}


# Job $1's run $2 reports its progress: $3 (0 to 1) and message $4 (or
# NULL), stored and announced on pgqueue_progress at commit. A heartbeat
# too. On Citus, of queue $5, and the announcement comes back (``announced``)
# for the coordinator to send.
def _progress(queue: str = "") -> str:
    announced = """pg_catalog.jsonb_build_object(
    'id', j.id, 'fraction', $3::float8, 'message', $4::text)::text"""
    source = ""
    if queue:  # built first: Citus refuses it in the RETURNING
        returned = "o.announced"
        source = f"""
FROM (SELECT {announced.replace("j.id", "$1::int8")} AS announced OFFSET 0) AS o"""
    else:
        returned = (
            f"pg_catalog.pg_notify('{PROGRESS_CHANNEL}', {announced}) IS NULL AS sent"
        )
    return f"""
UPDATE pgqueue_jobs AS j
SET progress = pg_catalog.jsonb_build_object('fraction', $3::float8, 'message', $4::text, 'at', pg_catalog.now()),
    updated_at = pg_catalog.now(){source}
WHERE {queue}{_FENCE}
RETURNING {returned}
"""


PROGRESS = _progress()
DISTRIBUTED_PROGRESS = _progress("j.queue = $5 AND ")

# What a job's durable state is now (Admin, the CLI and the dashboards
# show it; a Tracker reads the progress it missed): $1 a job id.
JOB_STATE = """
SELECT id, status, steps::text AS steps, signals::text AS signals, wait::text AS wait,
       progress::text AS progress
FROM pgqueue_jobs
WHERE id = $1
"""

# pgqueue_signal(job_id, name, payload): send signal `name` to job
# `job_id`, in the caller's transaction (it exists only if that commits).
# Raises (SQLSTATE P0002, no_data_found, the id in DETAIL) when no job has
# the id; returns false, storing nothing, when the job has ended; else
# appends the signal to the job's signals and returns true. A job parked
# for this signal becomes pending, due now, and its queue is woken; one
# pending until a deadline for it is due now. The name is checked as
# producers' names are (1 to 255 characters, no control character), the
# payload must be at most 64 kB of JSON, and a job keeps at most 1000
# signals (more raise 54000). SECURITY DEFINER: a producer may signal any
# job by id, and write nothing else of it.
MAX_SIGNALS = 1000
_SIGNAL_CHECKS = f"""    IF job_id IS NULL THEN
        RAISE EXCEPTION 'pgqueue_signal: job_id must not be NULL'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pgqueue_check_name('pgqueue_signal', 'name', name, 255);
    IF pg_catalog.octet_length(payload::text) > {MAX_SIGNAL_BYTES} THEN
        RAISE EXCEPTION 'pgqueue_signal: payload is % bytes of JSON; at most {MAX_SIGNAL_BYTES} are allowed',
            pg_catalog.octet_length(payload::text)
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
"""
_NO_JOB = """        RAISE EXCEPTION 'pgqueue_signal: no job has id %', job_id
            USING ERRCODE = 'no_data_found', DETAIL = job_id::text;
"""
_SIGNALS_HELD = f"""    IF held > {MAX_SIGNALS} THEN
        RAISE EXCEPTION 'pgqueue_signal: job % holds % signals already; at most {MAX_SIGNALS} are kept',
            job_id, held - 1
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    IF woken THEN
        PERFORM pg_catalog.pg_notify('pgqueue_jobs', q);
    END IF;
"""
SIGNAL_FUNCTION = f"""
CREATE OR REPLACE FUNCTION pgqueue_signal(job_id bigint, name text, payload jsonb DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
{FUNCTION_SETTINGS}AS $pgqueue_signal$
DECLARE
    q       text;
    woken   boolean;
    held    int;
BEGIN
{_SIGNAL_CHECKS}    UPDATE pgqueue_jobs AS j
    SET signals = CASE WHEN pg_catalog.jsonb_typeof(j.signals) = 'array' THEN j.signals ELSE '[]'::jsonb END
                  || pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
                         'name', pgqueue_signal.name, 'payload', pgqueue_signal.payload,
                         'at', pg_catalog.now())),
        status  = CASE WHEN j.status = {PARKED} AND j.wait ->> 'signal' = pgqueue_signal.name
                       THEN {PENDING} ELSE j.status END,
        run_at  = CASE WHEN j.status IN ({PARKED}, {PENDING}) AND j.wait ->> 'signal' = pgqueue_signal.name
                            AND j.run_at > pg_catalog.now()
                       THEN pg_catalog.now() ELSE j.run_at END,
        updated_at = CASE WHEN j.status = {PARKED} AND j.wait ->> 'signal' = pgqueue_signal.name
                          THEN pg_catalog.now() ELSE j.updated_at END
    WHERE j.id = pgqueue_signal.job_id AND j.status NOT IN {ENDED}
    RETURNING j.queue, j.status = {PENDING} AND j.wait ->> 'signal' = pgqueue_signal.name,
              pg_catalog.jsonb_array_length(j.signals)
    INTO q, woken, held;
    IF NOT FOUND THEN
        IF EXISTS (SELECT FROM pgqueue_jobs AS j WHERE j.id = pgqueue_signal.job_id) THEN
            RETURN false;
        END IF;
{_NO_JOB}    END IF;
{_SIGNALS_HELD}    RETURN true;
END
$pgqueue_signal$;
"""

# The call Queue.signal makes: whether the signal was stored.
SIGNAL = "SELECT pgqueue_signal($1::int8, $2::text, $3::text::jsonb) AS stored"

FUNCTIONS = {
    "pgqueue_signal(bigint, text, jsonb)": "definer",
}
"""The functions of this module, as `pgqueue._sql.functions.FUNCTIONS` lists them."""
