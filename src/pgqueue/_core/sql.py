"""Every SQL statement pgqueue runs.

The table and the wakeup channel match the Go module
``github.com/pascalallen/pgqueue`` v1.1.0, so producers and workers written
with either library share one ``pgqueue_jobs`` table. Times are always the
database's ``pg_catalog.now()``, never the client's clock.
"""

from __future__ import annotations

import textwrap
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "ADMIN_INDEXES",
    "BEGIN_PROBE",
    "CANCEL",
    "CANCEL_REQUESTED",
    "CHECKPOINT",
    "CITUS_CHECK",
    "CITUS_INSTALLED",
    "CLAIM",
    "CLAIM_GROUPS",
    "CLAIM_GROUPS_RATED",
    "CLAIM_RATED",
    "CLAIM_TYPES",
    "CLAIM_TYPES_RATED",
    "CLOCK",
    "COMPLETE",
    "CONTROL_CHANNEL",
    "COPY_COLUMNS",
    "COPY_TABLE",
    "DASHBOARD_ENQUEUED",
    "DASHBOARD_NEWEST",
    "DASHBOARD_RUNNING",
    "DEAD_COUNT",
    "DEPENDENCIES",
    "DISTRIBUTED_ANNOUNCE",
    "DISTRIBUTED_CANCEL",
    "DISTRIBUTED_CHECK",
    "DISTRIBUTED_CHECKPOINT",
    "DISTRIBUTED_CLAIM",
    "DISTRIBUTED_CLAIM_GROUPS",
    "DISTRIBUTED_CLAIM_GROUPS_RATED",
    "DISTRIBUTED_CLAIM_RATED",
    "DISTRIBUTED_CLAIM_TYPES",
    "DISTRIBUTED_CLAIM_TYPES_RATED",
    "DISTRIBUTED_CLAIM_ZERO",
    "DISTRIBUTED_CLAIM_ZERO_TYPES",
    "DISTRIBUTED_COMPLETE",
    "DISTRIBUTED_FINISH",
    "DISTRIBUTED_LEASE_EXPIRE",
    "DISTRIBUTED_LEASE_GRANT",
    "DISTRIBUTED_LEASE_WRITE",
    "DISTRIBUTED_MANY_UNIQUE",
    "DISTRIBUTED_MANY_UNIQUE_DELAYED",
    "DISTRIBUTED_NOTIFY",
    "DISTRIBUTED_PERIODIC_REGISTER",
    "DISTRIBUTED_PRUNE",
    "DISTRIBUTED_PRUNE_BATCH",
    "DISTRIBUTED_RATE_ROOM",
    "DISTRIBUTED_RECORD_START",
    "DISTRIBUTED_RELEASE_LEASE",
    "DISTRIBUTED_RESCUE",
    "DISTRIBUTED_RETRY",
    "DISTRIBUTED_TICK_ADVANCE",
    "DISTRIBUTED_TICK_JOB",
    "DISTRIBUTED_TICK_LIVE",
    "DISTRIBUTED_TICK_NEW",
    "DISTRIBUTED_TICK_SEEN",
    "DISTRIBUTED_TOUCH",
    "DISTRIBUTED_UNIQUE_SILENT",
    "ENQUEUE",
    "ENQUEUE_AFTER",
    "ENQUEUE_MANY",
    "ENQUEUE_MANY_DELAYED",
    "ENQUEUE_MANY_DELAYED_SILENT",
    "ENQUEUE_MANY_REPLACE",
    "ENQUEUE_MANY_SILENT",
    "ENQUEUE_MANY_UNIQUE",
    "ENQUEUE_MANY_UNIQUE_DELAYED",
    "ENQUEUE_MANY_UNIQUE_DELAYED_SILENT",
    "ENQUEUE_MANY_UNIQUE_SILENT",
    "ENQUEUE_REPLACE",
    "ENQUEUE_SILENT",
    "ENQUEUE_UNIQUE",
    "ENQUEUE_UNIQUE_SILENT",
    "ERROR_LINE_CHARS",
    "FINISH",
    "FINISHED_QUEUES",
    "FOREIGN_JOBS_PYFORMAT",
    "FUNCTIONS",
    "GROUP_HEADS",
    "HEAD_OF_LINE",
    "HISTORY_KEPT",
    "INDEX_PLANNING",
    "JIT_BACK",
    "JIT_OFF",
    "JOB",
    "JOBS_CHANNEL",
    "JOB_PREVIEW",
    "JOB_PYFORMAT",
    "JOB_STATUSES",
    "JOB_SUMMARY",
    "LEASE",
    "LOCK_CLAIMS",
    "LOCK_LIMIT",
    "NOTIFY_JOBS",
    "NO_JIT",
    "OUTCOMES",
    "OUTCOMES_CHANNEL",
    "PARENT_RESULTS",
    "PAUSE",
    "PAUSED",
    "PERIODIC_LIST",
    "PERIODIC_NOW",
    "PERIODIC_REGISTER",
    "PERIODIC_REMOVE",
    "PERIODIC_TABLE_EXISTS",
    "PERIODIC_TICK",
    "PRIORITIES",
    "PROGRESS_CHARS",
    "PRUNE",
    "PRUNE_BATCH",
    "PRUNE_BATCH_ANY",
    "PUBLISH",
    "QUEUES_OF",
    "RATE_ROOM",
    "RELEASE_LEASES",
    "REQUIRED_COLUMNS",
    "REQUIRED_FUNCTIONS",
    "REQUIRED_INDEXES",
    "RESCUE",
    "RESERVE_IDS",
    "RESUME",
    "RETRY",
    "RETRYABLE_IDS",
    "RETRY_CHILDREN",
    "SCHEMA",
    "SCHEMA_CHECK",
    "SCHEMA_DISTRIBUTED",
    "SCHEMA_DOWN",
    "SCHEMA_UPGRADE",
    "SEED_LIMIT",
    "SETTLE",
    "STATS",
    "STATS_COMPLETED",
    "STATS_LIMITS",
    "STATS_TABLE",
    "TABLE_EXISTS",
    "TOUCH",
    "WAKE",
    "WORKER_SETTINGS",
    "array",
    "booleans",
    "claim_places",
    "job_summaries_query",
    "jobs_query",
    "seconds",
    "timestamps",
]

JOBS_CHANNEL = "pgqueue_jobs"
"""Wakeups: the queue's name, when a job may have become ready (as the Go module)."""

CONTROL_CHANNEL = "pgqueue_control"
"""Cancel requests: the id of a running job whose cancel was requested. Any
role may NOTIFY here, so a worker takes the id as a hint (see CANCEL_REQUESTED)."""

OUTCOMES_CHANNEL = "pgqueue_outcomes"
"""The id of a tracked job that has ended (completed, dead or cancelled)."""


# How every statement pgqueue plans on its own connections, and inside the
# functions its schema creates, may read the tables: through an index,
# probing by key in nested loops. Each such statement looks rows up by
# their ids or walks an index from a place, and an index is right for it at
# every size; but planned on a new table, which the planner takes for ten
# pages or fewer, a sequential scan, a bitmap of the whole table or a hash
# or merge join over a full scan costs less, and a plan cached then (a
# worker's connections keep theirs for good) scans the table for every
# batch after it has grown to millions of rows (issue 39). With these off,
# the planner keeps those paths only where no index serves, and
# statements that could take one partial index for another spell their
# status tests so that only the right one's predicate is implied (see
# _STILL_RUNNING, the COLLATE "C" tests). JIT is off too: it never pays for
# statements of a few milliseconds, and before PostgreSQL 18 a plan node
# kept where no index serves costs 10^10 to the planner, far above the JIT
# threshold (an enqueue with 100 parents compiled for half a second).
INDEX_PLANNING = {
    "enable_seqscan": "off",
    "enable_bitmapscan": "off",
    "enable_hashjoin": "off",
    "enable_mergejoin": "off",
    "jit": "off",
}
"""Planner settings of pgqueue's own connections and functions: index lookups only."""

_FUNCTION_SETTINGS = "".join(
    f"SET {name} = {value}\n" for name, value in INDEX_PLANNING.items()
)


def array(values: Iterable[int | float]) -> str:
    """An array literal of numbers, for a ``$n::text::int[]`` (or bigint, float8) parameter."""
    return "{" + ",".join(map(repr, values)) + "}"


def seconds(values: Iterable[float | None]) -> str:
    """An array literal of seconds or NULLs, for a ``$n::text::float8[]`` parameter."""
    return "{" + ",".join("NULL" if v is None else repr(v) for v in values) + "}"


def booleans(values: Iterable[bool]) -> str:
    """An array literal of booleans, for a ``$n::text::boolean[]`` parameter."""
    return "{" + ",".join("t" if v else "f" for v in values) + "}"


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
    year = value.year  # compared first: comparing aware datetimes is slow
    if year == 1 and value == _MIN:
        return "-infinity"
    if year == 9999 and value == _MAX:
        return "infinity"
    return value.isoformat()


# What a parent's ending does to its children (see pgqueue_parent_ended in
# _ADDED_IN_V2, which runs it with the parent's id and new status): SETTLE
# is the same statement with those as $1 and $2, for the plan tests. The
# children are found by their edges, then by id: 'waiting' is spelled
# COLLATE "C" (the same test) so that the index of every waiting job
# (idx_pgqueue_jobs_waiting, whose predicate is in the default collation)
# is never taken for it.
_SETTLE = """
WITH settled AS (
    UPDATE pgqueue_dependencies SET settled = true
    WHERE parent_id = {id} AND NOT settled
    RETURNING child_id
), changed AS (
    UPDATE pgqueue_jobs AS c
    SET parents_left = c.parents_left - 1,
        status       = CASE WHEN {status} <> 'completed' AND c.on_parent_failure = 'cancel'
                            THEN 'cancelled'
                            WHEN c.parents_left <= 1 THEN 'pending'
                            ELSE 'waiting' END,
        run_at       = CASE WHEN c.parents_left <= 1 THEN greatest(c.run_at, pg_catalog.now())
                            ELSE c.run_at END,
        last_error   = CASE WHEN {status} <> 'completed' AND c.on_parent_failure = 'cancel'
                            THEN pg_catalog.format('parent job %s is %s', {id}, {status})
                            ELSE c.last_error END,
        updated_at   = pg_catalog.now()
    FROM settled AS s
    WHERE c.id = s.child_id AND c.status = 'waiting' COLLATE "C"
    RETURNING c.id, c.queue, c.status, c.tracked
)
SELECT pg_catalog.count(n.sent){into}
FROM changed AS c,
     LATERAL (SELECT CASE WHEN c.status = 'pending' THEN pg_catalog.pg_notify('pgqueue_jobs', c.queue)
                          WHEN c.tracked THEN pg_catalog.pg_notify('pgqueue_outcomes', c.id::text) END
              AS sent) AS n;
"""
SETTLE = _SETTLE.format(id="$1::int8", status="$2::text", into="").rstrip().rstrip(";")

# What schema v2 adds beside the Go module's table and indexes: the same
# text in SCHEMA and SCHEMA_UPGRADE, idempotent.
_ADDED_IN_V2_TEXT = """
-- Our claims of jobs with a priority (COLLATE "C": only they can use it).
CREATE INDEX IF NOT EXISTS idx_pgqueue_jobs_priority
    ON pgqueue_jobs (queue, priority, run_at, id)
    WHERE status = 'pending' COLLATE "C" AND priority <> 0;
-- One live job per (queue, job_type, unique_key): unique keys are per
-- queue, so one tenant's queue never meets another's keys. The earlier
-- form, on (job_type, unique_key) across queues, is replaced: the new one
-- is built first (it allows all the old one allowed), then the old one goes.
DO $$
DECLARE
    name text;
    predicate text;
BEGIN
    FOR name, predicate IN VALUES
        ('idx_pgqueue_jobs_unique', $p$unique_key IS NOT NULL AND status IN ('pending', 'running')$p$),
        ('idx_pgqueue_jobs_unique_next', $p$unique_key IS NOT NULL AND status = 'waiting'$p$)
    LOOP
        IF EXISTS (SELECT 1 FROM pg_index WHERE indexrelid = pg_catalog.to_regclass(name)
                   AND pg_catalog.pg_get_indexdef(indexrelid) NOT LIKE '%(queue, job_type, unique_key)%') THEN
            EXECUTE pg_catalog.format('CREATE UNIQUE INDEX %I ON pgqueue_jobs (queue, job_type, unique_key) WHERE %s',
                           name || '_per_queue', predicate);
            EXECUTE pg_catalog.format('DROP INDEX %I', name);
            EXECUTE pg_catalog.format('ALTER INDEX %I RENAME TO %I', name || '_per_queue', name);
        END IF;
    END LOOP;
END $$;
CREATE UNIQUE INDEX IF NOT EXISTS idx_pgqueue_jobs_unique
    ON pgqueue_jobs (queue, job_type, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'running');
-- The next job of a key whose live job had started when a replacing
-- enqueue came (see pgqueue_enqueue_replace): at most one per key, waiting
-- for the live one.
CREATE UNIQUE INDEX IF NOT EXISTS idx_pgqueue_jobs_unique_next
    ON pgqueue_jobs (queue, job_type, unique_key)
    WHERE unique_key IS NOT NULL AND status = 'waiting';
-- The operations' stats and listings of dead and cancelled jobs (pgqueue.Admin).
CREATE INDEX IF NOT EXISTS idx_pgqueue_jobs_failed
    ON pgqueue_jobs (queue, status, id) WHERE status IN ('dead', 'cancelled');

-- Periodic jobs: one row per schedule, its last tick (see PERIODIC_TICK).
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
-- The id of the schedule's last job (its own: a key can be forged).
ALTER TABLE pgqueue_periodic ADD COLUMN IF NOT EXISTS last_job_id BIGINT;

-- Fleet-wide limits: one row per limited queue, its limit, locked while a
-- lease of the queue is taken or renewed (see LEASE).
CREATE TABLE IF NOT EXISTS pgqueue_limits
(
    queue        TEXT PRIMARY KEY,
    global_limit INT  NOT NULL
);

-- Each worker's lease of a limited queue's slots: the jobs of the queue it
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

-- Paused queues (Admin.pause): one row each; claims take nothing from them.
CREATE TABLE IF NOT EXISTS pgqueue_paused
(
    queue     TEXT        PRIMARY KEY,
    paused_at TIMESTAMPTZ NOT NULL DEFAULT pg_catalog.now()
);

-- Rate limits (Worker(rate_limit=...)): each start of a job of a
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

-- The turns of the claims of a queue with a group or a rate limit (see
-- LOCK_CLAIMS): a row a queue, which such a claim locks first. A row lock,
-- not an advisory lock: only roles that may update this table (workers)
-- can take it, so no other role can stop a queue's claims.
CREATE TABLE IF NOT EXISTS pgqueue_turns
(
    queue TEXT PRIMARY KEY
);

-- The heads of the queues' groups (see CLAIM_GROUPS): for each group with
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

-- Groups (enqueue(group=...)): the pending and running jobs of each group,
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
CREATE INDEX IF NOT EXISTS idx_pgqueue_jobs_group
    ON pgqueue_jobs (queue, group_key, status COLLATE "C", run_at, id)
    WHERE group_key IS NOT NULL AND status IN ('pending' COLLATE "C", 'running');

-- A grouped job that becomes pending (inserted, retried, snoozed, rescued,
-- released, by any writer that sets its run_at: the Go module's retry does,
-- its rescue does not) makes its group's head no later than its run_at.
-- Only statements that set run_at fire it: claims, completions and
-- heartbeats, which do not, cost nothing. The head's row is locked only when it is lowered; else it is
-- held FOR KEY SHARE until commit (producers of one group never wait for
-- each other), so that a claim raising it (FOR UPDATE SKIP LOCKED, then a
-- fresh snapshot: pgqueue_group_heads) leaves it alone until this job is
-- visible, or else finds it. SECURITY DEFINER: a producer cannot write
-- heads itself.
CREATE OR REPLACE FUNCTION pgqueue_group_pending() RETURNS trigger
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
{settings}AS $pgqueue_group_pending$
BEGIN
    UPDATE pgqueue_groups SET due_at = NEW.run_at
    WHERE queue = NEW.queue AND group_key = NEW.group_key AND due_at > NEW.run_at;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM FROM pgqueue_groups WHERE queue = NEW.queue AND group_key = NEW.group_key
    FOR KEY SHARE;
    IF NOT FOUND THEN
        INSERT INTO pgqueue_groups AS g (queue, group_key, due_at)
        VALUES (NEW.queue, NEW.group_key, NEW.run_at)
        ON CONFLICT (queue, group_key) DO UPDATE SET due_at = LEAST(g.due_at, EXCLUDED.due_at);
    ELSE
        -- A claim may have raised it between the two statements above.
        UPDATE pgqueue_groups SET due_at = NEW.run_at
        WHERE queue = NEW.queue AND group_key = NEW.group_key AND due_at > NEW.run_at;
    END IF;
    RETURN NULL;
END
$pgqueue_group_pending$;

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_trigger WHERE tgrelid = 'pgqueue_jobs'::regclass
                   AND tgname = 'pgqueue_group_pending') THEN
        CREATE TRIGGER pgqueue_group_pending
            AFTER INSERT OR UPDATE OF run_at ON pgqueue_jobs
            FOR EACH ROW
            WHEN (NEW.group_key IS NOT NULL AND NEW.status = 'pending')
            EXECUTE FUNCTION pgqueue_group_pending();
        -- The groups' heads from before the trigger.
        INSERT INTO pgqueue_groups (queue, group_key, due_at)
        SELECT queue, group_key, pg_catalog.min(run_at) FROM pgqueue_jobs
        WHERE group_key IS NOT NULL AND status = 'pending'
        GROUP BY queue, group_key
        ON CONFLICT (queue, group_key) DO NOTHING;
    END IF;
END $$;

-- After a claim of queue p_queue under a group limit (in its transaction,
-- in its turn): the heads of the groups it took jobs of (p_claimed), and of
-- the groups whose head is due but whose jobs are not (cancelled, moved
-- later), are raised to their first pending job, or deleted without one.
-- Each is locked FOR UPDATE SKIP LOCKED (a producer's trigger holds the
-- heads of its new jobs' groups until commit: those are left for the next
-- claim), then read in a statement of its own, whose snapshot sees every
-- job committed before the lock was granted.
CREATE OR REPLACE FUNCTION pgqueue_group_heads(p_queue text, p_claimed text[]) RETURNS void
LANGUAGE plpgsql VOLATILE
{settings}AS $pgqueue_group_heads$
DECLARE
    g    text;
    head timestamptz;
BEGIN
    FOR g IN
        SELECT h.group_key FROM pgqueue_groups AS h
        WHERE h.queue = p_queue AND h.group_key = ANY (p_claimed)
        UNION
        SELECT h.group_key FROM pgqueue_groups AS h
        WHERE h.queue = p_queue AND h.due_at <= pg_catalog.now()
          AND NOT EXISTS (SELECT FROM pgqueue_jobs AS j
                          WHERE j.queue = p_queue AND j.group_key = h.group_key
                            AND j.status = 'pending' COLLATE "C" AND j.run_at <= pg_catalog.now())
    LOOP
        PERFORM FROM pgqueue_groups WHERE queue = p_queue AND group_key = g FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        head := (SELECT j.run_at FROM pgqueue_jobs AS j
                 WHERE j.queue = p_queue AND j.group_key = g AND j.status = 'pending' COLLATE "C"
                 ORDER BY j.run_at LIMIT 1);
        IF head IS NULL THEN
            DELETE FROM pgqueue_groups WHERE queue = p_queue AND group_key = g;
        ELSE
            UPDATE pgqueue_groups SET due_at = head
            WHERE queue = p_queue AND group_key = g AND due_at IS DISTINCT FROM head;
        END IF;
    END LOOP;
END
$pgqueue_group_heads$;


-- Dependencies (Queue.enqueue(after=...)): one row per parent and child,
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
-- The listings of waiting jobs (pgqueue.Admin, pgqueue jobs, the dashboard):
-- only jobs with unfinished parents are in it.
CREATE INDEX IF NOT EXISTS idx_pgqueue_jobs_waiting
    ON pgqueue_jobs (queue, id) WHERE status = 'waiting';

-- A parent (has_children) that ends, by any writer (a Go worker's too),
-- settles its unsettled edges, in the transaction of its outcome: each
-- waiting child counts one parent fewer (parents_left) and becomes pending
-- at zero, its queue woken; a child with on_parent_failure 'cancel' of a
-- parent that ended dead or cancelled is cancelled, naming the parent, and
-- being a status change of its own, cancels its own waiting children alike.
-- Each parent touches its own edges and children only: no statement reads a
-- child's other parents.
CREATE OR REPLACE FUNCTION pgqueue_parent_ended() RETURNS trigger
LANGUAGE plpgsql VOLATILE
{settings}AS $pgqueue_parent_ended$
DECLARE
    woken int;
BEGIN
    IF NEW.status NOT IN ('completed', 'dead', 'cancelled')
       OR OLD.status IN ('completed', 'dead', 'cancelled') THEN
        RETURN NULL;
    END IF;
{settle}    RETURN NULL;
END
$pgqueue_parent_ended$;

DO $$
BEGIN
    -- The trigger's WHEN is as small as it can be: PostgreSQL prepares it for
    -- every statement that updates the table (a claim, an outcome write),
    -- and reads it for each row. An earlier form (reading OLD) is replaced.
    IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'pgqueue_jobs'::regclass
               AND tgname = 'pgqueue_parent_ended'
               AND pg_catalog.pg_get_triggerdef(oid) NOT ILIKE '%WHEN (new.has_children) EXECUTE%') THEN
        DROP TRIGGER pgqueue_parent_ended ON pgqueue_jobs;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'pgqueue_jobs'::regclass
                   AND tgname = 'pgqueue_parent_ended') THEN
        CREATE TRIGGER pgqueue_parent_ended
            AFTER UPDATE OF status ON pgqueue_jobs
            FOR EACH ROW
            WHEN (NEW.has_children)
            EXECUTE FUNCTION pgqueue_parent_ended();
    END IF;
END $$;
"""
_ADDED_IN_V2 = _ADDED_IN_V2_TEXT.replace(
    "{settle}",
    textwrap.indent(
        _SETTLE.format(id="NEW.id", status="NEW.status", into=" INTO woken").strip(
            "\n"
        ),
        "    ",
    )
    + "\n",
).replace("{settings}", _FUNCTION_SETTINGS)


