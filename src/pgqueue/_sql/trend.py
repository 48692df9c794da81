"""The trend's statements: the workers' flushes into ``pgqueue_trend``, its pruning, and the reads of `pgqueue.Admin.trend`.

``pgqueue_trend`` (`pgqueue._sql.tables.TREND`) holds a row per minute,
queue and job type. A worker adds what it counted since its last flush
(`TREND_FLUSH`, rows sorted by queue and type, so two workers' flushes
lock their common rows in one order), into the minute of the database's
clock at the flush. Reads sum the buckets of a window: at most one row a
minute per queue and type, through the primary key (one queue) or the
bucket index (every queue).
"""

from __future__ import annotations

__all__ = [
    "DISTRIBUTED_TREND_ADD",
    "DISTRIBUTED_TREND_LOCK",
    "DISTRIBUTED_TREND_MINUTE",
    "DISTRIBUTED_TREND_NEW",
    "DISTRIBUTED_TREND_PRUNE",
    "TREND_FLUSH",
    "TREND_HISTOGRAM",
    "TREND_PRUNE",
    "TREND_ROWS",
    "TREND_SERIES",
    "TREND_TABLE_EXISTS",
]

_INSERT = """
INSERT INTO pgqueue_trend AS t
    (queue, bucket, job_type, completed, failed, dead, runs, run_time_sum, run_times)
"""

# A row that exists already adds the counts and merges the histograms.
_MERGE = """ON CONFLICT (queue, bucket, job_type) DO UPDATE SET
    completed = t.completed + excluded.completed,
    failed = t.failed + excluded.failed,
    dead = t.dead + excluded.dead,
    runs = t.runs + excluded.runs,
    run_time_sum = t.run_time_sum + excluded.run_time_sum,
    run_times = (
        SELECT coalesce(pg_catalog.jsonb_object_agg(m.k, m.n), '{}'::jsonb)
        FROM (
            SELECT e.k, pg_catalog.sum(e.n)::bigint AS n
            FROM (
                SELECT key AS k, value::bigint AS n FROM pg_catalog.jsonb_each_text(t.run_times)
                UNION ALL
                SELECT key, value::bigint FROM pg_catalog.jsonb_each_text(excluded.run_times)
            ) AS e
            GROUP BY e.k
        ) AS m
    )
"""

# $1 queues, $2 job types, $3 completed, $4 failed, $5 dead, $6 runs, $7 the
# runs' summed seconds, $8 their histograms (JSON text), one element a row.
# The numbers cross as array literals of text (`literals.array`): asyncpg
# would look bigint[] and float8[] up with session-scoped settings, which
# stay on the server connections of a transaction pooler.
TREND_FLUSH = (
    _INSERT
    + """SELECT u.queue, pg_catalog.date_trunc('minute', pg_catalog.now()), u.job_type,
       u.completed, u.failed, u.dead, u.runs, u.run_time_sum, u.run_times::jsonb
FROM ROWS FROM (pg_catalog.unnest($1::text[]), pg_catalog.unnest($2::text[]),
               pg_catalog.unnest($3::text::bigint[]), pg_catalog.unnest($4::text::bigint[]),
               pg_catalog.unnest($5::text::bigint[]), pg_catalog.unnest($6::text::bigint[]),
               pg_catalog.unnest($7::text::float8[]), pg_catalog.unnest($8::text[]))
    AS u (queue, job_type, completed, failed, dead, runs, run_time_sum, run_times)
"""
    + _MERGE
)

