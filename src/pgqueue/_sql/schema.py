"""The schema: ``SCHEMA``, ``SCHEMA_UPGRADE``, ``SCHEMA_DOWN`` and ``SCHEMA_DISTRIBUTED``, and checking what a database holds.

The table and the wakeup channel match the Go module
``github.com/pascalallen/pgqueue`` v1.1.0, so producers and workers written
with either library share one ``pgqueue_jobs`` table. Times are always the
database's ``pg_catalog.now()``, never the client's clock.
"""

from __future__ import annotations

from pgqueue._core.lifecycle import Status
from pgqueue._sql import durable, durable_distributed, functions, tables, triggers
from pgqueue._sql.functions import FUNCTIONS
from pgqueue._sql.statuses import CHECK_ARRAY

__all__ = [
    "BEGIN_PROBE",
    "CITUS_CHECK",
    "CITUS_INSTALLED",
    "DISTRIBUTED_CHECK",
    "REQUIRED_COLUMNS",
    "REQUIRED_FUNCTIONS",
    "REQUIRED_INDEXES",
    "SCHEMA",
    "SCHEMA_CHECK",
    "SCHEMA_DISTRIBUTED",
    "SCHEMA_DOWN",
    "SCHEMA_UPGRADE",
    "SERVER_IDENTITY",
    "TABLE_EXISTS",
]

# What schema v2 and later add beside the Go module's table and indexes:
# the same text in SCHEMA and SCHEMA_UPGRADE, idempotent.
_ADDED = "\n".join(
    [
        tables.PRIORITY_INDEX
        + tables.UNIQUE_INDEX_UPGRADE
        + tables.UNIQUE_INDEX
        + tables.UNIQUE_NEXT_INDEX
        + tables.FAILED_INDEX,
        tables.PERIODIC + tables.PERIODIC_UPGRADE,
        tables.LIMITS,
        tables.LEASES,
        tables.PAUSED,
        tables.STARTS,
        tables.TURNS,
        tables.GROUPS,
        tables.GROUP_INDEX_UPGRADE + tables.GROUP_INDEX,
        triggers.GROUP_PENDING,
        triggers.GROUP_HEADS_FUNCTION,
        tables.DEPENDENCIES + tables.WAITING_INDEX,
        triggers.PARENT_ENDED,
        tables.TREND,
        tables.PARKED_INDEX,
    ]
)
_FUNCTIONS = (
    functions.TAKE_TURN
    + functions.CHECK_JOB
    + functions.ENQUEUE_REPLACE
    + functions.ENQUEUE_AFTER
    + functions.ENQUEUE
    + durable.SIGNAL_FUNCTION
    + functions.PINNED
)

SCHEMA = (
    "\n"
    + tables.jobs_table()
    + "\n"
    + tables.CLAIM_INDEX
    + tables.RESCUE_INDEX
    + "\n"
    + _ADDED
    + _FUNCTIONS
)
"""Create the ``pgqueue_jobs`` table and its indexes, ``pgqueue_periodic``, ``pgqueue_limits`` and ``pgqueue_leases`` (apply it in a migration).

Idempotent on a database without the table or with the current one. On a
table created by the Go module or an earlier pgqueue, apply
`SCHEMA_UPGRADE` instead.
"""