# The functions of the schema. Those a producer calls to write what its
# grants do not let it write itself (pgqueue.grants: a producer may insert
# the columns of a plain job, nothing else) are SECURITY DEFINER: they run
# with their owner's rights, check every argument as the Python side does,
# and write only what a producer's enqueue may (its own new rows; the live
# job of its own key, by the replace rules; edges from its new jobs to their
# parents). Every function's search_path is pinned when the schema is
# applied (_PINNED), and every built-in is called as pg_catalog's.

# pgqueue_check_job(function, ...): raise unless the fields of one job are
# what a producer may write: a queue of at most 1024 bytes, a job type and a
# group of at most 255 characters, a key of at most 1024 that does not start
# 'periodic:', none empty or holding a C0 or C1 control character; a
# payload, at least one attempt, a priority from -5 to 5, a tracking flag.
# The messages start with the function's name; SQLSTATE 22023.
_CHECK_JOB_FUNCTION = """
CREATE OR REPLACE FUNCTION pgqueue_check_name(
    p_function text, p_what text, p_value text, p_max_chars int
) RETURNS void
LANGUAGE plpgsql IMMUTABLE
{settings}AS $pgqueue_check_name$
BEGIN
    IF p_value IS NULL OR p_value = '' THEN
        RAISE EXCEPTION '%: % must not be empty', p_function, p_what
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.char_length(p_value) > p_max_chars THEN
        RAISE EXCEPTION '%: % is % characters; at most % are allowed',
            p_function, p_what, pg_catalog.char_length(p_value), p_max_chars
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_value ~ E'[\\u0001-\\u001f\\u007f-\\u009f]' THEN
        RAISE EXCEPTION '%: % must not contain a control character', p_function, p_what
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
END
$pgqueue_check_name$;

CREATE OR REPLACE FUNCTION pgqueue_check_job(
    p_function     text,
    p_queue        text,
    p_job_type     text,
    p_payload      jsonb,
    p_max_attempts int,
    p_priority     int,
    p_tracked      boolean,
    p_unique_key   text,
    p_group_key    text
) RETURNS void
LANGUAGE plpgsql IMMUTABLE
{settings}AS $pgqueue_check_job$
BEGIN
    IF pg_catalog.octet_length(p_queue) > 1024 THEN
        RAISE EXCEPTION '%: queue name is % bytes; at most 1024 are allowed',
            p_function, pg_catalog.octet_length(p_queue)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pgqueue_check_name(p_function, 'queue', p_queue, 1024);
    PERFORM pgqueue_check_name(p_function, 'job_type', p_job_type, 255);
    IF p_payload IS NULL THEN
        RAISE EXCEPTION '%: payload must not be NULL (give ''{}'' for none)', p_function
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_max_attempts IS NULL OR p_max_attempts < 1 THEN
        RAISE EXCEPTION '%: max_attempts must be at least 1, got %',
            p_function, coalesce(p_max_attempts::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_priority IS NULL OR p_priority NOT BETWEEN -5 AND 5 THEN
        RAISE EXCEPTION '%: priority must be from -5 to 5, got %',
            p_function, coalesce(p_priority::text, 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_tracked IS NULL THEN
        RAISE EXCEPTION '%: track must be true or false, not NULL', p_function
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_unique_key IS NOT NULL THEN
        PERFORM pgqueue_check_name(p_function, 'unique_key', p_unique_key, 1024);
        IF pg_catalog.starts_with(p_unique_key, 'periodic:') THEN
            RAISE EXCEPTION '%: unique keys that start with ''periodic:'' are reserved for periodic schedules',
                p_function
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    IF p_group_key IS NOT NULL THEN
        PERFORM pgqueue_check_name(p_function, 'group', p_group_key, 255);
    END IF;
END
$pgqueue_check_job$;
""".replace("{settings}", _FUNCTION_SETTINGS)

_TAKE_TURN_FUNCTION = """
-- A claim's turn (LOCK_CLAIMS): the queue's row of pgqueue_turns, made if
-- it is missing, locked until the claim's transaction ends; waiting at
-- most 5 s for another worker's claim (lock_not_available after that: the
-- claimer retries, and says so).
CREATE OR REPLACE FUNCTION pgqueue_take_turn(p_queue text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET lock_timeout = '5s'
{settings}AS $pgqueue_take_turn$
BEGIN
    PERFORM FROM pgqueue_turns WHERE queue = p_queue FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO pgqueue_turns (queue) VALUES (p_queue) ON CONFLICT (queue) DO NOTHING;
        PERFORM FROM pgqueue_turns WHERE queue = p_queue FOR UPDATE;
    END IF;
END
$pgqueue_take_turn$;
""".replace("{settings}", _FUNCTION_SETTINGS)

# pgqueue_enqueue_replace(...): an enqueue with a unique key, or without:
# Queue.enqueue and enqueue_many with keys (p_replace false: the key's live
# job's id comes back instead, 'existed'), on_conflict="replace" and
# debounce (p_replace: the key's job that has not started takes the new
# payload and options), and pgqueue_enqueue. A job without a key is simply
# inserted. SECURITY DEFINER: a producer may insert and replace its keys'
# jobs without the UPDATE an INSERT ... ON CONFLICT DO UPDATE needs.
#
# The key's live job (pending or running) is taken and locked by the
# INSERT's conflict, or the row is new. Every replacing enqueue of a key
# holds that lock while it writes, so the statements after it (each sees
# what committed before it started, in READ COMMITTED) see the last
# replacing enqueue's writes:
# - the key's next job (waiting for the live one) exists: it takes the new
#   payload and options;
# - the live job is pending and has never started an attempt (no attempt
#   counted, never snoozed): it takes them;
# - else (running, or pending again after an attempt) it is left alone and
#   the new job is inserted waiting for it, as a child that runs whatever
#   the live job's end (on_parent_failure 'run'): the dependencies' trigger
#   makes it pending in the transaction of that end, by any writer (a Go
#   worker's too). Until then no claim sees it.
# A claim skips the locked live job (SKIP LOCKED) and takes it after the
# replace commits; a claim that locked it first makes the replace wait, and
# see it running.
# outcome: 'inserted', 'existed' (without p_replace), 'replaced' (the live
# job), 'replaced_next' (the next job) or 'queued_next' (a new next job).
# wake: whether the queue's workers have something to claim now (a new
# pending job, or a replaced one due now); with p_notify the function sends
# that wakeup itself. A key is a queue's: only that queue's jobs are seen.
_ENQUEUE_REPLACE_FUNCTION = """
DROP FUNCTION IF EXISTS pgqueue_enqueue_replace(text, text, jsonb, int, timestamptz, int, boolean, text, text, boolean, boolean);
CREATE OR REPLACE FUNCTION pgqueue_enqueue_replace(
    p_queue         text,
    p_job_type      text,
    p_payload       jsonb,
    p_max_attempts  int,
    p_run_at        timestamptz,
    p_priority      int,
    p_tracked       boolean,
    p_trace_context text,
    p_unique_key    text,
    p_replace       boolean,
    p_notify        boolean,
    p_group_key     text,
    OUT job_id      bigint,
    OUT outcome     text,
    OUT wake        boolean
)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
{settings}AS $pgqueue_enqueue_replace$
DECLARE
    live record;
BEGIN
    PERFORM pgqueue_check_job('pgqueue_enqueue_replace', p_queue, p_job_type, p_payload,
                              p_max_attempts, p_priority, p_tracked, p_unique_key, p_group_key);
    IF p_run_at IS NULL OR p_replace IS NULL OR p_notify IS NULL THEN
        RAISE EXCEPTION 'pgqueue_enqueue_replace: run_at, replace and notify must not be NULL'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_replace AND (p_unique_key IS NULL OR p_group_key IS NOT NULL) THEN
        RAISE EXCEPTION 'pgqueue_enqueue_replace: a replacing enqueue needs a unique_key, and no group'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    INSERT INTO pgqueue_jobs AS j (queue, job_type, payload, max_attempts, run_at, priority,
                                   tracked, trace_context, unique_key, group_key)
    VALUES (p_queue, p_job_type, p_payload, p_max_attempts, p_run_at, p_priority,
            p_tracked, p_trace_context, p_unique_key, p_group_key)
    ON CONFLICT (queue, job_type, unique_key) WHERE unique_key IS NOT NULL AND status IN ('pending', 'running')
    DO UPDATE SET unique_key = EXCLUDED.unique_key
    RETURNING j.id, j.status, j.attempts, j.snoozes, j.xmax <> 0 AS existed INTO live;

    IF NOT live.existed THEN
        job_id := live.id;
        outcome := 'inserted';
        wake := true;
    ELSIF NOT p_replace THEN
        job_id := live.id;
        outcome := 'existed';
        wake := false;
    ELSE
        UPDATE pgqueue_jobs AS j
        SET payload = p_payload, max_attempts = p_max_attempts,
            run_at = p_run_at, priority = p_priority, tracked = j.tracked OR p_tracked,
            trace_context = p_trace_context, updated_at = pg_catalog.now()
        WHERE j.queue = p_queue AND j.job_type = p_job_type AND j.unique_key = p_unique_key
          AND j.status = 'waiting'
        RETURNING j.id INTO job_id;
        IF FOUND THEN
            outcome := 'replaced_next';
            wake := false;
        ELSIF live.status = 'pending' AND live.attempts = 0 AND live.snoozes = 0 THEN
            UPDATE pgqueue_jobs AS j
            SET payload = p_payload, max_attempts = p_max_attempts,
                run_at = p_run_at, priority = p_priority, tracked = j.tracked OR p_tracked,
                trace_context = p_trace_context, updated_at = pg_catalog.now()
            WHERE j.id = live.id;
            job_id := live.id;
            outcome := 'replaced';
            wake := p_run_at <= pg_catalog.now();
        ELSE
            INSERT INTO pgqueue_jobs AS j (queue, job_type, payload, max_attempts, run_at, priority,
                                           tracked, trace_context, unique_key, status,
                                           parents_left, on_parent_failure)
            VALUES (p_queue, p_job_type, p_payload, p_max_attempts, p_run_at, p_priority,
                    p_tracked, p_trace_context, p_unique_key, 'waiting', 1, 'run')
            RETURNING j.id INTO job_id;
            INSERT INTO pgqueue_dependencies (parent_id, child_id) VALUES (live.id, job_id);
            UPDATE pgqueue_jobs AS j SET has_children = true
            WHERE j.id = live.id AND NOT j.has_children;
            outcome := 'queued_next';
            wake := false;
        END IF;
    END IF;
    IF wake AND p_notify THEN
        PERFORM pg_catalog.pg_notify('pgqueue_jobs', p_queue);
    END IF;
END
$pgqueue_enqueue_replace$;
""".replace("{settings}", _FUNCTION_SETTINGS)

# pgqueue_enqueue_after(...): jobs with dependencies (Queue.enqueue(after=),
# enqueue_many with NewJob(after=), pgqueue_enqueue(after =>)), in the
# caller's transaction: the jobs' columns as enqueue_many's (arrays, in
# input order; the payloads one JSON array), and the edges: each an index
# of a child (from 1) and its parent, a job id, or minus the index of an
# earlier job of the call. First the outside parents are locked FOR SHARE,
# in id order, and their statuses read (a parent ending meanwhile waits for
# the enqueue's commit, and its trigger then sees the new edges; a parent
# that ended first counts at once; the enqueues of one parent's children
# wait for each other only while the first marks it a parent); then the jobs are inserted; then the edges,
# each settled if its parent has ended, and each child's state: cancelled
# (on_parent_failure 'cancel') when a parent is dead or cancelled (a job of
# the call, cancelled so, is such a parent in turn), its last_error naming
# the first such parent; else waiting while a parent has not ended. Returns
# the jobs' ids, in input order. SECURITY DEFINER: a producer writes edges
# only from the jobs it inserts here.
_ENQUEUE_AFTER_FUNCTION = """
CREATE OR REPLACE FUNCTION pgqueue_enqueue_after(
    p_queue             text,
    p_job_types         text[],
    p_payloads          jsonb,
    p_max_attempts      int[],
    p_run_at            timestamptz[],
    p_delays            float8[],
    p_priorities        int[],
    p_tracked           boolean[],
    p_trace_context     text,
    p_children          int[],
    p_parents           bigint[],
    p_on_parent_failure text[],
    p_notify            boolean
) RETURNS bigint[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
{settings}AS $pgqueue_enqueue_after$
DECLARE
    jobs     int;
    ids      bigint[];
    missing  bigint;
BEGIN
    IF pg_catalog.jsonb_typeof(p_payloads) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'pgqueue_enqueue_after: payloads must be a JSON array'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    jobs := pg_catalog.jsonb_array_length(p_payloads);
    IF jobs = 0 OR pg_catalog.cardinality(p_job_types) IS DISTINCT FROM jobs
       OR pg_catalog.cardinality(p_children) IS DISTINCT FROM pg_catalog.cardinality(p_parents)
       OR pg_catalog.cardinality(p_children) = 0 THEN
        RAISE EXCEPTION 'pgqueue_enqueue_after: give one job type a payload, and edges of a child and a parent'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR i IN 1 .. jobs LOOP
        PERFORM pgqueue_check_job('pgqueue_enqueue_after', p_queue, p_job_types[i],
                                  p_payloads -> (i - 1), p_max_attempts[i],
                                  coalesce(p_priorities[i], 0), coalesce(p_tracked[i], false),
                                  NULL, NULL);
        IF p_run_at[i] IS NOT NULL AND p_delays[i] IS NOT NULL OR p_delays[i] < 0 THEN
            RAISE EXCEPTION 'pgqueue_enqueue_after: job %: give run_at or a delay of no less than 0, not both', i
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
    IF EXISTS (SELECT FROM ROWS FROM (pg_catalog.unnest(p_children), pg_catalog.unnest(p_parents)) AS e(child, parent)
               WHERE e.child IS NULL OR e.child NOT BETWEEN 1 AND jobs
                  OR e.parent IS NULL OR e.parent = 0 OR e.parent < 0 AND -e.parent >= e.child
                  OR p_on_parent_failure[e.child] IS NULL
                  OR p_on_parent_failure[e.child] NOT IN ('run', 'cancel')) THEN
        RAISE EXCEPTION 'pgqueue_enqueue_after: an edge names no child, no parent, a parent that is not an earlier job of the call, or no on_parent_failure (''run'' or ''cancel'')'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    PERFORM FROM pgqueue_jobs AS j
    WHERE j.id = ANY (ARRAY(SELECT DISTINCT p FROM pg_catalog.unnest(p_parents) AS p WHERE p > 0))
    ORDER BY j.id
    FOR SHARE;
    SELECT p INTO missing FROM pg_catalog.unnest(p_parents) WITH ORDINALITY AS u(p, n)
    WHERE p > 0 AND NOT EXISTS (SELECT FROM pgqueue_jobs AS j WHERE j.id = p)
    ORDER BY n LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'pgqueue_enqueue_after: job % does not exist', missing
            USING ERRCODE = 'foreign_key_violation', DETAIL = missing::text;
    END IF;

    WITH inserted AS (
        INSERT INTO pgqueue_jobs (queue, job_type, payload, max_attempts, run_at, priority, tracked, trace_context)
        SELECT p_queue, t.job_type, t.payload, t.max_attempts,
               coalesce(t.run_at, pg_catalog.now() + pg_catalog.make_interval(secs => t.delay), pg_catalog.now()),
               coalesce(t.priority, 0), coalesce(t.tracked, false), p_trace_context
        FROM ROWS FROM (
            pg_catalog.unnest(p_job_types),
            pg_catalog.jsonb_array_elements(p_payloads),
            pg_catalog.unnest(p_max_attempts),
            pg_catalog.unnest(p_run_at),
            pg_catalog.unnest(p_delays),
            pg_catalog.unnest(p_priorities),
            pg_catalog.unnest(p_tracked)
        ) WITH ORDINALITY AS t(job_type, payload, max_attempts, run_at, delay, priority, tracked, ord)
        WHERE t.ord <= jobs
        ORDER BY t.ord
        RETURNING id
    )
    SELECT pg_catalog.array_agg(id ORDER BY id) INTO ids FROM inserted;

    WITH RECURSIVE edges AS (
        SELECT e.n, e.child, ids[e.child] AS child_id,
               CASE WHEN e.parent > 0 THEN e.parent ELSE ids[-e.parent] END AS parent_id,
               CASE WHEN e.parent < 0 THEN (-e.parent)::int END AS parent_index,
               CASE WHEN e.parent > 0
                    THEN (SELECT j.status FROM pgqueue_jobs AS j WHERE j.id = e.parent) END AS outside
        FROM ROWS FROM (pg_catalog.unnest(p_children), pg_catalog.unnest(p_parents)) WITH ORDINALITY AS e(child, parent, n)
    ), cancelled AS (
        SELECT e.child FROM edges AS e
        WHERE e.outside IN ('dead', 'cancelled') AND p_on_parent_failure[e.child] = 'cancel'
        UNION
        SELECT e.child FROM edges AS e JOIN cancelled AS c ON c.child = e.parent_index
        WHERE p_on_parent_failure[e.child] = 'cancel'
    ), judged AS (
        SELECT e.*,
               coalesce(e.outside IN ('completed', 'dead', 'cancelled'), false)
               OR coalesce(e.parent_index IN (SELECT child FROM cancelled), false) AS settled,
               coalesce(e.outside IN ('dead', 'cancelled'), false)
               OR coalesce(e.parent_index IN (SELECT child FROM cancelled), false) AS failed
        FROM edges AS e
    ), written AS (
        INSERT INTO pgqueue_dependencies (parent_id, child_id, settled)
        SELECT parent_id, child_id, settled FROM judged
        ON CONFLICT DO NOTHING
    ), children AS (
        SELECT e.child_id AS id,
               CASE WHEN e.child IN (SELECT child FROM cancelled) THEN 'cancelled'
                    WHEN pg_catalog.count(*) FILTER (WHERE NOT e.settled) > 0 THEN 'waiting' END AS status,
               pg_catalog.count(*) FILTER (WHERE NOT e.settled)::int AS parents_left,
               p_on_parent_failure[e.child] AS on_parent_failure,
               CASE WHEN e.child IN (SELECT child FROM cancelled)
                    THEN (SELECT pg_catalog.format('parent job %s is %s', f.parent_id,
                                                   coalesce(f.outside, 'cancelled'))
                          FROM judged AS f WHERE f.child = e.child AND f.failed
                          ORDER BY f.n LIMIT 1) END AS last_error
        FROM judged AS e
        GROUP BY e.child, e.child_id
    ), touched AS (
        SELECT u.id, pg_catalog.bool_or(u.parent) AS parent, pg_catalog.max(u.status) AS status,
               pg_catalog.max(u.parents_left) AS parents_left,
               pg_catalog.max(u.on_parent_failure) AS on_parent_failure,
               pg_catalog.max(u.last_error) AS last_error
        FROM (SELECT c.id, false AS parent, c.status, c.parents_left, c.on_parent_failure, c.last_error
              FROM children AS c
              UNION ALL
              SELECT DISTINCT e.parent_id, true, NULL::text, NULL::int, NULL::text, NULL::text
              FROM edges AS e) AS u
        GROUP BY u.id
    )
    UPDATE pgqueue_jobs AS j
    SET has_children      = j.has_children OR t.parent,
        status            = coalesce(t.status, j.status),
        parents_left      = coalesce(t.parents_left, j.parents_left),
        on_parent_failure = coalesce(t.on_parent_failure, j.on_parent_failure),
        last_error        = coalesce(t.last_error, j.last_error)
    FROM touched AS t
    WHERE j.id = t.id AND NOT (t.status IS NULL AND t.parents_left IS NULL AND j.has_children);

    IF p_notify THEN
        PERFORM pg_catalog.pg_notify('pgqueue_jobs', p_queue);
    END IF;
    RETURN ids;
END
$pgqueue_enqueue_after$;
""".replace("{settings}", _FUNCTION_SETTINGS)

