"""Replace and debounce on unique keys: ``on_conflict="replace"`` and ``debounce=``.

On a real server: a pending job takes the new payload and options; a
running one is left alone and the new job waits for it, then runs (claimed
by our worker or the Go module's statements); debounce pushes ``run_at``
and keeps the last payload; bad arguments write nothing. The races are
forced: one transaction holds its write open while the other is seen
waiting for its lock in ``pg_locks``, then commits.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgqueue
from tests.go_module import GO_CLAIM, GO_COMPLETE
from tests.helpers import queue_count, row, running, wait_for_row, wait_until

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable


async def _live(pool: asyncpg.Pool, key: str) -> list[dict[str, Any]]:
    """The jobs of type "t" and ``key`` that are not finished, by id."""
    records = await pool.fetch(
        "SELECT id, status, payload::text AS payload, priority, run_at, queue"
        " FROM pgqueue_jobs WHERE job_type = 't' AND unique_key = $1"
        " AND status IN ('pending', 'running', 'waiting') ORDER BY id",
        key,
    )
    return [{**dict(r), "payload": json.loads(r["payload"])} for r in records]


async def _go_claim(executor: Any, queue: str) -> dict[int, int]:
    """What the Go module's claim takes from ``queue`` (on a pool or a connection): id -> attempts."""
    return {r["id"]: r["attempts"] for r in await executor.fetch(GO_CLAIM, queue, 10)}


@pytest.fixture
def key(queue_name: str) -> str:
    """A unique key of this test's own (keys are not scoped to a queue)."""
    return queue_name


# -- replace ------------------------------------------------------------------


