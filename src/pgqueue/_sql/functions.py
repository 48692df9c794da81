"""The functions of the schema: the producers' enqueues, their checks, and a claim's turn.

Each is created with the planner settings of pgqueue's own connections
(`pgqueue._sql.settings.FUNCTION_SETTINGS`) and its search_path pinned
(PINNED); every built-in is called as pg_catalog's. Those a producer calls
to write what its grants do not let it write itself (pgqueue.grants: a
producer may insert the columns of a plain job, nothing else) are SECURITY
DEFINER: they run with their owner's rights, check every argument as the
Python side does, and write only what a producer's enqueue may (its own new
rows; the live job of its own key, by the replace rules; edges from its new
jobs to their parents).
"""

from __future__ import annotations

from pgqueue._sql import durable
from pgqueue._sql.settings import FUNCTION_SETTINGS
from pgqueue._sql.statuses import CANCELLED, ENDED, FAILED, PENDING, WAITING
from pgqueue._sql.tables import LIVE_KEY

__all__ = [
    "CHECK_JOB",
    "ENQUEUE",
    "ENQUEUE_AFTER",
    "ENQUEUE_REPLACE",
    "FUNCTIONS",
    "PINNED",
    "TAKE_TURN",
]

# pgqueue_check_job(function, ...): raise (SQLSTATE 22023, the message
# starting with the function's name) unless one job's fields are what a
# producer may write: a queue of at most 1024 bytes, a job type and a group
# of at most 255 characters, a key of at most 1024 not starting 'periodic:',
# none empty or holding a C0 or C1 control character; a payload, at least
# one attempt, a priority from -5 to 5, a tracking flag.
CHECK_JOB = f"""
CREATE OR REPLACE FUNCTION pgqueue_check_name(
    p_function text, p_what text, p_value text, p_max_chars int
) RETURNS void
LANGUAGE plpgsql IMMUTABLE
{FUNCTION_SETTINGS}AS $pgqueue_check_name$
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
{FUNCTION_SETTINGS}AS $pgqueue_check_job$
BEGIN
    IF pg_catalog.octet_length(p_queue) > 1024 THEN
        RAISE EXCEPTION '%: queue name is % bytes; at most 1024 are allowed',
            p_function, pg_catalog.octet_length(p_queue)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM pgqueue_check_name(p_function, 'queue', p_queue, 1024);
    PERFORM pgqueue_check_name(p_function, 'job_type', p_job_type, 255);
    IF p_payload IS NULL THEN
        RAISE EXCEPTION '%: payload must not be NULL (give ''{{}}'' for none)', p_function
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
"""

TAKE_TURN = f"""
-- A claim's turn (LOCK_CLAIMS): the queue's row of pgqueue_turns, made if
-- it is missing, locked until the claim's transaction ends; waiting at
-- most 5 s for another worker's claim (lock_not_available after that: the
-- claimer retries, and says so).
CREATE OR REPLACE FUNCTION pgqueue_take_turn(p_queue text) RETURNS void
LANGUAGE plpgsql VOLATILE
SET lock_timeout = '5s'
{FUNCTION_SETTINGS}AS $pgqueue_take_turn$
BEGIN
    PERFORM FROM pgqueue_turns WHERE queue = p_queue FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO pgqueue_turns (queue) VALUES (p_queue) ON CONFLICT (queue) DO NOTHING;
        PERFORM FROM pgqueue_turns WHERE queue = p_queue FOR UPDATE;
    END IF;
END
$pgqueue_take_turn$;
"""

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
# A claim skips the locked live job (SKIP LOCKED) until the replace commits;
# one that locked it first makes the replace wait, and see it running.
# outcome: 'inserted', 'existed' (without p_replace), 'replaced' (the live
# job), 'replaced_next' (the next job) or 'queued_next' (a new next job);
# wake: whether the queue has a job to claim now (sent with p_notify). A key
# is a queue's: only that queue's jobs are seen.
ENQUEUE_REPLACE = f"""
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
{FUNCTION_SETTINGS}AS $pgqueue_enqueue_replace$
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
    ON CONFLICT {LIVE_KEY}
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
          AND j.status = {WAITING}
        RETURNING j.id INTO job_id;
        IF FOUND THEN
            outcome := 'replaced_next';
            wake := false;
        ELSIF live.status = {PENDING} AND live.attempts = 0 AND live.snoozes = 0 THEN
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
                    p_tracked, p_trace_context, p_unique_key, {WAITING}, 1, 'run')
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
"""

