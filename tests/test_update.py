"""`Admin.update`: change a job that has not started, atomically, on a real server.

The race with a claim runs on two connections: a claim that locks the row
first makes the update wait, then refuse (`pgqueue.JobStateError`); an
update that locks it first is what the claim then takes. The claim is the
Go module's (and a Go worker's): ``pending`` to ``running`` with its
attempt counted, the row taken ``FOR UPDATE SKIP LOCKED``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue import JobNotFoundError, JobStateError, Status
from tests.helpers import listening, row, rows, wait_until

CLAIM = """
UPDATE pgqueue_jobs SET status = $2, attempts = attempts + 1, claimed_at = now()
WHERE id = (SELECT id FROM pgqueue_jobs WHERE id = $1 AND status = $3 FOR UPDATE SKIP LOCKED)
RETURNING payload::text AS payload, priority
"""


async def _claim(connection: Any, job_id: int) -> asyncpg.Record | None:
    record: asyncpg.Record | None = await connection.fetchrow(
        CLAIM, job_id, Status.RUNNING, Status.PENDING
    )
    return record


async def test_update_changes_each_field_given(
    pool: asyncpg.Pool, dsn: str, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name)
    later = datetime.now(UTC) + timedelta(days=1)
    job_id = await queue.enqueue("task", {"a": 1}, run_at=later)
    admin = pgqueue.Admin(pool)
    soon = datetime.now(UTC) + timedelta(minutes=5)
    async with listening(dsn, pgqueue.JOBS_CHANNEL) as woken:
        job = await admin.update(
            job_id, payload=[1, "two"], priority=-3, run_at=soon, max_attempts=9
        )
        await woken.wait_for(queue_name)
    assert (job.payload, job.priority, job.run_at, job.max_attempts) == (
        [1, "two"],
        -3,
        soon,
        9,
    )
    # A field left out (None) is kept.
    job = await admin.update(job_id, group="tenant-1")
    assert (job.payload, job.priority) == ([1, "two"], -3)
    assert (await row(pool, job_id))["group_key"] == "tenant-1"
    assert job.status == Status.PENDING


async def test_a_waiting_job_is_updated_and_takes_no_group(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name)
    parent = await queue.enqueue("parent", {})
    child = await queue.enqueue("child", {"v": 1}, after=[parent])
    admin = pgqueue.Admin(pool)
    job = await admin.update(child, payload={"v": 2}, priority=5)
    assert (job.status, job.payload, job.priority) == (Status.WAITING, {"v": 2}, 5)
    before = await row(pool, child)
    with pytest.raises(ValueError, match="parents"):
        await admin.update(child, group="g")
    assert await row(pool, child) == before


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({}, ValueError),
        ({"priority": 6}, ValueError),
        ({"priority": "1"}, TypeError),
        ({"run_at": datetime(2026, 1, 1)}, ValueError),
        ({"group": ""}, ValueError),
        ({"max_attempts": 0}, ValueError),
        ({"payload": {"bad": object()}}, TypeError),
        ({"payload": "nul \x00"}, ValueError),
    ],
)
async def test_bad_input_raises_before_any_sql(
    pool: asyncpg.Pool, queue_name: str, fields: dict[str, Any], error: type
) -> None:
    job_id = await pgqueue.Queue(pool, name=queue_name).enqueue("task", {"a": 1})
    before = await rows(pool, queue_name)
    with pytest.raises(error):
        await pgqueue.Admin(pool).update(job_id, **fields)
    assert await rows(pool, queue_name) == before


async def test_an_unknown_id_and_a_started_job_are_refused(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    admin = pgqueue.Admin(pool)
    with pytest.raises(JobNotFoundError):
        await admin.update(2**62, priority=1)
    job_id = await pgqueue.Queue(pool, name=queue_name).enqueue("task", {})
    assert await _claim(pool, job_id) is not None
    with pytest.raises(JobStateError, match="is running") as refused:
        await admin.update(job_id, priority=1)
    assert isinstance(refused.value, pgqueue.PgQueueError)
    assert (refused.value.job_id, refused.value.status) == (job_id, Status.RUNNING)
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = $2 WHERE id = $1", job_id, Status.DEAD
    )
    with pytest.raises(JobStateError, match="is dead"):
        await admin.update(job_id, priority=1)


async def _blocked_by(pool: asyncpg.Pool, pid: int) -> bool:
    """Whether a session waits for a lock ``pid`` holds."""
    found: bool = await pool.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)))",
        pid,
    )
    return found


async def test_a_claim_first_makes_the_update_wait_then_refuse(
    pool: asyncpg.Pool, dsn: str, queue_name: str
) -> None:
    job_id = await pgqueue.Queue(pool, name=queue_name).enqueue("task", {"v": 1})
    admin = pgqueue.Admin(pool)
    refused: list[JobStateError] = []

    async def update() -> None:
        with pytest.raises(JobStateError) as caught:
            await admin.update(job_id, payload={"v": 2})
        refused.append(caught.value)

    claimer = await asyncpg.connect(dsn)
    try:
        async with anyio.create_task_group() as tasks:
            claim = claimer.transaction()
            await claim.start()
            taken = await _claim(claimer, job_id)
            assert taken is not None
            tasks.start_soon(update)
            pid = claimer.get_server_pid()
            await wait_until(lambda: _blocked_by(pool, pid))
            await claim.commit()
    finally:
        await claimer.close()
    assert refused[0].status == Status.RUNNING
    assert taken is not None
    assert json.loads(taken["payload"]) == {"v": 1}
    final = await admin.job(job_id)
    assert final is not None
    assert (final.status, final.payload) == (Status.RUNNING, {"v": 1})


async def test_an_update_first_is_what_the_claim_then_takes(
    pool: asyncpg.Pool, dsn: str, queue_name: str
) -> None:
    job_id = await pgqueue.Queue(pool, name=queue_name).enqueue("task", {"v": 1})
    claimer = await asyncpg.connect(dsn)
    try:
        async with pool.acquire() as connection, connection.transaction():
            await pgqueue.Admin(connection).update(job_id, payload={"v": 2}, priority=4)
            # The row is locked until the update commits: the claim skips it.
            assert await _claim(claimer, job_id) is None
        taken = await _claim(claimer, job_id)
    finally:
        await claimer.close()
    assert taken is not None
    assert (json.loads(taken["payload"]), taken["priority"]) == ({"v": 2}, 4)


async def test_update_and_claim_started_together_one_wins(
    pool: asyncpg.Pool, dsn: str, queue_name: str
) -> None:
    """Started at once, 20 times: the update lands before the claim, or is refused; never after it."""
    queue = pgqueue.Queue(pool, name=queue_name)
    admin = pgqueue.Admin(pool)
    claimer = await asyncpg.connect(dsn)
    outcomes = []
    try:
        for _ in range(20):
            job_id = await queue.enqueue("task", {"v": 1})
            start = anyio.Event()
            seen: dict[str, Any] = {}

            async def update(
                job_id: int = job_id,
                start: anyio.Event = start,
                seen: dict[str, Any] = seen,
            ) -> None:
                await start.wait()
                try:
                    await admin.update(job_id, payload={"v": 2})
                    seen["update"] = "applied"
                except JobStateError:
                    seen["update"] = "refused"

            async def claim(
                job_id: int = job_id,
                start: anyio.Event = start,
                seen: dict[str, Any] = seen,
            ) -> None:
                await start.wait()
                async with claimer.transaction():
                    await claimer.execute(
                        "SELECT 1 FROM pgqueue_jobs WHERE id = $1 FOR UPDATE", job_id
                    )
                    seen["claim"] = await _claim(claimer, job_id)

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(update)
                tasks.start_soon(claim)
                start.set()
            taken = seen["claim"]
            assert taken is not None
            claimed_payload = json.loads(taken["payload"])
            final = await admin.job(job_id)
            assert final is not None
            assert final.status == Status.RUNNING
            if seen["update"] == "applied":
                assert claimed_payload == final.payload == {"v": 2}
            else:
                assert claimed_payload == final.payload == {"v": 1}
            outcomes.append(seen["update"])
    finally:
        await claimer.close()
    assert set(outcomes) <= {"applied", "refused"}
