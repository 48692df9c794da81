"""What a worker writes of its runs: outcomes, checkpoints, heartbeats, and the rescue of orphans.

Each statement on a distributed (Citus) schema names its queue, so that
Citus routes it to the queue's shard (a write without it goes to every
shard, with a two-phase commit), and leaves its wakeups to the coordinator
(`pgqueue._sql.channels.ANNOUNCE`).
"""

from __future__ import annotations

from pgqueue._sql.statuses import (
    CANCELLED,
    COMPLETED,
    DEAD,
    DELAYED,
    ENDED,
    FAILURES,
    GIVES_BACK,
    KEEPS_ERROR,
    NOT_RUNNING,
    PENDING,
    PENDING_AGAIN,
    REQUEUED,
    RUNNING,
    SNOOZED,
)
from pgqueue._sql.tables import HISTORY_KEPT

__all__ = [
    "CANCEL_REQUESTED",
    "CHECKPOINT",
    "COMPLETE",
    "DISTRIBUTED_CHECKPOINT",
    "DISTRIBUTED_COMPLETE",
    "DISTRIBUTED_FINISH",
    "DISTRIBUTED_RESCUE",
    "DISTRIBUTED_TOUCH",
    "FINISH",
    "OUTCOMES",
    "RESCUE",
    "TOUCH",
    "history_kept",
]


def history_kept(column: str, entries: str) -> str:
    """``column`` (a JSON array, or NULL) with the array ``entries`` appended, keeping the last `HISTORY_KEPT`.

    Anything but an array there (written by hand) starts a new history
    rather than failing the outcome write.
    """
    return (
        f"CASE WHEN pg_catalog.jsonb_typeof({column}) = 'array'"
        f" THEN pg_catalog.jsonb_path_query_array({column}, '$[last - {HISTORY_KEPT - 2} to last]')"
        f" ELSE '[]'::jsonb END || {entries}"
    )


def _appended(column: str, entry: str) -> str:
    """`history_kept` of one entry, built in place."""
    return history_kept(column, f"pg_catalog.jsonb_build_array({entry})")


# A failed attempt's entry in ``errors`` (oldest first): its attempt, when
# it ended (the database's clock) and its error, the same text as
# last_error (capped alike, before it is sent). A snooze's entry in
# ``snoozed``: the attempt it gave back, when, and for how many seconds.
# On Citus, which refuses functions that are not immutable inside CASE
# (now(), jsonb_build_object, a timestamptz plus an interval), they are
# computed per row in a subquery it cannot pull up (OFFSET 0), and the CASEs
# pick them. The entries there name o.attempts, which the fence makes
# j.attempts.
_FAILED = "pg_catalog.jsonb_build_object('attempt', {attempts}, 'at', pg_catalog.now(), 'error', {error})"
_SNOOZED = "pg_catalog.jsonb_build_object('attempt', {attempts}, 'at', pg_catalog.now(), 'delay', {delay})"
_NO_HEARTBEAT = """pg_catalog.jsonb_build_object(
    'attempt', {attempts}, 'at', pg_catalog.now(),
    'error', 'no heartbeat for '
             || coalesce(pg_catalog.floor(extract(epoch FROM pg_catalog.now() - {updated_at}))::int8::text, '?') || ' s')"""

# The outcomes ($1 to $6): each run's job id and the attempt it claimed, its
# kind (an OutcomeKind), delay, error and result.
_OUTCOME_ROWS = "ROWS FROM (pg_catalog.unnest($1::text::bigint[]), pg_catalog.unnest($2::text::int[]), pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::text::float8[]), pg_catalog.unnest($5::text[]), pg_catalog.unnest($6::text[]))"

