"""Durable handlers' child jobs: ``job.spawn`` and ``job.wait_child``.

Through the public API on a real server: a child is enqueued once however
often its parent runs, the parent parks (no slot, no attempt) until the
child ends and then gets its result, a dead child raises ``ChildFailed``
naming it and its last error, a child that ended before the wait is seen at
once, and a wait for a job that does not exist raises.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio

import pgqueue
from tests.helpers import no_backoff, row, running, wait_for_row

if TYPE_CHECKING:
    import asyncpg


async def test_spawn_and_wait_child_that_completes_and_one_that_dies(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    seen: list[Any] = []
    worker = pgqueue.Worker(
        pool, queue=queue.name, concurrency=1, poll_interval=60, backoff=no_backoff
    )
    release_label = anyio.Event()

    @worker.handler("order")
    async def order(job: pgqueue.Job) -> Any:
        label_id = await job.spawn("label", "label", {"order": 1}, max_attempts=3)
        customs_id = await job.spawn("customs", "customs", {"order": 1}, max_attempts=1)
        seen.append(("spawned", job.attempts, label_id, customs_id))
        label = await job.wait_child(label_id)
        try:
            await job.wait_child(customs_id)
        except pgqueue.ChildFailed as exc:
            seen.append(("failed", exc.child_id, exc.status, exc.error))
        return label

    @worker.handler("label")
    async def label(job: pgqueue.Job) -> dict[str, Any]:
        await release_label.wait()
        return {"tracking": f"TRK-{job.payload['order']}"}

    @worker.handler("customs")
    async def customs(_job: pgqueue.Job) -> None:
        raise pgqueue.Permanent("no customs form for this country")

    order_id = await queue.enqueue("order", {})
    async with running(worker):
        # The parent parks on the label; the label then holds the one slot.
        parked = await wait_for_row(pool, order_id, status="parked")
        assert parked["attempts"] == 0
        label_id = json.loads(parked["wait"])["child"]
        await wait_for_row(pool, label_id, status="running")
        release_label.set()
        done = await wait_for_row(pool, order_id, status="completed")
    assert json.loads(done["result"]) == {"tracking": "TRK-1"}
    spawned = [s for s in seen if s[0] == "spawned"]
    # Each run spawned the same two children: enqueued once.
    assert len({s[2:] for s in spawned}) == 1
    _, _, label_id, customs_id = spawned[0]
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1", queue.name
        )
        == 3
    )
    assert (
        "failed",
        customs_id,
        "dead",
        "Permanent: no customs form for this country",
    ) in seen
    steps = json.loads(done["steps"])
    assert steps["pgqueue:spawn:label"]["result"] == label_id
    assert steps[f"pgqueue:child:{label_id}"]["result"]["status"] == "completed"
    assert steps[f"pgqueue:child:{customs_id}"]["result"]["status"] == "dead"
    assert (await row(pool, label_id))["max_attempts"] == 3


async def test_a_child_ended_before_the_wait_and_an_unknown_child(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    seen: list[Any] = []
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=0.2)

    @worker.handler("parent")
    async def parent(job: pgqueue.Job) -> Any:
        try:
            await job.wait_child(2**62)
        except pgqueue.JobNotFoundError:
            seen.append("not found")
        return await job.wait_child(job.payload["child"], timeout=30)

    @worker.handler("child")
    async def child(_job: pgqueue.Job) -> int:
        return 7

    child_id = await queue.enqueue("child", {})
    async with running(worker):
        await wait_for_row(pool, child_id, status="completed")
        parent_id = await queue.enqueue("parent", {"child": child_id})
        done = await wait_for_row(pool, parent_id, status="completed")
    assert seen == ["not found"]
    assert json.loads(done["result"]) == 7
    assert done["attempts"] == 1  # never parked
