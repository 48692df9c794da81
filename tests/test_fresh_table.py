"""A worker started on a new, empty table keeps its index plans while the table grows (issue 39).

A worker's own connections plan each statement once, generically, and keep
the plan. Made when ``pgqueue_jobs`` is new, with no statistics and a size
the planner takes for ten pages, the cheapest plans were sequential scans
(the claim's update by ids, the completion's join) and full scans of small
partial indexes; kept while the table grew, every batch read the whole
table. These tests start a worker on a brand-new table with autovacuum off
for it (so nothing re-plans it), let it prepare its statements on the small
table, grow the table to 200,000 rows under a steady backlog, and then read
the cost of a claim and a completion of 100 jobs, and the plan of every
statement, from the worker's own prepared statements on its own
connections: first with the settings the worker had before (the collapse),
then with today's (flat, and every plan by index), and through PgBouncer,
which refuses the startup parameters and plans each statement at every run
(by index on the grown table).

The cost of a batch is the shared buffers its two statements' scans of the
table touch (finding the rows; writing them costs the same at every size),
which the plan decides and the machine's load does not.
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue._sql.admin import PRUNE_BATCH
from pgqueue._sql.claims import (
    CLAIM_GROUPS,
    CLAIM_TYPES,
    CLAIM_TYPES_RATED,
    PARENT_RESULTS,
    RATE_ROOM,
)
from pgqueue._sql.enqueue import ENQUEUE_AFTER
from pgqueue._sql.literals import array, claim_places
from pgqueue._sql.outcomes import COMPLETE, FINISH, RESCUE, TOUCH
from pgqueue._store import postgres
from tests.helpers import (
    explain_analyze,
    plan_buffers,
    plan_nodes,
    running,
    wait_until,
)
from tests.pgbouncer import pgbouncer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

QUEUE = "fresh"
GROUPED = "fresh-grouped"
RATED = "fresh-rated"
MEASURED = "measured"  # no worker serves it: its jobs are claimed by the test
BATCH = 100
GROWN = 200_000
BACKLOG = 4_000

PER_JOB = 6
"""Buffers an index probe reads for one job, for each statement: the index's
levels and the row's page. A scan of the grown table reads about 30."""

BEFORE_ISSUE_39 = {"plan_cache_mode": "force_generic_plan"}
"""The worker's startup parameters before issue 39."""

# The statements a worker of these queues must have prepared by the end.
# (A worker claims only the types it has handlers for, by default.)
HOT = {
    CLAIM_TYPES: "claim",
    CLAIM_GROUPS: "group claim",
    CLAIM_TYPES_RATED: "rate-limited claim",
    RATE_ROOM: "rate limit's window",
    COMPLETE: "completion",
    FINISH: "outcome write",
    TOUCH: "heartbeat",
    RESCUE: "rescue sweep",
    PRUNE_BATCH: "retention sweep",
    PARENT_RESULTS: "parents' results",
}
OUR_TABLES = {"pgqueue_jobs", "pgqueue_dependencies", "pgqueue_starts"}
NOT_BY_INDEX = {"Seq Scan", "Bitmap Heap Scan", "Hash Join", "Merge Join"}


async def _prepared(connection: Any) -> dict[str, str]:
    """The statements prepared on one of a worker's connections: text to name."""
    rows = await connection.fetch("SELECT name, statement FROM pg_prepared_statements")
    return {row["statement"]: row["name"] for row in rows}


def _literal(value: object) -> str:
    """``value`` as an SQL literal (EXECUTE takes no bound parameters)."""
    if value is None:
        return "NULL"
    if isinstance(value, list):
        value = "{" + ",".join(map(str, value)) + "}"
    return "'" + str(value).replace("'", "''") + "'"