SCHEMA_UPGRADE = (
    f"""
ALTER TABLE pgqueue_jobs
    ADD COLUMN IF NOT EXISTS priority         SMALLINT NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS unique_key       TEXT,
    ADD COLUMN IF NOT EXISTS cancel_requested BOOLEAN  NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS snoozes          INT      NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS result           JSONB,
    ADD COLUMN IF NOT EXISTS tracked          BOOLEAN  NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS trace_context    TEXT,
    ADD COLUMN IF NOT EXISTS errors           JSONB,
    ADD COLUMN IF NOT EXISTS snoozed          JSONB,
    ADD COLUMN IF NOT EXISTS checkpoint       JSONB,
    ADD COLUMN IF NOT EXISTS has_children     BOOLEAN  NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS parents_left     INT,
    ADD COLUMN IF NOT EXISTS on_parent_failure TEXT,
    ADD COLUMN IF NOT EXISTS group_key        TEXT,
    ADD COLUMN IF NOT EXISTS claimed_at       TIMESTAMPTZ,
    ADD COLUMN IF NOT EXISTS steps            JSONB,
    ADD COLUMN IF NOT EXISTS signals          JSONB,
    ADD COLUMN IF NOT EXISTS wait             JSONB,
    ADD COLUMN IF NOT EXISTS progress         JSONB;

DO $$
DECLARE
    old record;
BEGIN
    -- The Go module's status check does not allow cancelled jobs, nor
    -- pgqueue's before dependencies waiting ones, nor before durable
    -- handlers parked ones: replace it, and pgqueue's
    -- written as an IN list (PostgreSQL prepares every check for each
    -- statement that writes the table: a constant array costs less).
    FOR old IN
        SELECT conname FROM pg_constraint
        WHERE conrelid = 'pgqueue_jobs'::regclass AND contype = 'c'
          AND pg_catalog.pg_get_constraintdef(oid) LIKE '%status%'
          AND pg_catalog.pg_get_constraintdef(oid) NOT LIKE '%{CHECK_ARRAY[1:-1]}%'
    LOOP
        EXECUTE pg_catalog.format('ALTER TABLE pgqueue_jobs DROP CONSTRAINT %I', old.conname);
    END LOOP;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = 'pgqueue_jobs'::regclass
                   AND conname = 'chk_pgqueue_jobs_status') THEN
        ALTER TABLE pgqueue_jobs ADD CONSTRAINT chk_pgqueue_jobs_status
            CHECK (status = ANY ({CHECK_ARRAY}::text[])) NOT VALID;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = 'pgqueue_jobs'::regclass
                   AND conname = 'chk_pgqueue_jobs_priority') THEN
        ALTER TABLE pgqueue_jobs ADD CONSTRAINT chk_pgqueue_jobs_priority
            CHECK (priority BETWEEN -5 AND 5) NOT VALID;
    END IF;
END $$;

ALTER TABLE pgqueue_jobs VALIDATE CONSTRAINT chk_pgqueue_jobs_status;
ALTER TABLE pgqueue_jobs VALIDATE CONSTRAINT chk_pgqueue_jobs_priority;
"""
    "\n" + _ADDED + _FUNCTIONS
)
"""Bring a ``pgqueue_jobs`` table created by the Go module (or an earlier pgqueue) up to date.

Only adds: columns with constant defaults or none (no table rewrite), the status
check widened to allow ``cancelled``, ``waiting`` and ``parked`` (added ``NOT VALID``,
then validated, which does not block writes), five partial indexes (the
unique index of live keys rebuilt to count parked jobs live), the
``pgqueue_periodic`` table of periodic schedules, the ``pgqueue_limits``
and ``pgqueue_leases`` tables of fleet-wide limits, and the
``pgqueue_dependencies`` table with the ``pgqueue_parent_ended`` trigger
that releases a job's children when it ends, the columns and the
``pgqueue_signal`` function of durable handlers. Idempotent. Go
producers and workers keep working on the upgraded table. On a large table,
run each ``VALIDATE`` and ``CREATE INDEX`` in a transaction of its own (or
build the indexes ``CONCURRENTLY`` first): a migration tool that wraps the
whole script in one transaction holds the first lock until the end.
"""


SCHEMA_DOWN = """
DROP TABLE IF EXISTS pgqueue_trend;
DROP TABLE IF EXISTS pgqueue_groups;
DROP TABLE IF EXISTS pgqueue_turns;
DROP TABLE IF EXISTS pgqueue_starts;
DROP TABLE IF EXISTS pgqueue_paused;
DROP TABLE IF EXISTS pgqueue_leases;
DROP TABLE IF EXISTS pgqueue_limits;
DROP TABLE IF EXISTS pgqueue_periodic;
DROP TABLE IF EXISTS pgqueue_dependencies;
DROP TABLE IF EXISTS pgqueue_jobs;
""" + "".join(f"DROP FUNCTION IF EXISTS {signature};\n" for signature in FUNCTIONS)
"""Drop everything `SCHEMA` creates."""

# The distributed schema (Citus): the same tables and indexes, each job on
# the shard of its queue. A unique index of a distributed table must hold
# its distribution column, so the primary key is (id, queue). Citus allows
# no trigger on a distributed table: no group heads (the group claims find
# the groups by a skip scan) and no dependencies (the table is there,
# empty, for the statements that read it). No producer function that
# writes edges or replaces a key's job either: there a key's enqueue is an
# INSERT ... ON CONFLICT.
_CITUS_REQUIRED = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus') THEN
        RAISE EXCEPTION 'pgqueue: the distributed schema needs the citus extension, which this database does not have'
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'CREATE EXTENSION citus on a Citus coordinator, or use pgqueue.SCHEMA';
    END IF;