# One statement writes the outcomes of many runs. Each row is fenced on the
# attempt it claimed: a run that was rescued and superseded matches nothing.
# The status each kind writes, and how, is pgqueue._core.lifecycle.OUTCOMES:
# 'completed' (with its result), 'dead', 'cancelled', 'pending' (retry after
# delay seconds), 'snoozed' (pending after delay seconds, its attempt given
# back) or 'released' (claimed but never started: pending where it was in
# line, its attempt given back). A job whose cancel was requested is
# cancelled instead of going back to pending.
# Giving an attempt back keeps fencing sound: the row's attempts never fall
# below those of a run that was superseded, so no later run holds its number.
# "Still running" is spelled NOT IN the other states (the CHECK allows no
# other) so the planner drives the update through the primary key: the
# rescue index's row estimate is usually stale (one row), and using it would
# make every write scan every running row of every queue.
# A tracked job that ends is announced on pgqueue_outcomes, at commit (on
# Citus, its id comes back in ``ended``, and the writer announces it; and
# one a durable handler waited for, in ``waited``: the writer wakes the
# jobs waiting for it, which no trigger does there).
_STILL_RUNNING = f"j.status NOT IN {NOT_RUNNING}"
_ANNOUNCE_ENDED = f"""CASE WHEN j.tracked AND j.status IN {ENDED}
                  THEN pg_catalog.pg_notify('pgqueue_outcomes', j.id::text) END"""
_DISTRIBUTED_ENDED = f"j.tracked AND j.status IN {ENDED} AS ended, j.has_children AND j.status IN {ENDED} AS waited"


def _finish(*, routed: bool) -> str:
    """FINISH, or with ``routed`` its Citus form (of the runs of queue $7)."""
    if routed:
        retry_at, now, queue = "o.retry_at", "o.now", "j.queue = $7 AND "
        failed = history_kept("j.errors", "o.failed")
        snoozed = history_kept("j.snoozed", "o.snooze")
        source = f"""(
    SELECT u.*, pg_catalog.now() AS now, pg_catalog.now() + pg_catalog.make_interval(secs => u.delay) AS retry_at,
           pg_catalog.jsonb_build_array({_FAILED.format(attempts="u.attempts", error="u.error")}) AS failed,
           pg_catalog.jsonb_build_array({_SNOOZED.format(attempts="u.attempts", delay="u.delay")}) AS snooze
    FROM {_OUTCOME_ROWS}
        AS u(id, attempts, status, delay, error, result)
    OFFSET 0
) AS o"""
    else:
        retry_at = "pg_catalog.now() + pg_catalog.make_interval(secs => o.delay)"
        now, queue = "pg_catalog.now()", ""
        failed = _appended(
            "j.errors", _FAILED.format(attempts="j.attempts", error="o.error")
        )
        snoozed = _appended(
            "j.snoozed", _SNOOZED.format(attempts="j.attempts", delay="o.delay")
        )
        source = (
            f"{_OUTCOME_ROWS}\n    AS o(id, attempts, status, delay, error, result)"
        )
    return f"""
UPDATE pgqueue_jobs AS j
SET status       = CASE WHEN j.cancel_requested AND o.status IN {REQUEUED}
                        THEN {CANCELLED}
                        WHEN o.status IN {PENDING_AGAIN} THEN {PENDING}
                        ELSE o.status END,
    attempts     = CASE WHEN o.status IN {GIVES_BACK} AND NOT j.cancel_requested
                        THEN j.attempts - 1 ELSE j.attempts END,
    snoozes      = CASE WHEN o.status = {SNOOZED} THEN j.snoozes + 1 ELSE j.snoozes END,
    run_at       = CASE WHEN o.status IN {DELAYED} AND NOT j.cancel_requested
                        THEN {retry_at} ELSE j.run_at END,
    last_error   = CASE WHEN j.cancel_requested AND o.status IN {REQUEUED}
                        THEN 'cancelled by request'
                        WHEN o.status IN {KEEPS_ERROR} THEN j.last_error
                        ELSE o.error END,
    result       = CASE WHEN o.status = {COMPLETED} THEN o.result::jsonb ELSE j.result END,
    completed_at = CASE WHEN o.status = {COMPLETED} THEN {now} ELSE j.completed_at END,
    checkpoint   = CASE WHEN o.status = {COMPLETED} THEN NULL ELSE j.checkpoint END,
    errors       = CASE WHEN o.status IN {FAILURES} THEN {failed} ELSE j.errors END,
    snoozed      = CASE WHEN o.status = {SNOOZED} AND NOT j.cancel_requested
                        THEN {snoozed} ELSE j.snoozed END,
    updated_at   = pg_catalog.now()
FROM {source}
WHERE {queue}j.id = o.id AND j.attempts = o.attempts AND {_STILL_RUNNING}
"""


