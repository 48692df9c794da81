"""The claim and the rescue stay on their partial indexes on a big, mostly finished table.

The table holds 1,000,000 completed and dead rows, 200,000 pending rows (a
quarter of them not due for an hour) and 1,000 running rows (100 of them
stale). ``EXPLAIN (ANALYZE, BUFFERS)`` of `CLAIM` (100 rows) and
`RESCUE` must show an index scan on ``idx_pgqueue_jobs_priority`` /
``idx_pgqueue_jobs_rescue``, no sequential or bitmap scan of the table, and
a number of shared buffers (hit + read) that depends on the rows moved, not
on the table's size.

The bounds, from what each moved row costs:

* Finding and locking 100 rows (the claim's id subquery, one scan per
  priority, each under a ``LockRows`` node, or the
  rescue's index scan) reads a handful of index pages plus about one heap
  buffer per row: bounded by 200 (measured: 106 and 4).
* The whole UPDATE also looks each claimed id up in the primary key (about
  4 buffers), writes the new row version (1-2) and inserts it into the
  primary key and the rescue index (about 3 each), so about 13 buffers per
  row: bounded by 20 per row, 2,000 for 100 rows (measured: 1,314 and 1,006).

A scan that wandered into the finished rows would touch the table's pages
instead (about 17,000 here): the test checks that the table has more than
five times the bound. One test checks both statements, so the table is
filled once (about 10 s).
Everything runs inside a transaction that is rolled back.
"""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from pgqueue._sql.claims import CLAIM
from pgqueue._sql.literals import claim_places
from pgqueue._sql.outcomes import RESCUE
from tests.helpers import explain_analyze, plan_buffers, plan_nodes

pytestmark = pytest.mark.slow

QUEUE = "default"
CLAIM_LIMIT = 100
STALE_RUNNING = 100
FIND_BOUND = 200
PER_ROW_BOUND = 20

FILL = (
    # 1,000,000 finished rows: nine in ten completed, one in ten dead.
    """
    INSERT INTO pgqueue_jobs (queue, job_type, status, attempts, run_at,
                              created_at, updated_at, completed_at, last_error)
    SELECT $1, 'noop',
           CASE WHEN g % 10 = 0 THEN 'dead' ELSE 'completed' END,
           1, now() - interval '2 days', now() - interval '2 days',
           now() - interval '1 day',
           CASE WHEN g % 10 = 0 THEN NULL ELSE now() - interval '1 day' END,
           CASE WHEN g % 10 = 0 THEN 'boom' END
    FROM generate_series(1, 1000000) AS g
    """,
    # 200,000 pending rows, one in four due only in an hour.
    """
    INSERT INTO pgqueue_jobs (queue, job_type, run_at)
    SELECT $1, 'noop',
           CASE WHEN g % 4 = 0 THEN now() + interval '1 hour'
                ELSE now() - make_interval(secs => g) END
    FROM generate_series(1, 200000) AS g
    """,
    # 1,000 running rows; the first 100 were last seen an hour ago.
    """
    INSERT INTO pgqueue_jobs (queue, job_type, status, attempts, updated_at)
    SELECT $1, 'noop', 'running', 1,
           CASE WHEN g <= 100 THEN now() - interval '1 hour' ELSE now() END
    FROM generate_series(1, 1000) AS g
    """,
)


def _finding(claim: dict[str, Any]) -> dict[str, Any]:
    """The claim's id subquery: the scans of every priority and their locks."""
    return next(n for n in plan_nodes(claim) if n["Node Type"] == "Limit")


def _check_scans(root: dict[str, Any], index: str) -> dict[str, Any]:
    """Return the index scan on ``index``; fail on any full scan of the table."""
    nodes = plan_nodes(root)
    full = [
        n["Node Type"]
        for n in nodes
        if n.get("Relation Name") == "pgqueue_jobs"
        and n["Node Type"] in {"Seq Scan", "Bitmap Heap Scan", "Tid Range Scan"}
    ]
    assert not full, f"full scans of pgqueue_jobs: {full}"
    scans = [n for n in nodes if n.get("Index Name") == index]
    assert scans, f"no scan of {index}: {[n['Node Type'] for n in nodes]}"
    return scans[0]


@pytest.fixture
async def big_table(fresh_dsn: str) -> Any:
    connection = await asyncpg.connect(fresh_dsn)
    try:
        for statement in FILL:
            await connection.execute(statement, QUEUE)
        await connection.execute("ANALYZE pgqueue_jobs")
        pages = await connection.fetchval(
            "SELECT pg_relation_size('pgqueue_jobs') / current_setting('block_size')::int"
        )
        assert pages > 5 * PER_ROW_BOUND * CLAIM_LIMIT, pages
        yield connection
    finally:
        await connection.close()


