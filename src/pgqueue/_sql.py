"""Every SQL statement pgqueue runs.

The table and the wakeup channel match the Go module
``github.com/pascalallen/pgqueue`` v1.1.0, so producers and workers written
with either library share one ``pgqueue_jobs`` table. Times are always the
database's ``now()``, never the client's clock.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "CLAIM",
    "ENQUEUE",
    "ENQUEUE_MANY",
    "FINISH",
    "HEAD_OF_LINE",
    "JOBS_CHANNEL",
    "PRUNE",
    "PRUNE_BATCH",
    "PUBLISH",
    "REQUIRED_COLUMNS",
    "RESCUE",
    "SCHEMA",
    "SCHEMA_CHECK",
    "SCHEMA_DOWN",
    "TOUCH",
    "WORKER_SETTINGS",
    "array",
    "timestamps",
]

JOBS_CHANNEL = "pgqueue_jobs"


def array(values: Iterable[int | float]) -> str:
    """An array literal of numbers, for a ``$n::text::int[]`` (or bigint, float8) parameter."""
    return "{" + ",".join(map(repr, values)) + "}"


_MIN = datetime.min.replace(tzinfo=UTC)
_MAX = datetime.max.replace(tzinfo=UTC)


def timestamps(values: Iterable[datetime | None]) -> str:
    """An array literal of aware times, for a ``$n::text::timestamptz[]`` parameter.

    The smallest and largest datetimes stand for ``-infinity`` and
    ``infinity``, as asyncpg writes them.
    """
    return "{" + ",".join(map(_timestamp, values)) + "}"


def _timestamp(value: datetime | None) -> str:
    if value is None:
        return "NULL"
    if value == _MIN:
        return "-infinity"
    if value == _MAX:
        return "infinity"
    return value.isoformat()


SCHEMA = """
CREATE TABLE pgqueue_jobs
(
    id           BIGSERIAL PRIMARY KEY,
    queue        TEXT        NOT NULL DEFAULT 'default',
    job_type     TEXT        NOT NULL,
    payload      JSONB       NOT NULL DEFAULT '{}'::jsonb,
    status       TEXT        NOT NULL DEFAULT 'pending'
        CONSTRAINT chk_pgqueue_jobs_status CHECK (status IN ('pending', 'running', 'completed', 'dead')),
    attempts     INT         NOT NULL DEFAULT 0,
    max_attempts INT         NOT NULL DEFAULT 5,
    run_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_error   TEXT,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    completed_at TIMESTAMPTZ
);

CREATE INDEX idx_pgqueue_jobs_claim ON pgqueue_jobs (queue, run_at, id) WHERE status = 'pending';
CREATE INDEX idx_pgqueue_jobs_rescue ON pgqueue_jobs (updated_at) WHERE status = 'running';
"""
"""Create the ``pgqueue_jobs`` table and its indexes (apply it in a migration)."""

SCHEMA_DOWN = "DROP TABLE IF EXISTS pgqueue_jobs;"
"""Drop everything `SCHEMA` creates."""

# JSON crosses the boundary as text, both ways ($3::text, payload::text):
# a pool whose init registers a jsonb codec (json.dumps and json.loads, a
# common recipe) must not change what is stored or what a handler gets.
#
# Arrays other than text[] cross it as text too (see `array`): asyncpg has
# no built-in codec for them, and looks their types up on first use with
# set_config('jit', ...) calls of session scope, in transactions of their
# own; behind a transaction pooler those settings stay on server
# connections that other clients then get.

# The row and its wakeup ride one statement, so a job enqueued inside the
# caller's transaction wakes workers only if that transaction commits.
ENQUEUE = """
WITH job AS (
    INSERT INTO pgqueue_jobs (queue, job_type, payload, max_attempts, run_at)
    VALUES ($1, $2, $3::text::jsonb, $4, COALESCE($5::timestamptz, now()))
    RETURNING id
)
SELECT job.id FROM job, pg_notify('pgqueue_jobs', $1)
"""

# Rows are inserted in input order, so ascending ids are the input order.
# The payloads arrive as one JSON array ($3), the rest as arrays; ROWS FROM
# zips them element by element.
ENQUEUE_MANY = """
WITH jobs AS (
    INSERT INTO pgqueue_jobs (queue, job_type, payload, max_attempts, run_at)
    SELECT $1, t.job_type, t.payload, t.max_attempts, COALESCE(t.run_at, now())
    FROM ROWS FROM (
        unnest($2::text[]),
        jsonb_array_elements($3::text::jsonb),
        unnest($4::text::int[]),
        unnest($5::text::timestamptz[])
    ) WITH ORDINALITY AS t(job_type, payload, max_attempts, run_at, ord)
    ORDER BY t.ord
    RETURNING id
)
SELECT array_to_string(array_agg(jobs.id ORDER BY jobs.id), ',')
FROM jobs, pg_notify('pgqueue_jobs', $1)
"""

PRUNE = """
DELETE FROM pgqueue_jobs
WHERE queue = $1
  AND status IN ('completed', 'dead')
  AND updated_at < now() - make_interval(secs => $2)
