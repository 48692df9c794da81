"""What the operator surfaces show of a durable handler's job: its steps, signals, wait and progress.

Read from the four columns `pgqueue._sql.durable` describes, bounded
whatever they hold: each step and signal comes back as its name (cut to
256 characters), when it was recorded and the size of its value (bytes of
JSON text), never the value itself; at most ``$2`` of each (the first
recorded), with how many there are.
"""

from __future__ import annotations

from pgqueue._sql.statuses import PARKED, PENDING

__all__ = ["JOB_DURABLE"]

# Job $1's steps and signals (the first $2 of each), its wait and its
# progress, as JSON text. The wait only while the job waits on it: parked,
# or pending until a time still ahead (a sleep, a wait with a timeout); a
# job's last wait is kept on its row after it ended. The progress message
# as Job.progress stores it (cut to 1000 characters), or cut so here.
JOB_DURABLE = f"""
SELECT s.total AS steps_total, s.shown::text AS steps,
       g.total AS signals_total, g.shown::text AS signals,
       CASE WHEN j.status = {PARKED} OR (j.status = {PENDING} AND j.run_at > pg_catalog.now())
            THEN j.wait END::text AS wait,
       CASE WHEN pg_catalog.jsonb_typeof(j.progress) = 'object'
            THEN j.progress || pg_catalog.jsonb_build_object(
                     'message', pg_catalog.left(j.progress ->> 'message', 1000))
            END::text AS progress
FROM pgqueue_jobs AS j
CROSS JOIN LATERAL (
    SELECT pg_catalog.count(*) AS total,
           pg_catalog.jsonb_agg(o.item ORDER BY o.n) FILTER (WHERE o.n <= $2) AS shown
    FROM (
        SELECT pg_catalog.row_number() OVER (ORDER BY e.value ->> 'at', e.key) AS n,
               pg_catalog.jsonb_build_object(
                   'name', pg_catalog.left(e.key, 256), 'at', e.value -> 'at',
                   'size', pg_catalog.octet_length((e.value -> 'result')::text)) AS item
        FROM pg_catalog.jsonb_each(CASE WHEN pg_catalog.jsonb_typeof(j.steps) = 'object'
                                        THEN j.steps ELSE '{{}}'::jsonb END) AS e
    ) AS o
) AS s
CROSS JOIN LATERAL (
    SELECT pg_catalog.count(*) AS total,
           pg_catalog.jsonb_agg(pg_catalog.jsonb_build_object(
               'name', pg_catalog.left(e.value ->> 'name', 256), 'at', e.value -> 'at',
               'size', pg_catalog.octet_length((e.value -> 'payload')::text)) ORDER BY e.n)
               FILTER (WHERE e.n <= $2) AS shown
    FROM pg_catalog.jsonb_array_elements(CASE WHEN pg_catalog.jsonb_typeof(j.signals) = 'array'
                                              THEN j.signals ELSE '[]'::jsonb END)
         WITH ORDINALITY AS e(value, n)
) AS g
WHERE j.id = $1
"""