async def _run_prepared(
    connection: Any, cached: bool, sql: str, *args: object
) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) of ``sql`` as the worker's ``connection`` runs it.

    With ``cached``, through the statement the worker prepared, and its
    cached plan; else planned with these values, as an unnamed statement
    behind PgBouncer is. The statement runs for real.
    """
    explain = "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "
    if not cached:
        raw = await connection.fetchrow(explain + sql, *args)
    else:
        literals = ", ".join(_literal(arg) for arg in args)

        async def run(one: asyncpg.Connection) -> asyncpg.Record | None:
            name = (await _prepared(one)).get(sql)
            if name is None:
                return None  # the claims' spare, which has not prepared it
            return await one.fetchrow(f"{explain}EXECUTE {name}({literals})")

        # On one of the worker's connections: a claim connection runs a
        # statement on its spare while the worker's claim holds it.
        with anyio.fail_after(10):
            while (raw := await connection.run_in_transaction(run)) is None:
                await anyio.sleep(0.01)
    assert raw is not None
    document: list[dict[str, Any]] = json.loads(raw[0])
    return document[0]


async def _batch(
    pool: asyncpg.Pool, connections: pgqueue.Connections, cached: bool
) -> tuple[int, float]:
    """Claim BATCH jobs of MEASURED and complete them with the worker's statements: buffers and ms."""
    claim = await _run_prepared(
        connections.claims,
        cached,
        CLAIM_TYPES,
        MEASURED,
        BATCH,
        *claim_places({}),
        ["noop"],
    )
    taken = await pool.fetch(
        "SELECT id, attempts FROM pgqueue_jobs WHERE queue = $1 AND status = 'running'",
        MEASURED,
    )
    assert len(taken) == BATCH
    complete = await _run_prepared(
        connections.writes,
        cached,
        COMPLETE,
        array(row["id"] for row in taken),
        array(row["attempts"] for row in taken),
        ["null"] * len(taken),
    )
    assert complete["Plan"]["Actual Rows"] == BATCH
    buffers = _read(claim["Plan"]) + _read(complete["Plan"])
    return buffers, claim["Execution Time"] + complete["Execution Time"]


def _read(plan: dict[str, Any]) -> int:
    """Buffers the plan's scans of pgqueue_jobs touched: what finding the rows cost.

    Writing them (new row versions, index entries) costs the same at
    every size, and is left out.
    """
    return sum(
        plan_buffers(node)
        for node in plan_nodes(plan)
        if node.get("Relation Name") == "pgqueue_jobs"
        and node["Node Type"].endswith("Scan")
    )


async def _table_size(pool: asyncpg.Pool) -> int:
    size: int = await pool.fetchval("SELECT count(*) FROM pgqueue_jobs")
    return size


async def _grow_to(pool: asyncpg.Pool, rows: int) -> None:
    """Add finished rows, 50,000 a statement, and keep QUEUE's backlog of due jobs full."""
    queue = pgqueue.Queue(pool, name=QUEUE)
    while (size := await _table_size(pool)) < rows:
        await pool.execute(
            "INSERT INTO pgqueue_jobs (queue, job_type, status, attempts, completed_at)"
            " SELECT 'done', 'noop', 'completed', 1, now() FROM generate_series(1, $1)",
            min(50_000, rows - size),
        )
        backlog = await pool.fetchval(
            "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1 AND status = 'pending'",
            QUEUE,
        )
        await queue.enqueue_many(
            [("noop", {})] * max(BACKLOG - backlog, 0) + [("fail", {})]
        )


@contextlib.asynccontextmanager
async def _worker(
    pool: asyncpg.Pool, connections: pgqueue.Connections
) -> AsyncIterator[pgqueue.Worker]:
    """A worker of QUEUE, GROUPED and RATED that runs every statement of HOT soon after it starts."""
    worker = pgqueue.Worker(
        pool,
        queues={QUEUE: 32, GROUPED: 2, RATED: 2},
        group_limit={GROUPED: 1},
        rate_limit={RATED: pgqueue.RateLimit(10_000, per=1.0)},
        connections=connections,
        poll_interval=0.2,
        rescue_after=1.5,
        retain=3600,
        backoff=lambda _attempt: 0.0,
    )
    release = anyio.Event()

    @worker.handler("noop")
    async def noop(job: pgqueue.Job) -> None:
        return None

    @worker.handler("fail")
    async def fail(job: pgqueue.Job) -> None:
        if job.attempts == 1:
            raise RuntimeError("first attempt fails")

    @worker.handler("slow")
    async def slow(job: pgqueue.Job) -> None:
        await release.wait()

    # A worker whose plans scan the grown table takes seconds to drain.
    async with running(worker, stop_within=60):
        queue = pgqueue.Queue(pool, name=QUEUE)
        parent = await queue.enqueue("noop", {})
        await queue.enqueue("noop", {}, after=[parent])
        await queue.enqueue("slow", {})
        await queue.enqueue_many([("noop", {})] * 200 + [("fail", {})])
        await pgqueue.Queue(pool, name=GROUPED).enqueue("noop", {}, group="g")
        await pgqueue.Queue(pool, name=RATED).enqueue("noop", {})
        try:
            yield worker
        finally:
            release.set()


