"""Fleet-wide limits: each worker's lease of a limited queue's slots."""

from __future__ import annotations

__all__ = [
    "DISTRIBUTED_LEASE_EXPIRE",
    "DISTRIBUTED_LEASE_GRANT",
    "DISTRIBUTED_LEASE_WRITE",
    "DISTRIBUTED_RELEASE_LEASE",
    "LEASE",
    "LOCK_LIMIT",
    "RELEASE_LEASES",
    "SEED_LIMIT",
]

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
# Expired leases are deleted. On Citus, the same in steps (in the
# transaction that holds LOCK_LIMIT, each on the queue's shard): the
# expired leases go, then what worker $2 is granted, then its lease is
# written ($3 the slots recorded, $4 wanted, $5 seconds).
_EXPIRED = "DELETE FROM pgqueue_leases WHERE queue = $1 AND worker <> $2 AND expires_at < pg_catalog.now()"
_OTHERS = """SELECT coalesce(pg_catalog.sum(slots), 0)::int AS held, pg_catalog.count(*) FILTER (WHERE wanted > 0)::int AS wanting
    FROM pgqueue_leases
    WHERE queue = $1 AND worker <> $2 AND expires_at >= pg_catalog.now()"""
_GRANTED = """LEAST($4::int, GREATEST($3::int - o.held, 0),
                 pg_catalog.ceil($3::int / (o.wanting + 1)::numeric)::int) AS slots"""
_UPSERT = """INSERT INTO pgqueue_leases AS l (queue, worker, slots, wanted, expires_at)
{values}
ON CONFLICT (queue, worker) DO UPDATE
SET slots = EXCLUDED.slots, wanted = EXCLUDED.wanted, expires_at = EXCLUDED.expires_at
"""
_FROM_GRANTED = """SELECT $1, $2, GREATEST(g.slots, $5::int), $4::int, pg_catalog.now() + pg_catalog.make_interval(secs => $6::float8)
FROM granted AS g"""
LEASE = f"""
WITH expired AS (
    {_EXPIRED}
), others AS (
    {_OTHERS}
), granted AS MATERIALIZED (
    SELECT {_GRANTED}
    FROM others AS o
)
{_UPSERT.format(values=_FROM_GRANTED)}RETURNING (SELECT slots FROM granted)
"""
DISTRIBUTED_LEASE_EXPIRE = f"\n{_EXPIRED}\n"
DISTRIBUTED_LEASE_GRANT = f"""
SELECT {_GRANTED}
FROM (
    {_OTHERS}
) AS o
"""
DISTRIBUTED_LEASE_WRITE = "\n" + _UPSERT.format(
    values="VALUES ($1, $2, $3::int, $4::int, pg_catalog.now() + pg_catalog.make_interval(secs => $5::float8))"
)

# A worker gives its leases back as it stops ($1, its id); on Citus, its
# lease of queue $1 ($2 its id), one statement a queue.
RELEASE_LEASES = "DELETE FROM pgqueue_leases WHERE worker = $1"
DISTRIBUTED_RELEASE_LEASE = (
    "DELETE FROM pgqueue_leases WHERE queue = $1 AND worker = $2"
)
