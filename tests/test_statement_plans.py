"""The worker's statements find their rows through indexes on a small table too.

A table of a few thousand rows is where the planner likes sequential scans:
the claim written as a join once scanned all 20,000 rows of the benchmark's
table for every batch, and the outcome write walked every running row
through the rescue index, whose row estimate is stale (one row) after an
ANALYZE that saw none running. The worker's own connections plan every
statement generically (`WORKER_SETTINGS`); that is the plan checked.
The claim is also checked as planned with its parameters' values, since it
holds up either way; the outcome writes, planned with 100 known ids on this
table, do take a sequential scan, one reason the worker plans generically.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest

from pgqueue._sql import outcomes as outcomes_sql
from pgqueue._sql.claims import CLAIM, NEXT_DUE
from pgqueue._sql.literals import array, claim_places
from pgqueue._sql.settings import WORKER_SETTINGS
from tests.helpers import explain_analyze, plan_buffers, plan_nodes

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

QUEUE = "default"
PENDING = 20_000
CLAIMED = 300
WRITTEN = 100
DRAINED = 15_000


async def _fill(connection: asyncpg.Connection) -> None:
    """PENDING due no-op jobs on QUEUE."""
    await connection.execute(
        "INSERT INTO pgqueue_jobs (queue, job_type)"
        " SELECT $1, 'noop' FROM generate_series(1, $2)",
        QUEUE,
        PENDING,
    )


@pytest.fixture
async def small_table(fresh_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await _fill(connection)
        await connection.execute("ANALYZE pgqueue_jobs")
        await connection.fetch(CLAIM, QUEUE, CLAIMED, *claim_places({}))
        yield connection
    finally:
        await connection.close()


async def _plans(
    connection: asyncpg.Connection,
    sql: str,
    *args: object,
    modes: tuple[str, ...] = ("custom", "generic"),
) -> dict[str, list[dict[str, Any]]]:
    """The nodes of ``sql``'s plans in ``modes``, each run and rolled back."""
    found = {}
    literals = ", ".join(_literal(arg) for arg in args)
    for mode in modes:
        transaction = connection.transaction()
        await transaction.start()
        try:
            if mode == "custom":
                raw = await connection.fetchval(
                    "EXPLAIN (ANALYZE, FORMAT JSON) " + sql, *args
                )
            else:
                for name, value in WORKER_SETTINGS.items():
                    await connection.execute(f"SET LOCAL {name} = {value}")
                await connection.execute("PREPARE checked AS " + sql)
                raw = await connection.fetchval(
                    f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE checked({literals})"
                )
        finally:
            await transaction.rollback()
        found[mode] = plan_nodes(json.loads(raw)[0]["Plan"])
    return found


def _literal(value: object) -> str:
    """``value`` as an SQL literal (EXECUTE takes no bound parameters)."""
    if isinstance(value, list):
        items = ",".join("NULL" if v is None else json.dumps(v) for v in value)
        return "'{" + items + "}'"
    return "'" + str(value).replace("'", "''") + "'"


def _claimed(nodes: list[dict[str, Any]]) -> int:
    """Rows the claim's id subquery found (its outer Limit runs once).

    Not the scans' rows: those run once per priority, and EXPLAIN shows
    their rounded mean per loop.
    """
    limit = next(n for n in nodes if n["Node Type"] == "Limit")
    assert limit["Actual Loops"] == 1
    return int(limit["Actual Rows"])


def _lock_over(plan: dict[str, Any], index: str) -> dict[str, Any]:
    """The LockRows node of the scan of ``index``."""
    return next(
        n
        for n in plan_nodes(plan)
        if n["Node Type"] == "LockRows"
        and any(c.get("Index Name") == index for c in plan_nodes(n))
    )