"""

# The retention sweep's PRUNE: at most $4 rows past id $3, in id order, so a
# sweep walks the table once however many batches it takes, and no batch
# holds the worker's upkeep connection (and its heartbeats) for long. Rows
# another session has locked are skipped (the next sweep gets them), never
# waited for. Returns how many rows went and the last id among them.
PRUNE_BATCH = """
WITH gone AS (
    DELETE FROM pgqueue_jobs
    WHERE id = ANY(ARRAY(
        SELECT id
        FROM pgqueue_jobs
        WHERE id > $3 AND queue = $1
          AND status IN ('completed', 'dead')
          AND updated_at < now() - make_interval(secs => $2)
        ORDER BY id
        LIMIT $4
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING id
)
SELECT count(*)::int, coalesce(max(id), $3) FROM gone
"""

HEAD_OF_LINE = (datetime.min.replace(tzinfo=UTC), 0)
"""CLAIM's place ($3, $4) for a claim from the head: ('-infinity', 0)."""

# The first due jobs in line after the place ($3, $4) = (run_at, id). A
# worker draining a backlog starts after the last job it took: each claimed
# job leaves a dead entry at the head of the claim index until vacuum, and a
# claim from the head walks them all.
# The ids come back as an array, so the update finds its rows through the
# primary key whatever the table's size or statistics: as a join, a table of
# a few thousand rows gets a sequential scan per claim.
# Times outside Python's datetime range (a BC date written by another
# producer) come back as NULL with their text in the last column: asyncpg
# would fail to decode the whole batch after the claim had committed.
_REPRESENTABLE = "{0} BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00' OR NOT isfinite({0})"
CLAIM = f"""
UPDATE pgqueue_jobs
SET status = 'running', attempts = attempts + 1, updated_at = now()
WHERE id = ANY(ARRAY(
    SELECT id
    FROM pgqueue_jobs
    WHERE queue = $1 AND status = 'pending' AND run_at <= now()
      AND (run_at, id) > ($3::timestamptz, $4::bigint)
    ORDER BY run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
))
RETURNING id, queue, job_type, payload::text AS payload, attempts, max_attempts,
    CASE WHEN {_REPRESENTABLE.format("run_at")} THEN run_at END AS run_at,
    CASE WHEN {_REPRESENTABLE.format("created_at")} THEN created_at END AS created_at,
    last_error,
    CASE WHEN ({_REPRESENTABLE.format("run_at")}) AND ({_REPRESENTABLE.format("created_at")}) THEN NULL
         ELSE format('run_at %s, created_at %s', run_at, created_at) END AS unrepresentable
"""

# One statement writes the outcomes of many runs. Each row is fenced on the
# attempt it claimed: a run that was rescued and superseded matches nothing.
# status is 'completed', 'dead', 'pending' (retry after delay seconds), or
# 'released': claimed but never started, so it goes back to pending where it
# was in line and its attempt is given back.
# "Still running" is spelled NOT IN the other three states (the CHECK allows
# no fourth) so the planner drives the update through the primary key: the
# rescue index's row estimate is usually stale (one row), and using it would
# make every write scan every running row of every queue.
FINISH = """
UPDATE pgqueue_jobs AS j
SET status       = CASE WHEN o.status = 'released' THEN 'pending' ELSE o.status END,
    attempts     = CASE WHEN o.status = 'released' THEN j.attempts - 1 ELSE j.attempts END,
    run_at       = CASE WHEN o.status = 'pending' THEN now() + make_interval(secs => o.delay) ELSE j.run_at END,
    last_error   = CASE WHEN o.status IN ('completed', 'released') THEN j.last_error ELSE o.error END,
    completed_at = CASE WHEN o.status = 'completed' THEN now() ELSE j.completed_at END,
    updated_at   = now()
FROM unnest($1::text::bigint[], $2::text::int[], $3::text[], $4::text::float8[], $5::text[])
    AS o(id, attempts, status, delay, error)
WHERE j.id = o.id AND j.attempts = o.attempts AND j.status NOT IN ('pending', 'completed', 'dead')
RETURNING j.id, o.attempts
"""

# A heartbeat: running rows this worker still holds were seen alive now
# (fenced like FINISH, and spelled like it for the same plan).
TOUCH = """
UPDATE pgqueue_jobs AS j
SET updated_at = now()
FROM unnest($1::text::bigint[], $2::text::int[]) AS o(id, attempts)
WHERE j.id = o.id AND j.attempts = o.attempts AND j.status NOT IN ('pending', 'completed', 'dead')
"""

# Orphans with attempts left go back to pending; the rest are dead-lettered,
# since a job that crashed its process on every attempt never reaches a
# handler's outcome write. At most $3 rows a statement; rows another
# session holds (a heartbeat or an outcome being written) are skipped.
RESCUE = """
UPDATE pgqueue_jobs
SET status     = CASE WHEN attempts < max_attempts THEN 'pending' ELSE 'dead' END,
    last_error = CASE WHEN attempts < max_attempts THEN last_error
                      ELSE 'rescued after exceeding max attempts' END,
    updated_at = now()
WHERE id = ANY(ARRAY(
    SELECT id
    FROM pgqueue_jobs
    WHERE status = 'running' AND updated_at < now() - make_interval(secs => $2) AND queue = $1
    LIMIT $3
    FOR UPDATE SKIP LOCKED
))
RETURNING status
"""

REQUIRED_COLUMNS = (
    "id",
    "queue",
    "job_type",
    "payload",
    "status",
    "attempts",
    "max_attempts",
    "run_at",
    "last_error",
    "created_at",
    "updated_at",
    "completed_at",
)
"""The columns of ``pgqueue_jobs`` the worker reads or writes."""

# Whether pgqueue_jobs is visible on the search_path, and which of the
# columns $1 it lacks.
SCHEMA_CHECK = """
SELECT to_regclass('pgqueue_jobs') IS NOT NULL,
       ARRAY(
           SELECT c
           FROM unnest($1::text[]) AS c
           WHERE NOT EXISTS (
               SELECT 1 FROM pg_attribute
               WHERE attrelid = to_regclass('pgqueue_jobs')
                 AND attname = c AND attnum > 0 AND NOT attisdropped
           )
       )
"""

PUBLISH = "SELECT pg_notify($1, $2)"

# Startup parameters of the worker's own connections. The statements above
# are written to plan well without their parameters' values, and a claim of
# ten jobs costs less to run than to re-plan: custom plans (chosen by
# default, since LIMIT $2 makes the generic plan look dear) cost about a
# quarter more server CPU per job. Sent in the startup packet, never with
# SET: a transaction pooler (PgBouncer) refuses, ignores or tracks startup
# parameters per client, while a SET would stay on a server connection it
# then hands to other clients.
WORKER_SETTINGS = {"plan_cache_mode": "force_generic_plan"}