# pgqueue_enqueue_after(...): jobs with dependencies (Queue.enqueue(after=),
# enqueue_many with NewJob(after=), pgqueue_enqueue(after =>)), in the
# caller's transaction: the jobs' columns as enqueue_many's (arrays, in
# input order; the payloads one JSON array), and the edges: each an index
# of a child (from 1) and its parent, a job id, or minus the index of an
# earlier job of the call. An outside parent not yet one is marked first,
# in id order (the enqueues of its first children take turns: holding it
# shared, each would wait for the other to mark it). Then the outside
# parents are locked FOR SHARE, in id order, and their statuses read (a
# parent ending meanwhile waits for the enqueue's commit, and its trigger
# then sees the new edges; one that ended first counts at once); then the
# jobs are inserted; then the edges, each
# settled if its parent has ended, and each child's state: cancelled
# (on_parent_failure 'cancel') when a parent is dead or cancelled (a job of
# the call, cancelled so, is such a parent in turn), its last_error naming
# the first such parent; else waiting while a parent has not ended. Returns
# the jobs' ids, in input order. SECURITY DEFINER: a producer writes edges
# only from the jobs it inserts here.
ENQUEUE_AFTER = f"""
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
{FUNCTION_SETTINGS}AS $pgqueue_enqueue_after$
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

    UPDATE pgqueue_jobs AS j SET has_children = true
    WHERE j.id IN (SELECT o.id FROM pgqueue_jobs AS o
                   WHERE o.id = ANY (ARRAY(SELECT DISTINCT p FROM pg_catalog.unnest(p_parents) AS p WHERE p > 0))
                     AND NOT o.has_children
                   ORDER BY o.id FOR NO KEY UPDATE);
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
        WHERE e.outside IN {FAILED} AND p_on_parent_failure[e.child] = 'cancel'
        UNION
        SELECT e.child FROM edges AS e JOIN cancelled AS c ON c.child = e.parent_index
        WHERE p_on_parent_failure[e.child] = 'cancel'
    ), judged AS (
        SELECT e.*,
               coalesce(e.outside IN {ENDED}, false)
               OR coalesce(e.parent_index IN (SELECT child FROM cancelled), false) AS settled,
               coalesce(e.outside IN {FAILED}, false)
               OR coalesce(e.parent_index IN (SELECT child FROM cancelled), false) AS failed
        FROM edges AS e
    ), written AS (
        INSERT INTO pgqueue_dependencies (parent_id, child_id, settled)
        SELECT parent_id, child_id, settled FROM judged
        ON CONFLICT DO NOTHING
    ), children AS (
        SELECT e.child_id AS id,
               CASE WHEN e.child IN (SELECT child FROM cancelled) THEN {CANCELLED}
                    WHEN pg_catalog.count(*) FILTER (WHERE NOT e.settled) > 0 THEN {WAITING} END AS status,
               pg_catalog.count(*) FILTER (WHERE NOT e.settled)::int AS parents_left,
               p_on_parent_failure[e.child] AS on_parent_failure,
               CASE WHEN e.child IN (SELECT child FROM cancelled)
                    THEN (SELECT pg_catalog.format('parent job %s is %s', f.parent_id,
                                                   coalesce(f.outside, {CANCELLED}))
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
"""