END $$;
-- Distributing tables and creating a function in one transaction need one
-- connection per node.
SET LOCAL citus.multi_shard_modify_mode TO 'sequential';
"""


def _distributed(table: str, how: str) -> str:
    """``table`` distributed by ``how`` (a call of Citus's), unless it is already."""
    return f"""
    IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = '{table}'::regclass) THEN
        PERFORM {how};
    END IF;"""


_COLOCATED = ("limits", "leases", "paused", "starts", "turns", "trend")
_REFERENCE = ("periodic", "dependencies")
_DISTRIBUTE = (
    """
-- Jobs, limits, leases and the trend by queue, co-located (a queue's rows
-- of each on one node); schedules and dependencies copied to every node.
DO $$
BEGIN"""
    + _distributed("pgqueue_jobs", "create_distributed_table('pgqueue_jobs', 'queue')")
    + "".join(
        _distributed(
            f"pgqueue_{name}",
            f"create_distributed_table('pgqueue_{name}', 'queue', colocate_with => 'pgqueue_jobs')",
        )
        for name in _COLOCATED
    )
    + "".join(
        _distributed(f"pgqueue_{name}", f"create_reference_table('pgqueue_{name}')")
        for name in _REFERENCE
    )
    + """
END $$;
"""
)

SCHEMA_DISTRIBUTED = "\n".join(
    [
        _CITUS_REQUIRED + tables.jobs_table(distributed=True),
        tables.CLAIM_INDEX
        + tables.RESCUE_INDEX
        + tables.PRIORITY_INDEX
        + tables.UNIQUE_INDEX
        + tables.FAILED_INDEX
        + tables.WAITING_INDEX
        + tables.PARKED_INDEX
        + tables.CHILD_WAITS_INDEX,
        tables.PERIODIC,
        tables.LIMITS,
        tables.LEASES,
        tables.PAUSED,
        tables.STARTS,
        tables.TURNS,
        tables.GROUP_INDEX,
        tables.DEPENDENCIES,
        tables.TREND,
        _DISTRIBUTE.strip("\n") + "\n",
    ]
) + (
    functions.TAKE_TURN
    + functions.CHECK_JOB
    + functions.ENQUEUE
    + durable_distributed.DISTRIBUTED_SIGNAL_FUNCTION
    + functions.PINNED
)
"""Create pgqueue's tables on a Citus coordinator and distribute them (``pgqueue schema print --distributed``).

``pgqueue_jobs``, ``pgqueue_limits`` and ``pgqueue_leases`` are distributed
by ``queue`` and co-located; ``pgqueue_periodic`` is a reference table.
The primary key is ``(id, queue)`` and a unique key is unique per
``(queue, job_type, unique_key)``. Idempotent; fails with a clear error on
a database without the ``citus`` extension. Jobs with dependencies
(``after=``) are not supported on it.
"""


TABLE_EXISTS = "SELECT pg_catalog.to_regclass('pgqueue_jobs') IS NOT NULL"

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
    "priority",
    "unique_key",
    "cancel_requested",
    "snoozes",
    "result",
    "tracked",
    "trace_context",
    "errors",
    "snoozed",
    "checkpoint",
    "has_children",
    "parents_left",
    "on_parent_failure",
    "group_key",
    "claimed_at",
    "steps",
    "signals",
    "wait",
    "progress",
)
"""The columns of ``pgqueue_jobs`` pgqueue reads or writes."""

REQUIRED_INDEXES = ("idx_pgqueue_jobs_priority", "idx_pgqueue_jobs_unique")
# (and the table pgqueue_dependencies, with the trigger pgqueue_parent_ended:
# both come with the status check that allows 'waiting', in one upgrade)
"""The indexes pgqueue's own statements need (beyond the Go module's)."""

REQUIRED_FUNCTIONS = tuple(FUNCTIONS)
"""The functions of the schema (the producers' keyed enqueues and ``after=`` among them)."""
_REQUIRED_FUNCTION_ARRAY = "{" + ",".join(f'"{f}"' for f in REQUIRED_FUNCTIONS) + "}"

