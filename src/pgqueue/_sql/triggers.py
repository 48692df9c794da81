"""The schema's triggers and the claims' upkeep of group heads: what every writer sets off.

A Go worker's writes fire them too: a parent's end settles its children
(pgqueue_parent_ended), a grouped job that becomes pending lowers its
group's head (pgqueue_group_pending).
"""

from __future__ import annotations

import textwrap

from pgqueue._sql.settings import FUNCTION_SETTINGS
from pgqueue._sql.statuses import (
    CANCELLED,
    COMPLETED,
    ENDED,
    PARKED,
    PENDING,
    WAITING,
)

__all__ = ["GROUP_HEADS_FUNCTION", "GROUP_PENDING", "PARENT_ENDED", "SETTLE"]


# What a parent's ending does to its children (see pgqueue_parent_ended in
# PARENT_ENDED, which runs it with the parent's id and new status): SETTLE
# is the same statement with those as $1 and $2, for the plan tests. The
# children are found by their edges, then by id: 'waiting' is spelled
# COLLATE "C" (the same test) so that the index of every waiting job
# (idx_pgqueue_jobs_waiting, whose predicate is in the default collation)
# is never taken for it. A durable handler's job that waits for this one
# (Job.wait_child: parked, or pending until a deadline, its wait naming
# this job; its edge is from this job to it) is due now, whatever the end.
_WAITS_FOR = f'c.status <> {WAITING} COLLATE "C"'


def _settle(parent: str, status: str, into: str = "") -> str:
    return f"""
WITH settled AS (
    UPDATE pgqueue_dependencies SET settled = true
    WHERE parent_id = {parent} AND NOT settled
    RETURNING child_id
), changed AS (
    UPDATE pgqueue_jobs AS c
    SET parents_left = CASE WHEN {_WAITS_FOR} THEN c.parents_left ELSE c.parents_left - 1 END,
        status       = CASE WHEN {_WAITS_FOR} THEN {PENDING}
                            WHEN {status} <> {COMPLETED} AND c.on_parent_failure = 'cancel'
                            THEN {CANCELLED}
                            WHEN c.parents_left <= 1 THEN {PENDING}
                            ELSE {WAITING} END,
        run_at       = CASE WHEN {_WAITS_FOR} THEN least(c.run_at, pg_catalog.now())
                            WHEN c.parents_left <= 1 THEN greatest(c.run_at, pg_catalog.now())
                            ELSE c.run_at END,
        last_error   = CASE WHEN NOT {_WAITS_FOR} AND {status} <> {COMPLETED} AND c.on_parent_failure = 'cancel'
                            THEN pg_catalog.format('parent job %s is %s', {parent}, {status})
                            ELSE c.last_error END,
        updated_at   = pg_catalog.now()
    FROM settled AS s
    WHERE c.id = s.child_id
      AND (c.status = {WAITING} COLLATE "C"
           OR (c.status IN ({PARKED} COLLATE "C", {PENDING}) AND c.wait ->> 'child' = {parent}::text))
    RETURNING c.id, c.queue, c.status, c.tracked
)
SELECT pg_catalog.count(n.sent){into}
FROM changed AS c,
     LATERAL (SELECT CASE WHEN c.status = {PENDING} THEN pg_catalog.pg_notify('pgqueue_jobs', c.queue)
                          WHEN c.tracked THEN pg_catalog.pg_notify('pgqueue_outcomes', c.id::text) END
              AS sent) AS n;
"""


SETTLE = _settle("$1::int8", "$2::text").rstrip().rstrip(";")
_SETTLE_IN_TRIGGER = textwrap.indent(
    _settle("NEW.id", "NEW.status", " INTO woken").strip("\n"), "    "
)


GROUP_PENDING = f"""-- A grouped job that becomes pending (inserted, retried, snoozed, rescued,
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
{FUNCTION_SETTINGS}AS $pgqueue_group_pending$
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
            WHEN (NEW.group_key IS NOT NULL AND NEW.status = {PENDING})
            EXECUTE FUNCTION pgqueue_group_pending();
        -- The groups' heads from before the trigger.
        INSERT INTO pgqueue_groups (queue, group_key, due_at)
        SELECT queue, group_key, pg_catalog.min(run_at) FROM pgqueue_jobs
        WHERE group_key IS NOT NULL AND status = {PENDING}
        GROUP BY queue, group_key
        ON CONFLICT (queue, group_key) DO NOTHING;
    END IF;
END $$;
"""

GROUP_HEADS_FUNCTION = f"""-- After a claim of queue p_queue under a group limit (in its transaction,
-- in its turn): the heads of the groups it took jobs of (p_claimed), and of
-- the groups whose head is due but whose jobs are not (cancelled, moved
-- later), are raised to their first pending job, or deleted without one.
-- Each is locked FOR UPDATE SKIP LOCKED (a producer's trigger holds the
-- heads of its new jobs' groups until commit: those are left for the next
-- claim), then read in a statement of its own, whose snapshot sees every
-- job committed before the lock was granted.
CREATE OR REPLACE FUNCTION pgqueue_group_heads(p_queue text, p_claimed text[]) RETURNS void
LANGUAGE plpgsql VOLATILE
{FUNCTION_SETTINGS}AS $pgqueue_group_heads$
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
                            AND j.status = {PENDING} COLLATE "C" AND j.run_at <= pg_catalog.now())
    LOOP
        PERFORM FROM pgqueue_groups WHERE queue = p_queue AND group_key = g FOR UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        head := (SELECT j.run_at FROM pgqueue_jobs AS j
                 WHERE j.queue = p_queue AND j.group_key = g AND j.status = {PENDING} COLLATE "C"
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
"""

PARENT_ENDED = f"""-- A parent (has_children) that ends, by any writer (a Go worker's too),
-- settles its unsettled edges, in the transaction of its outcome: each
-- waiting child counts one parent fewer (parents_left) and becomes pending
-- at zero, its queue woken; a child with on_parent_failure 'cancel' of a
-- parent that ended dead or cancelled is cancelled, naming the parent, and
-- being a status change of its own, cancels its own waiting children alike.
-- Each parent touches its own edges and children only: no statement reads a
-- child's other parents.
CREATE OR REPLACE FUNCTION pgqueue_parent_ended() RETURNS trigger
LANGUAGE plpgsql VOLATILE
{FUNCTION_SETTINGS}AS $pgqueue_parent_ended$
DECLARE
    woken int;
BEGIN
    IF NEW.status NOT IN {ENDED}
       OR OLD.status IN {ENDED} THEN
        RETURN NULL;
    END IF;
{_SETTLE_IN_TRIGGER}
    RETURN NULL;
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