# pgqueue_enqueue(...): an enqueue in SQL, in the caller's transaction (any
# driver, a trigger, psql): Queue.enqueue's defaults, checks and row, the
# wakeup riding the transaction. Parameters are read as pgqueue_enqueue.<name>
# (the columns' names). A job with a key goes through pgqueue_enqueue_replace,
# one with parents pgqueue_enqueue_after (SECURITY DEFINER both); a plain job
# is inserted with the caller's rights.
ENQUEUE = f"""
DROP FUNCTION IF EXISTS pgqueue_enqueue(text, jsonb, text, timestamptz, interval, int, int, text, text, boolean, text);
DROP FUNCTION IF EXISTS pgqueue_enqueue(text, jsonb, text, timestamptz, interval, int, int, text, text, boolean, text, text, bigint[], text);
CREATE OR REPLACE FUNCTION pgqueue_enqueue(
    job_type          text,
    payload           jsonb       DEFAULT '{{}}',
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
    on_parent_failure text        DEFAULT 'cancel',
    debounce          interval    DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE
{FUNCTION_SETTINGS}AS $pgqueue_enqueue$
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
    IF pgqueue_enqueue.debounce IS NOT NULL THEN
        IF pgqueue_enqueue.debounce <= interval '0' OR pgqueue_enqueue.unique_key IS NULL
           OR pgqueue_enqueue.run_at IS NOT NULL OR pgqueue_enqueue.delay IS NOT NULL
           OR pgqueue_enqueue.on_conflict = 'raise' THEN
            RAISE EXCEPTION 'pgqueue_enqueue: debounce must be positive, with a unique_key, and without run_at, delay or on_conflict ''raise'''
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        pgqueue_enqueue.on_conflict := 'replace';
        pgqueue_enqueue.delay := pgqueue_enqueue.debounce;
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
            ON CONFLICT {LIVE_KEY}
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
"""

FUNCTIONS = {
    "pgqueue_check_name(text, text, text, int)": "invoker",
    "pgqueue_check_job(text, text, text, jsonb, int, int, boolean, text, text)": "invoker",
    "pgqueue_enqueue_replace(text, text, jsonb, int, timestamptz, int, boolean, text, text, boolean, boolean, text)": "definer",
    "pgqueue_enqueue_after(text, text[], jsonb, int[], timestamptz[], float8[], int[], boolean[], text, int[], bigint[], text[], boolean)": "definer",
    "pgqueue_enqueue(text, jsonb, text, timestamptz, interval, int, int, text, text, boolean, text, text, bigint[], text, interval)": "invoker",
    "pgqueue_parent_ended()": "trigger",
    "pgqueue_group_pending()": "trigger",
    "pgqueue_group_heads(text, text[])": "invoker",
    "pgqueue_take_turn(text)": "invoker",
    **durable.FUNCTIONS,
}
"""Every function of the schema (the triggers' and durable handlers' too) by signature, for
grants and pinning: ``definer`` (SECURITY DEFINER: its owner's rights), ``invoker`` or ``trigger``."""

# Every function runs with a fixed search_path (pg_catalog, the schema it
# was installed into, pg_temp): no function or table planted in another
# schema, or a temporary one, is taken for its own or a built-in. The
# definer ones are for the roles granted them (pgqueue.grants), not PUBLIC.
_FUNCTION_ARRAY = "{" + ",".join(f'"{f}"' for f in FUNCTIONS) + "}"
_DEFINERS = [f for f, kind in FUNCTIONS.items() if kind == "definer"]
_DEFINER_ARRAY = "{" + ",".join(f'"{f}"' for f in _DEFINERS) + "}"
PINNED = f"""
DO $$ DECLARE f text;
BEGIN
    FOREACH f IN ARRAY '{_FUNCTION_ARRAY}'::text[] LOOP
        CONTINUE WHEN pg_catalog.to_regprocedure(f) IS NULL;  -- not in a distributed schema
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = pg_catalog, %I, pg_temp',
                                  f, pg_catalog.current_schema());
    END LOOP;
    FOREACH f IN ARRAY '{_DEFINER_ARRAY}'::text[] LOOP
        CONTINUE WHEN pg_catalog.to_regprocedure(f) IS NULL;
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END $$;
"""