# pgqueue_enqueue(...): an enqueue in SQL, in the caller's transaction, from
# any driver, a trigger or psql; the same defaults, checks and row as
# Queue.enqueue, and the wakeup rides the transaction. Parameters are read
# as pgqueue_enqueue.<name> (they share names with the columns). A job with
# a key goes through pgqueue_enqueue_replace, one with parents through
# pgqueue_enqueue_after (SECURITY DEFINER both); a plain job is inserted
# with the caller's rights.
_ENQUEUE_FUNCTION = """
DROP FUNCTION IF EXISTS pgqueue_enqueue(text, jsonb, text, timestamptz, interval, int, int, text, text, boolean, text);
CREATE OR REPLACE FUNCTION pgqueue_enqueue(
    job_type          text,
    payload           jsonb       DEFAULT '{}',
    queue             text        DEFAULT 'default',
    run_at            timestamptz DEFAULT NULL,
    delay             interval    DEFAULT NULL,
    max_attempts      int         DEFAULT 5,
    priority          int         DEFAULT 0,
    unique_key        text        DEFAULT NULL,
    on_conflict       text        DEFAULT 'return',
    track             boolean     DEFAULT false,
    trace_context     text        DEFAULT NULL,
    group_key         text        DEFAULT NULL,
    after             bigint[]    DEFAULT NULL,
    on_parent_failure text        DEFAULT 'cancel'
) RETURNS bigint
LANGUAGE plpgsql VOLATILE
{settings}AS $pgqueue_enqueue$
#variable_conflict use_column
DECLARE
    new_id  bigint;
    due     timestamptz;
    parents bigint[];
    r       record;
BEGIN
    PERFORM pgqueue_check_job('pgqueue_enqueue', pgqueue_enqueue.queue, pgqueue_enqueue.job_type,
                              pgqueue_enqueue.payload, pgqueue_enqueue.max_attempts,
                              pgqueue_enqueue.priority, pgqueue_enqueue.track,
                              pgqueue_enqueue.unique_key, pgqueue_enqueue.group_key);
    IF pgqueue_enqueue.run_at IS NOT NULL AND pgqueue_enqueue.delay IS NOT NULL THEN
        RAISE EXCEPTION 'pgqueue_enqueue: give run_at or delay, not both'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pgqueue_enqueue.delay < interval '0' THEN
        RAISE EXCEPTION 'pgqueue_enqueue: delay must not be negative, got %', pgqueue_enqueue.delay
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pgqueue_enqueue.on_conflict IS NULL
       OR pgqueue_enqueue.on_conflict NOT IN ('return', 'raise', 'replace') THEN
        RAISE EXCEPTION 'pgqueue_enqueue: on_conflict must be ''return'', ''raise'' or ''replace'', got %',
            coalesce(pg_catalog.quote_literal(pgqueue_enqueue.on_conflict), 'NULL')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pgqueue_enqueue.on_conflict = 'replace' AND pgqueue_enqueue.unique_key IS NULL THEN
        RAISE EXCEPTION 'pgqueue_enqueue: on_conflict ''replace'' needs a unique_key'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF pg_catalog.cardinality(pgqueue_enqueue.after) > 0
       AND (pgqueue_enqueue.unique_key IS NOT NULL OR pgqueue_enqueue.group_key IS NOT NULL) THEN
        RAISE EXCEPTION 'pgqueue_enqueue: a job with parents (after) cannot have a unique_key or a group'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    due := coalesce(pgqueue_enqueue.run_at, pg_catalog.now() + pgqueue_enqueue.delay, pg_catalog.now());

    IF pg_catalog.cardinality(pgqueue_enqueue.after) > 0 THEN
        -- Each parent once, in the order given.
        parents := ARRAY(SELECT u.p FROM pg_catalog.unnest(pgqueue_enqueue.after) WITH ORDINALITY AS u(p, n)
                         GROUP BY u.p ORDER BY pg_catalog.min(u.n));
        IF pg_catalog.cardinality(parents) > 10000 THEN
            RAISE EXCEPTION 'pgqueue_enqueue: a job has at most 10000 parents, got %',
                pg_catalog.cardinality(parents)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        RETURN (pgqueue_enqueue_after(
            pgqueue_enqueue.queue, ARRAY[pgqueue_enqueue.job_type],
            pg_catalog.jsonb_build_array(pgqueue_enqueue.payload),
            ARRAY[pgqueue_enqueue.max_attempts], ARRAY[due], ARRAY[NULL::float8],
            ARRAY[pgqueue_enqueue.priority], ARRAY[pgqueue_enqueue.track],
            pgqueue_enqueue.trace_context,
            pg_catalog.array_fill(1, ARRAY[pg_catalog.cardinality(parents)]), parents,
            ARRAY[pgqueue_enqueue.on_parent_failure], true))[1];
    END IF;

    IF pgqueue_enqueue.unique_key IS NOT NULL THEN
        IF pgqueue_enqueue.on_conflict <> 'replace'
           AND pg_catalog.to_regprocedure('pgqueue_enqueue_replace(text, text, jsonb, int, timestamptz, int, boolean, text, text, boolean, boolean, text)') IS NULL THEN
            -- A distributed schema has no pgqueue_enqueue_replace: the caller's
            -- own INSERT ... ON CONFLICT, which Citus runs on the queue's shard.
            INSERT INTO pgqueue_jobs AS j (queue, job_type, payload, max_attempts, run_at, priority,
                                           tracked, trace_context, unique_key, group_key)
            VALUES (pgqueue_enqueue.queue, pgqueue_enqueue.job_type, pgqueue_enqueue.payload,
                    pgqueue_enqueue.max_attempts, due, pgqueue_enqueue.priority, pgqueue_enqueue.track,
                    pgqueue_enqueue.trace_context, pgqueue_enqueue.unique_key, pgqueue_enqueue.group_key)
            ON CONFLICT (queue, job_type, unique_key) WHERE unique_key IS NOT NULL AND status IN ('pending', 'running')
            DO UPDATE SET unique_key = EXCLUDED.unique_key
            RETURNING j.id AS job_id, CASE WHEN j.xmax <> 0 THEN 'existed' ELSE 'inserted' END AS outcome
            INTO r;
            IF r.outcome = 'inserted' THEN
                PERFORM pg_catalog.pg_notify('pgqueue_jobs', pgqueue_enqueue.queue);
            END IF;
        ELSE
            SELECT * INTO r
            FROM pgqueue_enqueue_replace(
                pgqueue_enqueue.queue, pgqueue_enqueue.job_type, pgqueue_enqueue.payload,
                pgqueue_enqueue.max_attempts, due, pgqueue_enqueue.priority, pgqueue_enqueue.track,
                pgqueue_enqueue.trace_context, pgqueue_enqueue.unique_key,
                pgqueue_enqueue.on_conflict = 'replace', true, pgqueue_enqueue.group_key);
        END IF;
        IF r.outcome = 'existed' AND pgqueue_enqueue.on_conflict = 'raise' THEN
            RAISE EXCEPTION 'pgqueue_enqueue: job % of type % with unique key % is pending or running',
                r.job_id, pg_catalog.quote_literal(pgqueue_enqueue.job_type), pg_catalog.quote_literal(pgqueue_enqueue.unique_key)
                USING ERRCODE = 'unique_violation', DETAIL = r.job_id::text;
        END IF;
        RETURN r.job_id;
    END IF;

    INSERT INTO pgqueue_jobs (queue, job_type, payload, max_attempts, run_at, priority,
                              tracked, trace_context, group_key)
    VALUES (pgqueue_enqueue.queue, pgqueue_enqueue.job_type, pgqueue_enqueue.payload,
            pgqueue_enqueue.max_attempts, due, pgqueue_enqueue.priority, pgqueue_enqueue.track,
            pgqueue_enqueue.trace_context, pgqueue_enqueue.group_key)
    RETURNING id INTO new_id;
    PERFORM pg_catalog.pg_notify('pgqueue_jobs', pgqueue_enqueue.queue);
    RETURN new_id;
END
$pgqueue_enqueue$;
""".replace("{settings}", _FUNCTION_SETTINGS)

# The signatures of the functions above (and the trigger's), for grants and
# pinning: the definer ones a producer is granted, the rest any role may run.
FUNCTIONS = {
    "pgqueue_check_name(text, text, text, int)": "invoker",
    "pgqueue_check_job(text, text, text, jsonb, int, int, boolean, text, text)": "invoker",
    "pgqueue_enqueue_replace(text, text, jsonb, int, timestamptz, int, boolean, text, text, boolean, boolean, text)": "definer",
    "pgqueue_enqueue_after(text, text[], jsonb, int[], timestamptz[], float8[], int[], boolean[], text, int[], bigint[], text[], boolean)": "definer",
    "pgqueue_enqueue(text, jsonb, text, timestamptz, interval, int, int, text, text, boolean, text, text, bigint[], text)": "invoker",
    "pgqueue_parent_ended()": "trigger",
    "pgqueue_group_pending()": "trigger",
    "pgqueue_group_heads(text, text[])": "invoker",
    "pgqueue_take_turn(text)": "invoker",
}
"""Every function of the schema, by signature: ``definer`` (SECURITY DEFINER:
it runs with its owner's rights, for the roles granted it), ``invoker`` or
``trigger``."""

# Every function runs with a fixed search_path: pg_catalog first, then the
# schema it was installed into (this one), then pg_temp, so that no function
# or table planted in another schema, or a session's temporary schema, is
# taken for one of its own or a built-in; the definer ones are for the
# roles that are granted them (pgqueue.grants), not PUBLIC.
_PINNED = """
DO $$
DECLARE
    f text;
BEGIN
    FOREACH f IN ARRAY '{functions}'::text[] LOOP
        CONTINUE WHEN pg_catalog.to_regprocedure(f) IS NULL;  -- not in a distributed schema
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                                  f, pg_catalog.current_schema());
    END LOOP;
    FOREACH f IN ARRAY '{definers}'::text[] LOOP
        CONTINUE WHEN pg_catalog.to_regprocedure(f) IS NULL;
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END $$;
""".replace("{functions}", "{" + ",".join(f'"{f}"' for f in FUNCTIONS) + "}").replace(
    "{definers}",
    "{"
    + ",".join(f'"{f}"' for f, kind in FUNCTIONS.items() if kind == "definer")
    + "}",
)


SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS pgqueue_jobs
(
    id               BIGSERIAL PRIMARY KEY,
    queue            TEXT        NOT NULL DEFAULT 'default',
    job_type         TEXT        NOT NULL,
    payload          JSONB       NOT NULL DEFAULT '{}'::jsonb,
    status           TEXT        NOT NULL DEFAULT 'pending'
        CONSTRAINT chk_pgqueue_jobs_status
        CHECK (status = ANY ('{pending,running,completed,dead,cancelled,waiting}'::text[])),
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
    claimed_at       TIMESTAMPTZ
);

-- The Go module's claims, and ours of jobs without a priority.
CREATE INDEX IF NOT EXISTS idx_pgqueue_jobs_claim
    ON pgqueue_jobs (queue, run_at, id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS idx_pgqueue_jobs_rescue
    ON pgqueue_jobs (updated_at) WHERE status = 'running';
"""
    + _ADDED_IN_V2
    + _TAKE_TURN_FUNCTION
    + _CHECK_JOB_FUNCTION
    + _ENQUEUE_REPLACE_FUNCTION
    + _ENQUEUE_AFTER_FUNCTION
    + _ENQUEUE_FUNCTION
    + _PINNED
)
"""Create the ``pgqueue_jobs`` table and its indexes, ``pgqueue_periodic``, ``pgqueue_limits`` and ``pgqueue_leases`` (apply it in a migration).

Idempotent on a database without the table or with the current one. On a
table created by the Go module or an earlier pgqueue, apply
`SCHEMA_UPGRADE` instead.
"""

SCHEMA_UPGRADE = (
    """
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
    ADD COLUMN IF NOT EXISTS claimed_at       TIMESTAMPTZ;

DO $$
DECLARE
    old record;
BEGIN
    -- The Go module's status check does not allow 'cancelled', nor
    -- pgqueue's before dependencies 'waiting': replace it, and pgqueue's
    -- written as an IN list (PostgreSQL prepares every check for each
    -- statement that writes the table: a constant array costs less).
    FOR old IN
        SELECT conname FROM pg_constraint
        WHERE conrelid = 'pgqueue_jobs'::regclass AND contype = 'c'
          AND pg_catalog.pg_get_constraintdef(oid) LIKE '%status%'
          AND pg_catalog.pg_get_constraintdef(oid) NOT LIKE '%{pending,running,completed,dead,cancelled,waiting}%'
    LOOP
        EXECUTE pg_catalog.format('ALTER TABLE pgqueue_jobs DROP CONSTRAINT %I', old.conname);
    END LOOP;
    IF NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conrelid = 'pgqueue_jobs'::regclass
                   AND conname = 'chk_pgqueue_jobs_status') THEN
        ALTER TABLE pgqueue_jobs ADD CONSTRAINT chk_pgqueue_jobs_status
            CHECK (status = ANY ('{pending,running,completed,dead,cancelled,waiting}'::text[])) NOT VALID;
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
    + _ADDED_IN_V2
    + _TAKE_TURN_FUNCTION
    + _CHECK_JOB_FUNCTION
    + _ENQUEUE_REPLACE_FUNCTION
    + _ENQUEUE_AFTER_FUNCTION
    + _ENQUEUE_FUNCTION
    + _PINNED
)
"""Bring a ``pgqueue_jobs`` table created by the Go module (or an earlier pgqueue) up to date.

Only adds: columns with constant defaults or none (no table rewrite), the status
check widened to allow ``cancelled`` and ``waiting`` (added ``NOT VALID``,
then validated, which does not block writes), four partial indexes, the
``pgqueue_periodic`` table of periodic schedules, the ``pgqueue_limits``
and ``pgqueue_leases`` tables of fleet-wide limits, and the
``pgqueue_dependencies`` table with the ``pgqueue_parent_ended`` trigger
that releases a job's children when it ends. Idempotent. Go
producers and workers keep working on the upgraded table. On a large table,
run each ``VALIDATE`` and ``CREATE INDEX`` in a transaction of its own (or
build the indexes ``CONCURRENTLY`` first): a migration tool that wraps the
whole script in one transaction holds the first lock until the end.
"""

SCHEMA_DOWN = """
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

# JSON crosses the boundary as text, both ways ($3::text, payload::text):
# a pool whose init registers a jsonb codec (json.dumps and json.loads, a
# common recipe) must not change what is stored or what a handler gets.
#
# Arrays other than text[] cross it as text too (see `array`): asyncpg has
# no built-in codec for them, and looks their types up on first use with
# set_config('jit', ...) calls of session scope, in transactions of their
# own; behind a transaction pooler those settings stay on server
# connections that other clients then get.

# Inside the caller's transaction, the row and its wakeup ride one
# statement, so the job wakes workers only if that transaction commits. An
# enqueue that commits by itself while others of its pool are in flight
# takes the _SILENT statement instead, and its wakeup is sent after the
# commit (`pgqueue._wake`): a transaction that sends NOTIFY holds a lock of
# the whole cluster from before its commit until its commit record is
# flushed, so notifying commits cannot share a flush. A lone one keeps its
# NOTIFY here: it shares the flush with nobody.
# trace_context ($8) is opaque text an enqueue hook gives (pgqueue.otel: the
# producer span's propagation headers as JSON); NULL without one, as in a
# Go producer's rows. A delay ($9, seconds, NULL without one) counts from
# the database's now(), never the client's clock; run_at ($5) and a delay
# are never both given.
_RUN_AT = "COALESCE($5::timestamptz, pg_catalog.now() + pg_catalog.make_interval(secs => {delay}::float8), pg_catalog.now())"
_INSERT_ONE = f"""
    INSERT INTO pgqueue_jobs (queue, job_type, payload, max_attempts, run_at, priority, tracked, trace_context, group_key)
    VALUES ($1, $2, $3::text::jsonb, $4, {_RUN_AT.format(delay="$9")}, $6, $7, $8, $10)
    RETURNING id"""
ENQUEUE = f"""
WITH job AS ({_INSERT_ONE}
)
SELECT job.id FROM job, pg_catalog.pg_notify('pgqueue_jobs', $1)
"""
ENQUEUE_SILENT = _INSERT_ONE

# A group key ($10, or $11 with a unique key) is the job's group (see
# CLAIM_GROUPS), NULL without one.
# A job with a unique key ($9; its delay is $10), through
# pgqueue_enqueue_replace without replacing (a producer may not UPDATE, as
# INSERT ... ON CONFLICT DO UPDATE would): while a job of the same queue,
# type and key is pending or running, that job's id comes back instead
# (existed), with no wakeup.
_UNIQUE = """
SELECT r.job_id AS id, r.outcome = 'existed' AS existed
FROM pgqueue_enqueue_replace($1, $2, $3::text::jsonb, $4, {run_at},
                             $6, $7, $8, $9, false, {notify}, $11) AS r
"""
ENQUEUE_UNIQUE = _UNIQUE.format(run_at=_RUN_AT.format(delay="$10"), notify="true")
ENQUEUE_UNIQUE_SILENT = _UNIQUE.format(
    run_at=_RUN_AT.format(delay="$10"), notify="false"
)

# Citus has no pgqueue_enqueue_replace: there a key's enqueue is an INSERT
# ... ON CONFLICT, which locks and updates the existing row in place (so that
# an enqueuer racing its commit still gets it). xmax is 0 only on a row this
# statement inserted.
_ON_UNIQUE_CONFLICT = """
    ON CONFLICT (queue, job_type, unique_key) WHERE unique_key IS NOT NULL AND status IN ('pending', 'running')
    DO UPDATE SET unique_key = EXCLUDED.unique_key
"""

# Rows are inserted in input order, so ascending ids are the input order.
# The payloads arrive as one JSON array ($3), the rest as arrays; ROWS FROM
# zips them element by element, padding shorter ones with NULLs (so that a
# batch without priorities, tracking, keys or delays passes empty arrays for
# them). One trace context ($9, usually NULL) for the whole batch: its
# producer span's. Groups ($10, empty when no job has one). Delays ($11)
# are seconds from the database's now(). The keys ($8) are inserted only by
# Citus's statement: a batch with keys goes through pgqueue_enqueue_replace
# on plain PostgreSQL (a producer may not insert unique_key itself), and one
# without names no such column.
_ENQUEUE_ROWS = """
    INSERT INTO pgqueue_jobs (queue, job_type, payload, max_attempts, run_at, priority, tracked,{key} trace_context, group_key)
    SELECT $1, t.job_type, t.payload, t.max_attempts, {run_at},
           COALESCE(t.priority, 0), COALESCE(t.tracked, false),{key_value} $9::text, t.group_key
    FROM ROWS FROM (
        pg_catalog.unnest($2::text[]),
        pg_catalog.jsonb_array_elements($3::text::jsonb),
        pg_catalog.unnest($4::text::int[]),
        pg_catalog.unnest($5::text::timestamptz[]),
        pg_catalog.unnest($6::text::smallint[]),
        pg_catalog.unnest($7::text::boolean[]),
        pg_catalog.unnest($8::text[]),
        pg_catalog.unnest($10::text[]){delays}
    ) WITH ORDINALITY AS t(job_type, payload, max_attempts, run_at, priority, tracked, unique_key, group_key,{delay} ord)
    ORDER BY t.ord
"""
# A batch without delays is the common one: its statement has no delay
# column to unnest and no interval to compute per row (about 5% of a bulk
# enqueue); a batch with any delay takes the _DELAYED statement, which adds $11.
_UNDELAYED = {
    "run_at": "COALESCE(t.run_at, pg_catalog.now())",
    "delays": "",
    "delay": "",
}
_DELAYED = {
    "run_at": "COALESCE(t.run_at, pg_catalog.now() + pg_catalog.make_interval(secs => t.delay), pg_catalog.now())",
    "delays": ",\n        pg_catalog.unnest($11::text::float8[])",
    "delay": " delay,",
}
_UNKEYED = {"key": "", "key_value": ""}
_UNDELAYED_ROWS = _ENQUEUE_ROWS.format(**_UNDELAYED, **_UNKEYED)
_DELAYED_ROWS = _ENQUEUE_ROWS.format(**_DELAYED, **_UNKEYED)
_ENQUEUE_MANY = """
WITH jobs AS ({rows}
    RETURNING id
)
SELECT pg_catalog.array_to_string(pg_catalog.array_agg(jobs.id ORDER BY jobs.id), ','){notify}
"""
_NOTIFY_FROM = "\nFROM jobs, pg_catalog.pg_notify('pgqueue_jobs', $1)"
_SILENT_FROM = "\nFROM jobs"
ENQUEUE_MANY = _ENQUEUE_MANY.format(rows=_UNDELAYED_ROWS, notify=_NOTIFY_FROM)
ENQUEUE_MANY_DELAYED = _ENQUEUE_MANY.format(rows=_DELAYED_ROWS, notify=_NOTIFY_FROM)
ENQUEUE_MANY_SILENT = _ENQUEUE_MANY.format(rows=_UNDELAYED_ROWS, notify=_SILENT_FROM)
ENQUEUE_MANY_DELAYED_SILENT = _ENQUEUE_MANY.format(
    rows=_DELAYED_ROWS, notify=_SILENT_FROM
)

# enqueue_many with unique keys (no key twice in $8: the caller merges
# duplicates), each job through pgqueue_enqueue_replace without replacing,
# in input order (the columns as ENQUEUE_MANY's; a job without a key is
# inserted): each row's id, type and key, and whether it existed. Identical
# wakeups of one transaction are sent once.
_ENQUEUE_MANY_UNIQUE = """
SELECT r.job_id AS id, t.job_type, t.unique_key, r.outcome = 'existed' AS existed
FROM ROWS FROM (
    pg_catalog.unnest($2::text[]),
    pg_catalog.jsonb_array_elements($3::text::jsonb),
    pg_catalog.unnest($4::text::int[]),
    pg_catalog.unnest($5::text::timestamptz[]),
    pg_catalog.unnest($6::text::smallint[]),
    pg_catalog.unnest($7::text::boolean[]),
    pg_catalog.unnest($8::text[]),
    pg_catalog.unnest($10::text[]){delays}
) WITH ORDINALITY AS t(job_type, payload, max_attempts, run_at, priority, tracked, unique_key, group_key,{delay} ord)
CROSS JOIN LATERAL pgqueue_enqueue_replace(
    $1, t.job_type, t.payload, t.max_attempts, {run_at},
    COALESCE(t.priority, 0)::int, COALESCE(t.tracked, false), $9::text, t.unique_key,
    false, {notify}, t.group_key) AS r
