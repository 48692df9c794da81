"""The tables and indexes of the schema, each once, for the plain and the distributed schema alike.

`pgqueue._sql.schema` puts them together with the functions and triggers.
Each piece is idempotent (``IF NOT EXISTS``); an upgrade step that replaces
an earlier form of a piece comes just before it, in the plain schema only.
"""

from __future__ import annotations

from pgqueue._sql.statuses import (
    CHECK_ARRAY,
    FAILED,
    LIVE,
    PARKED,
    PENDING,
    RUNNING,
    WAITING,
)

__all__ = [
    "CHILD_WAITS_INDEX",
    "CLAIM_INDEX",
    "DEPENDENCIES",
    "FAILED_INDEX",
    "GROUPS",
    "GROUP_INDEX",
    "GROUP_INDEX_UPGRADE",
    "HISTORY_KEPT",
    "LEASES",
    "LIMITS",
    "LIVE_KEY",
    "PARKED_INDEX",
    "PAUSED",
    "PERIODIC",
    "PERIODIC_UPGRADE",
    "PRIORITY_INDEX",
    "RESCUE_INDEX",
    "STARTS",
    "TREND",
    "TURNS",
    "UNIQUE_INDEX",
    "UNIQUE_INDEX_UPGRADE",
    "UNIQUE_NEXT_INDEX",
    "WAITING_INDEX",
    "jobs_table",
]


HISTORY_KEPT = 20
"""The most entries ``errors`` (failed attempts) and ``snoozed`` (snoozes) keep: the newest."""


def jobs_table(*, distributed: bool = False) -> str:
    """``CREATE TABLE pgqueue_jobs``: the Go module's columns, then pgqueue's.

    ``distributed``: its primary key is ``(id, queue)``, since Citus
    distributes it by queue (a unique index must hold that column).
    """
    key = "BIGSERIAL," if distributed else "BIGSERIAL PRIMARY KEY,"
    end = ",\n    PRIMARY KEY (id, queue)\n" if distributed else "\n"
    return f"""CREATE TABLE IF NOT EXISTS pgqueue_jobs
(
    id               {key}
    queue            TEXT        NOT NULL DEFAULT 'default',
    job_type         TEXT        NOT NULL,
    payload          JSONB       NOT NULL DEFAULT '{{}}'::jsonb,
    status           TEXT        NOT NULL DEFAULT {PENDING}
        CONSTRAINT chk_pgqueue_jobs_status
        CHECK (status = ANY ({CHECK_ARRAY}::text[])),
    attempts         INT         NOT NULL DEFAULT 0,
    max_attempts     INT         NOT NULL DEFAULT 5,
    run_at           TIMESTAMPTZ NOT NULL DEFAULT pg_catalog.now(),
    last_error       TEXT,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT pg_catalog.now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT pg_catalog.now(),
    completed_at     TIMESTAMPTZ,
    priority         SMALLINT    NOT NULL DEFAULT 0
        CONSTRAINT chk_pgqueue_jobs_priority CHECK (priority BETWEEN -5 AND 5),
    unique_key       TEXT,
    cancel_requested BOOLEAN     NOT NULL DEFAULT false,
    snoozes          INT         NOT NULL DEFAULT 0,
    result           JSONB,
    tracked          BOOLEAN     NOT NULL DEFAULT false,
    trace_context    TEXT,
    errors           JSONB,
    snoozed          JSONB,
    checkpoint       JSONB,
    has_children     BOOLEAN     NOT NULL DEFAULT false,
    parents_left     INT,
    on_parent_failure TEXT,
    group_key        TEXT,
    claimed_at       TIMESTAMPTZ,
    steps            JSONB,
    signals          JSONB,
    wait             JSONB,
    progress         JSONB{end});
"""


