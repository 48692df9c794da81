"""How pgqueue's own connections and functions plan: by index, generically, without JIT."""

from __future__ import annotations

__all__ = [
    "FUNCTION_SETTINGS",
    "INDEX_PLANNING",
    "JIT_BACK",
    "JIT_OFF",
    "NO_JIT",
    "TIMEOUT",
    "TIMEOUT_BACK",
    "TIMEOUT_SET",
    "WORKER_SETTINGS",
]

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

FUNCTION_SETTINGS = "".join(
    f"SET {name} = {value}\n" for name, value in INDEX_PLANNING.items()
)
"""INDEX_PLANNING as the SET clauses of a CREATE FUNCTION."""

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

# A statement bounded by a timeout ($1, e.g. '10000ms'; a filtered listing,
# a bulk action's search): in a transaction of its own after TIMEOUT, or,
# in the caller's, after TIMEOUT_SET, which returns the setting it
# replaces, and TIMEOUT_BACK ($1) after it. set_config(..., true): nothing
# stays on a server connection a transaction pooler hands to others.
TIMEOUT = "SELECT pg_catalog.set_config('statement_timeout', $1, true)"
TIMEOUT_SET = "SELECT pg_catalog.current_setting('statement_timeout') AS was, pg_catalog.set_config('statement_timeout', $1, true)"
TIMEOUT_BACK = TIMEOUT