# TREND_FLUSH on Citus, a row at a time, each statement on the queue's
# shard (Citus refuses the histogram's merge, a subquery, in an INSERT, and
# runs an INSERT ... SELECT through intermediate results and a two-phase
# commit). In one transaction: the minute (DISTRIBUTED_TREND_MINUTE), then
# the row locked (LOCK: its histogram, to merge in Python) and updated
# (ADD), or else inserted (NEW; nothing back if another flush inserted it
# meanwhile: then lock and add). $1 queue, $2 job type, $3 the minute; ADD
# and NEW: $4 completed, $5 failed, $6 dead, $7 runs, $8 summed seconds,
# $9 the histogram (ADD: merged), JSON text.
DISTRIBUTED_TREND_MINUTE = (
    "SELECT pg_catalog.date_trunc('minute', pg_catalog.now()) AS minute"
)
_ROW = "queue = $1::text AND job_type = $2::text AND bucket = $3::timestamptz"
DISTRIBUTED_TREND_LOCK = f"""
SELECT run_times::text AS run_times FROM pgqueue_trend WHERE {_ROW} FOR UPDATE
"""
DISTRIBUTED_TREND_ADD = f"""
UPDATE pgqueue_trend
SET completed = completed + $4::bigint, failed = failed + $5::bigint, dead = dead + $6::bigint,
    runs = runs + $7::bigint, run_time_sum = run_time_sum + $8::float8, run_times = $9::text::jsonb
WHERE {_ROW}
"""
DISTRIBUTED_TREND_NEW = (
    _INSERT
    + """VALUES ($1::text, $3::timestamptz, $2::text, $4::bigint, $5::bigint, $6::bigint,
        $7::bigint, $8::float8, $9::text::jsonb)
ON CONFLICT (queue, bucket, job_type) DO NOTHING
RETURNING true AS added
"""
)

# $1 the worker's queues, $2 seconds kept: a few rows a minute per queue
# and type expire, so a regular prune deletes few.
TREND_PRUNE = """
DELETE FROM pgqueue_trend
WHERE queue = ANY ($1::text[])
  AND bucket < pg_catalog.now() - $2::float8 * interval '1 second'
"""

# TREND_PRUNE on Citus, of one queue ($1) on its shard.
DISTRIBUTED_TREND_PRUNE = """
DELETE FROM pgqueue_trend
WHERE queue = $1::text
  AND bucket < pg_catalog.now() - $2::float8 * interval '1 second'
"""

# The counts and run time of the rows summed: what a trend row and a step hold.
_SUMS = """pg_catalog.sum(completed)::bigint AS completed,
       pg_catalog.sum(failed)::bigint AS failed,
       pg_catalog.sum(dead)::bigint AS dead,
       pg_catalog.sum(runs)::bigint AS runs,
       pg_catalog.sum(run_time_sum)::float8 AS run_time_sum"""

_WINDOW = """
WHERE bucket >= pg_catalog.date_trunc('minute', pg_catalog.now() - $3::float8 * interval '1 second')
  AND ($1::text IS NULL OR queue = $1)
  AND ($2::text IS NULL OR job_type = $2)"""

# $1 a queue or NULL, $2 a job type or NULL, $3 the window in seconds.
TREND_ROWS = f"""
SELECT queue, job_type,
       {_SUMS}
FROM pgqueue_trend{_WINDOW}
GROUP BY queue, job_type
ORDER BY queue, job_type
"""

# The histograms of TREND_ROWS's rows, summed: (queue, job type, bucket k, count).
TREND_HISTOGRAM = f"""
SELECT queue, job_type, h.key::int AS k, pg_catalog.sum(h.value::bigint)::bigint AS n
FROM pgqueue_trend, pg_catalog.jsonb_each_text(run_times) AS h{_WINDOW}
GROUP BY queue, job_type, h.key::int
"""

# The window's steps of $4 seconds (from the Unix epoch), each summed over
# the rows of the filter: what the charts draw.
TREND_SERIES = f"""
SELECT pg_catalog.to_timestamp(
           pg_catalog.floor(pg_catalog.date_part('epoch', bucket) / $4::float8) * $4::float8
       ) AS at,
       {_SUMS}
FROM pgqueue_trend{_WINDOW}
GROUP BY 1
ORDER BY 1
"""

TREND_TABLE_EXISTS = "SELECT pg_catalog.to_regclass('pgqueue_trend') IS NOT NULL"