def _table_scans(nodes: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [
        (n["Node Type"], n.get("Index Name"))
        for n in nodes
        if n.get("Relation Name") == "pgqueue_jobs" and n["Node Type"] != "ModifyTable"
    ]


@pytest.mark.parametrize("start", ["head", "past the claimed"])
async def test_claim_never_scans_the_table(
    small_table: asyncpg.Connection, start: str
) -> None:
    after = None
    if start != "head":
        last = await small_table.fetchrow(
            "SELECT run_at, id FROM pgqueue_jobs WHERE status = 'running'"
            " ORDER BY run_at DESC, id DESC LIMIT 1"
        )
        assert last is not None
        after = (last["run_at"], last["id"])
    places = {} if after is None else {0: after}
    plans = await _plans(small_table, CLAIM, QUEUE, 100, *claim_places(places))
    for mode, nodes in plans.items():
        scans = _table_scans(nodes)
        # Priorities 5..1 and -1..-5 in their index (empty here), 0 in the
        # Go module's, the rows found through the primary key.
        assert scans.count(("Index Scan", "idx_pgqueue_jobs_priority")) == 2, (
            mode,
            scans,
        )
        assert ("Index Scan", "idx_pgqueue_jobs_claim") in scans, (mode, scans)
        assert ("Index Scan", "pgqueue_jobs_pkey") in scans, (mode, scans)
        assert all(kind == "Index Scan" for kind, _ in scans), (mode, scans)
        for scan in nodes:
            if scan.get("Index Name") not in (
                "idx_pgqueue_jobs_claim",
                "idx_pgqueue_jobs_priority",
            ):
                continue
            # Each line's place is where its scan starts, not a filter, and
            # its first job not yet due where it stops.
            assert "ROW(run_at, id) >" in scan["Index Cond"], (mode, scan)
            assert "run_at <= now()" in scan["Index Cond"], (mode, scan)
        assert _claimed(nodes) == 100, mode


async def test_next_due_starts_past_the_due_jobs_in_the_claim_index(
    small_table: asyncpg.Connection,
) -> None:
    """An idle worker's question walks none of the 20,000 due jobs before the answer."""
    await small_table.execute(
        "INSERT INTO pgqueue_jobs (queue, job_type, run_at)"
        " SELECT $1, 'later', now() + make_interval(secs => n) FROM generate_series(1, 3) AS n",
        QUEUE,
    )
    plans = await _plans(small_table, NEXT_DUE, QUEUE)
    for mode, nodes in plans.items():
        scans = [n for n in nodes if n.get("Relation Name") == "pgqueue_jobs"]
        assert [n.get("Index Name") for n in scans] == ["idx_pgqueue_jobs_claim"], (
            mode,
            scans,
        )
        assert "run_at > now()" in scans[0]["Index Cond"], (mode, scans)
        assert scans[0]["Actual Rows"] == 1, (mode, scans)
        assert nodes[0]["Actual Rows"] == 1, mode


@pytest.mark.parametrize("statement", ["FINISH", "COMPLETE", "TOUCH"])
async def test_outcome_writes_go_through_the_primary_key(
    small_table: asyncpg.Connection, statement: str
) -> None:
    running = await small_table.fetch(
        "SELECT id, attempts FROM pgqueue_jobs WHERE status = 'running'"
        " ORDER BY id LIMIT $1",
        WRITTEN,
    )
    ids = [r["id"] for r in running]
    attempts = [r["attempts"] for r in running]
    args: tuple[object, ...] = (array(ids), array(attempts))
    if statement == "FINISH":
        args += (
            ["completed"] * WRITTEN,
            array([0.0] * WRITTEN),
            [None] * WRITTEN,
            [None] * WRITTEN,
        )
    elif statement == "COMPLETE":
        args += ([None] * WRITTEN,)
    plans = await _plans(
        small_table, getattr(outcomes_sql, statement), *args, modes=("generic",)
    )
    nodes = plans["generic"]
    assert _table_scans(nodes) == [("Index Scan", "pgqueue_jobs_pkey")]
    assert nodes[0]["Actual Rows"] == (0 if statement == "TOUCH" else WRITTEN)


async def test_a_claim_past_the_jobs_taken_skips_their_dead_index_entries(
    fresh_dsn: str,
) -> None:
    """What a worker draining a backlog relies on until vacuum runs."""
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await connection.execute(
            "ALTER TABLE pgqueue_jobs SET (autovacuum_enabled = false)"
        )
        await _fill(connection)
        taken = await connection.fetch(CLAIM, QUEUE, DRAINED, *claim_places({}))
        after = max((r["run_at"], r["id"]) for r in taken)
        found = {}
        for start, places in (("head", {}), ("past", {0: after})):
            plan = await explain_analyze(
                connection, CLAIM, QUEUE, 100, *claim_places(places)
            )
            assert _claimed(plan_nodes(plan)) == 100
            found[start] = plan_buffers(_lock_over(plan, "idx_pgqueue_jobs_claim"))
    finally:
        await connection.close()
    # Walked from the head, skipped from past them (measured: 452 buffers
    # against 105, the rest being the 100 rows locked).
    assert found["past"] < 150, found
    assert found["head"] > found["past"] + 50, found
