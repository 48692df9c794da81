"""Durable handlers' child jobs: ``job.spawn`` and ``job.wait_child``.

Through the public API on a real server: a child is enqueued once however
often its parent runs, the parent parks (no slot, no attempt) until the
child ends and then gets its result, a dead child raises ``ChildFailed``
naming it and its last error, a child that ended before the wait is seen at
once, a wait for a job that does not exist raises, and a durable handler
behind PgBouncer in transaction mode leaves no session state, and the
grant sets suffice (a worker role runs it; producers and operators signal,
readers cannot).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgqueue
from tests.helpers import no_backoff, row, running, wait_for_row
from tests.pgbouncer import PgBouncer, pgbouncer
from tests.test_pgbouncer import assert_untouched, baseline, bounced_pool
from tests.test_trust_boundary import roles  # noqa: F401  (the fixture)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.test_trust_boundary import Roles


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


@pytest.fixture
def bouncer(dsn: str) -> Iterator[PgBouncer]:
    """A PgBouncer of the test's own in front of this run's database."""
    with pgbouncer(dsn, pool_size=2) as running_bouncer:
        yield running_bouncer


async def test_a_durable_handler_behind_pgbouncer_leaves_no_session_state(
    bouncer: PgBouncer, pool: asyncpg.Pool, queue_name: str
) -> None:
    before = await baseline(bouncer)
    async with bounced_pool(bouncer) as bounced:
        queue = pgqueue.Queue(bounced, name=queue_name)
        worker = pgqueue.Worker(
            bounced, queue=queue_name, listen=False, poll_interval=0.05
        )

        @worker.handler("order")
        async def order(job: pgqueue.Job) -> Any:
            paid = await job.step("pay", lambda: "paid")
            await job.progress(0.5, paid)
            if "napped" not in job.steps:
                await job.step("napped", lambda: True)
                await job.sleep(0.1)
            approval = await job.wait_for("approve")
            child = await job.spawn("label", "label", {})
            return [paid, approval, await job.wait_child(child)]

        @worker.handler("label")
        async def label(_job: pgqueue.Job) -> str:
            return "TRK-1"

        job_id = await queue.enqueue("order", {})
        async with running(worker):
            await wait_for_row(pool, job_id, status="parked")
            assert await queue.signal(job_id, "approve", "yes") is True
            done = await wait_for_row(pool, job_id, status="completed")
    assert json.loads(done["result"]) == ["paid", "yes", "TRK-1"]
    await assert_untouched(bouncer, before)


async def test_the_grant_sets_run_durable_handlers_and_signal_them(
    roles: Roles,  # noqa: F811  (the fixture: a role of each grant set)
) -> None:
    async with (
        asyncpg.create_pool(roles.dsn["producer"], min_size=1, max_size=2) as producer,
        asyncpg.create_pool(roles.dsn["worker"], min_size=1, max_size=4) as worker_pool,
        asyncpg.create_pool(roles.dsn["reader"], min_size=1, max_size=2) as reader,
        asyncpg.create_pool(roles.dsn["operator"], min_size=1, max_size=2) as operator,
        asyncpg.create_pool(roles.owner, min_size=1, max_size=2) as owner,
    ):
        worker = pgqueue.Worker(worker_pool, queue="granted", poll_interval=0.1)

        @worker.handler("order")
        async def order(job: pgqueue.Job) -> Any:
            paid = await job.step("pay", lambda: "paid")
            await job.progress(0.5)
            first = await job.wait_for("first")
            second = await job.wait_for("second")
            child = await job.spawn("label", "label", {})
            return [paid, first, second, await job.wait_child(child)]

        @worker.handler("label")
        async def label(_job: pgqueue.Job) -> str:
            return "TRK"

        job_id = await pgqueue.Queue(producer, name="granted").enqueue("order", {})
        async with running(worker):
            await wait_for_row(owner, job_id, status="parked")
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await pgqueue.Queue(reader, name="granted").signal(job_id, "first")
            assert await pgqueue.Queue(producer, name="granted").signal(
                job_id, "first", 1
            )
            assert await pgqueue.Queue(operator, name="granted").signal(
                job_id, "second", 2
            )
            done = await wait_for_row(owner, job_id, status="completed")
    assert json.loads(done["result"]) == ["paid", 1, 2, "TRK"]
