"""The claims: how a worker takes due jobs in line, under its limits, on either server.

On Citus every claim runs on its queue's shard: the outer UPDATE names the
queue; it returns no claim time and no parents (dependencies are not
supported there), and the starts of a rated claim are recorded apart.
"""

from __future__ import annotations

import textwrap

from pgqueue._sql.statuses import PENDING, RUNNING

__all__ = [
    "CLAIM",
    "CLAIM_COLUMNS",
    "CLAIM_GROUPS",
    "CLAIM_GROUPS_RATED",
    "CLAIM_RATED",
    "CLAIM_TYPES",
    "CLAIM_TYPES_RATED",
    "CLOCK",
    "DISTRIBUTED_CLAIM",
    "DISTRIBUTED_CLAIM_GROUPS",
    "DISTRIBUTED_CLAIM_GROUPS_RATED",
    "DISTRIBUTED_CLAIM_RATED",
    "DISTRIBUTED_CLAIM_TYPES",
    "DISTRIBUTED_CLAIM_TYPES_RATED",
    "DISTRIBUTED_CLAIM_ZERO",
    "DISTRIBUTED_CLAIM_ZERO_TYPES",
    "DISTRIBUTED_RATE_ROOM",
    "DISTRIBUTED_RECORD_START",
    "GROUP_HEADS",
    "LOCK_CLAIMS",
    "NEXT_DUE",
    "PARENT_RESULTS",
    "RATE_ROOM",
]

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
_PRIORITY_SCANS = f"""
    SELECT j.id
    FROM ROWS FROM (pg_catalog.unnest($3::text::timestamptz[]), pg_catalog.unnest($4::text::bigint[])) WITH ORDINALITY AS b(run_at, id, level)
    CROSS JOIN LATERAL (
        SELECT p.id
        FROM pgqueue_jobs AS p
        WHERE p.queue = $1 AND p.status = {PENDING} COLLATE "C" AND p.priority <> 0
          AND p.priority = (6 - b.level)::smallint
          AND p.run_at <= pg_catalog.now() AND (p.run_at, p.id) > (b.run_at, b.id){{types}}
        ORDER BY p.run_at, p.id
        LIMIT {{limit}}
        FOR UPDATE OF p SKIP LOCKED
    ) AS j
    WHERE b.level {{levels}}
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
    "steps",
)
"""The columns a claim returns, in this order (`pgqueue._engine.claimer.jobs_from_rows` unpacks them)."""

# The columns of CLAIM_COLUMNS that are not the table's own.
_EXPRESSIONS = {
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
    # A durable handler's recorded steps (NULL for every other job).
    "steps": "steps::text",
    # A job enqueued after others: the claimer reads their results with
    # PARENT_RESULTS (a subquery here would be set up by every claim).
    "has_parents": "parents_left IS NOT NULL",
}
_DISTRIBUTED_EXPRESSIONS = {
    **_EXPRESSIONS,
    "unrepresentable": (
        f"CASE WHEN ({_REPRESENTABLE.format('run_at')}) AND ({_REPRESENTABLE.format('created_at')}) THEN NULL\n"
        "         ELSE 'run_at or created_at is out of range' END"
    ),
    # No claim time (the policy then starts no line past it).
    "claimed_at": "NULL::int8",
    "has_parents": "false",  # no dependencies on Citus
}


def _returning(*, distributed: bool, extra: tuple[str, ...] = ()) -> str:
    expressions = _DISTRIBUTED_EXPRESSIONS if distributed else _EXPRESSIONS
    return ",\n    ".join(
        [
            f"{expressions[name]} AS {name}" if name in expressions else name
            for name in CLAIM_COLUMNS
        ]
        + list(extra)
    )


# A paused queue ($1) claims nothing: an uncorrelated test, which the plan
# runs once, before the scans (a One-Time Filter), so a paused queue's
# claim reads one index page of an (empty, or nearly) table and no job.
_NOT_PAUSED = "\n  AND NOT EXISTS (SELECT FROM pgqueue_paused WHERE queue = $1)"


def _claiming(
    ids: str,
    *,
    recheck: str = "",
    distributed: bool = False,
    extra: tuple[str, ...] = (),
) -> str:
    """The claim's UPDATE of the jobs whose ids the query ``ids`` gives (none while the queue is paused).

    ``recheck``: a condition the rows must still meet (the group claim's
    picks are read without a lock), spelled so that no partial index's
    predicate follows from it: the rows are found by their ids.
    ``distributed``: on Citus, on queue $1's shard. ``extra``: columns
    returned after `CLAIM_COLUMNS`.
    """
    queue = "queue = $1 AND " if distributed else ""
    return f"""
