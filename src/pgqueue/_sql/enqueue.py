"""The producers' statements: enqueue one job or many, with keys, replaces or parents; the wakeups after commit."""

from __future__ import annotations

from functools import cache

from pgqueue._sql.tables import LIVE_KEY

__all__ = [
    "COPY_COLUMNS",
    "COPY_TABLE",
    "DISTRIBUTED_COLUMNS",
    "DISTRIBUTED_ROWS",
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
    "NOTIFY_JOBS",
    "PARAMETERS",
    "RESERVE_IDS",
    "WAKE",
    "distributed_many",
]

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
_ON_UNIQUE_CONFLICT = f"""
    ON CONFLICT {LIVE_KEY}
    DO UPDATE SET unique_key = EXCLUDED.unique_key
"""

# Rows are inserted in input order, so ascending ids are the input order.
# The payloads arrive as one JSON array ($3), the rest as arrays; ROWS FROM
# zips them element by element, padding shorter ones with NULLs (so that a
# batch without priorities, tracking, keys or delays passes empty arrays for
# them). One trace context ($9, usually NULL) for the whole batch: its
# producer span's. Groups ($10, empty when no job has one). Delays ($11)
# are seconds from the database's now(). The keys ($8) are never inserted
# here: a batch with keys goes through pgqueue_enqueue_replace (a producer
# may not insert unique_key itself), and one without names no such column.
_COLUMNS = """
    pg_catalog.unnest($2::text[]),
    pg_catalog.jsonb_array_elements($3::text::jsonb),
    pg_catalog.unnest($4::text::int[]),
    pg_catalog.unnest($5::text::timestamptz[]),
    pg_catalog.unnest($6::text::smallint[]),
    pg_catalog.unnest($7::text::boolean[]),
    pg_catalog.unnest($8::text[]),"""