CLAIM_INDEX = f"""-- The Go module's claims, and ours of jobs without a priority.
CREATE INDEX IF NOT EXISTS idx_pgqueue_jobs_claim
    ON pgqueue_jobs (queue, run_at, id) WHERE status = {PENDING};
"""
RESCUE_INDEX = f"""CREATE INDEX IF NOT EXISTS idx_pgqueue_jobs_rescue
    ON pgqueue_jobs (updated_at) WHERE status = {RUNNING};
"""
PRIORITY_INDEX = f"""-- Our claims of jobs with a priority (COLLATE "C": only they can use it).
CREATE INDEX IF NOT EXISTS idx_pgqueue_jobs_priority
    ON pgqueue_jobs (queue, priority, run_at, id)
    WHERE status = {PENDING} COLLATE "C" AND priority <> 0;
"""

LIVE_KEY = (
    f"(queue, job_type, unique_key) WHERE unique_key IS NOT NULL AND status IN {LIVE}"
)
"""The unique index of live keys, as an ON CONFLICT names it."""

UNIQUE_INDEX_UPGRADE = f"""-- One live job per (queue, job_type, unique_key): unique keys are per
-- queue, so one tenant's queue never meets another's keys. The earlier
-- form, on (job_type, unique_key) across queues, is replaced: the new one
-- is built first (it allows all the old one allowed), then the old one goes.
-- So is the form before parked jobs (durable handlers), whose live keys
-- were those of pending and running jobs only: the new one is built first
-- (an old table has no parked job), then the old one goes.
DO $$
DECLARE
    name text;
    predicate text;
BEGIN
    FOR name, predicate IN VALUES
        ('idx_pgqueue_jobs_unique', $p$unique_key IS NOT NULL AND status IN {LIVE}$p$),
        ('idx_pgqueue_jobs_unique_next', $p$unique_key IS NOT NULL AND status = {WAITING}$p$)
    LOOP
        IF EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = pg_catalog.to_regclass(name)
                   AND (pg_catalog.pg_get_indexdef(indexrelid) NOT LIKE '%(queue, job_type, unique_key)%'
                        OR (name = 'idx_pgqueue_jobs_unique'
                            AND pg_catalog.pg_get_indexdef(indexrelid) NOT LIKE '%parked%'))) THEN
            EXECUTE pg_catalog.format('CREATE UNIQUE INDEX %I ON pgqueue_jobs (queue, job_type, unique_key) WHERE %s',
                           name || '_per_queue', predicate);
            EXECUTE pg_catalog.format('DROP INDEX %I', name);
            EXECUTE pg_catalog.format('ALTER INDEX %I RENAME TO %I', name || '_per_queue', name);
        END IF;
    END LOOP;
END $$;
"""
UNIQUE_INDEX = f"""CREATE UNIQUE INDEX IF NOT EXISTS idx_pgqueue_jobs_unique
    ON pgqueue_jobs (queue, job_type, unique_key)
    WHERE unique_key IS NOT NULL AND status IN {LIVE};
"""
UNIQUE_NEXT_INDEX = f"""-- The next job of a key whose live job had started when a replacing
-- enqueue came (see pgqueue_enqueue_replace): at most one per key, waiting
-- for the live one.
CREATE UNIQUE INDEX IF NOT EXISTS idx_pgqueue_jobs_unique_next
    ON pgqueue_jobs (queue, job_type, unique_key)
    WHERE unique_key IS NOT NULL AND status = {WAITING};
"""
PARKED_INDEX = f"""-- Parked jobs (durable handlers waiting for a signal or a child): the
-- listings and counts of them; only parked jobs are in it.
CREATE INDEX IF NOT EXISTS idx_pgqueue_jobs_parked
    ON pgqueue_jobs (queue, id) WHERE status = {PARKED};
"""
CHILD_WAITS_INDEX = f"""-- On Citus only (no trigger wakes them there): the durable handlers' jobs
-- that wait for a child job to end, parked or pending until a deadline, by
-- the child's id (the Citus store wakes them when the child ends). A
-- statement of its own: Citus sends a new index of a table it distributed
-- already to the shards with the text of the command, which must be one.
DO $$
BEGIN
    EXECUTE $i$CREATE INDEX IF NOT EXISTS idx_pgqueue_jobs_child_waits
        ON pgqueue_jobs ((wait ->> 'child')) WHERE wait ? 'child' AND status IN ({PARKED}, {PENDING})$i$;
END $$;
"""
FAILED_INDEX = f"""-- The operations' stats and listings of dead and cancelled jobs (pgqueue.Admin).
CREATE INDEX IF NOT EXISTS idx_pgqueue_jobs_failed
    ON pgqueue_jobs (queue, status, id) WHERE status IN {FAILED};
"""