FINISH = f"{_finish(routed=False)}RETURNING j.id, o.attempts, {_ANNOUNCE_ENDED}\n"
# Outcome writes of one queue ($7): the ids of tracked jobs that ended come
# back in ``ended``, for the writer to announce on the coordinator.
DISTRIBUTED_FINISH = (
    f"{_finish(routed=True)}RETURNING j.id, o.attempts, {_DISTRIBUTED_ENDED}\n"
)


# FINISH for a batch of runs that all completed, a drain's usual batch:
# the same write without FINISH's per-row cases. Completion clears the
# job's checkpoint (FINISH's too). On Citus, of the runs of queue $4.
def _complete(queue: str = "") -> str:
    return f"""
UPDATE pgqueue_jobs AS j
SET status = {COMPLETED}, result = o.result::jsonb, checkpoint = NULL,
    completed_at = pg_catalog.now(), updated_at = pg_catalog.now()
FROM ROWS FROM (pg_catalog.unnest($1::text::bigint[]), pg_catalog.unnest($2::text::int[]), pg_catalog.unnest($3::text[])) AS o(id, attempts, result)
WHERE {queue}j.id = o.id AND j.attempts = o.attempts AND {_STILL_RUNNING}
"""


COMPLETE = f"{_complete()}RETURNING j.id, o.attempts, {_ANNOUNCE_ENDED}\n"
DISTRIBUTED_COMPLETE = f"{_complete('j.queue = $4 AND ')}RETURNING j.id, o.attempts, {_DISTRIBUTED_ENDED}\n"


# A handler's checkpoint ($3, JSON text) of job $1, fenced like every
# outcome on the attempt its run claimed ($2): a run that was rescued and
# superseded matches nothing, and gets no row back. It counts as a
# heartbeat of that run. On Citus, of queue $4.
def _checkpoint(queue: str = "") -> str:
    return f"""
UPDATE pgqueue_jobs AS j
SET checkpoint = $3::text::jsonb, updated_at = pg_catalog.now()
WHERE {queue}j.id = $1 AND j.attempts = $2 AND {_STILL_RUNNING}
RETURNING true
"""


CHECKPOINT = _checkpoint()
DISTRIBUTED_CHECKPOINT = _checkpoint("j.queue = $4 AND ")


# A heartbeat: running rows this worker still holds were seen alive now
# (fenced like FINISH, and spelled like it for the same plan). Returns the
# ids of those whose cancel was requested. On Citus, of queue $3's runs.
def _touch(queue: str = "") -> str:
    return f"""
WITH touched AS (
    UPDATE pgqueue_jobs AS j
    SET updated_at = pg_catalog.now()
    FROM ROWS FROM (pg_catalog.unnest($1::text::bigint[]), pg_catalog.unnest($2::text::int[])) AS o(id, attempts)
    WHERE {queue}j.id = o.id AND j.attempts = o.attempts AND {_STILL_RUNNING}
    RETURNING j.id, j.cancel_requested
)
SELECT id FROM touched WHERE cancel_requested
"""


TOUCH = _touch()
DISTRIBUTED_TOUCH = _touch("j.queue = $3 AND ")