_ROWS_FROM = f"""ROWS FROM ({_COLUMNS}
    pg_catalog.unnest($10::text[]){{delays}}
) WITH ORDINALITY AS t(job_type, payload, max_attempts, run_at, priority, tracked, unique_key, group_key,{{delay}} ord)"""
_ENQUEUE_ROWS = f"""
    INSERT INTO pgqueue_jobs (queue, job_type, payload, max_attempts, run_at, priority, tracked, trace_context, group_key)
    SELECT $1, t.job_type, t.payload, t.max_attempts, {{run_at}},
           COALESCE(t.priority, 0), COALESCE(t.tracked, false), $9::text, t.group_key
    FROM {_ROWS_FROM}
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
_UNDELAYED_ROWS = _ENQUEUE_ROWS.format(**_UNDELAYED)
_DELAYED_ROWS = _ENQUEUE_ROWS.format(**_DELAYED)
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
_ENQUEUE_MANY_UNIQUE = f"""
SELECT r.job_id AS id, t.job_type, t.unique_key, r.outcome = 'existed' AS existed
FROM {_ROWS_FROM}
CROSS JOIN LATERAL pgqueue_enqueue_replace(
    $1, t.job_type, t.payload, t.max_attempts, {{run_at}},
    COALESCE(t.priority, 0)::int, COALESCE(t.tracked, false), $9::text, t.unique_key,
    false, {{notify}}, t.group_key) AS r
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
ENQUEUE_MANY_REPLACE = f"""
SELECT r.job_id AS id, r.outcome, r.wake
FROM ROWS FROM ({_COLUMNS}
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
# pgqueue_enqueue_after): enqueue_many's columns ($1 the queue, $2 the
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

# Enqueues on Citus insert with the _SILENT statements (enqueue_many with
# distributed_many's, below); the wakeup is a separate statement, which
# runs on the coordinator (where workers listen).
DISTRIBUTED_UNIQUE_SILENT = f"""
    INSERT INTO pgqueue_jobs (queue, job_type, payload, max_attempts, run_at, priority, tracked, trace_context, unique_key, group_key)
    VALUES ($1, $2, $3::text::jsonb, $4, {_RUN_AT.format(delay="$10")}, $6, $7, $8, $9, $11)
    {_ON_UNIQUE_CONFLICT}
    RETURNING id, xmax <> 0 AS existed"""

# enqueue_many on Citus: an INSERT ... VALUES of the queue's rows, which
# Citus routes to the queue's shard (one node: its transaction commits
# without a two-phase commit, and now() is evaluated on the coordinator, as
# in a single enqueue). An INSERT ... SELECT FROM unnest(...) would run "via
# the coordinator", COPYing the rows into an intermediate result, and every
# COPY into a distributed table is a two-phase commit. $1 is the queue, $2
# the batch's trace context (when it has one); then each row's parameters,
# of the columns the batch uses (DISTRIBUTED_COLUMNS: every row's type,
# payload as JSON text and max_attempts; a run_at, delay, priority,
# tracking, unique key or group only when a job of the batch has one, the
# table's defaults otherwise: Citus evaluates and deparses each value of
# each row, a third of the statement's time for the rarely used ones). The
# keyed kind takes its key's live job as DISTRIBUTED_UNIQUE_SILENT does (no
# key twice in one call: the caller merges duplicates), each row with its
# type and key, as the reader of a keyed batch wants them. A statement has
# DISTRIBUTED_ROWS rows at most (9 parameters a row at most, far from the
# protocol's 65,535) and a power of two of them, so that few texts are
# ever prepared.
DISTRIBUTED_ROWS = 1024
"""The most rows of one statement of `distributed_many` (a power of two)."""
DISTRIBUTED_COLUMNS = (
    "job_type",
    "payload",
    "max_attempts",
    "run_at",
    "delay",
    "priority",
    "tracked",
    "unique_key",
    "group",
)
"""The parameters of a row of `distributed_many`, in their order (each optional but the first three)."""
_VALUES = {  # the table's column and its value, by parameter
    "job_type": ("job_type", "${job_type}::text"),
    "payload": ("payload", "${payload}::text::jsonb"),
    "max_attempts": ("max_attempts", "${max_attempts}::int"),
    "run_at": ("run_at", "COALESCE(${run_at}::timestamptz, pg_catalog.now())"),
    "priority": ("priority", "${priority}::int"),
    "tracked": ("tracked", "${tracked}::boolean"),
    "unique_key": ("unique_key", "${unique_key}::text"),
    "group": ("group_key", "${group}::text"),
}
_DELAYED_RUN_AT = "COALESCE(${run_at}::timestamptz, pg_catalog.now() + pg_catalog.make_interval(secs => ${delay}::float8), pg_catalog.now())"
_DISTRIBUTED_INSERT = """
    INSERT INTO pgqueue_jobs (queue, {columns})
    VALUES {rows}{on_conflict}
    RETURNING {returning}"""


@cache
def distributed_many(rows: int, columns: tuple[str, ...], *, traced: bool) -> str:
    """The INSERT ... VALUES of ``rows`` jobs of one queue on Citus (see above).

    ``columns``: the parameters of each row, in `DISTRIBUTED_COLUMNS`'
    order (a ``delay`` with a ``run_at`` only). ``traced``: with the trace
    context's parameter. The parameters' names (in `PARAMETERS`):
    ``queue``, ``trace_context`` (when traced), then each row's columns
    suffixed by the row's place from 0 (``job_type0``, ``payload0``, ...).
    """
    keyed = "unique_key" in columns
    shared = ("queue", "trace_context") if traced else ("queue",)
    targets: list[str] = []
    values: list[str] = ["$1::text"]
    for column in columns:
        if column != "delay":
            target, value = _VALUES[column]
            targets.append(target)
            values.append(
                _DELAYED_RUN_AT if column == "run_at" and "delay" in columns else value
            )
    if traced:
        targets.append("trace_context")
        values.append("$2::text")
    row = "(" + ", ".join(values) + ")"
    width = len(columns)
    rows_text: list[str] = []
    names = list(shared)
    for place in range(rows):
        first = len(shared) + 1 + place * width
        rows_text.append(
            row.format(**{name: first + at for at, name in enumerate(columns)})
        )
        names.extend(f"{name}{place}" for name in columns)
    statement = _DISTRIBUTED_INSERT.format(
        columns=", ".join(targets),
        rows=",\n           ".join(rows_text),
        on_conflict=_ON_UNIQUE_CONFLICT.rstrip() if keyed else "",
        returning="id, job_type, unique_key, xmax <> 0 AS existed" if keyed else "id",
    )
    PARAMETERS[statement] = tuple(names)
    return statement


# Each statement's parameters by name, $1 first: `pgqueue._store.plan` fills
# them by name, whatever their places. A single job's first ones are the
# columns of a plain job (COPY's, but the id).
_ONE = tuple(column for column in COPY_COLUMNS if column != "id")
_MANY = (
    "queue",
    "job_types",
    "payloads",
    "max_attempts",
    "run_ats",
    "priorities",
    "tracked",
    "unique_keys",
    "trace_context",
)
PARAMETERS: dict[str, tuple[str, ...]] = {
    ENQUEUE: (*_ONE, "delay", "group"),
    ENQUEUE_SILENT: (*_ONE, "delay", "group"),
    ENQUEUE_UNIQUE: (*_ONE, "unique_key", "delay", "group"),
    ENQUEUE_UNIQUE_SILENT: (*_ONE, "unique_key", "delay", "group"),
    DISTRIBUTED_UNIQUE_SILENT: (*_ONE, "unique_key", "delay", "group"),
    ENQUEUE_REPLACE: (*_ONE, "unique_key", "delay", "notify"),
    ENQUEUE_MANY: (*_MANY, "groups"),
    ENQUEUE_MANY_SILENT: (*_MANY, "groups"),
    ENQUEUE_MANY_UNIQUE: (*_MANY, "groups"),
    ENQUEUE_MANY_UNIQUE_SILENT: (*_MANY, "groups"),
    ENQUEUE_MANY_DELAYED: (*_MANY, "groups", "delays"),
    ENQUEUE_MANY_DELAYED_SILENT: (*_MANY, "groups", "delays"),
    ENQUEUE_MANY_UNIQUE_DELAYED: (*_MANY, "groups", "delays"),
    ENQUEUE_MANY_UNIQUE_DELAYED_SILENT: (*_MANY, "groups", "delays"),
    ENQUEUE_MANY_REPLACE: (*_MANY, "delays", "replaces", "notify"),
    ENQUEUE_AFTER: (
        "queue",
        "job_types",
        "payloads",
        "max_attempts",
        "run_ats",
        "delays",
        "priorities",
        "tracked",
        "trace_context",
        "children",
        "parents",
        "on_parent_failure",
        "notify",
    ),
}
"""The names of each enqueue statement's ``$n`` parameters, in order."""
