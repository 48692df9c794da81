"""The bulk actions of `pgqueue.Admin` on the jobs a `JobFilter` matches, on a real server.

retry, cancel, delete, move and redrive: a dry run counts what the action
then changes; running jobs are never moved or deleted; ``rate`` paces the
batches; an interrupted action run again finishes the job, each job acted
on once.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, TypeAlias

import anyio
import pytest

import pgqueue
from pgqueue import JobFilter, Status
from tests.helpers import listening, rows

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    import asyncpg


async def _set_status(pool: asyncpg.Pool, ids: list[int], status: Status) -> None:
    """Write ``status`` as the writer of that status would (a claim: attempts and claimed_at)."""
    running = status == Status.RUNNING
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = $2,"
        " attempts = CASE WHEN $3 THEN attempts + 1 ELSE max_attempts END,"
        " claimed_at = CASE WHEN $3 THEN now() END,"
        " last_error = CASE WHEN $3 THEN NULL ELSE 'boom' END"
        " WHERE id = ANY($1::bigint[])",
        ids,
        status,
        running,
    )


async def _mixed(pool: asyncpg.Pool, queue: str) -> dict[Status, list[int]]:
    """A queue of jobs in every status but waiting: their ids by status."""
    ids = await pgqueue.Queue(pool, name=queue).enqueue_many(
        [("task", {"n": n, "user_id": n % 2}) for n in range(16)]
    )
    by_status = {
        Status.DEAD: ids[0:5],
        Status.CANCELLED: ids[5:8],
        Status.RUNNING: ids[8:10],
        Status.COMPLETED: ids[10:12],
        Status.PENDING: ids[12:16],
    }
    for status, some in by_status.items():
        if status != Status.PENDING:
            await _set_status(pool, some, status)
    return by_status


Act: TypeAlias = "Callable[[pgqueue.Admin, JobFilter, bool], Awaitable[int]]"

ACTIONS: dict[str, tuple[Act, set[Status]]] = {
    "retry": (
        lambda admin, found, dry: admin.retry(filter=found, dry_run=dry),
        {Status.DEAD, Status.CANCELLED},
    ),
    "redrive": (
        lambda admin, found, dry: admin.redrive(
            filter=found, to_queue=f"{found.queue}-2", dry_run=dry
        ),
        {Status.DEAD, Status.CANCELLED},
    ),
    "cancel": (
        lambda admin, found, dry: admin.cancel(filter=found, dry_run=dry),
        {Status.PENDING, Status.RUNNING},
    ),
    "delete": (
        lambda admin, found, dry: admin.delete(filter=found, dry_run=dry),
        {Status.DEAD, Status.CANCELLED, Status.COMPLETED, Status.PENDING},
    ),
    "move": (
        lambda admin, found, dry: admin.move(
            filter=found, to_queue=f"{found.queue}-2", dry_run=dry
        ),
        {Status.DEAD, Status.CANCELLED, Status.COMPLETED, Status.PENDING},
    ),
}


@pytest.mark.parametrize("action", sorted(ACTIONS))
async def test_a_dry_run_counts_what_the_action_then_changes(
    pool: asyncpg.Pool, queue_name: str, action: str
) -> None:
    by_status = await _mixed(pool, queue_name)
    act, acted_on = ACTIONS[action]
    admin = pgqueue.Admin(pool)
    before = await rows(pool, queue_name)
    found = JobFilter(queue=queue_name)
    counted = await act(admin, found, True)
    assert await rows(pool, queue_name) == before  # the dry run wrote nothing
    changed = await act(admin, found, False)
    assert counted == changed == sum(len(by_status[s]) for s in acted_on)
    after = {r["id"]: r for r in await rows(pool, queue_name)}
    # Running jobs are never moved or deleted (a cancel asks them to stop).
    for job_id in by_status[Status.RUNNING]:
        assert after[job_id]["status"] == Status.RUNNING
        assert after[job_id]["cancel_requested"] == (action == "cancel")
    # Nothing else was touched.
    untouched = [i for s, some in by_status.items() if s not in acted_on for i in some]
    old = {r["id"]: r for r in before}
    for job_id in untouched:
        if job_id not in by_status[Status.RUNNING]:
            assert after[job_id] == old[job_id]
    # Run again, the action finds nothing left to do (but the running jobs
    # a cancel asked to stop, which it would ask again).
    left = len(by_status[Status.RUNNING]) if action == "cancel" else 0
    assert await act(admin, found, True) == left


async def test_each_action_acts_as_its_by_id_form(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    by_status = await _mixed(pool, queue_name)
    admin = pgqueue.Admin(pool)
    user_0 = JobFilter(queue=queue_name, payload={"user_id": 0})
    assert (
        await admin.retry(filter=user_0, attempts=2) == 4
    )  # dead 0, 2, 4; cancelled 6
    for job_id in (*by_status[Status.DEAD], *by_status[Status.CANCELLED]):
        job = await admin.job(job_id)
        assert job is not None
        n = job.payload["n"]
        if n % 2 == 0:
            assert (job.status, job.max_attempts) == (Status.PENDING, job.attempts + 2)
        else:
            assert job.status in (Status.DEAD, Status.CANCELLED)
    assert await admin.cancel(filter=JobFilter(queue=queue_name, status="running")) == 2
    for job_id in by_status[Status.RUNNING]:
        job = await admin.job(job_id)
        assert job is not None
        assert (job.status, job.cancel_requested) == (Status.RUNNING, True)
    # The per-id forms keep their answers.
    dead = by_status[Status.DEAD][1]
    assert await admin.retry(dead) == {dead: "retried"}
    assert await admin.cancel(dead) == {dead: "cancelled"}


@pytest.mark.parametrize(
    ("action", "status"),
    [
        ("retry", "running"),
        ("retry", "pending"),
        ("redrive", "running"),
        ("redrive", "completed"),
        ("cancel", "completed"),
        ("delete", "running"),
        ("move", "running"),
    ],
)
async def test_a_filter_on_a_status_the_action_never_takes_raises(
    pool: asyncpg.Pool, queue_name: str, action: str, status: str
) -> None:
    await _mixed(pool, queue_name)
    before = await rows(pool, queue_name)
    act, _ = ACTIONS[action]
    with pytest.raises(ValueError, match="only"):
        await act(
            pgqueue.Admin(pool), JobFilter(queue=queue_name, status=status), False
        )
    assert await rows(pool, queue_name) == before


async def test_bad_arguments_raise_before_any_sql(pool: asyncpg.Pool) -> None:
    admin = pgqueue.Admin(pool)
    found = JobFilter(queue="nowhere")
    with pytest.raises(TypeError, match="JobFilter"):
        await admin.delete(filter={"queue": "x"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rate"):
        await admin.retry(filter=found, rate=0)
    with pytest.raises(ValueError, match="limit"):
        await admin.cancel(filter=found, limit=0)
    with pytest.raises(TypeError, match="dry_run"):
        await admin.delete(filter=found, dry_run="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        await admin.retry(1, filter=found)  # type: ignore[call-overload]
    with pytest.raises(ValueError, match="queue name"):
        await admin.move(filter=found, to_queue="")


async def test_limit_bounds_the_action_and_its_dry_run(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    by_status = await _mixed(pool, queue_name)
    admin = pgqueue.Admin(pool)
    dead = JobFilter(queue=queue_name, status="dead")
    assert await admin.retry(filter=dead, limit=3, dry_run=True) == 3
    assert await admin.retry(filter=dead, limit=3) == 3
    statuses = [
        r["status"]
        for r in await rows(pool, queue_name)
        if r["id"] in by_status[Status.DEAD]
    ]
    assert statuses == [Status.PENDING] * 3 + [Status.DEAD] * 2  # in id order


async def test_an_interrupted_redrive_run_again_retries_each_job_once(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await pgqueue.Queue(pool, name=queue_name).enqueue_many(
        [("task", {"n": n}) for n in range(300)]
    )
    await _set_status(pool, ids, Status.DEAD)
    admin = pgqueue.Admin(pool)
    dead = JobFilter(queue=queue_name, status="dead")
    # 300 jobs at 200 a second take 1.5 s: stopped at 0.5 s, part is done.
    with anyio.move_on_after(0.5):
        await admin.redrive(filter=dead, rate=200)
    done = sum(r["status"] == Status.PENDING for r in await rows(pool, queue_name))
    assert 0 < done < 300
    assert await admin.redrive(filter=dead) == 300 - done
    after = await rows(pool, queue_name)
    assert {r["status"] for r in after} == {Status.PENDING}
    # Each was retried once: max_attempts raised once, from 5 to 5 + 5.
    assert {r["max_attempts"] for r in after} == {10}


@pytest.mark.slow
@pytest.mark.timeout(60)
async def test_a_redrive_of_2000_dead_jobs_at_500_a_second_takes_about_4_s(
    pool: asyncpg.Pool, dsn: str, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name)
    dead = await queue.enqueue_many([("task", {"n": n}) for n in range(2000)])
    await _set_status(pool, dead, Status.DEAD)
    running = await queue.enqueue_many([("task", {"n": -n}) for n in range(20)])
    await _set_status(pool, running, Status.RUNNING)
    target = queue_name + "-redriven"
    admin = pgqueue.Admin(pool)
    async with listening(dsn, pgqueue.JOBS_CHANNEL) as woken:
        started = time.monotonic()
        count = await admin.redrive(
            filter=JobFilter(queue=queue_name), to_queue=target, rate=500
        )
        elapsed = time.monotonic() - started
        await woken.wait_for(target)
    assert count == 2000
    assert 3.0 <= elapsed <= 8.0, elapsed
    moved = await rows(pool, target)
    assert [r["id"] for r in moved] == dead
    assert {r["status"] for r in moved} == {Status.PENDING}
    left = await rows(pool, queue_name)
    assert [(r["id"], r["status"]) for r in left] == [
        (job_id, Status.RUNNING) for job_id in running
    ]


async def test_delete_keeps_a_parent_whose_child_has_not_finished(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name)
    parent = await queue.enqueue("parent", {})
    child = await queue.enqueue("child", {}, after=[parent])
    admin = pgqueue.Admin(pool)
    everything = JobFilter(queue=queue_name)
    assert await admin.delete(filter=everything) == 1  # the child; its parent stays
    assert [r["id"] for r in await rows(pool, queue_name)] == [parent]
    edges = await pool.fetchval(
        "SELECT count(*) FROM pgqueue_dependencies WHERE child_id = $1", child
    )
    assert edges == 0
    assert await admin.delete(filter=everything) == 1
    assert await rows(pool, queue_name) == []


async def test_move_wakes_the_new_queue_and_leaves_a_key_it_holds(
    pool: asyncpg.Pool, dsn: str, queue_name: str
) -> None:
    source = pgqueue.Queue(pool, name=queue_name)
    target = pgqueue.Queue(pool, name=queue_name + "-to")
    keyed = await source.enqueue("task", {"n": 1}, unique_key="k")
    held = await target.enqueue("task", {"n": 2}, unique_key="k")
    free = await source.enqueue("task", {"n": 3})
    admin = pgqueue.Admin(pool)
    async with listening(dsn, pgqueue.JOBS_CHANNEL) as woken:
        moved = await admin.move(
            filter=JobFilter(queue=queue_name), to_queue=target.name
        )
        await woken.wait_for(target.name)
    assert moved == 1
    assert [r["id"] for r in await rows(pool, queue_name)] == [keyed]
    assert [r["id"] for r in await rows(pool, target.name)] == [held, free]