async def _every_hot_statement_prepared(connections: pgqueue.Connections) -> bool:
    prepared: set[str] = set()
    for connection in (connections.claims, connections.writes, connections.upkeep):
        prepared |= set(await _prepared(connection))
    return prepared >= set(HOT)


async def _done(pool: asyncpg.Pool, jobs: int) -> bool:
    done: int = await pool.fetchval(
        "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1 AND status = 'completed'",
        QUEUE,
    )
    return done >= jobs


async def _not_by_index(connection: Any) -> dict[str, list[str]]:
    """The scans of each prepared statement's cached plan that read our tables otherwise than by an index condition.

    On one of the worker's connections (a claim connection's spare has
    statements of its own).
    """

    async def run(one: asyncpg.Connection) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        rows = await one.fetch(
            "SELECT name, statement, cardinality(parameter_types) AS params"
            " FROM pg_prepared_statements WHERE statement LIKE '%pgqueue\\_%'"
        )
        for row in rows:
            nulls = ", ".join(["NULL"] * row["params"])
            arguments = f"({nulls})" if nulls else ""
            raw = await one.fetchrow(
                f"EXPLAIN (FORMAT JSON) EXECUTE {row['name']}{arguments}"
            )
            assert raw is not None
            bad = []
            for node in plan_nodes(json.loads(raw[0])[0]["Plan"]):
                kind = node["Node Type"]
                ours = node.get("Relation Name") in OUR_TABLES
                if kind in NOT_BY_INDEX and (ours or "Join" in kind):
                    bad.append(f"{kind} on {node.get('Relation Name')}")
                elif ours and "Index" in kind and "Index Cond" not in node:
                    bad.append(f"{kind} of all of {node['Index Name']}")
            if bad:
                found[HOT.get(row["statement"], row["statement"][:80])] = bad
        return found

    found: dict[str, list[str]] = await connection.run_in_transaction(run)
    return found