PERIODIC = """-- Periodic jobs: one row per schedule, its last tick (see PERIODIC_TICK).
CREATE TABLE IF NOT EXISTS pgqueue_periodic
(
    name         TEXT        PRIMARY KEY,
    schedule     TEXT        NOT NULL,
    timezone     TEXT        NOT NULL DEFAULT 'UTC',
    queue        TEXT        NOT NULL,
    job_type     TEXT        NOT NULL,
    last_tick    TIMESTAMPTZ,
    next_tick    TIMESTAMPTZ,
    last_job_key TEXT,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT pg_catalog.now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT pg_catalog.now(),
    last_job_id  BIGINT
);
"""
PERIODIC_UPGRADE = """-- The id of the schedule's last job (its own: a key can be forged).
ALTER TABLE pgqueue_periodic ADD COLUMN IF NOT EXISTS last_job_id BIGINT;
"""

LIMITS = """-- Fleet-wide limits: one row per limited queue, its limit, locked while a
-- lease of the queue is taken or renewed (see LEASE).
CREATE TABLE IF NOT EXISTS pgqueue_limits
(
    queue        TEXT PRIMARY KEY,
    global_limit INT  NOT NULL
);
"""
LEASES = """-- Each worker's lease of a limited queue's slots: the jobs of the queue it
-- may run at once until expires_at, and how many it would like.
CREATE TABLE IF NOT EXISTS pgqueue_leases
(
    queue      TEXT        NOT NULL,
    worker     TEXT        NOT NULL,
    slots      INT         NOT NULL,
    wanted     INT         NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (queue, worker)
);
"""
PAUSED = """-- Paused queues (Admin.pause): one row each; claims take nothing from them.
CREATE TABLE IF NOT EXISTS pgqueue_paused
(
    queue     TEXT        PRIMARY KEY,
    paused_at TIMESTAMPTZ NOT NULL DEFAULT pg_catalog.now()
);
"""
STARTS = """-- Rate limits (Worker(rate_limit=...)): each start of a job of a
-- rate-limited queue, on the database clock, while it is in a window (see
-- RATE_ROOM); group_key for limits per group.
CREATE TABLE IF NOT EXISTS pgqueue_starts
(
    queue      TEXT        NOT NULL,
    group_key  TEXT,
    started_at TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_pgqueue_starts
    ON pgqueue_starts (queue, started_at);
-- A group's starts in its window (a rate per group), one probe a group.
CREATE INDEX IF NOT EXISTS idx_pgqueue_starts_group
    ON pgqueue_starts (queue, group_key, started_at) WHERE group_key IS NOT NULL;
"""
TURNS = """-- The turns of the claims of a queue with a group or a rate limit (see
-- LOCK_CLAIMS): a row a queue, which such a claim locks first. A row lock,
-- not an advisory lock: only roles that may update this table (workers)
-- can take it, so no other role can stop a queue's claims.
CREATE TABLE IF NOT EXISTS pgqueue_turns
(
    queue TEXT PRIMARY KEY
);
"""
GROUPS = """-- The heads of the queues' groups (see CLAIM_GROUPS): for each group with
-- a pending job, a time no later than its first pending job's run_at (a
-- claim finds the groups with a job due through (queue, due_at), and no
-- group whose jobs are all in the future costs it anything). Kept by the
-- trigger pgqueue_group_pending for every writer, lowered when a grouped
-- job becomes pending; raised (or the row deleted) by the claims, after
-- they take a group's first jobs, by pgqueue_group_heads.
CREATE TABLE IF NOT EXISTS pgqueue_groups
(
    queue     TEXT        NOT NULL,
    group_key TEXT        NOT NULL,
    due_at    TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (queue, group_key)
);
CREATE INDEX IF NOT EXISTS idx_pgqueue_groups_due
    ON pgqueue_groups (queue, due_at);
"""