UPDATE pgqueue_jobs
SET status = {RUNNING}, attempts = attempts + 1, updated_at = pg_catalog.now(), claimed_at = pg_catalog.now()
WHERE {queue}id = ANY(ARRAY({ids})){recheck}{_NOT_PAUSED}
RETURNING {_returning(distributed=distributed, extra=extra)}
"""


def _recorded(ids: str, at: str, *, recheck: str = "", group_key: bool = False) -> str:
    """`_claiming` ``ids`` that also records each job it takes in ``pgqueue_starts``, started at ``at``.

    With ``group_key``, each row's group comes last.
    """
    claim = _claiming(ids, recheck=recheck, extra=("group_key",)).removesuffix("\n")
    columns = [*CLAIM_COLUMNS, "group_key"] if group_key else CLAIM_COLUMNS
    return f"""
WITH claimed AS ({textwrap.indent(claim, "    ")}
), recorded AS (
    INSERT INTO pgqueue_starts (queue, group_key, started_at)
    SELECT queue, group_key, {at}::timestamptz FROM claimed
)
SELECT {", ".join(columns)} FROM claimed
"""


def _zero_scan(limit: str, only: str) -> str:
    """The claim's scan of priority 0's line, from its place ($3[6], $4[6])."""
    return f"""
        SELECT id
        FROM pgqueue_jobs
        WHERE queue = $1 AND status = {PENDING} AND priority = 0 AND run_at <= pg_catalog.now()
          AND (run_at, id) > (($3::text::timestamptz[])[6], ($4::text::bigint[])[6]){only}
        ORDER BY run_at, id
        LIMIT {limit}
        FOR UPDATE SKIP LOCKED
    """


def _only(types: str | None, column: str = "job_type") -> str:
    return "" if types is None else f" AND {column} = ANY({types}::text[])"


def _in_line(limit: str, types: str | None = None) -> str:
    """The ids of at most ``limit`` jobs in line (CLAIM's ``$2``); with ``types`` (a ``text[]`` parameter), of those types."""
    only = _only(types)
    return f"""
    ({_PRIORITY_SCANS.format(levels="<= 5", limit=limit, types=_only(types, "p.job_type"))})
    UNION ALL
    (SELECT z.id FROM ({_zero_scan(limit, only)}) AS z)
    UNION ALL
    ({_PRIORITY_SCANS.format(levels=">= 7", limit=limit, types=_only(types, "p.job_type"))})
    LIMIT {limit}
"""


CLAIM = _claiming(_in_line("$2"))

# CLAIM of only the job types in $5 (a worker with unknown_types="wait",
# which leaves other types for a worker that has their handlers). The type
# is a filter on the same index scans: waiting jobs of other types that are
# due are walked by every claim (and skipped), not a scan of the table.
CLAIM_TYPES = _claiming(_in_line("$2", "$5"))

# CLAIM and CLAIM_TYPES under a rate limit: run after LOCK_CLAIMS and
# RATE_ROOM (whose time is the last parameter, the starts' time).
CLAIM_RATED = _recorded(_in_line("$2"), "$5")
CLAIM_TYPES_RATED = _recorded(_in_line("$2", "$5"), "$6")


# On Citus every claim is planned again, on the coordinator and on the
# node (a statement with subqueries gets no cached plan there), and the
# eleven scans of CLAIM cost most of a claim's time: about 1.8 ms through
# the coordinator against 1.0 ms for the scan of priority 0 alone. So a
# claim of a queue that has no pending job with a priority takes that scan
# only (DISTRIBUTED_CLAIM_ZERO), and each claim says in its last column
# whether such jobs were pending when it began, for the next one to choose.
def _distributed_claim(types: str | None, *, zero: bool = False) -> str:
    only = _only(types)
    prioritized = (
        "(SELECT EXISTS (SELECT FROM pgqueue_jobs WHERE queue = $1"
        f""" AND status = {PENDING} COLLATE "C" AND priority <> 0{only})) AS prioritized"""
    )
    ids = _zero_scan("$2", only) if zero else _in_line("$2", types)
    return _claiming(ids, distributed=True, extra=(prioritized,))


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

# The rated claims on Citus return each job's group_key last, and the
# claimer records the starts with DISTRIBUTED_RECORD_START, one row a
# statement: Citus runs an INSERT ... SELECT (or a claim's CTE that
# inserts) through the coordinator, with a two-phase commit.
DISTRIBUTED_CLAIM_RATED = _claiming(
    _in_line("$2"), distributed=True, extra=("group_key",)
)
DISTRIBUTED_CLAIM_TYPES_RATED = _claiming(
    _in_line("$2", "$5"), distributed=True, extra=("group_key",)
)
DISTRIBUTED_RECORD_START = (
    "INSERT INTO pgqueue_starts (queue, group_key, started_at) VALUES ($1, $2, $3)"
)

# Claims of a queue with a group limit ($3: the most running jobs of one
# group, across the fleet), run after LOCK_CLAIMS in one transaction, so
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
_GROUPS_BY_SKIP_SCAN = f"""
WITH RECURSIVE groups AS (
    (SELECT group_key FROM pgqueue_jobs
     WHERE queue = $1 AND group_key IS NOT NULL AND status IN ({PENDING} COLLATE "C", {RUNNING})
     ORDER BY group_key LIMIT 1)
    UNION ALL
    SELECT (SELECT j.group_key FROM pgqueue_jobs AS j
            WHERE j.queue = $1 AND j.group_key IS NOT NULL
              AND j.status IN ({PENDING} COLLATE "C", {RUNNING}) AND j.group_key > g.group_key
            ORDER BY j.group_key LIMIT 1)
    FROM groups AS g
    WHERE g.group_key IS NOT NULL
)"""
_GROUP_PICKS = f"""{{groups}}, picks AS (
    SELECT n.id, n.place, n.priority, n.run_at
    FROM groups AS g
    CROSS JOIN LATERAL (
        SELECT $3::int - pg_catalog.count(*)::int AS room FROM pgqueue_jobs AS r
        WHERE r.queue = $1 AND r.group_key = g.group_key AND r.status = {RUNNING} COLLATE "C"
    ) AS r{{group_rate}}
    CROSS JOIN LATERAL (
        SELECT p.id, p.priority, p.run_at, pg_catalog.row_number() OVER (ORDER BY p.run_at, p.id) AS place
        FROM pgqueue_jobs AS p
        WHERE p.queue = $1 AND p.group_key = g.group_key AND p.status = {PENDING} COLLATE "C"
          AND p.run_at <= pg_catalog.now(){{types_p}}
        ORDER BY p.run_at, p.id
        LIMIT GREATEST({{room}}, 0)
    ) AS n
    WHERE g.group_key IS NOT NULL
    UNION ALL
    SELECT u.id, 1, u.priority, u.run_at
    FROM (
        SELECT id, priority, run_at FROM pgqueue_jobs
        WHERE queue = $1 AND status = {PENDING} AND run_at <= pg_catalog.now() AND group_key IS NULL{{types}}
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

# The group claim's picks are read without a lock.
_STILL_PENDING = f' AND status = {PENDING} COLLATE "C"'


def _typed(column: str) -> str:
    return f" AND ($4::text[] IS NULL OR {column} = ANY($4::text[]))"


def _group_picks(*, group_rate: bool = False, heads: bool = True) -> str:
    """The ids of at most ``$2`` jobs of queue ``$1`` under a group limit of ``$3``.

    Only jobs of the types in ``$4`` (a ``text[]``; NULL for every type).
    ``group_rate``: also at most ``$5`` starts per group in ``$6`` seconds
    before ``$7`` (the jobs without a group are not limited). ``heads``:
    the groups found through pgqueue_groups (else a skip scan, for Citus).
    """
    picks = _GROUP_PICKS.format(
        groups=_GROUPS_BY_HEAD if heads else _GROUPS_BY_SKIP_SCAN,
        types=_typed("job_type"),
        types_p=_typed("p.job_type"),
        group_rate=_GROUP_RATE.rstrip() if group_rate else "",
        room="LEAST(r.room, w.room)" if group_rate else "r.room",
    )
    return f"{textwrap.indent(picks, '    ').strip()}\n"


# Each row's group_key comes last (see GROUP_HEADS).
CLAIM_GROUPS = _claiming(_group_picks(), recheck=_STILL_PENDING, extra=("group_key",))
# Under a rate limit (of the queue: the claim's $2 is within RATE_ROOM's room;
# per group: $5 starts per $6 seconds), recording the starts at $7.
CLAIM_GROUPS_RATED = _recorded(
    _group_picks(group_rate=True), "$7", recheck=_STILL_PENDING, group_key=True
)
DISTRIBUTED_CLAIM_GROUPS = _claiming(
    _group_picks(heads=False), recheck=_STILL_PENDING, distributed=True
)
DISTRIBUTED_CLAIM_GROUPS_RATED = _claiming(
    _group_picks(group_rate=True, heads=False),
    recheck=_STILL_PENDING,
    distributed=True,
    extra=("group_key",),
)

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

# When the queue's ($1) first pending job not yet due falls due: seconds
# from now on the database clock, NULL when there is none (infinity for a
# run_at of 'infinity'). An idle worker asks after a claim from the heads
# came back short, and wakes then, whatever its poll_interval (a delayed
# job's own wakeup came at its enqueue, and found nothing due). The first
# entry of the Go module's claim index past now(), every priority's pending
# jobs being in it: the scan starts there and stops at once, however many
# jobs are due (or their dead entries wait for vacuum) before it. Those due
# but left behind (another application's types, a paused queue) are not
# asked about: a worker wakes for each pending job once at most.
NEXT_DUE = f"""
SELECT pg_catalog.date_part('epoch', j.run_at) - pg_catalog.date_part('epoch', pg_catalog.clock_timestamp())
FROM pgqueue_jobs AS j
WHERE j.queue = $1 AND j.status = {PENDING} AND j.run_at > pg_catalog.now()
ORDER BY j.run_at
LIMIT 1
"""

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

# The results of the parents of the claimed jobs $1 that have parents
# (`Job.parent_results`): per child, {parent id: result} as JSON text, and
# the ids of the parents whose rows are gone (a JSON array, or NULL). Only
# a Go worker's Prune (or a hand-written DELETE) removes a parent whose
# child has not run: it knows nothing of the edges, while pgqueue's own
# retention keeps such a parent. The edge stays (settled when the parent
# ended), so the child still lists that parent, with a null result, and the
# worker says so in its log. The result is not copied onto the edges when a
# parent ends, which would keep it: that write would cost every parent's end
# its result once per child (each edge its own TOASTed copy: a 10 kB result
# of a parent of 10,000 children, 100 MB written) to guard against a
# retention that a deployment sharing a table with Go workers can leave to
# pgqueue on its queues with dependencies.
PARENT_RESULTS = """
SELECT d.child_id, pg_catalog.jsonb_object_agg(d.parent_id::text, p.result)::text,
       (pg_catalog.jsonb_agg(d.parent_id ORDER BY d.parent_id) FILTER (WHERE p.id IS NULL))::text
FROM pgqueue_dependencies AS d LEFT JOIN pgqueue_jobs AS p ON p.id = d.parent_id
WHERE d.child_id = ANY($1::text::bigint[])
GROUP BY d.child_id
"""