@pytest.fixture
async def fresh_table(fresh_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on a database whose pgqueue_jobs is new, empty and never analyzed by autovacuum."""
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool:
        for table in ("pgqueue_jobs", "pgqueue_dependencies", "pgqueue_starts"):
            await pool.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        await pool.execute(
            "INSERT INTO pgqueue_jobs (queue, job_type)"
            " SELECT $1, 'noop' FROM generate_series(1, $2)",
            MEASURED,
            6 * BATCH,
        )
        yield pool


async def _grown_costs(
    pool: asyncpg.Pool, connections: pgqueue.Connections, *, cached: bool
) -> tuple[tuple[int, float], tuple[int, float]]:
    """A batch's cost once the worker has prepared its statements on the small table, and at GROWN rows."""
    async with _worker(pool, connections):
        if cached:
            await wait_until(lambda: _every_hot_statement_prepared(connections))
        else:  # nothing stays prepared behind PgBouncer: the first jobs are done
            await wait_until(lambda: _done(pool, 201))
        small = await _table_size(pool)
        assert small < 2_000
        first = await _batch(pool, connections, cached)
        await _grow_to(pool, GROWN)
        grown = await _batch(pool, connections, cached)
    return first, grown


@pytest.mark.slow
async def test_plans_cached_on_a_new_table_scanned_it_as_it_grew(
    fresh_table: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres, "WORKER_SETTINGS", BEFORE_ISSUE_39)
    async with pgqueue.Connections(fresh_table) as connections:
        (small, small_ms), (grown, grown_ms) = await _grown_costs(
            fresh_table, connections, cached=True
        )
    assert grown > 10 * small, (small, small_ms, grown, grown_ms)


@pytest.mark.slow
async def test_a_worker_started_on_a_new_table_keeps_index_plans_as_it_grows(
    fresh_table: asyncpg.Pool,
) -> None:
    async with pgqueue.Connections(fresh_table) as connections:
        (small, small_ms), (grown, grown_ms) = await _grown_costs(
            fresh_table, connections, cached=True
        )
        assert grown <= 2 * small, (small, small_ms, grown, grown_ms)
        assert grown <= 2 * BATCH * PER_JOB, (small, small_ms, grown, grown_ms)
        for connection in (connections.claims, connections.writes, connections.upkeep):
            assert await _not_by_index(connection) == {}


@pytest.mark.slow
async def test_behind_pgbouncer_a_new_table_costs_the_worker_nothing_as_it_grows(
    fresh_dsn: str, fresh_table: asyncpg.Pool
) -> None:
    with pgbouncer(fresh_dsn, pool_size=4) as bouncer:
        async with (
            asyncpg.create_pool(
                bouncer.dsn, min_size=1, max_size=4, statement_cache_size=0
            ) as pool,
            pgqueue.Connections(pool, listen=fresh_dsn) as connections,
        ):
            (small, small_ms), (grown, grown_ms) = await _grown_costs(
                pool, connections, cached=False
            )
    # Planned at each run: a small table is read whole (cheaper there than
    # by its index), a grown one by index.
    assert grown <= 2 * BATCH * PER_JOB, (small, small_ms, grown, grown_ms)


OLD_LOCK_PARENTS = """
SELECT id, status FROM pgqueue_jobs
WHERE id = ANY($1::text::bigint[])
ORDER BY id
FOR NO KEY UPDATE
"""
"""How an enqueue with parents locked them before issue 39: a statement of the producer's own."""


async def _enqueue_after_buffers(connection: Any, parents: list[int]) -> int:
    """Buffers an enqueue of one job waiting for ``parents`` touches (rolled back)."""
    plan = await explain_analyze(
        connection,
        ENQUEUE_AFTER,
        QUEUE,
        ["noop"],
        "[{}]",
        "{5}",
        "{NULL}",
        "{NULL}",
        "{0}",
        "{f}",
        None,
        array([1] * len(parents)),
        array(parents),
        ["run"],
        False,
    )
    return plan_buffers(plan)


@pytest.mark.slow
async def test_enqueues_with_parents_read_by_index_whatever_the_table_was_when_first_run(
    fresh_dsn: str, fresh_table: asyncpg.Pool
) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=1) as pool:
        queue = pgqueue.Queue(pool, name=QUEUE)
        parents = [await queue.enqueue("noop", {}) for _ in range(BATCH)]
        for _ in range(8):  # a pool's connection plans generically after five runs
            await queue.enqueue("noop", {}, after=parents)
            await pool.fetch(OLD_LOCK_PARENTS, array(parents))
        async with pool.acquire() as connection:
            small = await _enqueue_after_buffers(connection, parents)
        await _grow_to(fresh_table, GROWN)
        async with pool.acquire() as connection:
            grown = await _enqueue_after_buffers(connection, parents)
            old_lock = (await _prepared(connection))[OLD_LOCK_PARENTS]
            before = await connection.fetchval(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)"
                f" EXECUTE {old_lock}({_literal(array(parents))})"
            )
    pages = await fresh_table.fetchval(
        "SELECT pg_relation_size('pgqueue_jobs') / current_setting('block_size')::int"
    )
    old = plan_buffers(json.loads(before)[0]["Plan"])
    assert old >= pages, (pages, old)  # the plan cached on the small table reads it all
    assert grown <= 2 * small, (pages, old, small, grown)