# Orphans with attempts left go back to pending; the rest are dead-lettered,
# since a job that crashed its process on every attempt never reaches a
# handler's outcome write; an orphan whose cancel was requested is
# cancelled. Orphans of the worker's queues ($1, a text[]); each row comes
# back with its queue and new status. At most $3 rows a statement; rows
# another session holds (a heartbeat or an outcome being written) are skipped.
# An orphan put back or dead-lettered records its attempt in the history
# ("no heartbeat for N s", N the whole seconds since the row was last seen).
_RESCUED_STATUS = f"""CASE WHEN {{j}}cancel_requested THEN {CANCELLED}
                          WHEN {{j}}attempts < {{j}}max_attempts THEN {PENDING} ELSE {DEAD} END"""
_RESCUED_ERROR = """CASE WHEN {j}cancel_requested THEN 'cancelled by request'
                          WHEN {j}attempts < {j}max_attempts THEN {j}last_error
                          ELSE 'rescued after exceeding max attempts' END"""
RESCUE = f"""
WITH rescued AS (
    UPDATE pgqueue_jobs AS j
    SET status     = {_RESCUED_STATUS.format(j="")},
        last_error = {_RESCUED_ERROR.format(j="")},
        errors     = CASE WHEN cancel_requested THEN errors
                          ELSE {_appended("j.errors", _NO_HEARTBEAT.format(attempts="j.attempts", updated_at="j.updated_at"))} END,
        run_at     = run_at,  -- unchanged, named: a grouped job's head follows it
        updated_at = pg_catalog.now()
    WHERE id = ANY(ARRAY(
        SELECT id
        FROM pgqueue_jobs
        WHERE status = {RUNNING} AND updated_at < pg_catalog.now() - pg_catalog.make_interval(secs => $2)
          AND queue = ANY($1::text[])
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING id, queue, status, tracked
)
SELECT queue, status, CASE WHEN tracked AND status <> {PENDING} THEN pg_catalog.pg_notify('pgqueue_outcomes', id::text) END
FROM rescued
"""

# The rescue sweep of one queue ($1, text) on Citus; the rows come back for
# the worker to announce the tracked ones that ended, and to wake the jobs
# waiting for those that ended (``waited``).
DISTRIBUTED_RESCUE = f"""
WITH rescued AS (
    UPDATE pgqueue_jobs AS j
    SET status     = {_RESCUED_STATUS.format(j="j.")},
        last_error = {_RESCUED_ERROR.format(j="j.")},
        errors     = CASE WHEN j.cancel_requested THEN j.errors
                          ELSE {history_kept("j.errors", "o.entry")} END,
        updated_at = pg_catalog.now()
    FROM (
        SELECT id, pg_catalog.jsonb_build_array({_NO_HEARTBEAT.format(attempts="attempts", updated_at="updated_at")}) AS entry
        FROM pgqueue_jobs
        WHERE queue = $1 AND status = {RUNNING} AND updated_at < pg_catalog.now() - pg_catalog.make_interval(secs => $2)
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ) AS o
    WHERE j.queue = $1 AND j.id = o.id
    RETURNING j.id, j.queue, j.status, j.tracked, j.has_children
)
SELECT queue, status, id, tracked AND status <> {PENDING} AS ended,
       has_children AND status <> {PENDING} AS waited
FROM rescued
"""

# The rows of the jobs a Tracker waits for ($1), ended or not, so that a job
# still running is told apart from an id with no row.
OUTCOMES = """
SELECT id, status, result::text AS result, last_error, attempts
FROM pgqueue_jobs
WHERE id = ANY($1::text::bigint[])
"""

# Which of the jobs $1 have had their cancel requested (`Queue.cancel` of a
# running job): what a worker reads before it acts on a control NOTIFY,
# since anyone who can connect can send one.
CANCEL_REQUESTED = """
SELECT id FROM pgqueue_jobs WHERE id = ANY($1::text::bigint[]) AND cancel_requested
"""
