"""Dependencies: jobs enqueued ``after=[...]`` others run once those have ended.

Through the public API on a real server: a pipeline runs in order, each
step reading its parent's result; a parent that dies cancels its waiting
descendants (or lets a ``"run"`` child go); a parent already ended counts
at once; an unknown parent writes nothing; cancelling a waiting job
cancels its waiting descendants; ``Admin.retry(children=True)`` brings
them back; retention keeps a parent while a child of it has not finished.
A Go worker's Prune on the same table, which knows nothing of the edges:
the child of a parent it deleted still runs, reading None for that parent
(said in the worker's log), and the edges it leaves behind go with the
Python worker's retention sweep.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import pgqueue
from pgqueue._store.postgres import Store
from tests.go_module import GO_PRUNE
from tests.helpers import (
    no_backoff,
    queue_count,
    row,
    running,
    wait_for_row,
    wait_until,
)

if TYPE_CHECKING:
    import asyncpg


def worker_for(pool: asyncpg.Pool, queue: pgqueue.Queue) -> pgqueue.Worker:
    return pgqueue.Worker(pool, queue=queue.name, poll_interval=5, backoff=no_backoff)


async def test_a_three_step_pipeline_runs_in_order_each_step_reading_its_parents_result(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    ran: list[tuple[str, dict[int, Any]]] = []
    worker = worker_for(pool, queue)

    @worker.handler("extract")
    async def extract(job: pgqueue.Job) -> list[int]:
        ran.append(("extract", dict(job.parent_results)))
        return [1, 2, 3]

    @worker.handler("transform")
    async def transform(job: pgqueue.Job) -> list[int]:
        ran.append(("transform", dict(job.parent_results)))
        (rows,) = job.parent_results.values()
        return [n * 10 for n in rows]

    @worker.handler("load")
    async def load(job: pgqueue.Job) -> int:
        ran.append(("load", dict(job.parent_results)))
        (rows,) = job.parent_results.values()
        return sum(rows)

    # The later steps are enqueued first, waiting; the worker is idle (its
    # poll is 5 s away): each step starts on the wakeup its parent's
    # outcome sends.
    async with running(worker):
        e, t, load_id = await queue.enqueue_many(
            [
                pgqueue.NewJob("extract", {}),
                pgqueue.NewJob("transform", {}, after=[-1]),
                pgqueue.NewJob("load", {}, after=[-1]),
            ]
        )
        done = await wait_for_row(pool, load_id, within=4, status="completed")
    assert ran == [
        ("extract", {}),
        ("transform", {e: [1, 2, 3]}),
        ("load", {t: [10, 20, 30]}),
    ]
    assert done["result"] == "60"


async def test_a_waiting_job_is_not_claimed_and_starts_when_its_parent_completes(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    parent = await queue.enqueue("a", {}, delay=3600)
    child = await queue.enqueue("b", {}, after=[parent])
    assert (await row(pool, child))["status"] == "waiting"
    assert (await queue.enqueue("b", {}, after=[parent, child])) > child
    worker = worker_for(pool, queue)
    seen: list[Any] = []
    worker.handler("a")(lambda job: "parent result")

    @worker.handler("b")
    async def b(job: pgqueue.Job) -> None:
        seen.append(dict(job.parent_results))

    async with running(worker):
        await anyio.sleep(0.3)
        assert seen == []
        await pool.execute(
            "UPDATE pgqueue_jobs SET run_at = now() WHERE id = $1", parent
        )
        await pool.execute("SELECT pg_notify('pgqueue_jobs', $1)", queue.name)
        await wait_for_row(pool, child, within=4, status="completed")
    assert seen[0] == {parent: "parent result"}


async def test_an_unknown_parent_raises_and_writes_nothing(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    parent = await queue.enqueue("a", {})
    with pytest.raises(pgqueue.JobNotFoundError) as caught:
        await queue.enqueue("b", {}, after=[parent, 2**62])
    assert caught.value.job_id == 2**62
    with pytest.raises(pgqueue.JobNotFoundError):
        await queue.enqueue_many(
            [("c", {}), pgqueue.NewJob("d", {}, after=[-1, 2**62 + 1])]
        )
    assert await queue_count(pool, queue.name) == 1
    assert (await row(pool, parent))["has_children"] is False


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"after": [-1]}, "counts back"),
        ({"after": [0]}, "positive"),
        ({"after": "12"}, "sequence"),
        ({"after": [1], "unique_key": "k"}, "unique_key"),
        ({"on_parent_failure": "skip"}, "on_parent_failure"),
    ],
)
async def test_bad_dependencies_are_refused_before_any_sql(
    queue: pgqueue.Queue, kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        await queue.enqueue("b", {}, **kwargs)


async def test_a_batch_reference_must_count_back_to_an_earlier_job(
    queue: pgqueue.Queue,
) -> None:
    with pytest.raises(ValueError, match="job 1: after: -2 counts back past"):
        await queue.enqueue_many([("a", {}), pgqueue.NewJob("b", after=[-2])])
    with pytest.raises(ValueError, match="unique_key"):
        await queue.enqueue_many(
            [pgqueue.NewJob("a", unique_key="k"), pgqueue.NewJob("b", after=[-1])]
        )


async def test_a_dead_parent_cancels_its_waiting_descendants_and_lets_a_run_child_go(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    a, b, c, d = await queue.enqueue_many(
        [
            pgqueue.NewJob("fail", {}, max_attempts=1),
            pgqueue.NewJob("ok", {}, after=[-1]),
            pgqueue.NewJob("ok", {}, after=[-1]),
            pgqueue.NewJob("ok", {}, after=[-3], on_parent_failure="run"),
        ]
    )
    worker = worker_for(pool, queue)
    seen: dict[int, dict[int, Any]] = {}

    @worker.handler("fail")
    async def fail(job: pgqueue.Job) -> None:
        raise RuntimeError("boom")

    @worker.handler("ok")
    async def ok(job: pgqueue.Job) -> None:
        seen[job.id] = dict(job.parent_results)

    async with running(worker):
        await wait_for_row(pool, d, within=4, status="completed")
        await wait_for_row(pool, c, status="cancelled")
    assert (await row(pool, a))["status"] == "dead"
    assert (await row(pool, b))["last_error"] == f"parent job {a} is dead"
    assert (await row(pool, c))["last_error"] == f"parent job {b} is cancelled"
    assert seen == {d: {a: None}}


async def test_a_parent_that_ended_before_the_child_was_enqueued_counts_at_once(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    done, dead = await queue.enqueue_many([("a", {}), ("a", {})])
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed', result = '7' WHERE id = $1", done
    )
    await pool.execute("UPDATE pgqueue_jobs SET status = 'dead' WHERE id = $1", dead)
    ready = await queue.enqueue("b", {}, after=[done])
    cancelled = await queue.enqueue("b", {}, after=[done, dead])
    runs = await queue.enqueue("b", {}, after=[done, dead], on_parent_failure="run")
    grandchild = await queue.enqueue("b", {}, after=[cancelled])
    assert (await row(pool, ready))["status"] == "pending"
    assert (await row(pool, cancelled))["status"] == "cancelled"
    assert (await row(pool, cancelled))["last_error"] == f"parent job {dead} is dead"
    assert (await row(pool, runs))["status"] == "pending"
    assert (await row(pool, grandchild))["status"] == "cancelled"


async def test_cancelling_a_waiting_job_cancels_its_waiting_descendants(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    parent = await queue.enqueue("a", {})
    child, grandchild, runner = await queue.enqueue_many(
        [
            pgqueue.NewJob("b", after=[parent]),
            pgqueue.NewJob("b", after=[-1]),
            pgqueue.NewJob("b", after=[-2, parent], on_parent_failure="run"),
        ]
    )
    assert await queue.cancel(child) == {child: "cancelled"}
    assert (await row(pool, child))["status"] == "cancelled"
    assert (await row(pool, grandchild))["status"] == "cancelled"
    assert (await row(pool, grandchild))[
        "last_error"
    ] == f"parent job {child} is cancelled"
    # The "run" child counted the cancelled parent, and still waits for the other.
    assert (await row(pool, runner))["status"] == "waiting"
    assert (await row(pool, runner))["parents_left"] == 1
    assert (await row(pool, parent))["status"] == "pending"


async def test_admin_retry_brings_cancelled_children_back_only_if_asked(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    admin = pgqueue.Admin(pool)
    parent = await queue.enqueue("a", {})
    child, grandchild = await queue.enqueue_many(
        [pgqueue.NewJob("b", after=[parent]), pgqueue.NewJob("b", after=[-1])]
    )
    await pool.execute("UPDATE pgqueue_jobs SET status = 'dead' WHERE id = $1", parent)
    assert (await row(pool, grandchild))["status"] == "cancelled"
    assert await admin.retry(parent) == {parent: "retried"}
    assert (await row(pool, child))["status"] == "cancelled"
    await pool.execute("UPDATE pgqueue_jobs SET status = 'dead' WHERE id = $1", parent)
    assert await admin.retry(parent, children=True) == {parent: "retried"}
    assert (await row(pool, child))["status"] == "waiting"
    assert (await row(pool, grandchild))["status"] == "waiting"
    assert (await row(pool, grandchild))["parents_left"] == 1
    worker = worker_for(pool, queue)
    worker.handler("a")(lambda job: None)
    worker.handler("b")(lambda job: None)
    with anyio.fail_after(10):
        await worker.run(until_empty=True)
    assert (await row(pool, grandchild))["status"] == "completed"


async def test_retention_keeps_a_parent_while_a_child_of_it_has_not_finished(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    admin = pgqueue.Admin(pool)
    parent, other = await queue.enqueue_many([("a", {}), ("a", {})])
    child = await queue.enqueue("b", {}, after=[parent, other])
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed', updated_at = now() - interval '2 days'"
        " WHERE id = $1",
        parent,
    )
    await admin.prune(older_than=60, queue=queue.name)
    assert (await row(pool, parent))["status"] == "completed"
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed', updated_at = now() - interval '2 days'"
        " WHERE id = ANY($1::bigint[])",
        [other, child],
    )
    await admin.prune(older_than=60, queue=queue.name)
    assert await queue_count(pool, queue.name) == 0
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM pgqueue_dependencies WHERE child_id = $1", child
        )
        == 0
    )


async def test_dependencies_ride_the_callers_transaction(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    parent = await queue.enqueue("a", {})
    async with pool.acquire() as connection:
        transaction = connection.transaction()
        await transaction.start()
        child = await queue.enqueue("b", {}, after=[parent], connection=connection)
        status = await connection.fetchval(
            "SELECT status FROM pgqueue_jobs WHERE id = $1", child
        )
        assert status == "waiting"
        await transaction.rollback()
        async with queue.transaction(connection), connection.transaction():
            kept = await queue.enqueue("b", {}, after=[parent], connection=connection)
    assert await queue_count(pool, queue.name) == 2
    assert (await row(pool, kept))["status"] == "waiting"
    assert (await row(pool, parent))["has_children"] is True


async def test_enqueue_hooks_see_the_parents(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    events: list[pgqueue.EnqueueEvent] = []

    class Hook(pgqueue.EnqueueHook):
        def before_enqueue(self, event: pgqueue.EnqueueEvent) -> None:
            events.append(event)

    queue = pgqueue.Queue(pool, name=queue_name, hooks=[Hook()])
    parent = await queue.enqueue("a", {})
    child = await queue.enqueue("b", {"n": 1}, after=[parent], on_parent_failure="run")
    (event_job,) = events[-1].jobs
    assert events[-1].ids == [child]
    assert (event_job.after, event_job.on_parent_failure) == ((parent,), "run")
    assert event_job.payload == {"n": 1}


async def test_children_of_one_parent_enqueued_at_once_do_not_deadlock(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name)
    for _ in range(3):  # the race is on a parent's first children
        parent = await queue.enqueue("a", {})
        results = await asyncio.gather(
            *(queue.enqueue("b", {"n": n}, after=[parent]) for n in range(8)),
            return_exceptions=True,
        )
        assert all(isinstance(r, int) for r in results), results
        assert (
            await pool.fetchval(
                "SELECT count(*) FROM pgqueue_dependencies WHERE parent_id = $1", parent
            )
            == 8
        )


async def _finish(
    pool: asyncpg.Pool, job_id: int, result: str | None, *, age: str = "0"
) -> None:
    """End ``job_id`` completed with ``result`` (JSON text), as last updated ``age`` ago."""
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed', result = $2::jsonb,"
        " completed_at = now(), updated_at = now() - $3::text::interval WHERE id = $1",
        job_id,
        result,
        age,
    )


async def _edges(pool: asyncpg.Pool, *children: int) -> set[tuple[int, int]]:
    found = await pool.fetch(
        "SELECT parent_id, child_id FROM pgqueue_dependencies"
        " WHERE child_id = ANY($1::bigint[])",
        list(children),
    )
    return {(r["parent_id"], r["child_id"]) for r in found}


async def test_the_child_of_a_parent_a_go_prune_deleted_runs_and_reads_none_for_it(
    pool: asyncpg.Pool, queue: pgqueue.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pgqueue")
    old, slow = await queue.enqueue_many([("a", {}), ("a", {})])
    child = await queue.enqueue("b", {}, after=[old, slow])
    await _finish(pool, old, '"old result"', age="2 days")
    # The Go worker's retention (Retain: 1 hour) deletes the parent while
    # its child still waits for the other one.
    assert await pool.execute(GO_PRUNE, queue.name, 3600.0) == "DELETE 1"
    with pytest.raises(AssertionError, match="has no row"):
        await row(pool, old)
    assert (await row(pool, child))["status"] == "waiting"
    await _finish(pool, slow, "8")
    assert (await row(pool, child))["status"] == "pending"
    seen: list[dict[int, Any]] = []
    worker = worker_for(pool, queue)

    @worker.handler("b")
    async def b(job: pgqueue.Job) -> None:
        seen.append(dict(job.parent_results))

    async with running(worker):
        await pool.execute("SELECT pg_notify('pgqueue_jobs', $1)", queue.name)
        await wait_for_row(pool, child, within=4, status="completed")
    # Every parent is listed: the pruned one with None, as its result is gone.
    assert seen == [{old: None, slow: 8}]
    (warning,) = [
        r for r in caplog.records if "deleted before it ran" in r.getMessage()
    ]
    assert warning.levelno == logging.WARNING
    assert getattr(warning, "job_id", None) == child
    assert getattr(warning, "parents", None) == [old]


async def test_the_retention_sweep_removes_the_edges_a_go_prune_left_behind(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    parent, other = await queue.enqueue_many([("a", {}), ("a", {})])
    first, second = await queue.enqueue_many(
        [
            pgqueue.NewJob("b", after=[parent, other]),
            pgqueue.NewJob("b", after=[parent]),
        ]
    )
    waiting = await queue.enqueue("b", {}, after=[parent, other], delay=3600)
    for job_id in (parent, other, first, second):
        await _finish(pool, job_id, "1", age="2 days")
    # Pending past its parents, but not due: it outlives the Go Prune.
    assert (await row(pool, waiting))["status"] == "pending"
    assert await pool.execute(GO_PRUNE, queue.name, 3600.0) == "DELETE 4"
    # The Go Prune deleted the rows and left every edge.
    assert len(await _edges(pool, first, second, waiting)) == 5
    # Walked one edge at a time: a child's edges past the window go with it.
    async with pool.acquire() as connection:
        assert await Store().prune_orphan_edges(connection, 1) == 3
        assert await Store().prune_orphan_edges(connection, 1000) == 0
    # The edges of a child that is still there stay (its parent_results
    # lists those parents).
    assert await _edges(pool, first, second, waiting) == {
        (parent, waiting),
        (other, waiting),
    }


async def _orphaned_edge(pool: asyncpg.Pool, queue: pgqueue.Queue) -> tuple[int, int]:
    """A parent and its child, both finished two days ago, deleted by a Go Prune: their edge is left."""
    parent = await queue.enqueue("a", {})
    child = await queue.enqueue("b", {}, after=[parent])
    for job_id in (parent, child):
        await _finish(pool, job_id, None, age="2 days")
    assert await pool.execute(GO_PRUNE, queue.name, 3600.0) == "DELETE 2"
    return parent, child


async def test_a_python_worker_with_retention_sweeps_orphan_edges(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    parent, child = await _orphaned_edge(pool, queue)
    assert await _edges(pool, child) == {(parent, child)}
    worker = pgqueue.Worker(
        pool, queue=queue.name, retain=7 * 86400, rescue_after=1e6, poll_interval=5
    )
    worker.handler("a")(lambda job: None)

    async def swept() -> bool:
        return not await _edges(pool, child)

    async with running(worker):
        await wait_until(swept, within=5)


async def test_admin_prune_removes_orphan_edges_too(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    _, child = await _orphaned_edge(pool, queue)
    assert await pgqueue.Admin(pool).prune(older_than=60, queue=queue.name) == 0
    assert await _edges(pool, child) == set()
