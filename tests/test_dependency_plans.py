"""Dependencies at scale: a parent's ending touches its own edges and children only.

A fan-in of 10,000 parents to one child, and a fan-out of one parent to
10,000 children, beside 20,000 other jobs: the statement each parent's
ending runs (`SETTLE`, the body of the ``pgqueue_parent_ended``
trigger) reads no sibling, whether it is the first parent to end or the
last, and scans neither table; the drain's outcome write of jobs without
children never fires the trigger. Planned as the trigger function plans
it (with its own planner settings, generically: the trigger's statement is
cached generic after five runs) and with the values known.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import asyncpg
import pytest

import pgqueue
from pgqueue._sql.listings import DEPENDENCIES
from pgqueue._sql.literals import array
from pgqueue._sql.outcomes import COMPLETE
from pgqueue._sql.settings import INDEX_PLANNING
from pgqueue._sql.triggers import SETTLE
from tests.helpers import explain_analyze, plan_buffers, plan_nodes

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

FAN = 10_000
OTHERS = 20_000


@pytest.fixture
async def table(fresh_dsn: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await connection.execute(
            "INSERT INTO pgqueue_jobs (queue, job_type)"
            " SELECT 'other', 'noop' FROM generate_series(1, $1)",
            OTHERS,
        )
        yield connection
    finally:
        await connection.close()


async def _jobs(connection: asyncpg.Connection, n: int, **columns: Any) -> list[int]:
    names = ", ".join(columns)
    values = ", ".join(f"${i}" for i in range(2, len(columns) + 2))
    ids: list[int] = await connection.fetchval(
        f"WITH j AS (INSERT INTO pgqueue_jobs (queue, job_type{', ' if names else ''}{names})"
        f" SELECT 'deps', 't'{', ' if values else ''}{values} FROM generate_series(1, $1)"
        " RETURNING id) SELECT array_agg(id ORDER BY id) FROM j",
        n,
        *columns.values(),
    )
    return ids


async def _edges(
    connection: asyncpg.Connection, parents: list[int], children: list[int]
) -> None:
    await connection.execute(
        "INSERT INTO pgqueue_dependencies (parent_id, child_id)"
        " SELECT p, c FROM unnest($1::bigint[]) AS p, unnest($2::bigint[]) AS c",
        parents,
        children,
    )


async def _settle_plans(
    connection: asyncpg.Connection, parent: int
) -> dict[str, list[dict[str, Any]]]:
    """SETTLE's plan nodes for ``parent`` completing, custom and generic; rolled back.

    Under the trigger function's own planner settings (`INDEX_PLANNING`).
    """
    found = {}
    for mode in ("custom", "generic"):
        transaction = connection.transaction()
        await transaction.start()
        try:
            await connection.execute(f"SET LOCAL plan_cache_mode = force_{mode}_plan")
            for name, value in INDEX_PLANNING.items():
                await connection.execute(f"SET LOCAL {name} = {value}")
            await connection.execute("PREPARE settle AS " + SETTLE)
            raw = await connection.fetchval(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)"
                f" EXECUTE settle({parent}, 'completed')"
            )
        finally:
            await transaction.rollback()
            await connection.execute("DEALLOCATE settle")
        found[mode] = plan_nodes(json.loads(raw)[0]["Plan"])
    return found


def _scans(nodes: list[dict[str, Any]]) -> list[tuple[str, str | None, str]]:
    return [
        (n["Node Type"], n.get("Index Name"), n["Relation Name"])
        for n in nodes
        if "Relation Name" in n and n["Node Type"] != "ModifyTable"
    ]


async def test_each_parent_of_a_fan_in_of_10000_settles_without_reading_its_siblings(
    table: asyncpg.Connection,
) -> None:
    parents = await _jobs(table, FAN, status="running", has_children=True)
    [child] = await _jobs(table, 1, status="waiting", parents_left=FAN)
    await _edges(table, parents, [child])
    await table.execute("ANALYZE pgqueue_jobs; ANALYZE pgqueue_dependencies")
    for parent in (parents[0], parents[-1]):
        for mode, nodes in (await _settle_plans(table, parent)).items():
            for scan in _scans(nodes):
                assert scan[0] != "Seq Scan", (mode, scan)
            # One edge and one child: a few index pages, not 10,000 siblings.
            assert plan_buffers(nodes[0]) < 60, (mode, plan_buffers(nodes[0]))
        # Through the trigger: parents end one by one, the child stays
        # waiting until the last.
        await table.execute(
            "UPDATE pgqueue_jobs SET status = 'completed' WHERE id = ANY($1::bigint[])",
            parents[:-1] if parent == parents[0] else [parents[-1]],
        )
        found = await table.fetchrow(
            "SELECT status, parents_left FROM pgqueue_jobs WHERE id = $1", child
        )
        assert found is not None
        assert tuple(found) == (
            ("waiting", 1) if parent == parents[0] else ("pending", 0)
        )


async def test_the_parent_of_a_fan_out_of_10000_settles_each_child_once(
    table: asyncpg.Connection,
) -> None:
    [parent] = await _jobs(table, 1, status="running", has_children=True)
    children = await _jobs(table, FAN, status="waiting", parents_left=1)
    await _edges(table, [parent], children)
    await table.execute("ANALYZE pgqueue_jobs; ANALYZE pgqueue_dependencies")
    for mode, nodes in (await _settle_plans(table, parent)).items():
        # The children are found through the parent's edges, once: by an
        # index probe per edge, or (here, where every edge is the parent's)
        # one hash join over the table; never a scan per child.
        for node in nodes:
            if node["Node Type"] == "Seq Scan":
                assert node["Actual Loops"] == 1, (mode, _scans(nodes))
        assert nodes[0]["Actual Rows"] == 1  # the count of wakeups, one row
    await table.execute(
        "UPDATE pgqueue_jobs SET status = 'completed' WHERE id = $1", parent
    )
    assert (
        await table.fetchval(
            "SELECT count(*) FROM pgqueue_jobs WHERE status = 'pending' AND queue = 'deps'"
        )
        == FAN
    )


async def test_the_outcome_write_of_jobs_without_children_never_fires_the_trigger(
    table: asyncpg.Connection,
) -> None:
    ids = await _jobs(table, 100, status="running", attempts=1)
    [parent] = await _jobs(table, 1, status="running", attempts=1, has_children=True)
    ids.append(parent)
    transaction = table.transaction()
    await transaction.start()
    try:
        raw = await table.fetchval(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + COMPLETE,
            array(ids),
            array([1] * len(ids)),
            [None] * len(ids),
        )
    finally:
        await transaction.rollback()
    fired = {
        t["Trigger Name"]: t["Calls"] for t in json.loads(raw)[0].get("Triggers", [])
    }
    assert fired == {"pgqueue_parent_ended": 1}


async def test_a_jobs_parents_and_children_are_read_through_the_edge_indexes(
    table: asyncpg.Connection,
) -> None:
    """`Admin.dependencies` (the job page, ``pgqueue jobs show``) of a fan-out and a fan-in of 10,000.

    Children through the primary key of ``pgqueue_dependencies``, parents
    through its child index, each one's status by the jobs' primary key:
    no scan of either table, and the first 50 of each read, not 10,000.
    """
    [parent] = await _jobs(table, 1, status="running", has_children=True)
    children = await _jobs(table, FAN, status="waiting", parents_left=1)
    await _edges(table, [parent], children)
    parents = await _jobs(table, FAN, status="running", has_children=True)
    [child] = await _jobs(table, 1, status="waiting", parents_left=FAN)
    await _edges(table, parents, [child])
    await table.execute("VACUUM ANALYZE pgqueue_jobs, pgqueue_dependencies")
    for job, expected in ((parent, (0, FAN)), (child, (FAN, 0))):
        for mode in ("auto", "force_generic_plan"):
            await table.execute(f"SET plan_cache_mode = {mode}")
            plan = await explain_analyze(table, DEPENDENCIES, job, 50)
            nodes = plan_nodes(plan)
            for node in nodes:
                if node.get("Relation Name") in {
                    "pgqueue_jobs",
                    "pgqueue_dependencies",
                }:
                    assert "Index" in node["Node Type"], (mode, _scans(nodes))
            used = {n["Index Name"] for n in nodes if "Index Name" in n}
            assert "pgqueue_jobs_pkey" in used, (mode, used)
            assert used <= {
                "pgqueue_jobs_pkey",
                "pgqueue_dependencies_pkey",
                "idx_pgqueue_dependencies_child",
            }, (mode, used)
            assert plan["Actual Rows"] == 50, (mode, plan["Actual Rows"])
            assert plan_buffers(plan) < 400, (mode, plan_buffers(plan))
        await table.execute("RESET plan_cache_mode")
        found = await pgqueue.Admin(table).dependencies(job)
        assert (found.parents_total, found.children_total) == expected
        assert len(found.parents) + len(found.children) == 50
        shown = found.parents or found.children
        assert [r.id for r in shown] == sorted(parents if job == child else children)[
            :50
        ]
        assert {r.status for r in shown} == {"running" if job == child else "waiting"}