GROUP_INDEX_UPGRADE = """-- Groups (enqueue(group=...)): the pending and running jobs of each group,
-- for the claims of a queue with a group limit (see CLAIM_GROUPS); only
-- jobs with a group are in it. Its status is spelled COLLATE "C" (the same
-- values, compared alike), as are the group claims' tests of it, so that
-- the Go module's claim and rescue indexes, whose predicates are in the
-- default collation, are never taken for those tests, nor it for theirs.
-- An earlier form without it is replaced.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = pg_catalog.to_regclass('idx_pgqueue_jobs_group')
               AND pg_catalog.pg_get_indexdef(indexrelid) NOT LIKE '%status COLLATE "C"%') THEN
        DROP INDEX idx_pgqueue_jobs_group;
    END IF;
END $$;
"""
GROUP_INDEX = f"""CREATE INDEX IF NOT EXISTS idx_pgqueue_jobs_group
    ON pgqueue_jobs (queue, group_key, status COLLATE "C", run_at, id)
    WHERE group_key IS NOT NULL AND status IN ({PENDING} COLLATE "C", {RUNNING});
"""

DEPENDENCIES = """-- Dependencies (Queue.enqueue(after=...)): one row per parent and child,
-- found by parent (the primary key) when the parent ends and by child for
-- its handler's parent_results. settled: the parent's end has been counted
-- on the child (once: a parent retried and ending again is not counted twice).
CREATE TABLE IF NOT EXISTS pgqueue_dependencies
(
    parent_id BIGINT  NOT NULL,
    child_id  BIGINT  NOT NULL,
    settled   BOOLEAN NOT NULL DEFAULT false,
    PRIMARY KEY (parent_id, child_id)
);
CREATE INDEX IF NOT EXISTS idx_pgqueue_dependencies_child
    ON pgqueue_dependencies (child_id);
"""
WAITING_INDEX = f"""-- The listings of waiting jobs (pgqueue.Admin, pgqueue jobs, the dashboard):
-- only jobs with unfinished parents are in it.
CREATE INDEX IF NOT EXISTS idx_pgqueue_jobs_waiting
    ON pgqueue_jobs (queue, id) WHERE status = {WAITING};
"""
TREND = """-- The trend (Admin.trend, pgqueue stats --since, the dashboard's charts):
-- per minute (bucket, on the database clock), queue and job type, the
-- attempts pgqueue workers ran that completed, failed (retried or dead)
-- and ended dead, and their run times: a count, a sum and a histogram
-- (run_times: {"k": count}, bucket k holding times in
-- [2^(k/8), 2^((k+1)/8)) ms). Each worker counts its outcomes in memory
-- and adds them here every few seconds (one statement per flush, never
-- one per job); its upkeep deletes buckets older than the trend's
-- retention. A Go worker's outcomes are not counted.
CREATE TABLE IF NOT EXISTS pgqueue_trend
(
    queue        TEXT             NOT NULL,
    bucket       TIMESTAMPTZ      NOT NULL,
    job_type     TEXT             NOT NULL,
    completed    BIGINT           NOT NULL DEFAULT 0,
    failed       BIGINT           NOT NULL DEFAULT 0,
    dead         BIGINT           NOT NULL DEFAULT 0,
    runs         BIGINT           NOT NULL DEFAULT 0,
    run_time_sum DOUBLE PRECISION NOT NULL DEFAULT 0,
    run_times    JSONB            NOT NULL DEFAULT '{}'::jsonb,
    PRIMARY KEY (queue, bucket, job_type)
);
CREATE INDEX IF NOT EXISTS idx_pgqueue_trend_bucket
    ON pgqueue_trend (bucket);
"""