ORDER BY t.ord
"""


def _many_unique(delays: dict[str, str], *, notify: bool) -> str:
    return _ENQUEUE_MANY_UNIQUE.format(**delays, notify="true" if notify else "false")


ENQUEUE_MANY_UNIQUE = _many_unique(_UNDELAYED, notify=True)
ENQUEUE_MANY_UNIQUE_DELAYED = _many_unique(_DELAYED, notify=True)
ENQUEUE_MANY_UNIQUE_SILENT = _many_unique(_UNDELAYED, notify=False)
ENQUEUE_MANY_UNIQUE_DELAYED_SILENT = _many_unique(_DELAYED, notify=False)

# An enqueue that replaces the pending job of its key ($9) or, if that job
# has started, queues one to run after it (see pgqueue_enqueue_replace):
# the job's id, what was done, and whether its queue has a job to claim now
# (sent by the statement with $11, else by the caller after the commit).
# $10: the delay, as in ENQUEUE_UNIQUE.
ENQUEUE_REPLACE = f"""
SELECT r.job_id AS id, r.outcome, r.wake
FROM pgqueue_enqueue_replace($1, $2, $3::text::jsonb, $4, {_RUN_AT.format(delay="$10")},
                             $6, $7, $8, $9, true, $11::boolean, NULL) AS r
"""

# enqueue_many with jobs that replace ($11, per job) or a key's jobs of
# both kinds: each job through pgqueue_enqueue_replace, in input order (the
# columns as ENQUEUE_MANY's; $10 the delays, $12 whether to NOTIFY).
ENQUEUE_MANY_REPLACE = """
SELECT r.job_id AS id, r.outcome, r.wake
FROM ROWS FROM (
    pg_catalog.unnest($2::text[]),
    pg_catalog.jsonb_array_elements($3::text::jsonb),
    pg_catalog.unnest($4::text::int[]),
    pg_catalog.unnest($5::text::timestamptz[]),
    pg_catalog.unnest($6::text::smallint[]),
    pg_catalog.unnest($7::text::boolean[]),
    pg_catalog.unnest($8::text[]),
    pg_catalog.unnest($10::text::float8[]),
    pg_catalog.unnest($11::text::boolean[])
) WITH ORDINALITY AS t(job_type, payload, max_attempts, run_at, priority, tracked,
                       unique_key, delay, replace, ord)
CROSS JOIN LATERAL pgqueue_enqueue_replace(
    $1, t.job_type, t.payload, t.max_attempts,
    COALESCE(t.run_at, pg_catalog.now() + pg_catalog.make_interval(secs => t.delay), pg_catalog.now()),
    COALESCE(t.priority, 0), COALESCE(t.tracked, false), $9::text, t.unique_key,
    COALESCE(t.replace, false), $12::boolean, NULL) AS r
ORDER BY t.ord
"""

# The wakeups `pgqueue._wake` sends after commits, one per queue of $1, in
# one transaction: the channel and payload a Go worker listens for. A
# transaction that notifies gets a transaction id, so its commit would wait
# for a WAL flush; nothing of it needs to survive a crash (the jobs are
# durable already, and a lost wakeup costs a poll), so it commits without
# waiting (synchronous_commit off, for this transaction only).
WAKE = """
SELECT pg_catalog.set_config('synchronous_commit', 'off', true), pg_catalog.pg_notify('pgqueue_jobs', queue)
FROM pg_catalog.unnest($1::text[]) AS queue
"""

# enqueue_many's COPY path (pgqueue._copy), for batches without unique keys.
# COPY returns no ids, so $1 ids of the table's sequence are reserved first,
# ascending, with the transaction's now() for run_at (the INSERT path's
# now(): one transaction). The ids come back as one bytea, 8 bytes each, big
# endian (a third faster than text for 50,000). The sequence is looked up
# once (MATERIALIZED), not once a row. The last column says whether this
# role may insert the ids (a producer's grants do not let it: it takes the
# INSERT path, and the ids reserved stay unused).
RESERVE_IDS = """
WITH s AS MATERIALIZED (
    SELECT pg_catalog.pg_get_serial_sequence('pgqueue_jobs', 'id')::regclass AS seq
)
SELECT pg_catalog.string_agg(pg_catalog.int8send(pg_catalog.nextval(s.seq)), ''), pg_catalog.now(),
       pg_catalog.has_column_privilege('pgqueue_jobs', 'id', 'INSERT')
FROM s, pg_catalog.generate_series(1, $1)
"""
# The rows are copied with every column the INSERT path sets (defaults fill
# status, attempts, created_at and updated_at; a table without those columns
# fails alike); then one wakeup, before commit.
COPY_TABLE = "pgqueue_jobs"
COPY_COLUMNS = (
    "id",
    "queue",
    "job_type",
    "payload",
    "max_attempts",
    "run_at",
    "priority",
    "tracked",
    "trace_context",
)
NOTIFY_JOBS = "SELECT pg_catalog.pg_notify('pgqueue_jobs', $1)"

# Jobs with dependencies (after=...), through pgqueue_enqueue_after (see
# _ENQUEUE_AFTER_FUNCTION): enqueue_many's columns ($1 the queue, $2 the
# types, $3 the payloads, $4 to $8 max_attempts, run_at, delays,
# priorities and tracking), $9 the trace context, the edges ($10 each
# child's index from 1, $11 its parent: a job id, or minus an earlier job's
# index), $12 each job's on_parent_failure, $13 whether to NOTIFY.
ENQUEUE_AFTER = """
SELECT pgqueue_enqueue_after($1, $2::text[], $3::text::jsonb, $4::text::int[],
                             $5::text::timestamptz[], $6::text::float8[], $7::text::int[],
                             $8::text::boolean[], $9::text, $10::text::int[], $11::text::bigint[],
                             $12::text[], $13::boolean)
"""

# Cancel the jobs $1: pending and waiting ones at once (no worker claims
# them, Go's included; a waiting job's own waiting children are cancelled
# by the pgqueue_parent_ended trigger), running ones by request (cancel_requested, and a control
# NOTIFY to the worker running them). Each id comes back with what was done:
# cancelled, requested, finished (already completed, dead or cancelled:
# nothing written) or not_found. Locked first, so a claim that commits
# meanwhile is seen: the row is then running.
CANCEL = """
WITH wanted AS (
    SELECT DISTINCT pg_catalog.unnest($1::text::bigint[]) AS id
), found AS (
    SELECT id, status FROM pgqueue_jobs WHERE id IN (SELECT id FROM wanted) FOR UPDATE
), changed AS (
    UPDATE pgqueue_jobs AS j
    SET status           = CASE WHEN f.status IN ('pending', 'waiting') THEN 'cancelled' ELSE j.status END,
        cancel_requested = j.cancel_requested OR f.status = 'running',
        last_error       = CASE WHEN f.status IN ('pending', 'waiting') THEN 'cancelled by request' ELSE j.last_error END,
        updated_at       = CASE WHEN f.status IN ('pending', 'waiting') THEN pg_catalog.now() ELSE j.updated_at END
    FROM found AS f
    WHERE j.id = f.id AND f.status IN ('pending', 'waiting', 'running')
    RETURNING j.id, CASE WHEN f.status = 'waiting' THEN 'pending' ELSE f.status END AS was, j.tracked
)
SELECT w.id,
       CASE WHEN c.was = 'pending' THEN 'cancelled'
            WHEN c.was = 'running' THEN 'requested'
            WHEN f.id IS NOT NULL THEN 'finished'
            ELSE 'not_found' END AS result,
       CASE WHEN c.was = 'running' THEN pg_catalog.pg_notify('pgqueue_control', w.id::text)
            WHEN c.was = 'pending' AND c.tracked THEN pg_catalog.pg_notify('pgqueue_outcomes', w.id::text) END AS notified