# Whether pgqueue_jobs is visible on the search_path; which of the columns
# $1 and indexes $2 it lacks, in their order; whether a check on status refuses 'parked'
# (earlier ones refuse 'waiting' too, the Go module's 'cancelled'); whether its unique keys are
# still one across queues (before schema v3);
# whether pgqueue_limits (fleet-wide limits) is visible; which of
# REQUIRED_FUNCTIONS are missing; whether the table has ever been analyzed
# (by ANALYZE or autovacuum, as far as the statistics since their last
# reset know): the planner's estimates of a table never analyzed are
# guesses, and the operator should know.
SCHEMA_CHECK = f"""
WITH t AS (SELECT pg_catalog.to_regclass('pgqueue_jobs') AS oid)
SELECT t.oid IS NOT NULL AS table_exists,
       ARRAY(
           SELECT c FROM pg_catalog.unnest($1::text[]) WITH ORDINALITY AS u (c, n)
           WHERE NOT EXISTS (
               SELECT 1 FROM pg_attribute
               WHERE attrelid = t.oid AND attname = c AND attnum > 0 AND NOT attisdropped
           )
           ORDER BY n
       ) AS missing_columns,
       ARRAY(
           SELECT i FROM pg_catalog.unnest($2::text[]) WITH ORDINALITY AS u (i, n)
           WHERE NOT EXISTS (
               SELECT 1 FROM pg_index JOIN pg_class ON pg_class.oid = pg_index.indexrelid
               WHERE pg_index.indrelid = t.oid AND pg_class.relname = i
           )
           ORDER BY n
       ) AS missing_indexes,
       EXISTS (
           SELECT 1 FROM pg_constraint
           WHERE conrelid = t.oid AND contype = 'c'
             AND pg_catalog.pg_get_constraintdef(oid) LIKE '%status%'
             AND pg_catalog.pg_get_constraintdef(oid) NOT LIKE '%{Status.PARKED}%'
       ) AS old_status_check,
       EXISTS (
           SELECT 1 FROM pg_index
           WHERE indrelid = t.oid AND indexrelid = pg_catalog.to_regclass('idx_pgqueue_jobs_unique')
             AND pg_catalog.pg_get_indexdef(indexrelid) NOT LIKE '%(queue, job_type, unique_key)%'
       ) AS old_unique_index,
       pg_catalog.to_regclass('pgqueue_limits') IS NOT NULL AND pg_catalog.to_regclass('pgqueue_leases') IS NOT NULL AS has_limits,
       pg_catalog.to_regclass('pgqueue_paused') IS NOT NULL AS has_paused,
       ARRAY(
           SELECT f FROM pg_catalog.unnest('{_REQUIRED_FUNCTION_ARRAY}'::text[]) WITH ORDINALITY AS u (f, n)
           WHERE pg_catalog.to_regprocedure(f) IS NULL
           ORDER BY n
       ) AS missing_functions,
       EXISTS (
           SELECT 1 FROM pg_stat_all_tables AS s
           WHERE s.relid = t.oid AND coalesce(s.last_analyze, s.last_autoanalyze) IS NOT NULL
       ) AS analyzed
FROM t
"""


# Run through SQLAlchemy's asyncpg adapter, which begins its transaction
# only at its first statement: after it, an enqueue on the adapter's
# asyncpg connection rides that transaction (pgqueue.sqlalchemy).
BEGIN_PROBE = "SELECT 1"

# Who and what the test run's server is (pgqueue.testing's pytest plugin
# prints it): never the password, which the server does not know anyway.
SERVER_IDENTITY = "SELECT current_user, pg_catalog.current_database(), pg_catalog.current_setting('server_version')"

# Whether the Citus catalog and pgqueue_jobs are there; then (on Citus
# only: the catalog table exists nowhere else) whether the table is
# distributed. One look per pool or worker, at start.
CITUS_INSTALLED = "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = 'citus')"
CITUS_CHECK = (
    "SELECT pg_catalog.to_regclass('pg_catalog.pg_dist_partition') IS NOT NULL AS citus,"
    " pg_catalog.to_regclass('pgqueue_jobs') IS NOT NULL AS jobs"
)
DISTRIBUTED_CHECK = """
SELECT EXISTS (SELECT FROM pg_catalog.pg_dist_partition
               WHERE logicalrelid = pg_catalog.to_regclass('pgqueue_jobs') AND partmethod = 'h')
"""