async def test_claim_and_rescue_use_their_partial_indexes(
    big_table: asyncpg.Connection,
) -> None:
    claim = await explain_analyze(
        big_table, CLAIM, QUEUE, CLAIM_LIMIT, *claim_places({})
    )
    rescue = await explain_analyze(big_table, RESCUE, [QUEUE], 300.0, 1000)

    _check_scans(claim, "idx_pgqueue_jobs_priority")
    assert claim["Actual Rows"] == CLAIM_LIMIT
    lock = _finding(claim)
    assert plan_buffers(lock) < FIND_BOUND, lock
    assert plan_buffers(claim) < PER_ROW_BOUND * CLAIM_LIMIT, plan_buffers(claim)

    scan = _check_scans(rescue, "idx_pgqueue_jobs_rescue")
    assert scan["Actual Rows"] == STALE_RUNNING
    assert rescue["Actual Rows"] == STALE_RUNNING
    assert plan_buffers(scan) < FIND_BOUND, scan
    assert plan_buffers(rescue) < PER_ROW_BOUND * STALE_RUNNING, plan_buffers(rescue)


FUTURE_HIGH_PRIORITY = """
INSERT INTO pgqueue_jobs (queue, job_type, priority, run_at)
SELECT $1, 'noop', 5, now() + interval '1 hour' + make_interval(secs => g)
FROM generate_series(1, 1000000) AS g
"""


async def test_future_jobs_of_a_higher_priority_cost_a_claim_nothing(
    fresh_dsn: str,
) -> None:
    """1,000,000 priority-5 jobs due in an hour: a claim of the due ones never walks them."""
    connection = await asyncpg.connect(fresh_dsn)
    try:
        due = "INSERT INTO pgqueue_jobs (queue, job_type) SELECT $1, 'noop' FROM generate_series(1, 5000)"
        await connection.execute(due, QUEUE)
        await connection.execute("ANALYZE pgqueue_jobs")
        alone = await explain_analyze(
            connection, CLAIM, QUEUE, CLAIM_LIMIT, *claim_places({})
        )
        await connection.execute(FUTURE_HIGH_PRIORITY, QUEUE)
        await connection.execute("ANALYZE pgqueue_jobs")
        behind = await explain_analyze(
            connection, CLAIM, QUEUE, CLAIM_LIMIT, *claim_places({})
        )
    finally:
        await connection.close()
    for plan in (alone, behind):
        assert plan["Actual Rows"] == CLAIM_LIMIT
        assert any(
            n.get("Index Name") == "idx_pgqueue_jobs_priority" for n in plan_nodes(plan)
        )
    _check_scans(behind, "idx_pgqueue_jobs_priority")
    found = {
        name: plan_buffers(_finding(plan))
        for name, plan in (("alone", alone), ("behind", behind))
    }
    # Each priority's scan stops at its first job not yet due: the million
    # cost a few index pages (the tree is a level deeper), not a walk.
    assert found["behind"] <= found["alone"] + 20, found


async def test_a_claim_past_an_exhausted_priority_does_not_walk_lower_ones(
    fresh_dsn: str,
) -> None:
    """Draining a backlog of priority -1, claims skip the priorities above it.

    Priority 0 is found through the Go module's index, which holds every
    pending job: from its head, a claim walks the whole due backlog of
    priority -1 to find no job of priority 0. Once a claim went past
    priority 0, the worker starts that line at the claim's time.
    """
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await connection.execute(
            "INSERT INTO pgqueue_jobs (queue, job_type, priority, run_at)"
            " SELECT $1, 'noop', -1, now() - make_interval(secs => g)"
            " FROM generate_series(1, 50000) AS g",
            QUEUE,
        )
        await connection.execute("ANALYZE pgqueue_jobs")
        now = await connection.fetchval("SELECT now()")
        exhausted = dict.fromkeys(range(6), (now, 2**63 - 1))
        found = {}
        for start, places in (("head", {}), ("past", exhausted)):
            plan = await explain_analyze(
                connection, CLAIM, QUEUE, CLAIM_LIMIT, *claim_places(places)
            )
            assert plan["Actual Rows"] == CLAIM_LIMIT
            found[start] = plan_buffers(_finding(plan))
    finally:
        await connection.close()
    assert found["head"] > 5 * found["past"], found  # measured: 891 against 124
    assert found["past"] < FIND_BOUND, found