FROM wanted AS w LEFT JOIN found AS f ON f.id = w.id LEFT JOIN changed AS c ON c.id = w.id
"""

# Which of the jobs $1 have had their cancel requested (`Queue.cancel` of a
# running job): what a worker reads before it acts on a control NOTIFY,
# since anyone who can connect can send one.
CANCEL_REQUESTED = """
SELECT id FROM pgqueue_jobs WHERE id = ANY($1::text::bigint[]) AND cancel_requested
"""

# A row that may go: not a parent of a child that has not finished (its
# result is that child's parent_results). Scalar subqueries, not EXISTS or
# a join: PostgreSQL may run an EXISTS as one hashed pass over every job not
# finished, or a join from the jobs to the edges; this reads the row's
# edges, then each child by its id.
_KEEPS_NO_CHILD = """NOT (has_children AND coalesce((
          SELECT true FROM pgqueue_dependencies AS d
          WHERE d.parent_id = pgqueue_jobs.id
            AND (SELECT c.status FROM pgqueue_jobs AS c WHERE c.id = d.child_id)
                IN ('waiting', 'pending', 'running')
          LIMIT 1), false))"""

# A parent stays while a child of it has not finished (see _KEEPS_NO_CHILD);
# a child's edges go with it. Returns how many rows went.
PRUNE = f"""
WITH gone AS (
    DELETE FROM pgqueue_jobs
    WHERE queue = $1
      AND status IN ('completed', 'dead', 'cancelled')
      AND updated_at < pg_catalog.now() - pg_catalog.make_interval(secs => $2)
      AND {_KEEPS_NO_CHILD}
    RETURNING id, parents_left
), edges AS (
    DELETE FROM pgqueue_dependencies
    WHERE child_id IN (SELECT id FROM gone WHERE parents_left IS NOT NULL)
)
SELECT pg_catalog.count(*)::int FROM gone
"""


def _prune_batch(queue_matches: str) -> str:
    """PRUNE in a batch: at most $4 rows past id $3 whose queue matches, in id order.

    A sweep walks the table once however many batches it takes, and no batch
    holds a connection (the worker's upkeep, and its heartbeats) for long.
    Rows another session has locked are skipped (the next sweep gets them),
    never waited for. A parent stays while a child of it has not finished
    (its result is the child's ``parent_results``); a child's edges go
    with it. Returns how many rows went and the last id among them.
    """
    return f"""
WITH gone AS (
    DELETE FROM pgqueue_jobs
    WHERE id = ANY(ARRAY(
        SELECT id
        FROM pgqueue_jobs
        WHERE id > $3 AND {queue_matches}
          AND status IN ('completed', 'dead', 'cancelled')
          AND updated_at < pg_catalog.now() - pg_catalog.make_interval(secs => $2)
          AND {_KEEPS_NO_CHILD}
        ORDER BY id
        LIMIT $4
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING id, parents_left
), edges AS (
    DELETE FROM pgqueue_dependencies
    WHERE child_id IN (SELECT id FROM gone WHERE parents_left IS NOT NULL)
)
SELECT pg_catalog.count(*)::int AS removed, coalesce(pg_catalog.max(id), $3) AS last_id FROM gone
"""


# The retention sweep's, over the worker's queues ($1, a text[]: the one
# array type asyncpg binds without looking it up).
PRUNE_BATCH = _prune_batch("queue = ANY($1::text[])")

# Each batch of the retention sweep runs after this, in a transaction of its
# own. On a table of a few hundred thousand retained rows the planner costs
# PRUNE_BATCH's walk of the primary key above jit_above_cost (the generic
# plan a prepared statement gets after five runs, also above the inlining
# and optimizing thresholds), so each batch compiled for 15 to 430 ms for
# about 5 ms of work: at 2,000 jobs/s the sweep deleted no faster than jobs
# finished and the table grew (benchmarks/soak.py). SET LOCAL, so nothing
# stays on a server connection a transaction pooler hands to others.
NO_JIT = "SET LOCAL jit = off"
# NO_JIT inside a caller's transaction (Admin.prune on its connection):
# JIT_OFF returns the setting it replaces, JIT_BACK ($1) puts it back.
JIT_OFF = "SELECT pg_catalog.current_setting('jit') AS was, pg_catalog.set_config('jit', 'off', true)"
JIT_BACK = "SELECT pg_catalog.set_config('jit', $1, true)"

HEAD_OF_LINE = (datetime.min.replace(tzinfo=UTC), 0)
"""A place before every job of a priority: ('-infinity', 0)."""

PRIORITIES = tuple(range(5, -6, -1))
"""The priorities a job may have, in the order claims take them (highest first)."""


def claim_places(places: Mapping[int, tuple[datetime, int]]) -> tuple[str, str]:
    """CLAIM's $3 and $4: where each priority's line starts (at its head if not in ``places``)."""
    if not places:
        return _HEADS
    starts = [places.get(priority, HEAD_OF_LINE) for priority in PRIORITIES]
    texts = {start[0]: _timestamp(start[0]) for start in starts}  # few distinct times
    return (
        "{" + ",".join([texts[start[0]] for start in starts]) + "}",
        array([start[1] for start in starts]),
    )


_HEADS = (
    timestamps([HEAD_OF_LINE[0]] * len(PRIORITIES)),
    array([HEAD_OF_LINE[1]] * len(PRIORITIES)),
)

# The first due jobs in line, highest priority first, then by (run_at, id):
# one index scan per priority, in that order, each starting past its
# priority's place ($3[i], $4[i]; a worker draining a backlog starts after
# the last job it took, since each claimed job leaves a dead entry in the
# index until vacuum and a claim from the head would walk them all) and
# stopping at its first job not yet due, so that future-dated jobs of any
# priority are never walked.
# Priority 0 (every job that does not use priorities) is found through the
# Go module's index on (queue, run_at, id); the others through the partial
# index on (queue, priority, run_at, id) of the jobs with a priority, which
# only they pay for. "pending" is spelled COLLATE "C" in that index and for
# those scans (the same comparison; to the planner another one), so that
# neither index can be taken for the other's scans.
# The ids come back as an array, so the update finds its rows through the
# primary key whatever the table's size or statistics: as a join, a table of
# a few thousand rows gets a sequential scan per claim.
# The claim's own time (claimed_at) comes back in microseconds since the
# epoch: on every row, and an integer decodes far faster than a timestamptz.
# Times outside Python's datetime range (a BC date written by another
# producer) come back as NULL with their text in the last column: asyncpg
# would fail to decode the whole batch after the claim had committed.
_REPRESENTABLE = "{0} BETWEEN '0001-01-01 00:00:00+00' AND '9999-12-31 23:59:59.999999+00' OR NOT pg_catalog.isfinite({0})"
_PRIORITY_SCANS = """
    SELECT j.id
    FROM ROWS FROM (pg_catalog.unnest($3::text::timestamptz[]), pg_catalog.unnest($4::text::bigint[])) WITH ORDINALITY AS b(run_at, id, level)
    CROSS JOIN LATERAL (
        SELECT p.id
        FROM pgqueue_jobs AS p
        WHERE p.queue = $1 AND p.status = 'pending' COLLATE "C" AND p.priority <> 0
          AND p.priority = (6 - b.level)::smallint
          AND p.run_at <= pg_catalog.now() AND (p.run_at, p.id) > (b.run_at, b.id){types}
        ORDER BY p.run_at, p.id
        LIMIT {limit}
        FOR UPDATE OF p SKIP LOCKED
    ) AS j
    WHERE b.level {levels}
"""


CLAIM_COLUMNS = (
    "id",
    "queue",
    "job_type",
    "payload",
    "attempts",
    "max_attempts",
    "run_at",
    "created_at",
    "last_error",
    "unrepresentable",
    "priority",
    "unique_key",
    "snoozes",
    "claimed_at",
    "trace_context",
    "checkpoint",
    "has_parents",
)
"""The columns a claim returns, in this order (`pgqueue._engine.claimer.jobs_from_rows` unpacks them)."""

# The columns of CLAIM_COLUMNS that are not the table's own.
_CLAIM_EXPRESSIONS = {
    "payload": "payload::text",
    "run_at": f"CASE WHEN {_REPRESENTABLE.format('run_at')} THEN run_at END",
    "created_at": f"CASE WHEN {_REPRESENTABLE.format('created_at')} THEN created_at END",
    "unrepresentable": (
        f"CASE WHEN ({_REPRESENTABLE.format('run_at')}) AND ({_REPRESENTABLE.format('created_at')}) THEN NULL\n"
        "         ELSE pg_catalog.format('run_at %s, created_at %s', run_at, created_at) END"
    ),
    # Once per claim (an InitPlan), not per row: numeric arithmetic is dear.
    "claimed_at": "(SELECT (extract(epoch FROM pg_catalog.now()) * 1000000)::int8)",
    "checkpoint": "checkpoint::text",
    # A job enqueued after others: the claimer reads their results with
    # PARENT_RESULTS (a subquery here would be set up by every claim).
    "has_parents": "parents_left IS NOT NULL",
}
_CLAIM_RETURNING = ",\n    ".join(
    f"{_CLAIM_EXPRESSIONS[name]} AS {name}" if name in _CLAIM_EXPRESSIONS else name
    for name in CLAIM_COLUMNS
)
_GROUP_RETURNING = f"RETURNING {_CLAIM_RETURNING},\n    group_key\n"


# A paused queue ($1) claims nothing: an uncorrelated test, which the plan
# runs once, before the scans (a One-Time Filter), so a paused queue's
# claim reads one index page of an (empty, or nearly) table and no job.
_NOT_PAUSED = "\n  AND NOT EXISTS (SELECT FROM pgqueue_paused WHERE queue = $1)"


def _recorded(claim: str, at: str, *, group_key: bool = False) -> str:
    """``claim`` that also records each job it takes in ``pgqueue_starts``, started at ``at``.

    With ``group_key``, each row's group comes last (as `_with_group`'s).
    """
    returning = f"RETURNING {_CLAIM_RETURNING}\n"
    if claim.endswith(_GROUP_RETURNING):
        returning = _GROUP_RETURNING
    assert claim.endswith(returning)
    body = claim[: -len(returning)] + f"RETURNING {_CLAIM_RETURNING},\n    group_key"
    columns = [*CLAIM_COLUMNS, "group_key"] if group_key else CLAIM_COLUMNS
    return f"""
WITH claimed AS ({textwrap.indent(body, "    ")}
), recorded AS (
    INSERT INTO pgqueue_starts (queue, group_key, started_at)
    SELECT queue, group_key, {at}::timestamptz FROM claimed
)
SELECT {", ".join(columns)} FROM claimed
"""


def _with_group(claim: str) -> str:
    """``claim`` returning each job's group last (the group claims' heads are raised after)."""
    returning = f"RETURNING {_CLAIM_RETURNING}\n"
    assert claim.endswith(returning)
    return claim[: -len(returning)] + _GROUP_RETURNING


def _claiming(ids: str, *, recheck: str = "") -> str:
    """The claim's UPDATE of the jobs whose ids the query ``ids`` gives (none while the queue is paused).

    ``recheck``: a condition the rows must still meet (the group claim's
    picks are read without a lock), spelled so that no partial index's
    predicate follows from it: the rows are found by their ids.
    """
    return f"""
UPDATE pgqueue_jobs
SET status = 'running', attempts = attempts + 1, updated_at = pg_catalog.now(), claimed_at = pg_catalog.now()
WHERE id = ANY(ARRAY({ids})){recheck}{_NOT_PAUSED}
RETURNING {_CLAIM_RETURNING}
"""


def _zero_scan(limit: str, only: str) -> str:
    """The claim's scan of priority 0's line, from its place ($3[6], $4[6])."""
    return f"""
        SELECT id
        FROM pgqueue_jobs
        WHERE queue = $1 AND status = 'pending' AND priority = 0 AND run_at <= pg_catalog.now()
          AND (run_at, id) > (($3::text::timestamptz[])[6], ($4::text::bigint[])[6]){only}
        ORDER BY run_at, id
        LIMIT {limit}
        FOR UPDATE SKIP LOCKED
    """


def _claim(limit: str, types: str | None = None) -> str:
    """The claim's UPDATE of at most ``limit`` jobs (CLAIM's ``$2``, or a limited claim's slots).

    With ``types`` (a ``text[]`` parameter), only jobs of those types.
    """
    only = "" if types is None else f" AND job_type = ANY({types}::text[])"
    only_p = only.replace("job_type", "p.job_type")
    return _claiming(f"""
    ({_PRIORITY_SCANS.format(levels="<= 5", limit=limit, types=only_p)})
    UNION ALL
    (SELECT z.id FROM ({_zero_scan(limit, only)}) AS z)
    UNION ALL
    ({_PRIORITY_SCANS.format(levels=">= 7", limit=limit, types=only_p)})
    LIMIT {limit}
""")


CLAIM = _claim("$2")

# CLAIM of only the job types in $5 (a worker with unknown_types="wait",
# which leaves other types for a worker that has their handlers). The type
# is a filter on the same index scans: waiting jobs of other types that are
# due are walked by every claim (and skipped), not a scan of the table.
CLAIM_TYPES = _claim("$2", types="$5")

# CLAIM and CLAIM_TYPES under a rate limit: run after LOCK_CLAIMS and
# RATE_ROOM (whose time is the last parameter, the starts' time).
CLAIM_RATED = _recorded(CLAIM, "$5")
CLAIM_TYPES_RATED = _recorded(CLAIM_TYPES, "$6")

# Claims of a queue with a group limit ($3: the most running jobs of one
# group, across the fleet), run after LOCK_GROUPS in one transaction, so
# the queue's group claims take turns and each one's snapshot sees the
# others' (the running jobs it counts are all there). Round-robin: each
# group with room gives its first jobs in (run_at, id) order, as many as
# its room, and the claim takes the first job of every group before the
# second of any, oldest heads (highest priority first) first; so a group's
# flood delays another group's job by at most one claim. The groups are
# found through their heads (pgqueue_groups, by due_at: only groups with a
# job due, whatever the number of groups whose jobs are all in the future),
# each group's running count and first jobs in idx_pgqueue_jobs_group. The
# claimer then raises the heads of the groups it took jobs of (see
# pgqueue_group_heads). On Citus, which has no heads (a trigger of a
# distributed table), the groups are found by a skip scan of
# idx_pgqueue_jobs_group: one probe per group with jobs pending or running.
# Jobs without a group are each a group of their own; finding them walks
# the queue's due jobs in line (grouped ones included).
_GROUPS_BY_HEAD = """
WITH groups AS (
    SELECT h.group_key FROM pgqueue_groups AS h
    WHERE h.queue = $1 AND h.due_at <= pg_catalog.now()
)"""
_GROUPS_BY_SKIP_SCAN = """
WITH RECURSIVE groups AS (
    (SELECT group_key FROM pgqueue_jobs
     WHERE queue = $1 AND group_key IS NOT NULL AND status IN ('pending' COLLATE "C", 'running')
     ORDER BY group_key LIMIT 1)
    UNION ALL
    SELECT (SELECT j.group_key FROM pgqueue_jobs AS j
            WHERE j.queue = $1 AND j.group_key IS NOT NULL
              AND j.status IN ('pending' COLLATE "C", 'running') AND j.group_key > g.group_key
            ORDER BY j.group_key LIMIT 1)
    FROM groups AS g
    WHERE g.group_key IS NOT NULL
)"""
_GROUP_PICKS = """{groups}, picks AS (
    SELECT n.id, n.place, n.priority, n.run_at
    FROM groups AS g
    CROSS JOIN LATERAL (
        SELECT $3::int - pg_catalog.count(*)::int AS room FROM pgqueue_jobs AS r
        WHERE r.queue = $1 AND r.group_key = g.group_key AND r.status = 'running' COLLATE "C"
    ) AS r{group_rate}
    CROSS JOIN LATERAL (
        SELECT p.id, p.priority, p.run_at, pg_catalog.row_number() OVER (ORDER BY p.run_at, p.id) AS place
        FROM pgqueue_jobs AS p
        WHERE p.queue = $1 AND p.group_key = g.group_key AND p.status = 'pending' COLLATE "C"
          AND p.run_at <= pg_catalog.now(){types_p}
        ORDER BY p.run_at, p.id
        LIMIT GREATEST({room}, 0)
    ) AS n
    WHERE g.group_key IS NOT NULL
    UNION ALL
    SELECT u.id, 1, u.priority, u.run_at
    FROM (
        SELECT id, priority, run_at FROM pgqueue_jobs
        WHERE queue = $1 AND status = 'pending' AND run_at <= pg_catalog.now() AND group_key IS NULL{types}
        ORDER BY run_at, id
        LIMIT $2
    ) AS u
)
SELECT id FROM picks ORDER BY place, priority DESC, run_at, id LIMIT $2
"""


# A rate per group: the group's starts in the window ($5 starts, $6 seconds,
# $7 the window's end: RATE_ROOM's time) leave it room for the rest.
_GROUP_RATE = """
    CROSS JOIN LATERAL (
        SELECT $5::int - pg_catalog.count(*)::int AS room FROM pgqueue_starts AS s
        WHERE s.queue = $1 AND s.group_key = g.group_key
          AND s.started_at > $7::timestamptz - pg_catalog.make_interval(secs => $6::float8)
    ) AS w"""


def _claim_groups(*, group_rate: bool = False, heads: bool = True) -> str:
    """The claim of at most ``$2`` jobs of queue ``$1`` under a group limit of ``$3``.

    Only jobs of the types in ``$4`` (a ``text[]``; NULL for every type).
    ``group_rate``: also at most ``$5`` starts per group in ``$6`` seconds
    before ``$7`` (the jobs without a group are not limited). ``heads``:
    the groups found through pgqueue_groups (else a skip scan, for Citus).
    """
    only = " AND ($4::text[] IS NULL OR job_type = ANY($4::text[]))"
    picks = _GROUP_PICKS.format(
        groups=_GROUPS_BY_HEAD if heads else _GROUPS_BY_SKIP_SCAN,
        types=only,
        types_p=only.replace("job_type", "p.job_type"),
        group_rate=_GROUP_RATE.rstrip() if group_rate else "",
        room="LEAST(r.room, w.room)" if group_rate else "r.room",
    )
    return _claiming(
        f"{textwrap.indent(picks, '    ').strip()}\n",
        recheck=" AND status = 'pending' COLLATE \"C\"",
    )


# Each row's group_key comes last (see GROUP_HEADS).
CLAIM_GROUPS = _with_group(_claim_groups())
# Under a rate limit (of the queue: the claim's $2 is within RATE_ROOM's room;
# per group: $5 starts per $6 seconds), recording the starts at $7.
CLAIM_GROUPS_RATED = _recorded(_claim_groups(group_rate=True), "$7", group_key=True)

# After a group claim, in its transaction: raise the heads of queue $1's
# groups it took jobs of ($2) and of those due without a due job.
GROUP_HEADS = "SELECT pgqueue_group_heads($1, $2::text[])"

# Taken first in the transaction of a claim of queue $1 under a group or a
# rate limit: such claims take turns across the fleet, and each one's
# later statements (their snapshots taken after the lock) see what the
# claims before it took and recorded. A row lock of pgqueue_turns (see
# pgqueue_take_turn): no role but a worker's can hold it.
LOCK_CLAIMS = "SELECT pgqueue_take_turn($1)"

# A rate limit of $2 starts per $3 seconds of queue $1 (per group with $4):
# the starts recorded less than $3 s before now (the clock's now, taken
# after LOCK_CLAIMS) are counted, older ones deleted. Returns that time (the
# rated claim records its starts at it), the starts the window leaves room
# for (of the queue; for $4, $2: each group's room is the claim's), and
# the seconds until the oldest start in it leaves it (NULL if none): when
# room may come back. Every start in a window is counted by the claims
# after it, whose starts lie in the same window, so no window of $3
# seconds ever holds more than $2 starts (of the queue, or of each group).
RATE_ROOM = """
WITH t AS MATERIALIZED (SELECT pg_catalog.clock_timestamp() AS at),
gone AS (
    DELETE FROM pgqueue_starts AS s USING t
    WHERE s.queue = $1 AND s.started_at <= t.at - pg_catalog.make_interval(secs => $3::float8)
), w AS (
    SELECT pg_catalog.count(*)::int AS n, pg_catalog.min(s.started_at) AS oldest
    FROM pgqueue_starts AS s, t
    WHERE s.queue = $1 AND s.started_at > t.at - pg_catalog.make_interval(secs => $3::float8)
)
SELECT t.at,
       CASE WHEN $4::boolean THEN $2::int ELSE GREATEST($2::int - w.n, 0) END AS room,
       extract(epoch FROM w.oldest + pg_catalog.make_interval(secs => $3::float8) - t.at)::float8 AS wait
FROM t, w
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

# The results of the parents of the claimed jobs $1 that have parents
# (`Job.parent_results`): per child, {parent id: result} as JSON text.
PARENT_RESULTS = """
SELECT d.child_id, pg_catalog.jsonb_object_agg(d.parent_id::text, p.result)::text
FROM pgqueue_dependencies AS d JOIN pgqueue_jobs AS p ON p.id = d.parent_id
WHERE d.child_id = ANY($1::text::bigint[])
GROUP BY d.child_id
"""

# Make sure limited queue $1 has its row (a worker with a global_limit of
# $2, as it starts). The row records the limit of the worker that started
# last, for display: each worker leases within its own limit, so with
# workers that disagree the queue runs at most the largest of them.
SEED_LIMIT = """
INSERT INTO pgqueue_limits (queue, global_limit) VALUES ($1, $2)
ON CONFLICT (queue) DO UPDATE SET global_limit = EXCLUDED.global_limit
"""

# A worker's lease of a limited queue's slots is taken or renewed in a
# transaction: lock the queue's row (LOCK_LIMIT; no row: seed it), then
# LEASE, whose snapshot, taken after the lock, sees every lease of the
# queue committed before (one statement would read the leases as they were
# before it waited for the lock). So leases of a queue are taken in turn.
LOCK_LIMIT = "SELECT true FROM pgqueue_limits WHERE queue = $1 FOR UPDATE"

# Worker $2 (its own limit $3) would like $4 slots of queue $1, and may hold
# up to $5 of them while this runs (its jobs running, or its old lease if
# larger), for $6 seconds. It gets what the limit leaves after the others'
# unexpired leases, at most its fair share (the limit divided among the
# workers that want slots) and what it wants; the lease records at least
# $5, since those runs are not stopped. Returns the slots it may fill.
# Expired leases are deleted.
LEASE = """
WITH expired AS (
    DELETE FROM pgqueue_leases WHERE queue = $1 AND worker <> $2 AND expires_at < pg_catalog.now()
), others AS (
    SELECT coalesce(pg_catalog.sum(slots), 0)::int AS held, pg_catalog.count(*) FILTER (WHERE wanted > 0)::int AS wanting
    FROM pgqueue_leases
    WHERE queue = $1 AND worker <> $2 AND expires_at >= pg_catalog.now()
), granted AS MATERIALIZED (
    SELECT LEAST($4::int, GREATEST($3::int - o.held, 0),
                 pg_catalog.ceil($3::int / (o.wanting + 1)::numeric)::int) AS slots
    FROM others AS o
)
INSERT INTO pgqueue_leases AS l (queue, worker, slots, wanted, expires_at)
SELECT $1, $2, GREATEST(g.slots, $5::int), $4::int, pg_catalog.now() + pg_catalog.make_interval(secs => $6::float8)
FROM granted AS g
ON CONFLICT (queue, worker) DO UPDATE
SET slots = EXCLUDED.slots, wanted = EXCLUDED.wanted, expires_at = EXCLUDED.expires_at
RETURNING (SELECT slots FROM granted)
"""

# A worker gives its leases back as it stops ($1, its id).
RELEASE_LEASES = "DELETE FROM pgqueue_leases WHERE worker = $1"

HISTORY_KEPT = 20
"""The most entries ``errors`` (failed attempts) and ``snoozed`` (snoozes) keep: the newest."""


def _appended(column: str, entry: str) -> str:
    """``column`` (a JSON array, or NULL) with ``entry`` appended, keeping the last `HISTORY_KEPT`.

    Anything but an array there (written by hand) starts a new history
    rather than failing the outcome write.
    """
    return (
        f"CASE WHEN pg_catalog.jsonb_typeof({column}) = 'array'"
        f" THEN pg_catalog.jsonb_path_query_array({column}, '$[last - {HISTORY_KEPT - 2} to last]')"
        f" ELSE '[]'::jsonb END || pg_catalog.jsonb_build_array({entry})"
    )


# A failed attempt's entry in ``errors`` (oldest first): its attempt, when
# it ended (the database's clock) and its error, the same text as
# last_error (capped alike, before it is sent). A snooze's entry in
# ``snoozed``: the attempt it gave back, when, and for how many seconds.
_FAILED_ATTEMPT = _appended(
    "j.errors",
    "pg_catalog.jsonb_build_object('attempt', j.attempts, 'at', pg_catalog.now(), 'error', o.error)",
)
_NO_HEARTBEAT = """pg_catalog.jsonb_build_object(
    'attempt', j.attempts, 'at', pg_catalog.now(),
    'error', 'no heartbeat for '
             || coalesce(pg_catalog.floor(extract(epoch FROM pg_catalog.now() - j.updated_at))::int8::text, '?') || ' s')"""
_SNOOZE = _appended(
    "j.snoozed",
    "pg_catalog.jsonb_build_object('attempt', j.attempts, 'at', pg_catalog.now(), 'delay', o.delay)",
)

# One statement writes the outcomes of many runs. Each row is fenced on the
# attempt it claimed: a run that was rescued and superseded matches nothing.
# status is 'completed' (with its result), 'dead', 'cancelled', 'pending'
# (retry after delay seconds), 'snoozed' (pending after delay seconds, its
# attempt given back) or 'released' (claimed but never started: pending
# where it was in line, its attempt given back). A job whose cancel was
# requested is cancelled instead of going back to pending.
# Giving an attempt back keeps fencing sound: the row's attempts never fall
# below those of a run that was superseded, so no later run holds its number.
# "Still running" is spelled NOT IN the other states (the CHECK allows no
# other) so the planner drives the update through the primary key: the
# rescue index's row estimate is usually stale (one row), and using it would
# make every write scan every running row of every queue.
# A tracked job that ends is announced on pgqueue_outcomes, at commit.
_STILL_RUNNING = (
    "j.status NOT IN ('pending', 'completed', 'dead', 'cancelled', 'waiting')"
)
_ANNOUNCE_ENDED = """CASE WHEN j.tracked AND j.status IN ('completed', 'dead', 'cancelled')
                  THEN pg_catalog.pg_notify('pgqueue_outcomes', j.id::text) END"""
_FINISH = f"""
UPDATE pgqueue_jobs AS j
SET status       = CASE WHEN j.cancel_requested AND o.status IN ('pending', 'snoozed', 'released')
                        THEN 'cancelled'
                        WHEN o.status IN ('snoozed', 'released') THEN 'pending'
                        ELSE o.status END,
    attempts     = CASE WHEN o.status IN ('snoozed', 'released') AND NOT j.cancel_requested
                        THEN j.attempts - 1 ELSE j.attempts END,
    snoozes      = CASE WHEN o.status = 'snoozed' THEN j.snoozes + 1 ELSE j.snoozes END,
    run_at       = CASE WHEN o.status IN ('pending', 'snoozed') AND NOT j.cancel_requested
                        THEN pg_catalog.now() + pg_catalog.make_interval(secs => o.delay) ELSE j.run_at END,
    last_error   = CASE WHEN j.cancel_requested AND o.status IN ('pending', 'snoozed', 'released')
                        THEN 'cancelled by request'
                        WHEN o.status IN ('completed', 'snoozed', 'released') THEN j.last_error
                        ELSE o.error END,
    result       = CASE WHEN o.status = 'completed' THEN o.result::jsonb ELSE j.result END,
    completed_at = CASE WHEN o.status = 'completed' THEN pg_catalog.now() ELSE j.completed_at END,
    checkpoint   = CASE WHEN o.status = 'completed' THEN NULL ELSE j.checkpoint END,
    errors       = CASE WHEN o.status IN ('pending', 'dead') THEN {_FAILED_ATTEMPT} ELSE j.errors END,
    snoozed      = CASE WHEN o.status = 'snoozed' AND NOT j.cancel_requested
                        THEN {_SNOOZE} ELSE j.snoozed END,
    updated_at   = pg_catalog.now()
FROM ROWS FROM (pg_catalog.unnest($1::text::bigint[]), pg_catalog.unnest($2::text::int[]), pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::text::float8[]), pg_catalog.unnest($5::text[]), pg_catalog.unnest($6::text[]))
    AS o(id, attempts, status, delay, error, result)
WHERE j.id = o.id AND j.attempts = o.attempts AND {_STILL_RUNNING}
"""
FINISH = f"{_FINISH}RETURNING j.id, o.attempts, {_ANNOUNCE_ENDED}\n"

# FINISH for a batch of runs that all completed, a drain's usual batch:
# the same write without FINISH's per-row cases. Completion clears the
# job's checkpoint (FINISH's too).
_COMPLETE = f"""
UPDATE pgqueue_jobs AS j
SET status = 'completed', result = o.result::jsonb, checkpoint = NULL,
    completed_at = pg_catalog.now(), updated_at = pg_catalog.now()
FROM ROWS FROM (pg_catalog.unnest($1::text::bigint[]), pg_catalog.unnest($2::text::int[]), pg_catalog.unnest($3::text[])) AS o(id, attempts, result)
WHERE j.id = o.id AND j.attempts = o.attempts AND {_STILL_RUNNING}
"""
COMPLETE = f"{_COMPLETE}RETURNING j.id, o.attempts, {_ANNOUNCE_ENDED}\n"

# A handler's checkpoint ($3, JSON text) of job $1, fenced like every
# outcome on the attempt its run claimed ($2): a run that was rescued and
# superseded matches nothing, and gets no row back. It counts as a
# heartbeat of that run.
CHECKPOINT = f"""
UPDATE pgqueue_jobs AS j
SET checkpoint = $3::text::jsonb, updated_at = pg_catalog.now()
WHERE j.id = $1 AND j.attempts = $2 AND {_STILL_RUNNING}
RETURNING true
"""

# A heartbeat: running rows this worker still holds were seen alive now
# (fenced like FINISH, and spelled like it for the same plan). Returns the
# ids of those whose cancel was requested.
TOUCH = f"""
WITH touched AS (
    UPDATE pgqueue_jobs AS j
    SET updated_at = pg_catalog.now()
    FROM ROWS FROM (pg_catalog.unnest($1::text::bigint[]), pg_catalog.unnest($2::text::int[])) AS o(id, attempts)
    WHERE j.id = o.id AND j.attempts = o.attempts AND {_STILL_RUNNING}
    RETURNING j.id, j.cancel_requested
)
SELECT id FROM touched WHERE cancel_requested
"""

# Orphans with attempts left go back to pending; the rest are dead-lettered,
# since a job that crashed its process on every attempt never reaches a
# handler's outcome write; an orphan whose cancel was requested is
# cancelled. Orphans of the worker's queues ($1, a text[]); each row comes
# back with its queue and new status. At most $3 rows a statement; rows
# another session holds (a heartbeat or an outcome being written) are skipped.
# An orphan put back or dead-lettered records its attempt in the history
# ("no heartbeat for N s", N the whole seconds since the row was last seen).
RESCUE = f"""
WITH rescued AS (
    UPDATE pgqueue_jobs AS j
    SET status     = CASE WHEN cancel_requested THEN 'cancelled'
                          WHEN attempts < max_attempts THEN 'pending' ELSE 'dead' END,
        last_error = CASE WHEN cancel_requested THEN 'cancelled by request'
                          WHEN attempts < max_attempts THEN last_error
                          ELSE 'rescued after exceeding max attempts' END,
        errors     = CASE WHEN cancel_requested THEN errors
                          ELSE {_appended("j.errors", _NO_HEARTBEAT)} END,
        run_at     = run_at,  -- unchanged, named: a grouped job's head follows it
        updated_at = pg_catalog.now()
    WHERE id = ANY(ARRAY(
        SELECT id
        FROM pgqueue_jobs
        WHERE status = 'running' AND updated_at < pg_catalog.now() - pg_catalog.make_interval(secs => $2)
          AND queue = ANY($1::text[])
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING id, queue, status, tracked
)
SELECT queue, status, CASE WHEN tracked AND status <> 'pending' THEN pg_catalog.pg_notify('pgqueue_outcomes', id::text) END
FROM rescued
"""

TABLE_EXISTS = "SELECT pg_catalog.to_regclass('pgqueue_jobs') IS NOT NULL"

# The rows of the jobs a Tracker waits for ($1), ended or not, so that a job
# still running is told apart from an id with no row.
OUTCOMES = """
SELECT id, status, result::text AS result, last_error, attempts
FROM pgqueue_jobs
WHERE id = ANY($1::text::bigint[])
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
)
"""The columns of ``pgqueue_jobs`` pgqueue reads or writes."""

REQUIRED_INDEXES = ("idx_pgqueue_jobs_priority", "idx_pgqueue_jobs_unique")
# (and the table pgqueue_dependencies, with the trigger pgqueue_parent_ended:
# both come with the status check that allows 'waiting', in one upgrade)
"""The indexes pgqueue's own statements need (beyond the Go module's)."""

REQUIRED_FUNCTIONS = tuple(FUNCTIONS)
"""The functions of the schema (the producers' keyed enqueues and ``after=`` among them)."""

# Whether pgqueue_jobs is visible on the search_path; which of the columns
# $1 and indexes $2 it lacks, in their order; whether a check on status refuses 'waiting'
# (the Go module's refuses 'cancelled' too); whether its unique keys are
# still one across queues (before schema v3);
# whether pgqueue_limits (fleet-wide limits) is visible; which of
# REQUIRED_FUNCTIONS are missing; whether the table has ever been analyzed
# (by ANALYZE or autovacuum, as far as the statistics since their last
# reset know): the planner's estimates of a table never analyzed are
# guesses, and the operator should know.
SCHEMA_CHECK = """
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
             AND pg_catalog.pg_get_constraintdef(oid) NOT LIKE '%waiting%'
       ) AS old_status_check,
       EXISTS (
           SELECT 1 FROM pg_index
           WHERE indrelid = t.oid AND indexrelid = pg_catalog.to_regclass('idx_pgqueue_jobs_unique')
             AND pg_catalog.pg_get_indexdef(indexrelid) NOT LIKE '%(queue, job_type, unique_key)%'
       ) AS old_unique_index,
       pg_catalog.to_regclass('pgqueue_limits') IS NOT NULL AND pg_catalog.to_regclass('pgqueue_leases') IS NOT NULL AS has_limits,
       pg_catalog.to_regclass('pgqueue_paused') IS NOT NULL AS has_paused,
       ARRAY(
           SELECT f FROM pg_catalog.unnest('{functions}'::text[]) WITH ORDINALITY AS u (f, n)
           WHERE pg_catalog.to_regprocedure(f) IS NULL
           ORDER BY n
       ) AS missing_functions,
       EXISTS (
           SELECT 1 FROM pg_stat_all_tables AS s
           WHERE s.relid = t.oid AND coalesce(s.last_analyze, s.last_autoanalyze) IS NOT NULL
       ) AS analyzed
FROM t
""".replace("{functions}", "{" + ",".join(f'"{f}"' for f in REQUIRED_FUNCTIONS) + "}")

PUBLISH = "SELECT pg_catalog.pg_notify($1, $2)"

# Run through SQLAlchemy's asyncpg adapter, which begins its transaction
# only at its first statement: after it, an enqueue on the adapter's
# asyncpg connection rides that transaction (pgqueue.sqlalchemy).
BEGIN_PROBE = "SELECT 1"

# Who and what the test run's server is (pgqueue.testing's pytest plugin
# prints it): never the password, which the server does not know anyway.
SERVER_IDENTITY = "SELECT current_user, pg_catalog.current_database(), pg_catalog.current_setting('server_version')"

# Startup parameters of the worker's own connections. The statements above
# are written to plan well without their parameters' values, and a claim of
# ten jobs costs less to run than to re-plan: custom plans (chosen by
# default, since LIMIT $2 makes the generic plan look dear) cost about a
# quarter more server CPU per job. A generic plan is kept for the life of
# the connection, made when the statement first runs, perhaps on a table
# that is still empty: INDEX_PLANNING makes that plan the one an index
# gives, whatever the table's size and statistics then and later. Sent in
# the startup packet, never with SET: a transaction pooler (PgBouncer)
# refuses, ignores or tracks startup parameters per client, while a SET
# would stay on a server connection it then hands to other clients. (One
# that refuses them gets connections without: PgBouncer in transaction
# mode, with asyncpg's statement cache off, then plans each statement with
# its values at every run, never from a cached plan.)
WORKER_SETTINGS = {"plan_cache_mode": "force_generic_plan", **INDEX_PLANNING}

# Dashboard (``pgqueue top``): read-only, and each statement bounded by an
# index whatever the table holds, so that a frame every second costs about
# the same on a table of a million retained rows as on an empty one.

# The newest id (a backward step on the primary key) and the database's
# clock, which times the rates.
DASHBOARD_NEWEST = "SELECT coalesce(pg_catalog.max(id), 0)::int8 AS newest, pg_catalog.now() AS now FROM pgqueue_jobs"

# Jobs enqueued per queue with ids in ($1, $2]: the rows inserted since the
# previous frame, a range of the primary key. Queue $3, or every queue.
DASHBOARD_ENQUEUED = """
SELECT queue, pg_catalog.count(*)::int8 AS enqueued
FROM pgqueue_jobs
WHERE id > $1 AND id <= $2 AND ($3::text IS NULL OR queue = $3)
GROUP BY queue
"""

# The $2 jobs running longest: seconds since they were claimed (claimed_at;
# run_at for a job a Go worker claimed, as Admin's longest_running) and
# since they were last heard from (claimed or heartbeat, updated_at), and their progress: the first PROGRESS_CHARS
# characters of their checkpoint's JSON text. The running rows come through the rescue index,
# and are few (no more than the workers' concurrency, plus orphans).
# Queue $1, or every queue.
PROGRESS_CHARS = 200
"""The most characters of a running job's checkpoint a dashboard frame reads."""

DASHBOARD_RUNNING = f"""
SELECT id, queue, job_type,
       CASE WHEN pg_catalog.isfinite(coalesce(claimed_at, run_at))
            THEN greatest(extract(epoch FROM pg_catalog.now() - coalesce(claimed_at, run_at)), 0)::float8
       END AS running_for,
       CASE WHEN pg_catalog.isfinite(updated_at)
            THEN greatest(extract(epoch FROM pg_catalog.now() - updated_at), 0)::float8 END AS heard_from,
       pg_catalog.left(checkpoint::text, {PROGRESS_CHARS}) AS progress
FROM pgqueue_jobs
WHERE status = 'running' AND ($1::text IS NULL OR queue = $1)
ORDER BY coalesce(claimed_at, run_at), id
LIMIT $2
"""


# Operations ---------------------------------------------------------------------------
#
# What pgqueue.Admin runs: stats, listing, retry, prune, the schema's state.
# Every statement that reads many rows goes through a partial index, so a
# table holding millions of completed rows costs them nothing.

ADMIN_INDEXES = ("idx_pgqueue_jobs_failed",)
"""The indexes the operations use (the worker never needs them)."""


# Per queue: pending jobs due (ready) and not yet due (scheduled), and how
# long the oldest due job has waited (through the claim index); running
# jobs, the earliest claim among them and their stalest heartbeat (through
# the rescue index); dead and cancelled jobs (through the failed index);
# jobs waiting for their parents (through the waiting index).
# $1: one queue, or NULL for every queue. Completed jobs are not counted
# here (see STATS_COMPLETED and STATS_TABLE).
STATS = """
WITH pending AS (
    SELECT queue,
           pg_catalog.count(*) FILTER (WHERE run_at <= pg_catalog.now()) AS ready,
           pg_catalog.count(*) FILTER (WHERE run_at > pg_catalog.now()) AS scheduled,
           extract(epoch FROM pg_catalog.now() - pg_catalog.min(run_at) FILTER (WHERE run_at <= pg_catalog.now()))::float8 AS lag
    FROM pgqueue_jobs
    WHERE status = 'pending' AND ($1::text IS NULL OR queue = $1)
    GROUP BY queue
), running AS (
    SELECT queue, pg_catalog.count(*) AS running,
           extract(epoch FROM pg_catalog.now() - pg_catalog.min(coalesce(claimed_at, run_at)))::float8 AS longest_running,
           extract(epoch FROM pg_catalog.now() - pg_catalog.min(updated_at))::float8 AS oldest_heartbeat
    FROM pgqueue_jobs
    WHERE status = 'running' AND ($1::text IS NULL OR queue = $1)
    GROUP BY queue
), failed AS (
    SELECT queue,
           pg_catalog.count(*) FILTER (WHERE status = 'dead') AS dead,
           pg_catalog.count(*) FILTER (WHERE status = 'cancelled') AS cancelled
    FROM pgqueue_jobs
    WHERE status IN ('dead', 'cancelled') AND ($1::text IS NULL OR queue = $1)
    GROUP BY queue
), waiting AS (
    SELECT queue, pg_catalog.count(*) AS waiting
    FROM pgqueue_jobs
    WHERE status = 'waiting' AND ($1::text IS NULL OR queue = $1)
    GROUP BY queue
)
SELECT queue,
       coalesce(p.ready, 0)::int8, coalesce(p.scheduled, 0)::int8, coalesce(r.running, 0)::int8,
       coalesce(f.dead, 0)::int8, coalesce(f.cancelled, 0)::int8, coalesce(w.waiting, 0)::int8,
       p.lag, r.longest_running, r.oldest_heartbeat
FROM pending AS p
FULL JOIN running AS r USING (queue)
FULL JOIN failed AS f USING (queue)
FULL JOIN waiting AS w USING (queue)
ORDER BY queue
"""

# The table's size as the planner knows it: its pages now, its live rows
# (the planner's own estimate: rows per page at the last ANALYZE or VACUUM
# times the pages now; the statistics collector's count, which can lag or
# run ahead of an ANALYZE, only for a table never analyzed), and the share
# of its rows each frequent queue holds (from the last ANALYZE), with what
# is left for the other queues and how many distinct queues there are.
STATS_TABLE = """
WITH size AS (
    SELECT pg_catalog.pg_relation_size('pgqueue_jobs'::regclass)
           / pg_catalog.current_setting('block_size')::int8 AS pages
)
SELECT size.pages,
       CASE WHEN c.relpages > 0 AND c.reltuples >= 0
            THEN (c.reltuples / c.relpages * size.pages)::int8
            ELSE coalesce(s.n_live_tup, 0)
       END AS live,
       q.most_common_vals::text::text[] AS common_queues, q.most_common_freqs, q.n_distinct,
       pg_catalog.to_regclass('pgqueue_limits') IS NOT NULL AND pg_catalog.to_regclass('pgqueue_leases') IS NOT NULL AS has_limits,
       pg_catalog.to_regclass('pgqueue_paused') IS NOT NULL AS has_paused
FROM size, pg_class AS c
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
LEFT JOIN pg_stats AS q
    ON q.schemaname = c.relnamespace::regnamespace::text
   AND q.tablename = c.relname AND q.attname = 'queue'
WHERE c.oid = 'pgqueue_jobs'::regclass
"""

# Each queue with a fleet-wide limit: the slots its workers' unexpired
# leases hold (slots in use) and the limit of the worker that started last. Run only when STATS_TABLE
# found pgqueue_limits (a table without schema v2 has none); one row per
# limited queue.
STATS_LIMITS = """
SELECT l.queue,
       (SELECT coalesce(pg_catalog.sum(e.slots), 0) FROM pgqueue_leases AS e
        WHERE e.queue = l.queue AND e.expires_at >= pg_catalog.now())::int8 AS in_use,
       l.global_limit::int8 AS global_limit
FROM pgqueue_limits AS l
WHERE ($1::text IS NULL OR l.queue = $1)
"""

# An exact count of completed jobs per queue: a scan of the whole table,
# run only when the table is small (see pgqueue.Admin.stats).
STATS_COMPLETED = """
SELECT queue, pg_catalog.count(*) AS completed
FROM pgqueue_jobs
WHERE status = 'completed' AND ($1::text IS NULL OR queue = $1)
GROUP BY queue
"""


def _readable(column: str) -> str:
    """``column``, a time Python cannot represent (a BC date, year 10000 on) read as -infinity or infinity.

    asyncpg would fail to decode the whole result (a Go producer may have
    written such a row): the listings and the dashboard must still show it.
    """
    return (
        f"CASE WHEN {column} < '0001-01-01 00:00:00+00' THEN '-infinity'::timestamptz"
        f" WHEN {column} > '9999-12-31 23:59:59.999999+00' THEN 'infinity'::timestamptz"
        f" ELSE {column} END AS {column}"
    )


_JOB_COLUMNS = f"""
    id, queue, job_type, status, attempts, max_attempts, priority, {_readable("run_at")},
    {_readable("created_at")}, {_readable("updated_at")}, {_readable("completed_at")},
    last_error, unique_key, snoozes, cancel_requested,
    payload::text AS payload, result::text AS result,
    errors::text AS errors, snoozed::text AS snoozed, checkpoint::text AS checkpoint
"""

JOB = f"SELECT {_JOB_COLUMNS} FROM pgqueue_jobs WHERE id = $1"

# The same row for DB-API drivers (psycopg, psycopg2 through Django), with a
# pyformat placeholder; times as they are (the driver decodes every year).
JOB_PYFORMAT = """
SELECT id, queue, job_type, status, attempts, max_attempts, priority, run_at,
       created_at, updated_at, completed_at, last_error,
       payload::text AS payload, result::text AS result
FROM pgqueue_jobs WHERE id = CAST(%(id)s AS bigint)
"""

# Whether pgqueue_jobs holds a job of a type other than %(job_type)s: the
# Django migration's reverse drops the table only when it holds none.
FOREIGN_JOBS_PYFORMAT = """
SELECT EXISTS (SELECT 1 FROM pgqueue_jobs WHERE job_type <> CAST(%(job_type)s AS text))
"""

ERROR_LINE_CHARS = 300
"""The most characters of an error's first line a summary carries."""

_SCALAR_COLUMNS = f"""
    id, queue, job_type, status, attempts, max_attempts, priority, {_readable("run_at")},
    {_readable("created_at")}, {_readable("updated_at")}, {_readable("completed_at")},
    unique_key, snoozes, cancel_requested"""

# A job without its payload and result, and only the first line of its
# last error (past leading blank space, with no carriage return), cut to
# ERROR_LINE_CHARS characters: what a listing shows. The error is sliced
# before it is split, so a huge error costs no more than its head to read.
_SUMMARY_COLUMNS = f"""{_SCALAR_COLUMNS},
    pg_catalog.left(pg_catalog.rtrim(pg_catalog.split_part(pg_catalog.ltrim(pg_catalog.substr(last_error, 1, 4096), E' \\t\\r\\n'), E'\\n', 1), E'\\r'),
         {ERROR_LINE_CHARS}) AS error_line
"""

# One job's summary (the dashboard's confirmation pages).
JOB_SUMMARY = f"SELECT {_SUMMARY_COLUMNS} FROM pgqueue_jobs WHERE id = $1"

# A job's parents and children (Admin.dependencies): the first $2 of each by
# id, each with its status (NULL for a job since deleted), and how many it
# has. Parents through the child index, children through the primary key of
# pgqueue_dependencies; each one's status by the jobs' primary key, so a
# fan-out or fan-in of any size costs $2 lookups and two index-only counts.
# No row when the job $1 has neither.
DEPENDENCIES = """
WITH parents AS (
    SELECT parent_id AS id FROM pgqueue_dependencies
    WHERE child_id = $1
    ORDER BY parent_id
    LIMIT $2
), children AS (
    SELECT child_id AS id FROM pgqueue_dependencies
    WHERE parent_id = $1
    ORDER BY child_id
    LIMIT $2
), related AS (
    SELECT true AS parent, id FROM parents
    UNION ALL
    SELECT false, id FROM children
)
SELECT r.parent, r.id, j.status,
       (SELECT pg_catalog.count(*) FROM pgqueue_dependencies WHERE child_id = $1) AS parents_total,
       (SELECT pg_catalog.count(*) FROM pgqueue_dependencies WHERE parent_id = $1) AS children_total
FROM related AS r
LEFT JOIN pgqueue_jobs AS j ON j.id = r.id
ORDER BY r.parent DESC, r.id
"""


def _history_preview(column: str, detail: str) -> str:
    """The last `HISTORY_KEPT` entries of ``column`` as JSON text, each bounded.

    ``attempt`` is kept only if it is a number and ``at`` cut to 40
    characters; ``detail`` is the entry's own field (its error cut to the
    preview's size). A history written by hand costs no more to read.
    """
    return f"""(
           SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
                      'attempt', CASE WHEN pg_catalog.jsonb_typeof(e->'attempt') = 'number' THEN e->'attempt' END,
                      'at', pg_catalog.substr(e->>'at', 1, 40), {detail}) ORDER BY x.n)::text
           FROM pg_catalog.jsonb_array_elements(CASE WHEN pg_catalog.jsonb_typeof({column}) = 'array' THEN {column} END)
                WITH ORDINALITY AS x(e, n)
           WHERE x.n > pg_catalog.jsonb_array_length({column}) - {HISTORY_KEPT} AND pg_catalog.jsonb_typeof(e) = 'object'
       )"""


# One job with its payload and result as JSON text, and its last error,
# each cut to $2 + 1 characters in the database (one more than shown, which
# says it was cut), so a job of any size costs a bounded read.
JOB_PREVIEW = f"""
SELECT {_SCALAR_COLUMNS},
       pg_catalog.substr(payload::text, 1, c.chars) AS payload,
       pg_catalog.substr(result::text, 1, c.chars) AS result,
       pg_catalog.substr(checkpoint::text, 1, c.chars) AS checkpoint,
       pg_catalog.substr(last_error, 1, c.chars) AS last_error,
       {_history_preview("errors", "'error', CASE WHEN pg_catalog.jsonb_typeof(e->'error') = 'string' THEN pg_catalog.substr(e->>'error', 1, c.chars - 1) END")} AS errors,
       {_history_preview("snoozed", "'delay', CASE WHEN pg_catalog.jsonb_typeof(e->'delay') = 'number' THEN e->'delay' END")} AS snoozed
FROM pgqueue_jobs, (SELECT least($2::int8 + 1, 2147483647)::int AS chars) AS c
WHERE id = $1
"""

# Newest first, at most $4 jobs below id $3 (keyset pagination), of queue
# $1 and type $2 when given; or, for the page just newer, oldest first, at
# most $4 jobs above id $3 (always given, so that the primary key is read
# from it on; the caller reverses them). The status is part of the
# statement's text (see `jobs_query`) so that the planner can use the
# partial index that serves it even with a generic plan. For those statuses
# the order is spelled "id + 0", which no index provides: the planner then
# reads the status's rows through its partial index and sorts them, rather
# than walking the primary key through every completed row in the hope of
# meeting a few (with no such row, it would walk the whole table).
_JOBS = """
SELECT {columns}
FROM pgqueue_jobs
WHERE {status}
  AND ($1::text IS NULL OR queue = $1)
  AND ($2::text IS NULL OR job_type = $2)
  AND {cursor}
ORDER BY {order}{direction}
LIMIT $4
"""
_STATUS_FILTERS = {
    None: "true",
    "pending": "status = 'pending'",
    "ready": "status = 'pending' AND run_at <= pg_catalog.now()",
    "scheduled": "status = 'pending' AND run_at > pg_catalog.now()",
    "running": "status = 'running'",
    "waiting": "status = 'waiting'",
    "completed": "status = 'completed'",
    "dead": "status = 'dead'",
    "cancelled": "status = 'cancelled'",
}
JOB_STATUSES = tuple(status for status in _STATUS_FILTERS if status is not None)
"""What `jobs_query` accepts: the five statuses, ``ready`` and ``scheduled``."""


def jobs_query(status: str | None, *, newer: bool = False) -> str:
    """The listing of jobs of ``status`` (one of `JOB_STATUSES`, or None for any).

    With ``newer``, the jobs just above a cursor, oldest first.
    """
    return _listing(_JOB_COLUMNS, status, newer=newer)


def _listing(columns: str, status: str | None, *, newer: bool) -> str:
    return _JOBS.format(
        columns=columns,
        status=_STATUS_FILTERS[status],
        order="id" if status in (None, "completed") else "id + 0",
        cursor="id > $3::int8" if newer else "($3::int8 IS NULL OR id < $3)",
        direction="" if newer else " DESC",
    )


def job_summaries_query(status: str | None, *, newer: bool = False) -> str:
    """`jobs_query`, reading summaries: no payload or result, an error's first line."""
    return _listing(_SUMMARY_COLUMNS, status, newer=newer)


# Put dead and cancelled jobs $1 back to pending, due now, with $2 more
# attempts each (NULL: as many as their max_attempts) on top of those they
# used: attempts is never reset, so a stale run of an old attempt stays
# fenced off. A job whose (queue, job_type, unique_key) is held by a live job (or
# by another job of this call: the newest one is retried) is skipped.
# Each id comes back with what was done: retried, duplicate, not_retryable
# (pending, running or completed) or not_found; each queue that got jobs
# back is woken (identical notifications of a transaction are sent once).
RETRY = """
WITH wanted AS (
    SELECT DISTINCT pg_catalog.unnest($1::text::bigint[]) AS id
), found AS (
    SELECT id, queue, job_type, status, unique_key
    FROM pgqueue_jobs WHERE id IN (SELECT id FROM wanted)
    FOR UPDATE
), eligible AS (
    SELECT f.id,
           f.unique_key IS NULL OR (
               pg_catalog.row_number() OVER (PARTITION BY f.queue, f.job_type, f.unique_key ORDER BY f.id DESC) = 1
               AND NOT EXISTS (
                   SELECT 1 FROM pgqueue_jobs AS live
                   WHERE live.queue = f.queue AND live.job_type = f.job_type AND live.unique_key = f.unique_key
                     AND live.unique_key IS NOT NULL AND live.status IN ('pending', 'running')
               )
           ) AS free
    FROM found AS f
    WHERE f.status IN ('dead', 'cancelled')
), retried AS (
    UPDATE pgqueue_jobs AS j
    SET status           = 'pending',
        run_at           = pg_catalog.now(),
        updated_at       = pg_catalog.now(),
        max_attempts     = least(2147483647,
                                 j.attempts::int8 + coalesce($2::int8, j.max_attempts::int8))::int,
        cancel_requested = false
    FROM eligible AS e
    WHERE j.id = e.id AND e.free
    RETURNING j.id, j.queue
)
SELECT w.id,
       CASE WHEN r.id IS NOT NULL THEN 'retried'
            WHEN e.id IS NOT NULL THEN 'duplicate'
            WHEN f.id IS NOT NULL THEN 'not_retryable'
            ELSE 'not_found' END AS result,
       CASE WHEN r.id IS NOT NULL THEN pg_catalog.pg_notify('pgqueue_jobs', r.queue) END AS notified
FROM wanted AS w
LEFT JOIN found AS f ON f.id = w.id
LEFT JOIN eligible AS e ON e.id = w.id
LEFT JOIN retried AS r ON r.id = w.id
"""

# Admin.retry(..., children=True): the cancelled children ($1: jobs just
# retried, or children brought back) of those jobs that were cancelled for
# a parent's failure (on_parent_failure 'cancel') and have no parent dead or
# cancelled now go back to waiting, counting the parents not completed
# (their edges unsettled again). Returns their ids, for the next round.
RETRY_CHILDREN = """
WITH kids AS MATERIALIZED (
    SELECT DISTINCT c.id
    FROM pgqueue_dependencies AS d JOIN pgqueue_jobs AS c ON c.id = d.child_id
    WHERE d.parent_id = ANY($1::text::bigint[])
      AND c.status = 'cancelled' AND c.on_parent_failure = 'cancel'
      AND NOT EXISTS (
          SELECT FROM pgqueue_dependencies AS e JOIN pgqueue_jobs AS p ON p.id = e.parent_id
          WHERE e.child_id = c.id AND p.status IN ('dead', 'cancelled'))
), unsettled AS (
    UPDATE pgqueue_dependencies AS e SET settled = false
    FROM kids AS k, pgqueue_jobs AS p
    WHERE e.child_id = k.id AND p.id = e.parent_id AND p.status <> 'completed'
    RETURNING e.child_id
)
UPDATE pgqueue_jobs AS c
SET status       = CASE WHEN n.left_ > 0 THEN 'waiting' ELSE 'pending' END,
    parents_left = n.left_,
    last_error   = NULL,
    run_at       = pg_catalog.now(),
    updated_at   = pg_catalog.now()
FROM (SELECT k.id, (SELECT pg_catalog.count(*) FROM unsettled AS u WHERE u.child_id = k.id)::int AS left_
      FROM kids AS k) AS n
WHERE c.id = n.id
RETURNING c.id, c.queue, c.status, CASE WHEN c.status = 'pending' THEN pg_catalog.pg_notify('pgqueue_jobs', c.queue) END
"""

# The next $4 dead (or cancelled: $1) jobs past id $5, of queue $2 and type
# $3 when given, in id order: what retry_all retries next.
RETRYABLE_IDS = """
SELECT id FROM pgqueue_jobs
WHERE status IN ('dead', 'cancelled') AND status = $1
  AND ($2::text IS NULL OR queue = $2)
  AND ($3::text IS NULL OR job_type = $3)
  AND id > $5
ORDER BY id
LIMIT $4
"""

# How many dead jobs of queue $1 and type $2 (when given) there are: what
# a retry_all of them would take (the web dashboard's confirmation), read
# through the partial index of dead and cancelled jobs.
DEAD_COUNT = """
SELECT pg_catalog.count(*)::int8 FROM pgqueue_jobs
WHERE status IN ('dead', 'cancelled') AND status = 'dead'
  AND ($1::text IS NULL OR queue = $1)
  AND ($2::text IS NULL OR job_type = $2)
"""

# PRUNE_BATCH for one queue ($1) or every queue (NULL).
PRUNE_BATCH_ANY = _prune_batch("($1::text IS NULL OR queue = $1)")

# Periodic jobs ------------------------------------------------------------------------
#
# One row per schedule in pgqueue_periodic: its last tick run. Every worker
# that registers a schedule computes its ticks (in Python, from the
# database's clock) and runs PERIODIC_TICK for each tick that falls due;
# the statement that advances the row inserts the job, so however many
# workers race for one tick, one advances the row and inserts the job and
# the others change nothing. No leader is elected.

# The database's clock, as the schedulers read it.
PERIODIC_NOW = "SELECT pg_catalog.now() AS now"

# Register schedule $1 (written $2, in zone $3) of jobs of type $5 on queue
# $4: a new row remembers when it was first seen ($7, the schedulers'
# clock), so that no tick before that runs; an existing row keeps its last
# tick and takes the new definition. $6: the next tick, for listings.
PERIODIC_REGISTER = """
INSERT INTO pgqueue_periodic AS p (name, schedule, timezone, queue, job_type, next_tick, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, pg_catalog.now())
ON CONFLICT (name) DO UPDATE
SET schedule = EXCLUDED.schedule, timezone = EXCLUDED.timezone, queue = EXCLUDED.queue,
    job_type = EXCLUDED.job_type, next_tick = EXCLUDED.next_tick, updated_at = pg_catalog.now()
"""

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
PERIODIC_TICK = """
WITH seen AS (
    SELECT last_tick, created_at, last_job_id, last_job_key FROM pgqueue_periodic WHERE name = $1
), live AS (
    SELECT $11 AND coalesce((
        SELECT CASE WHEN s.last_job_id IS NOT NULL
                    THEN EXISTS (SELECT FROM pgqueue_jobs AS j
                                 WHERE j.id = s.last_job_id AND j.status IN ('pending', 'running'))
                    ELSE EXISTS (SELECT FROM pgqueue_jobs AS j
                                 WHERE j.queue = $4 AND j.job_type = $5 AND j.unique_key = s.last_job_key
                                   AND j.status IN ('pending', 'running'))
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
    ON CONFLICT (queue, job_type, unique_key) WHERE unique_key IS NOT NULL AND status IN ('pending', 'running')
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


# ---------------------------------------------------------------------------
# Distributed mode (Citus): the schema and the statement variants Citus
# routes to one shard. The plain statements above stay as they are; the
# library takes these only when its tables are distributed (see
# DISTRIBUTED_CHECK). Each job lives on the shard of its queue, so every
# write names its queue (an UPDATE or DELETE without it goes to every shard
# and commits with two-phase commit), functions Citus refuses in RETURNING
# and inside CASE (now(), jsonb_build_object) are left out or computed in a
# subquery, and wakeups are a separate SELECT pg_notify(...) on the
# coordinator (a statement routed whole to a shard would send its NOTIFY
# from the worker node). Jobs with dependencies are not supported.
# ---------------------------------------------------------------------------

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

_PLAIN_JOBS_KEY = "    id               BIGSERIAL PRIMARY KEY,\n"
_PLAIN_JOBS_END = "    claimed_at       TIMESTAMPTZ\n);\n"
assert SCHEMA.count(_PLAIN_JOBS_KEY) == 1
assert SCHEMA.count(_PLAIN_JOBS_END) == 1
_DISTRIBUTED_JOBS = (
    SCHEMA[
        SCHEMA.index("CREATE TABLE IF NOT EXISTS pgqueue_jobs") : SCHEMA.index(
            _PLAIN_JOBS_END
        )
    ].replace(_PLAIN_JOBS_KEY, "    id               BIGSERIAL,\n")
    + "    claimed_at       TIMESTAMPTZ,\n    PRIMARY KEY (id, queue)\n);\n"
)


def _created(name: str) -> str:
    """SCHEMA's statement creating the table or index ``name`` (a distributed schema has the same)."""
    for start, end in (("CREATE TABLE", "\n);\n"), ("CREATE INDEX", ";\n")):
        head = f"{start} IF NOT EXISTS {name}\n"
        if head in SCHEMA:
            begin = SCHEMA.index(head)
            return SCHEMA[begin : SCHEMA.index(end, begin) + len(end)]
    raise LookupError(name)


SCHEMA_DISTRIBUTED = (
    _CITUS_REQUIRED
    + _DISTRIBUTED_JOBS
    + "\n"
    + "".join(
        _created(name)
        for name in (
            "idx_pgqueue_jobs_claim",
            "idx_pgqueue_jobs_rescue",
            "idx_pgqueue_jobs_priority",
        )
    )
    + """-- One live job per (queue, job_type, unique_key): a unique index of a
-- distributed table must hold its distribution column.
CREATE UNIQUE INDEX IF NOT EXISTS idx_pgqueue_jobs_unique
    ON pgqueue_jobs (queue, job_type, unique_key)
    WHERE unique_key IS NOT NULL AND status IN ('pending', 'running');
"""
    + "".join(
        _created(name)
        for name in (
            "idx_pgqueue_jobs_failed",
            "idx_pgqueue_jobs_waiting",
        )
    )
    + "\n"
    + "".join(
        _created(name)
        for name in ("pgqueue_periodic", "pgqueue_limits", "pgqueue_leases")
    )
    + """-- Pauses and rate limits' starts (issue 29), by queue, co-located: each
-- claim's test of its queue's pause stays on the queue's node.
"""
    + "".join(
        _created(name)
        for name in (
            "pgqueue_paused",
            "pgqueue_starts",
            "idx_pgqueue_starts",
            "idx_pgqueue_starts_group",
            "pgqueue_turns",
            "idx_pgqueue_jobs_group",
        )
    )
    + """-- Dependencies are not supported distributed (a parent and its children
-- may live on different nodes): the table is there, empty, for the
-- statements that read it, and no trigger settles it.
"""
    + _created("pgqueue_dependencies")
    + _created("idx_pgqueue_dependencies_child")
    + """
-- Jobs, limits and leases by queue, co-located (a queue's rows of all
-- three on one node); schedules and dependencies copied to every node.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'pgqueue_jobs'::regclass) THEN
        PERFORM create_distributed_table('pgqueue_jobs', 'queue');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'pgqueue_limits'::regclass) THEN
        PERFORM create_distributed_table('pgqueue_limits', 'queue', colocate_with => 'pgqueue_jobs');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'pgqueue_leases'::regclass) THEN
        PERFORM create_distributed_table('pgqueue_leases', 'queue', colocate_with => 'pgqueue_jobs');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'pgqueue_paused'::regclass) THEN
        PERFORM create_distributed_table('pgqueue_paused', 'queue', colocate_with => 'pgqueue_jobs');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'pgqueue_starts'::regclass) THEN
        PERFORM create_distributed_table('pgqueue_starts', 'queue', colocate_with => 'pgqueue_jobs');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'pgqueue_turns'::regclass) THEN
        PERFORM create_distributed_table('pgqueue_turns', 'queue', colocate_with => 'pgqueue_jobs');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'pgqueue_periodic'::regclass) THEN
        PERFORM create_reference_table('pgqueue_periodic');
    END IF;
    IF NOT EXISTS (SELECT FROM pg_dist_partition WHERE logicalrelid = 'pgqueue_dependencies'::regclass) THEN
        PERFORM create_reference_table('pgqueue_dependencies');
    END IF;
END $$;
"""
    + _TAKE_TURN_FUNCTION
    + _CHECK_JOB_FUNCTION
    + _ENQUEUE_FUNCTION
    + _PINNED
)
"""Create pgqueue's tables on a Citus coordinator and distribute them (``pgqueue schema print --distributed``).

``pgqueue_jobs``, ``pgqueue_limits`` and ``pgqueue_leases`` are distributed
by ``queue`` and co-located; ``pgqueue_periodic`` is a reference table.
The primary key is ``(id, queue)`` and a unique key is unique per
``(queue, job_type, unique_key)``. Idempotent; fails with a clear error on
a database without the ``citus`` extension. Jobs with dependencies
(``after=``) are not supported on it.
"""

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


def _routed(statement: str, *changes: tuple[str, str]) -> str:
    """``statement`` with each ``(old, new)`` made: its one ``old`` replaced by ``new``.

    Checked: an original that changed so that ``old`` is not there once
    fails at import.
    """
    for old, new in changes:
        assert statement.count(old) == 1, old
        statement = statement.replace(old, new)
    return statement


_DIST_CLAIM_EXPRESSIONS = {
    **_CLAIM_EXPRESSIONS,
    "unrepresentable": (
        f"CASE WHEN ({_REPRESENTABLE.format('run_at')}) AND ({_REPRESENTABLE.format('created_at')}) THEN NULL\n"
        "         ELSE 'run_at or created_at is out of range' END"
    ),
    # No claim time (the policy then starts no line past it).
    "claimed_at": "NULL::int8",
    "has_parents": "false",  # no dependencies on Citus
}


# On Citus every claim is planned again, on the coordinator and on the
# node (a statement with subqueries gets no cached plan there), and the
# eleven scans of CLAIM cost most of a claim's time: about 1.8 ms through
# the coordinator against 1.0 ms for the scan of priority 0 alone. So a
# claim of a queue that has no pending job with a priority takes that scan
# only (DISTRIBUTED_CLAIM_ZERO), and each claim says in its last column
# whether such jobs were pending when it began, for the next one to choose.
_DIST_CLAIM_RETURNING = ",\n    ".join(
    f"{_DIST_CLAIM_EXPRESSIONS[name]} AS {name}"
    if name in _DIST_CLAIM_EXPRESSIONS
    else name
    for name in CLAIM_COLUMNS
)


def _on_citus(claim: str) -> str:
    """``claim`` as Citus runs it on the queue's shard: the outer UPDATE names the queue."""
    return _routed(
        claim,
        (_CLAIM_RETURNING, _DIST_CLAIM_RETURNING),
        ("WHERE id = ANY(ARRAY(", "WHERE queue = $1 AND id = ANY(ARRAY("),
    )


def _distributed_claim(types: str | None, *, zero: bool = False) -> str:
    only = "" if types is None else f" AND job_type = ANY({types}::text[])"
    statement = _claiming(_zero_scan("$2", only)) if zero else _claim("$2", types)
    prioritized = (
        "(SELECT EXISTS (SELECT FROM pgqueue_jobs WHERE queue = $1"
        f""" AND status = 'pending' COLLATE "C" AND priority <> 0{only})) AS prioritized"""
    )
    return _routed(
        _on_citus(statement),
        (_DIST_CLAIM_RETURNING, f"{_DIST_CLAIM_RETURNING},\n    {prioritized}"),
    )


DISTRIBUTED_CLAIM = _distributed_claim(None)
"""CLAIM on Citus: the outer UPDATE names the queue; no claim time, no parents' results.

A last column, ``prioritized``, says whether the queue had pending jobs
with a priority when the claim began.
"""
DISTRIBUTED_CLAIM_TYPES = _distributed_claim("$5")
"""CLAIM_TYPES on Citus, as DISTRIBUTED_CLAIM."""
DISTRIBUTED_CLAIM_ZERO = _distributed_claim(None, zero=True)
"""DISTRIBUTED_CLAIM of priority 0's line only, for a queue without pending jobs of other priorities."""
DISTRIBUTED_CLAIM_ZERO_TYPES = _distributed_claim("$5", zero=True)
"""DISTRIBUTED_CLAIM_ZERO of the job types in $5."""

# The claims under a group or a rate limit on Citus (CLAIM_GROUPS and the
# rated claims, after LOCK_CLAIMS and DISTRIBUTED_RATE_ROOM): every line's
# scans, on the queue's shard. A rated claim returns each job's group_key
# last, and the claimer records the starts with DISTRIBUTED_RECORD_START,
# one row a statement: Citus runs an INSERT ... SELECT (or a claim's CTE
# that inserts) through the coordinator, with a two-phase commit.
DISTRIBUTED_CLAIM_GROUPS = _on_citus(_claim_groups(heads=False))


def _with_group_key(claim: str) -> str:
    return _routed(
        _on_citus(claim),
        (
            f"RETURNING {_DIST_CLAIM_RETURNING}\n",
            f"RETURNING {_DIST_CLAIM_RETURNING},\n    group_key\n",
        ),
    )


DISTRIBUTED_CLAIM_GROUPS_RATED = _with_group_key(
    _claim_groups(group_rate=True, heads=False)
)
DISTRIBUTED_CLAIM_RATED = _with_group_key(CLAIM)
DISTRIBUTED_CLAIM_TYPES_RATED = _with_group_key(CLAIM_TYPES)
DISTRIBUTED_RECORD_START = (
    "INSERT INTO pgqueue_starts (queue, group_key, started_at) VALUES ($1, $2, $3)"
)

# RATE_ROOM on Citus, at the time $5 (CLOCK's, read after LOCK_CLAIMS): it
# refuses a stable function of a column in a statement that deletes, so
# the window's bounds are computed from the parameter.
CLOCK = "SELECT pg_catalog.clock_timestamp()"
DISTRIBUTED_RATE_ROOM = """
WITH gone AS (
    DELETE FROM pgqueue_starts
    WHERE queue = $1 AND started_at <= $5::timestamptz - pg_catalog.make_interval(secs => $3::float8)
), w AS (
    SELECT pg_catalog.count(*)::int AS n, pg_catalog.min(started_at) AS oldest
    FROM pgqueue_starts
    WHERE queue = $1 AND started_at > $5::timestamptz - pg_catalog.make_interval(secs => $3::float8)
)
SELECT $5::timestamptz AS at,
       CASE WHEN $4::boolean THEN $2::int ELSE GREATEST($2::int - w.n, 0) END AS room,
       extract(epoch FROM w.oldest - $5::timestamptz)::float8 + $3::float8 AS wait
FROM w
"""

# Outcome writes of one queue ($4 for COMPLETE, $7 for FINISH): the ids of
# tracked jobs that ended come back in ``ended``, announced by the writer
# with DISTRIBUTED_ANNOUNCE on the coordinator.
_DIST_ENDED = "j.tracked AND j.status IN ('completed', 'dead', 'cancelled') AS ended"
DISTRIBUTED_COMPLETE = (
    _routed(_COMPLETE, ("WHERE j.id = o.id", "WHERE j.queue = $4 AND j.id = o.id"))
    + f"RETURNING j.id, o.attempts, {_DIST_ENDED}\n"
)


# Citus refuses functions that are not immutable inside CASE (now(),
# jsonb_build_object, a timestamptz plus an interval): they are computed per
# row in a subquery it cannot pull up (OFFSET 0), and the CASEs pick them.
# The history entries name o.attempts, which the fence makes j.attempts.
def _kept(column: str, entry: str) -> str:
    return (
        f"CASE WHEN pg_catalog.jsonb_typeof({column}) = 'array'"
        f" THEN pg_catalog.jsonb_path_query_array({column}, '$[last - {HISTORY_KEPT - 2} to last]')"
        f" ELSE '[]'::jsonb END || {entry}"
    )


DISTRIBUTED_FINISH = f"""
UPDATE pgqueue_jobs AS j
SET status       = CASE WHEN j.cancel_requested AND o.status IN ('pending', 'snoozed', 'released')
                        THEN 'cancelled'
                        WHEN o.status IN ('snoozed', 'released') THEN 'pending'
                        ELSE o.status END,
    attempts     = CASE WHEN o.status IN ('snoozed', 'released') AND NOT j.cancel_requested
                        THEN j.attempts - 1 ELSE j.attempts END,
    snoozes      = CASE WHEN o.status = 'snoozed' THEN j.snoozes + 1 ELSE j.snoozes END,
    run_at       = CASE WHEN o.status IN ('pending', 'snoozed') AND NOT j.cancel_requested
                        THEN o.retry_at ELSE j.run_at END,
    last_error   = CASE WHEN j.cancel_requested AND o.status IN ('pending', 'snoozed', 'released')
                        THEN 'cancelled by request'
                        WHEN o.status IN ('completed', 'snoozed', 'released') THEN j.last_error
                        ELSE o.error END,
    result       = CASE WHEN o.status = 'completed' THEN o.result::jsonb ELSE j.result END,
    completed_at = CASE WHEN o.status = 'completed' THEN o.now ELSE j.completed_at END,
    checkpoint   = CASE WHEN o.status = 'completed' THEN NULL ELSE j.checkpoint END,
    errors       = CASE WHEN o.status IN ('pending', 'dead') THEN {_kept("j.errors", "o.failed")} ELSE j.errors END,
    snoozed      = CASE WHEN o.status = 'snoozed' AND NOT j.cancel_requested
                        THEN {_kept("j.snoozed", "o.snooze")} ELSE j.snoozed END,
    updated_at   = pg_catalog.now()
FROM (
    SELECT u.*, pg_catalog.now() AS now, pg_catalog.now() + pg_catalog.make_interval(secs => u.delay) AS retry_at,
           pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object('attempt', u.attempts, 'at', pg_catalog.now(), 'error', u.error)) AS failed,
           pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object('attempt', u.attempts, 'at', pg_catalog.now(), 'delay', u.delay)) AS snooze
    FROM ROWS FROM (pg_catalog.unnest($1::text::bigint[]), pg_catalog.unnest($2::text::int[]), pg_catalog.unnest($3::text[]), pg_catalog.unnest($4::text::float8[]), pg_catalog.unnest($5::text[]), pg_catalog.unnest($6::text[]))
        AS u(id, attempts, status, delay, error, result)
    OFFSET 0
) AS o
WHERE j.queue = $7 AND j.id = o.id AND j.attempts = o.attempts AND {_STILL_RUNNING}
RETURNING j.id, o.attempts, {_DIST_ENDED}
"""
DISTRIBUTED_ANNOUNCE = "SELECT pg_catalog.pg_notify('pgqueue_outcomes', id) FROM pg_catalog.unnest($1::text[]) AS id"

# A heartbeat of one queue's runs ($3).
DISTRIBUTED_TOUCH = _routed(
    TOUCH, ("WHERE j.id = o.id", "WHERE j.queue = $3 AND j.id = o.id")
)

# The rescue sweep of one queue ($1, text); the rows come back for the
# worker to announce the tracked ones that ended.
DISTRIBUTED_RESCUE = f"""
WITH rescued AS (
    UPDATE pgqueue_jobs AS j
    SET status     = CASE WHEN j.cancel_requested THEN 'cancelled'
                          WHEN j.attempts < j.max_attempts THEN 'pending' ELSE 'dead' END,
        last_error = CASE WHEN j.cancel_requested THEN 'cancelled by request'
                          WHEN j.attempts < j.max_attempts THEN j.last_error
                          ELSE 'rescued after exceeding max attempts' END,
        errors     = CASE WHEN j.cancel_requested THEN j.errors
                          ELSE {_kept("j.errors", "o.entry")} END,
        updated_at = pg_catalog.now()
    FROM (
        SELECT id, pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
                   'attempt', attempts, 'at', pg_catalog.now(),
                   'error', 'no heartbeat for '
                            || coalesce(pg_catalog.floor(extract(epoch FROM pg_catalog.now() - updated_at))::int8::text, '?') || ' s')) AS entry
        FROM pgqueue_jobs
        WHERE queue = $1 AND status = 'running' AND updated_at < pg_catalog.now() - pg_catalog.make_interval(secs => $2)
        LIMIT $3
        FOR UPDATE SKIP LOCKED
    ) AS o
    WHERE j.queue = $1 AND j.id = o.id
    RETURNING j.id, j.queue, j.status, j.tracked
)
SELECT queue, status, id, tracked AND status <> 'pending' AS ended
FROM rescued
"""

# Retention of one queue ($1, text): no dependencies on Citus, so no parent
# is kept for its children and no edge is deleted.
DISTRIBUTED_PRUNE_BATCH = """
WITH gone AS (
    DELETE FROM pgqueue_jobs
    WHERE queue = $1 AND id = ANY(ARRAY(
        SELECT id
        FROM pgqueue_jobs
        WHERE id > $3 AND queue = $1
          AND status IN ('completed', 'dead', 'cancelled')
          AND updated_at < pg_catalog.now() - pg_catalog.make_interval(secs => $2)
        ORDER BY id
        LIMIT $4
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING id
)
SELECT pg_catalog.count(*)::int AS removed, coalesce(pg_catalog.max(id), $3) AS last_id FROM gone
"""
DISTRIBUTED_PRUNE = """
WITH gone AS (
    DELETE FROM pgqueue_jobs
    WHERE queue = $1
      AND status IN ('completed', 'dead', 'cancelled')
      AND updated_at < pg_catalog.now() - pg_catalog.make_interval(secs => $2)
    RETURNING id
)
SELECT pg_catalog.count(*)::int FROM gone
"""

# Enqueues on Citus insert with the _SILENT statements; the wakeup is this
# separate statement, which runs on the coordinator (where workers listen).
DISTRIBUTED_UNIQUE_SILENT = f"""
    INSERT INTO pgqueue_jobs (queue, job_type, payload, max_attempts, run_at, priority, tracked, trace_context, unique_key, group_key)
    VALUES ($1, $2, $3::text::jsonb, $4, {_RUN_AT.format(delay="$10")}, $6, $7, $8, $9, $11)
    {_ON_UNIQUE_CONFLICT}
    RETURNING id, xmax <> 0 AS existed"""
_KEYED = {"key": " unique_key,", "key_value": " t.unique_key,"}
_DISTRIBUTED_MANY_UNIQUE = """
WITH jobs AS ({rows}{on_conflict}
    RETURNING id, job_type, unique_key, xmax <> 0 AS existed
)
SELECT id, job_type, unique_key, existed
FROM jobs
"""
DISTRIBUTED_MANY_UNIQUE = _DISTRIBUTED_MANY_UNIQUE.format(
    rows=_ENQUEUE_ROWS.format(**_UNDELAYED, **_KEYED), on_conflict=_ON_UNIQUE_CONFLICT
)
DISTRIBUTED_MANY_UNIQUE_DELAYED = _DISTRIBUTED_MANY_UNIQUE.format(
    rows=_ENQUEUE_ROWS.format(**_DELAYED, **_KEYED), on_conflict=_ON_UNIQUE_CONFLICT
)

# Which queue each of the jobs $1 is in (for the calls that give only ids).
QUEUES_OF = "SELECT id, queue FROM pgqueue_jobs WHERE id = ANY($1::text::bigint[])"

# Cancel the jobs $1 of queue $2 (CANCEL on Citus; the ids' queues are
# looked up first with QUEUES_OF). The control and outcome NOTIFYs are
# sent by DISTRIBUTED_NOTIFY, from the coordinator.
DISTRIBUTED_CANCEL = """
WITH wanted AS (
    SELECT DISTINCT pg_catalog.unnest($1::text::bigint[]) AS id
), found AS MATERIALIZED (
    SELECT id, status, pg_catalog.now() AS now FROM pgqueue_jobs
    WHERE queue = $2 AND id IN (SELECT id FROM wanted) FOR UPDATE
), changed AS (
    UPDATE pgqueue_jobs AS j
    SET status           = CASE WHEN f.status IN ('pending', 'waiting') THEN 'cancelled' ELSE j.status END,
        cancel_requested = j.cancel_requested OR f.status = 'running',
        last_error       = CASE WHEN f.status IN ('pending', 'waiting') THEN 'cancelled by request' ELSE j.last_error END,
        updated_at       = CASE WHEN f.status IN ('pending', 'waiting') THEN f.now ELSE j.updated_at END
    FROM found AS f
    WHERE j.queue = $2 AND j.id = f.id AND f.status IN ('pending', 'waiting', 'running')
    RETURNING j.id, CASE WHEN f.status = 'waiting' THEN 'pending' ELSE f.status END AS was, j.tracked
)
SELECT w.id,
       CASE WHEN c.was = 'pending' THEN 'cancelled'
            WHEN c.was = 'running' THEN 'requested'
            WHEN f.id IS NOT NULL THEN 'finished'
            ELSE 'not_found' END AS result,
       CASE WHEN c.was = 'running' THEN 'pgqueue_control'
            WHEN c.was = 'pending' AND c.tracked THEN 'pgqueue_outcomes' END AS channel
FROM wanted AS w LEFT JOIN found AS f ON f.id = w.id LEFT JOIN changed AS c ON c.id = w.id
"""

# Retry the jobs $1 of queue $3 (RETRY on Citus; $2 as RETRY's). A unique
# key is unique per queue there. The wakeup is DISTRIBUTED_NOTIFY's.
DISTRIBUTED_RETRY = _routed(
    RETRY,
    ("), found AS (\n", "), found AS MATERIALIZED (\n"),
    (
        "FROM pgqueue_jobs WHERE id IN",
        "FROM pgqueue_jobs WHERE queue = $3 AND id IN",
    ),
    (
        "WHERE live.queue = f.queue AND live.job_type = f.job_type",
        "WHERE live.queue = $3 AND live.job_type = f.job_type",
    ),
    (
        "    WHERE j.id = e.id AND e.free\n    RETURNING j.id, j.queue\n",
        "    WHERE j.queue = $3 AND j.id = e.id AND e.free\n    RETURNING j.id\n",
    ),
    (
        (
            "END AS result,\n       CASE WHEN r.id IS NOT NULL"
            " THEN pg_catalog.pg_notify('pgqueue_jobs', r.queue) END AS notified\n"
        ),
        "END AS result\n",
    ),
)

# NOTIFYs on the coordinator: channel $1[i], payload $2[i].
DISTRIBUTED_NOTIFY = "SELECT pg_catalog.pg_notify(c, p) FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[])) AS n(c, p)"

# A lease on Citus (LEASE in steps, in the transaction that holds
# LOCK_LIMIT, each on the queue's shard): expired leases of others go ($1
# queue, $2 worker); then what worker $2 is granted (as LEASE: its limit
# $3, wanted $4); then its lease is written ($3 the slots recorded, $4
# wanted, $5 seconds).
DISTRIBUTED_LEASE_EXPIRE = """
DELETE FROM pgqueue_leases WHERE queue = $1 AND worker <> $2 AND expires_at < pg_catalog.now()
"""
DISTRIBUTED_LEASE_GRANT = """
SELECT LEAST($4::int, GREATEST($3::int - o.held, 0),
             pg_catalog.ceil($3::int / (o.wanting + 1)::numeric)::int) AS slots
FROM (
    SELECT coalesce(pg_catalog.sum(slots), 0)::int AS held, pg_catalog.count(*) FILTER (WHERE wanted > 0)::int AS wanting
    FROM pgqueue_leases
    WHERE queue = $1 AND worker <> $2 AND expires_at >= pg_catalog.now()
) AS o
"""
DISTRIBUTED_LEASE_WRITE = """
INSERT INTO pgqueue_leases AS l (queue, worker, slots, wanted, expires_at)
VALUES ($1, $2, $3::int, $4::int, pg_catalog.now() + pg_catalog.make_interval(secs => $5::float8))
ON CONFLICT (queue, worker) DO UPDATE
SET slots = EXCLUDED.slots, wanted = EXCLUDED.wanted, expires_at = EXCLUDED.expires_at
"""
# A worker ($2) gives its lease of queue $1 back as it stops.
DISTRIBUTED_RELEASE_LEASE = (
    "DELETE FROM pgqueue_leases WHERE queue = $1 AND worker = $2"
)

# PERIODIC_REGISTER on Citus (no now() in ON CONFLICT DO UPDATE).
DISTRIBUTED_PERIODIC_REGISTER = _routed(
    PERIODIC_REGISTER,
    (
        "job_type = EXCLUDED.job_type, next_tick = EXCLUDED.next_tick, updated_at = pg_catalog.now()",
        "job_type = EXCLUDED.job_type, next_tick = EXCLUDED.next_tick, updated_at = EXCLUDED.updated_at",
    ),
)
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
DISTRIBUTED_TICK_LIVE = """
SELECT EXISTS (SELECT FROM pgqueue_jobs
               WHERE queue = $1 AND status IN ('pending', 'running')
                 AND (id = $4 OR $4::int8 IS NULL AND job_type = $2 AND unique_key = $3))
"""
DISTRIBUTED_TICK_ADVANCE = """
UPDATE pgqueue_periodic
SET last_tick = $2, next_tick = $3, last_job_key = coalesce($4, last_job_key),
    last_job_id = coalesce($5, last_job_id), updated_at = pg_catalog.now()
WHERE name = $1
"""
DISTRIBUTED_TICK_JOB = """
INSERT INTO pgqueue_jobs (queue, job_type, payload, max_attempts, unique_key)
VALUES ($1, $2, $3::text::jsonb, $4, $5)
ON CONFLICT (queue, job_type, unique_key) WHERE unique_key IS NOT NULL AND status IN ('pending', 'running')
DO NOTHING
RETURNING id
"""

# The queues with finished jobs (Admin.prune of every queue on Citus, which
# then prunes queue by queue).
FINISHED_QUEUES = """
SELECT DISTINCT queue FROM pgqueue_jobs WHERE status IN ('completed', 'dead', 'cancelled')
"""

# A checkpoint of job $1 of queue $4 (CHECKPOINT on Citus).
DISTRIBUTED_CHECKPOINT = _routed(
    CHECKPOINT, ("WHERE j.id = $1", "WHERE j.queue = $4 AND j.id = $1")
)


# Operator surfaces, bounded whatever the rows hold (issue 40) -------------------------
#
# Any client may have written a row (a Go producer, SQL by hand): names of
# megabytes and of any character. What the dashboards, pgqueue top and the
# Prometheus collector read is bounded here: each name cut to one character
# past the longest pgqueue allows (a name that long was cut), with substr,
# which detoasts no more than it returns; and at most $3 queues, the ones
# with the most jobs to do, of those the filter lets through.

__all__ += [  # the names this block adds
    "DASHBOARD_DEAD_SHOWN",
    "DASHBOARD_ENQUEUED_SHOWN",
    "DASHBOARD_RUNNING_SHOWN",
    "JOB_PREVIEW_SHOWN",
    "JOB_SUMMARY_SHOWN",
    "READ_KEY_CHARS",
    "READ_NAME_CHARS",
    "READ_QUEUE_CHARS",
    "STATS_TOP",
    "STATS_TOP_COMPLETED",
    "shown_summaries_query",
]

READ_QUEUE_CHARS = 1025
"""The most characters of a queue name an operator surface reads: one past the longest (1,024 bytes)."""
READ_NAME_CHARS = 256
"""The most characters of a job type an operator surface reads: one past the longest (255)."""
READ_KEY_CHARS = 1025
"""The most characters of a unique key an operator surface reads: one past the longest (1,024)."""

_READ_CHARS = {
    "queue": READ_QUEUE_CHARS,
    "job_type": READ_NAME_CHARS,
    "unique_key": READ_KEY_CHARS,
}

_SUMMARY_NAMES = (
    "id", "queue", "job_type", "status", "attempts", "max_attempts", "priority",
    "run_at", "created_at", "updated_at", "completed_at", "unique_key", "snoozes",
    "cancel_requested", "error_line",
)  # fmt: skip
"""The columns of a summary (_SUMMARY_COLUMNS), by name."""
_PREVIEW_NAMES = (
    *_SUMMARY_NAMES[:-1], "payload", "result", "checkpoint", "last_error", "errors", "snoozed",
)  # fmt: skip
"""The columns of JOB_PREVIEW, by name."""


def _names_cut(statement: str, columns: Iterable[str], order: str = "") -> str:
    """``statement``'s rows (``columns``) with the queue, job type and unique key cut to `_READ_CHARS`.

    The cut applies to the rows ``statement`` returns: the names are read
    whole by nothing (a toasted name stays a pointer until substr reads its
    head).
    """
    shown = ", ".join(
        f"pg_catalog.substr(r.{name}, 1, {_READ_CHARS[name]}) AS {name}"
        if name in _READ_CHARS
        else f"r.{name}"
        for name in columns
    )
    return f"SELECT {shown} FROM ({statement}) AS r{order}"


def shown_summaries_query(status: str | None, *, newer: bool = False) -> str:
    """`job_summaries_query`, its names cut (`_READ_CHARS`): what a listing shows."""
    order = " ORDER BY r.id" + ("" if newer else " DESC")
    return _names_cut(job_summaries_query(status, newer=newer), _SUMMARY_NAMES, order)


# One job's summary and preview, their names cut (the dashboard's job and
# confirmation pages).
JOB_SUMMARY_SHOWN = _names_cut(JOB_SUMMARY, _SUMMARY_NAMES)
JOB_PREVIEW_SHOWN = _names_cut(JOB_PREVIEW, _PREVIEW_NAMES)

# Which queues a frame shows: those named in $1 (NULL: any) whose name holds
# $2 (NULL: any).
_SHOWN_FILTER = (
    "($1::text[] IS NULL OR queue = ANY($1)) "
    "AND ($2::text IS NULL OR pg_catalog.strpos(queue, $2) > 0)"
)


# STATS of the queues the filter lets through, the $3 with the most jobs to
# do (waiting, ready, scheduled and running; then the most dead; then by
# name), and how many queues the filter let through in all (matched). The
# queues in $4 are counted even without a job (paused queues, queues named
# by the caller, those the planner's statistics say hold completed jobs).
# Every status's rows come through its index, as in STATS; only the $3
# rows leave the server. With ``completed``, each queue's completed jobs
# are counted too, by a scan of the table (a small one: see
# pgqueue.Admin.stats).
def _stats_top(*, completed: bool) -> str:
    count_completed = (
        f""", completed AS (
    SELECT queue, pg_catalog.count(*) AS completed
    FROM pgqueue_jobs
    WHERE status = 'completed' AND {_SHOWN_FILTER}
    GROUP BY queue
)"""
        if completed
        else ""
    )
    return f"""
WITH pending AS (
    SELECT queue,
           pg_catalog.count(*) FILTER (WHERE run_at <= pg_catalog.now()) AS ready,
           pg_catalog.count(*) FILTER (WHERE run_at > pg_catalog.now()) AS scheduled,
           extract(epoch FROM pg_catalog.now() - pg_catalog.min(run_at) FILTER (WHERE run_at <= pg_catalog.now()))::float8 AS lag
    FROM pgqueue_jobs
    WHERE status = 'pending' AND {_SHOWN_FILTER}
    GROUP BY queue
), running AS (
    SELECT queue, pg_catalog.count(*) AS running,
           extract(epoch FROM pg_catalog.now() - pg_catalog.min(coalesce(claimed_at, run_at)))::float8 AS longest_running,
           extract(epoch FROM pg_catalog.now() - pg_catalog.min(updated_at))::float8 AS oldest_heartbeat
    FROM pgqueue_jobs
    WHERE status = 'running' AND {_SHOWN_FILTER}
    GROUP BY queue
), failed AS (
    SELECT queue,
           pg_catalog.count(*) FILTER (WHERE status = 'dead') AS dead,
           pg_catalog.count(*) FILTER (WHERE status = 'cancelled') AS cancelled
    FROM pgqueue_jobs
    WHERE status IN ('dead', 'cancelled') AND {_SHOWN_FILTER}
    GROUP BY queue
), waiting AS (
    SELECT queue, pg_catalog.count(*) AS waiting
    FROM pgqueue_jobs
    WHERE status = 'waiting' AND {_SHOWN_FILTER}
    GROUP BY queue
){count_completed}, listed AS (
    SELECT DISTINCT queue FROM pg_catalog.unnest($4::text[]) AS x(queue)
    WHERE {_SHOWN_FILTER}
), counted AS (
    SELECT queue,
           coalesce(p.ready, 0)::int8 AS ready, coalesce(p.scheduled, 0)::int8 AS scheduled,
           coalesce(r.running, 0)::int8 AS running, coalesce(f.dead, 0)::int8 AS dead,
           coalesce(f.cancelled, 0)::int8 AS cancelled, coalesce(w.waiting, 0)::int8 AS waiting,
           p.lag, r.longest_running, r.oldest_heartbeat,
           {"coalesce(c.completed, 0)::int8" if completed else "NULL::int8"} AS completed
    FROM pending AS p
    FULL JOIN running AS r USING (queue)
    FULL JOIN failed AS f USING (queue)
    FULL JOIN waiting AS w USING (queue)
    {"FULL JOIN completed AS c USING (queue)" if completed else ""}
    FULL JOIN listed AS l USING (queue)
)
SELECT pg_catalog.substr(queue, 1, {READ_QUEUE_CHARS}) AS queue,
       ready, scheduled, running, dead, cancelled, waiting,
       lag, longest_running, oldest_heartbeat, completed,
       pg_catalog.count(*) OVER () AS matched
FROM counted
ORDER BY waiting + ready + scheduled + running DESC, dead DESC, queue
LIMIT $3
"""


STATS_TOP = _stats_top(completed=False)
STATS_TOP_COMPLETED = _stats_top(completed=True)

# DASHBOARD_ENQUEUED of the queues shown, named as STATS_TOP names them ($3).
DASHBOARD_ENQUEUED_SHOWN = f"""
SELECT pg_catalog.substr(queue, 1, {READ_QUEUE_CHARS}) AS queue, pg_catalog.count(*)::int8 AS enqueued
FROM pgqueue_jobs
WHERE id > $1 AND id <= $2 AND pg_catalog.substr(queue, 1, {READ_QUEUE_CHARS}) = ANY($3::text[])
GROUP BY 1
"""

# DASHBOARD_RUNNING of the queues the filter lets through, $3 jobs, names
# cut; the checkpoint's head only when $4 (a dashboard that hides payloads
# reads none).
DASHBOARD_RUNNING_SHOWN = f"""
SELECT id, pg_catalog.substr(queue, 1, {READ_QUEUE_CHARS}) AS queue,
       pg_catalog.substr(job_type, 1, {READ_NAME_CHARS}) AS job_type,
       CASE WHEN pg_catalog.isfinite(coalesce(claimed_at, run_at))
            THEN greatest(extract(epoch FROM pg_catalog.now() - coalesce(claimed_at, run_at)), 0)::float8
       END AS running_for,
       CASE WHEN pg_catalog.isfinite(updated_at)
            THEN greatest(extract(epoch FROM pg_catalog.now() - updated_at), 0)::float8 END AS heard_from,
       CASE WHEN $4::bool THEN pg_catalog.substr(checkpoint::text, 1, {PROGRESS_CHARS}) END AS progress
FROM pgqueue_jobs
WHERE status = 'running' AND {_SHOWN_FILTER}
ORDER BY coalesce(claimed_at, run_at), id
LIMIT $3
"""

# The $3 latest dead jobs of the queues the filter lets through, as summaries
# (names cut), newest first, through the index of dead and cancelled jobs.
DASHBOARD_DEAD_SHOWN = _names_cut(
    f"""SELECT {_SUMMARY_COLUMNS} FROM pgqueue_jobs
    WHERE status = 'dead' AND {_SHOWN_FILTER}
    ORDER BY id + 0 DESC LIMIT $3""",
    _SUMMARY_NAMES,
    " ORDER BY r.id DESC",
)