async def test_replace_gives_a_pending_job_the_new_payload_priority_and_run_at(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    first = await queue.enqueue("t", {"v": 1}, unique_key=key, delay=3600)
    later = datetime.now(UTC) + timedelta(hours=2)
    again = await queue.enqueue(
        "t", {"v": 2}, unique_key=key, on_conflict="replace", priority=3, run_at=later
    )
    assert again == first
    (job,) = await _live(pool, key)
    assert (job["id"], job["status"], job["payload"], job["priority"]) == (
        first,
        "pending",
        {"v": 2},
        3,
    )
    assert job["run_at"] == later
    assert await queue_count(pool, queue.name) == 1


async def test_replace_without_a_live_job_inserts_one(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    job_id = await queue.enqueue("t", {"v": 1}, unique_key=key, on_conflict="replace")
    assert [j["id"] for j in await _live(pool, key)] == [job_id]


async def test_return_and_raise_keep_their_meaning_beside_replace(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    first = await queue.enqueue("t", {"v": 1}, unique_key=key, delay=3600)
    assert await queue.enqueue("t", {"v": 2}, unique_key=key) == first
    with pytest.raises(pgqueue.DuplicateJobError) as caught:
        await queue.enqueue("t", {"v": 3}, unique_key=key, on_conflict="raise")
    assert caught.value.job_id == first
    ((job,),) = [await _live(pool, key)]
    assert job["payload"] == {"v": 1}


async def test_replace_on_a_running_job_queues_one_that_runs_after_it(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    first = await queue.enqueue("t", {"v": 1}, unique_key=key)
    assert await _go_claim(pool, queue.name) == {first: 1}
    # The running job is left alone; the new one waits for it, and later
    # replaces change the waiting one.
    second = await queue.enqueue("t", {"v": 2}, unique_key=key, on_conflict="replace")
    third = await queue.enqueue("t", {"v": 3}, unique_key=key, on_conflict="replace")
    assert second == third != first
    live = await _live(pool, key)
    assert [(j["id"], j["status"], j["payload"]) for j in live] == [
        (first, "running", {"v": 1}),
        (second, "waiting", {"v": 3}),
    ]
    # No claim takes it while the first runs (a Go worker's neither).
    assert await _go_claim(pool, queue.name) == {}
    # A plain duplicate still gets the running job's id.
    assert await queue.enqueue("t", {}, unique_key=key) == first
    # The Go worker completes the first: the next one is pending, and
    # claimable by the Go worker.
    await pool.execute(GO_COMPLETE, first, 1)
    await wait_for_row(pool, second, status="pending")
    assert await _go_claim(pool, queue.name) == {second: 1}


async def test_replace_after_a_failed_attempt_leaves_the_retry_alone(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    ran: list[Any] = []
    failed = anyio.Event()

    def worker() -> pgqueue.Worker:
        made = pgqueue.Worker(
            pool, queue=queue.name, poll_interval=0.05, backoff=lambda _a: 3600
        )

        @made.handler("t")
        async def handle(job: pgqueue.Job) -> None:
            ran.append(job.payload)
            if job.payload == {"v": 1}:
                failed.set()
                raise RuntimeError("first attempt fails")

        return made

    first = await queue.enqueue("t", {"v": 1}, unique_key=key)
    async with running(worker()):
        with anyio.fail_after(10):
            await failed.wait()
        await wait_for_row(pool, first, status="pending", attempts=1)
    # Pending for its retry (an hour away): it has started, so it is kept.
    second = await queue.enqueue("t", {"v": 2}, unique_key=key, on_conflict="replace")
    assert second != first
    live = await _live(pool, key)
    assert [(j["id"], j["status"], j["payload"]) for j in live] == [
        (first, "pending", {"v": 1}),
        (second, "waiting", {"v": 2}),
    ]
    await queue.cancel(first)
    await wait_for_row(pool, second, status="pending")
    async with running(worker()):
        await wait_for_row(pool, second, status="completed")
    assert ran == [{"v": 1}, {"v": 2}]


@pytest.mark.parametrize("on_conflict", ["replace", "return", "raise"])
async def test_a_key_is_a_queues_own_another_queues_job_is_never_touched_or_told(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str, on_conflict: str
) -> None:
    other = pgqueue.Queue(pool, name=f"{queue.name}-other")
    theirs = await other.enqueue("t", {"v": 1}, unique_key=key, delay=60)
    ours = await queue.enqueue(
        "t",
        {"v": 2},
        unique_key=key,
        on_conflict=on_conflict,  # type: ignore[arg-type]
    )
    assert ours != theirs
    jobs = {job["id"]: (job["queue"], job["payload"]) for job in await _live(pool, key)}
    assert jobs == {theirs: (other.name, {"v": 1}), ours: (queue.name, {"v": 2})}


async def test_a_replaced_job_due_now_wakes_an_idle_worker(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    started = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        started.set()

    first = await queue.enqueue("t", {"v": 1}, unique_key=key, delay=3600)
    async with running(worker):
        assert (
            await queue.enqueue("t", {"v": 2}, unique_key=key, on_conflict="replace")
            == first
        )
        with anyio.fail_after(5):  # the poll is a minute away
            await started.wait()


# -- debounce -----------------------------------------------------------------


async def test_debounce_pushes_run_at_and_keeps_the_last_payload(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    ids = []
    for n in range(3):
        async with pool.acquire() as conn, conn.transaction():
            ids.append(
                await queue.enqueue(
                    "t", {"n": n}, unique_key=key, debounce=5.0, connection=conn
                )
            )
            started = await conn.fetchval("SELECT now()")
        (job,) = await _live(pool, key)
        # Five seconds after this enqueue's now(), whatever came before.
        assert job["run_at"] == started + timedelta(seconds=5)
        assert job["payload"] == {"n": n}
    assert len(set(ids)) == 1


async def test_a_debounced_job_runs_once_with_the_last_payload_after_the_quiet_time(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    ran: list[tuple[Any, datetime]] = []
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=0.05)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        ran.append((job.payload, await pool.fetchval("SELECT now()")))

    async with running(worker):
        for n in range(5):
            job_id = await queue.enqueue(
                "t", {"n": n}, unique_key=key, debounce=timedelta(seconds=0.5)
            )
        last = await pool.fetchval(
            "SELECT run_at FROM pgqueue_jobs WHERE id = $1", job_id
        )
        await wait_for_row(pool, job_id, status="completed")
    ((payload, at),) = ran
    assert payload == {"n": 4}
    assert at >= last


async def test_debounce_while_running_queues_one_more_run(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    first = await queue.enqueue("t", {"n": 0}, unique_key=key, debounce=0.001)
    await wait_until(
        lambda: pool.fetchval(
            "SELECT run_at <= now() FROM pgqueue_jobs WHERE id = $1", first
        )
    )
    assert await _go_claim(pool, queue.name) == {first: 1}
    second = await queue.enqueue("t", {"n": 1}, unique_key=key, debounce=60)
    third = await queue.enqueue("t", {"n": 2}, unique_key=key, debounce=60)
    assert second == third != first
    await pool.execute(GO_COMPLETE, first, 1)
    job = await wait_for_row(pool, second, status="pending")
    assert json.loads(job["payload"]) == {"n": 2}
    assert job["run_at"] > datetime.now(UTC) + timedelta(seconds=30)


async def test_a_worker_runs_the_queued_job_after_the_running_one_never_beside_it(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    started, release = anyio.Event(), anyio.Event()
    log: list[tuple[str, int]] = []
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=4, poll_interval=0.05)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        log.append(("start", job.payload["v"]))
        if job.payload["v"] == 1:
            started.set()
            await release.wait()
        log.append(("end", job.payload["v"]))

    async with running(worker):
        first = await queue.enqueue("t", {"v": 1}, unique_key=key)
        with anyio.fail_after(10):
            await started.wait()
        second = await queue.enqueue("t", {"v": 2}, unique_key=key, debounce=0.01)
        third = await queue.enqueue("t", {"v": 3}, unique_key=key, debounce=0.01)
        assert second == third != first
        # Due for a while (the worker has polled several times): still waiting.
        await wait_until(
            lambda: pool.fetchval(
                "SELECT run_at < now() - interval '0.3 s' FROM pgqueue_jobs WHERE id = $1",
                second,
            )
        )
        assert (await row(pool, second))["status"] == "waiting"
        release.set()
        await wait_for_row(pool, second, status="completed")
    assert log == [("start", 1), ("end", 1), ("start", 3), ("end", 3)]


# -- enqueue_many -------------------------------------------------------------


async def test_enqueue_many_replace_and_debounce(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    first = await queue.enqueue("t", {"v": 1}, unique_key=key + "a", delay=3600)
    kept = await queue.enqueue("t", {"v": 1}, unique_key=key + "b", delay=3600)
    ids = await queue.enqueue_many(
        [
            pgqueue.NewJob("t", {"v": 2}, unique_key=key + "a"),
            ("t", {"plain": True}),
            pgqueue.NewJob("t", {"v": 3}, unique_key=key + "c"),
            pgqueue.NewJob("t", {"v": 4}, unique_key=key + "c", priority=2),
        ],
        on_conflict="replace",
    )
    assert ids[0] == first
    assert ids[2] == ids[3] not in (first, ids[1])
    assert [j["payload"] for j in await _live(pool, key + "a")] == [{"v": 2}]
    ((c,),) = [await _live(pool, key + "c")]
    assert (c["payload"], c["priority"]) == ({"v": 4}, 2)  # the call's last one
    # debounce in a call without on_conflict: only that job replaces.
    ids = await queue.enqueue_many(
        [
            pgqueue.NewJob("t", {"v": 5}, unique_key=key + "a", debounce=30),
            pgqueue.NewJob("t", {"v": 5}, unique_key=key + "b"),
        ]
    )
    assert ids == [first, kept]
    ((a,),) = [await _live(pool, key + "a")]
    ((b,),) = [await _live(pool, key + "b")]
    assert (a["payload"], b["payload"]) == ({"v": 5}, {"v": 1})
    assert a["run_at"] < datetime.now(UTC) + timedelta(seconds=31)


async def test_enqueue_many_replace_of_a_running_job_queues_after_it(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    first = await queue.enqueue("t", {"v": 1}, unique_key=key)
    await _go_claim(pool, queue.name)
    (second,) = await queue.enqueue_many(
        [pgqueue.NewJob("t", {"v": 2}, unique_key=key)], on_conflict="replace"
    )
    live = await _live(pool, key)
    assert [(j["id"], j["status"]) for j in live] == [
        (first, "running"),
        (second, "waiting"),
    ]


async def test_hooks_see_a_replace_as_a_duplicate_and_a_queued_job_as_new(
    pool: asyncpg.Pool, queue_name: str, key: str
) -> None:
    events: list[pgqueue.EnqueueEvent] = []

    class Hook:
        def before_enqueue(self, event: pgqueue.EnqueueEvent) -> None:
            events.append(event)

        def after_enqueue(
            self, event: pgqueue.EnqueueEvent, state: Any, error: BaseException | None
        ) -> None:
            assert error is None

    queue = pgqueue.Queue(pool, name=queue_name, hooks=[Hook()])
    first = await queue.enqueue("t", {}, unique_key=key, delay=60)
    await queue.enqueue("t", {}, unique_key=key, debounce=5)
    assert [e.duplicates for e in events] == [[False], [True]]
    assert events[1].jobs[0].debounce == 5
    assert events[1].ids == [first]


# -- bad input ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"on_conflict": "replace"}, ValueError, "needs a unique_key"),
        ({"debounce": 5}, ValueError, "debounce needs a unique_key"),
        ({"unique_key": "bad", "debounce": 0}, ValueError, "more than 0"),
        ({"unique_key": "bad", "debounce": -1}, ValueError, "non-negative"),
        ({"unique_key": "bad", "debounce": float("nan")}, ValueError, "finite"),
        (
            {"unique_key": "bad", "debounce": "5"},
            TypeError,
            "debounce must be a number",
        ),
        (
            {"unique_key": "bad", "debounce": True},
            TypeError,
            "debounce must be a number",
        ),
        ({"unique_key": "bad", "debounce": 5, "delay": 1}, ValueError, "not both"),
        (
            {"unique_key": "bad", "debounce": 5, "run_at": datetime.now(UTC)},
            ValueError,
            "not both",
        ),
        (
            {"unique_key": "bad", "debounce": 5, "on_conflict": "raise"},
            ValueError,
            'on_conflict="raise"',
        ),
        ({"unique_key": "bad", "on_conflict": "ignore"}, ValueError, '"replace"'),
    ],
)
async def test_bad_arguments_write_nothing(
    pool: asyncpg.Pool,
    queue: pgqueue.Queue,
    kwargs: dict[str, Any],
    error: type[Exception],
    fragment: str,
) -> None:
    with pytest.raises(error, match=fragment):
        await queue.enqueue("t", {}, **kwargs)
    conflict = kwargs.pop("on_conflict", "return")
    if kwargs.get("debounce") is not None:
        # As a NewJob of an enqueue_many call, after a good job: nothing written.
        with pytest.raises(error, match=f"job 1: .*{fragment}"):
            await queue.enqueue_many(
                [("t", {}), pgqueue.NewJob("t", {}, **kwargs)], on_conflict=conflict
            )
    assert await queue_count(pool, queue.name) == 0


async def test_enqueue_many_refuses_an_unknown_on_conflict_and_debounce_with_raise(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    with pytest.raises(ValueError, match='"replace"'):
        await queue.enqueue_many([("t", {})], on_conflict="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="job 0: debounce"):
        await queue.enqueue_many(
            [pgqueue.NewJob("t", {}, unique_key=key, debounce=1)], on_conflict="raise"
        )
    # A call's replace applies to its jobs with a key only.
    await queue.enqueue_many([("t", {})], on_conflict="replace")
    assert await queue_count(pool, queue.name) == 1


# -- races --------------------------------------------------------------------


async def _waiting_for_a_lock(pool: asyncpg.Pool, pid: int) -> bool:
    """Whether backend ``pid`` waits for a lock another transaction holds."""
    waiting: bool = await pool.fetchval(
        "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND NOT granted)", pid
    )
    return waiting


async def _interleave(
    pool: asyncpg.Pool,
    first: Callable[[Any], Awaitable[Any]],
    second: Callable[[Any], Awaitable[Any]],
) -> tuple[Any, Any]:
    """Run ``first`` in a transaction left open until ``second`` (on another
    connection, by itself) is seen waiting for its locks; then commit.
    Their results."""
    results: list[Any] = []
    async with pool.acquire() as a, pool.acquire() as b:
        pid = await b.fetchval("SELECT pg_backend_pid()")
        transaction = a.transaction()
        await transaction.start()
        committed = False
        try:
            results.append(await first(a))

            async def run_second() -> None:
                results.append(await second(b))

            async with anyio.create_task_group() as tg:
                tg.start_soon(run_second)
                await wait_until(lambda: _waiting_for_a_lock(pool, pid))
                await transaction.commit()
                committed = True
        finally:
            if not committed:
                await transaction.rollback()
    return results[0], results[1]


@pytest.mark.parametrize("state", ["none", "pending", "running"])
async def test_two_replacing_enqueues_of_one_key_at_once_leave_one_job_to_run(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str, state: str
) -> None:
    held = None
    if state != "none":
        held = await queue.enqueue("t", {"by": "before"}, unique_key=key)
    if state == "running":
        assert await _go_claim(pool, queue.name) == {held: 1}

    def replace(by: str) -> Callable[[Any], Awaitable[int]]:
        return lambda conn: queue.enqueue(
            "t", {"by": by}, unique_key=key, debounce=60, connection=conn
        )

    a, b = await _interleave(pool, replace("a"), replace("b"))
    assert a == b
    live = [(j["id"], j["status"], j["payload"]) for j in await _live(pool, key)]
    if state == "running":
        assert live == [
            (held, "running", {"by": "before"}),
            (a, "waiting", {"by": "b"}),
        ]
    else:
        assert live == [(a, "pending", {"by": "b"})]
        assert state == "none" or a == held


async def test_a_replace_waiting_for_a_claim_queues_after_the_claimed_job(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    held = await queue.enqueue("t", {"v": 1}, unique_key=key)
    claimed, queued = await _interleave(
        pool,
        lambda conn: _go_claim(conn, queue.name),
        lambda conn: queue.enqueue(
            "t", {"v": 2}, unique_key=key, on_conflict="replace", connection=conn
        ),
    )
    assert claimed == {held: 1}
    live = [(j["id"], j["status"], j["payload"]) for j in await _live(pool, key)]
    assert live == [(held, "running", {"v": 1}), (queued, "waiting", {"v": 2})]


async def test_a_claim_skips_a_job_being_replaced_and_takes_it_replaced(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    held = await queue.enqueue("t", {"v": 1}, unique_key=key)
    async with pool.acquire() as conn, conn.transaction():
        assert (
            await queue.enqueue(
                "t", {"v": 2}, unique_key=key, on_conflict="replace", connection=conn
            )
            == held
        )
        # Locked by the replace: the claim skips it rather than wait.
        assert await _go_claim(pool, queue.name) == {}
    assert await _go_claim(pool, queue.name) == {held: 1}
    ((job,),) = [await _live(pool, key)]
    assert (job["status"], job["payload"]) == ("running", {"v": 2})


async def test_a_replace_waiting_for_the_running_job_to_complete_inserts_a_new_one(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    held = await queue.enqueue("t", {"v": 1}, unique_key=key)
    await _go_claim(pool, queue.name)
    _, new = await _interleave(
        pool,
        lambda conn: conn.execute(GO_COMPLETE, held, 1),
        lambda conn: queue.enqueue(
            "t", {"v": 2}, unique_key=key, on_conflict="replace", connection=conn
        ),
    )
    assert new != held
    live = [(j["id"], j["status"], j["payload"]) for j in await _live(pool, key)]
    assert live == [(new, "pending", {"v": 2})]


async def test_a_completion_waiting_for_a_replace_releases_the_queued_job(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    held = await queue.enqueue("t", {"v": 1}, unique_key=key)
    await _go_claim(pool, queue.name)
    queued, _ = await _interleave(
        pool,
        lambda conn: queue.enqueue(
            "t", {"v": 2}, unique_key=key, on_conflict="replace", connection=conn
        ),
        lambda conn: conn.execute(GO_COMPLETE, held, 1),
    )
    assert queued != held
    live = [(j["id"], j["status"], j["payload"]) for j in await _live(pool, key)]
    assert live == [(queued, "pending", {"v": 2})]
    assert await _go_claim(pool, queue.name) == {queued: 1}


# -- the other producers ----------------------------------------------------


async def test_pgqueue_enqueue_in_sql_replaces_and_debounces(
    pool: asyncpg.Pool, queue_name: str, key: str
) -> None:
    call = (
        "SELECT pgqueue_enqueue('t', $1::jsonb, queue => $2, unique_key => $3,"
        " on_conflict => 'replace', delay => $4::interval)"
    )
    first = await pool.fetchval(call, '{"v": 1}', queue_name, key, timedelta(hours=1))
    async with pool.acquire() as conn, conn.transaction():
        again = await conn.fetchval(
            call, '{"v": 2}', queue_name, key, timedelta(seconds=5)
        )
        started = await conn.fetchval("SELECT now()")
    assert again == first
    ((job,),) = [await _live(pool, key)]
    assert (job["payload"], job["run_at"]) == ({"v": 2}, started + timedelta(seconds=5))
    assert await pool.fetchval(call, '{"v": 3}', queue_name, key, None) == first
    assert await _go_claim(pool, queue_name) == {first: 1}
    queued = await pool.fetchval(call, '{"v": 4}', queue_name, key, None)
    assert [(j["id"], j["status"]) for j in await _live(pool, key)] == [
        (first, "running"),
        (queued, "waiting"),
    ]


async def test_the_sync_queue_and_the_sqlalchemy_helpers_replace_and_debounce(
    pool: asyncpg.Pool, dsn: str, queue_name: str, key: str
) -> None:
    import psycopg
    import sqlalchemy as sa

    import pgqueue.sqlalchemy
    import pgqueue.sync

    with psycopg.connect(dsn, autocommit=True) as conn:
        queue = pgqueue.sync.Queue(conn, queue_name)
        first = queue.enqueue("t", {"v": 1}, unique_key=key, delay=60)
        assert queue.enqueue("t", {"v": 2}, unique_key=key, debounce=5) == first
        assert queue.enqueue_many(
            [pgqueue.NewJob("t", {"v": 3}, unique_key=key)], on_conflict="replace"
        ) == [first]
        with pytest.raises(ValueError, match="debounce needs a unique_key"):
            queue.enqueue("t", {}, debounce=5)
    assert [j["payload"] for j in await _live(pool, key)] == [{"v": 3}]

    engine = sa.create_engine(sa.make_url(dsn).set(drivername="postgresql+psycopg"))
    try:
        with engine.begin() as conn:
            assert (
                pgqueue.sqlalchemy.enqueue_sync(
                    conn, "t", {"v": 4}, queue=queue_name, unique_key=key, debounce=5
                )
                == first
            )
    finally:
        engine.dispose()
    assert [j["payload"] for j in await _live(pool, key)] == [{"v": 4}]


@dataclasses.dataclass
class Reindex:
    v: int


async def test_a_job_type_enqueues_with_debounce(
    pool: asyncpg.Pool, queue: pgqueue.Queue, key: str
) -> None:
    reindex = pgqueue.JobType("t", Reindex)
    first = await reindex.enqueue(queue, Reindex(1), unique_key=key, debounce=5)
    assert await reindex.enqueue(queue, Reindex(2), unique_key=key, debounce=5) == first
    assert [j["payload"] for j in await _live(pool, key)] == [{"v": 2}]


async def test_a_schema_without_the_replacing_function_says_to_upgrade(
    fresh_dsn: str,
) -> None:
    import psycopg

    import pgqueue.sync

    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=2) as pool:
        await pgqueue.install(pool)
        await pool.execute(
            "DROP FUNCTION pgqueue_enqueue_replace(text, text, jsonb, int, timestamptz,"
            " int, boolean, text, text, boolean, boolean, text)"
        )
        queue = pgqueue.Queue(pool, name="q")
        with pytest.raises(pgqueue.SchemaError, match="SCHEMA_UPGRADE") as caught:
            await queue.enqueue("t", {}, unique_key="k", debounce=1)
        assert caught.value.where is not None
        with pytest.raises(pgqueue.SchemaError, match="pgqueue_enqueue_replace"):
            await queue.enqueue_many(
                [pgqueue.NewJob("t", {}, unique_key="k")], on_conflict="replace"
            )
        with (
            psycopg.connect(fresh_dsn, autocommit=True) as conn,
            pytest.raises(pgqueue.SchemaError, match="SCHEMA_UPGRADE"),
        ):
            pgqueue.sync.Queue(conn, "q").enqueue("t", {}, unique_key="k", debounce=1)
        # Unique keys need it too (a producer's enqueues with keys go through
        # it); plain enqueues do not. The upgrade brings it back.
        with pytest.raises(pgqueue.SchemaError, match="pgqueue_enqueue_replace"):
            await queue.enqueue("t", {}, unique_key="k")
        assert await queue.enqueue("t", {}) > 0
        await pool.execute(pgqueue.SCHEMA_UPGRADE)
        assert await queue.enqueue("t", {}, unique_key="k", debounce=1) > 0


async def test_pgqueue_enqueue_on_the_command_line_replaces_and_debounces(
    pool: asyncpg.Pool, dsn: str, queue_name: str, key: str
) -> None:
    from tests.test_cli import EXIT_OK, EXIT_USAGE, cli

    def enqueue(payload: str, *flags: str) -> Awaitable[Any]:
        return cli(dsn, "enqueue", "t", payload, "--queue", queue_name, *flags)

    first = await enqueue('{"v": 1}', "--unique-key", key, "--debounce", "1h")
    assert first.code == EXIT_OK, first
    again = await enqueue('{"v": 2}', "--unique-key", key, "--debounce", "90s")
    replaced = await enqueue('{"v": 3}', "--unique-key", key, "--replace", "--in", "1h")
    assert first.out == again.out == replaced.out
    assert [j["payload"] for j in await _live(pool, key)] == [{"v": 3}]
    refused = await enqueue("{}", "--debounce", "1m")
    assert refused.code == EXIT_USAGE
    assert "debounce needs a unique_key" in refused.err
