"""Fleet-wide limits: ``Worker(pool, queue=..., global_limit=N)``.

At most N jobs of a queue run at once across every worker and process:
the database splits the limit among the workers' leases
(``pgqueue_leases``, taken in turn under the queue's row lock in
``pgqueue_limits``), whose sum never exceeds it, each at most a fair share;
a worker runs jobs within its lease. A crashed worker's lease runs out
after ``rescue_after``; a stopped one gives it back. Against a real server,
with real worker processes; waits are on rows and events, under deadlines.
"""

from __future__ import annotations

import contextlib
import signal
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue._sql.leases import LEASE, LOCK_LIMIT, SEED_LIMIT
from pgqueue._sql.settings import WORKER_SETTINGS
from pgqueue.cli import _processes, build_parser
from tests.cli_apps.limited import SAMPLES, make_worker
from tests.helpers import running, wait_until
from tests.test_cli_worker import started, statuses

if TYPE_CHECKING:
    from pgqueue._engine.lease import Lease

LIMITED = "tests.cli_apps.limited:worker"

# The most runs of the queue ($1) that overlapped, from their recorded
# starts and ends (an end sorts before a start at the same instant; a run
# not ended counts as running still).
MAX_OVERLAP = """
SELECT coalesce(max(live), 0) FROM (
    SELECT sum(d) OVER (ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS live
    FROM (
        SELECT started AS t, 1 AS d FROM limit_samples WHERE queue = $1
        UNION ALL
        SELECT ended, -1 FROM limit_samples WHERE queue = $1 AND ended IS NOT NULL
    ) AS events
) AS running
"""


async def slots_in_use(pool: asyncpg.Pool, queue: str) -> int:
    """The slots the queue's unexpired leases hold."""
    count: int = await pool.fetchval(
        "SELECT coalesce(sum(slots), 0) FROM pgqueue_leases"
        " WHERE queue = $1 AND expires_at >= now()",
        queue,
    )
    return count


async def lease(
    executor: asyncpg.Pool | asyncpg.Connection,
    queue: str,
    worker: str,
    *,
    limit: int = 3,
    wanted: int = 10,
    held: int = 0,
    ttl: float = 60.0,
) -> int:
    """Take or renew ``worker``'s lease of ``queue``, as a worker does; the slots it may fill."""
    async with contextlib.AsyncExitStack() as stack:
        connection = (
            executor
            if isinstance(executor, asyncpg.Connection)
            else await stack.enter_async_context(executor.acquire())
        )
        async with connection.transaction():
            assert await connection.fetchval(LOCK_LIMIT, queue)
            slots: int = await connection.fetchval(
                LEASE, queue, worker, limit, wanted, held, ttl
            )
    return slots


async def recorded(pool: asyncpg.Pool, queue: str) -> dict[str, int]:
    """The slots each worker's lease records."""
    rows = await pool.fetch(
        "SELECT worker, slots FROM pgqueue_leases WHERE queue = $1", queue
    )
    return {row[0]: row[1] for row in rows}


async def samples(pool: asyncpg.Pool, queue: str) -> list[int]:
    """The job id of every run of the queue."""
    records = await pool.fetch(
        "SELECT job_id FROM limit_samples WHERE queue = $1", queue
    )
    return [r[0] for r in records]


async def enqueue(pool: asyncpg.Pool, queue: str, n: int, **payload: Any) -> list[int]:
    await pool.execute(SAMPLES)
    return await pgqueue.Queue(pool, name=queue).enqueue_many([("sample", payload)] * n)


def completed(pool: asyncpg.Pool, queue: str, n: int) -> Any:
    async def check() -> bool:
        return (await statuses(pool, queue))["completed"] >= n

    return check


# --------------------------------------------------------------------------
# Across processes


async def test_eight_processes_never_run_more_than_the_limit(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    # 500 jobs of 5 ms, 3 at a time: about 2 s of work once the workers are up.
    ids = await enqueue(pool, queue_name, 500, sleep=0.005)
    flags = ["--concurrency", "10", "--global-limit", "3", "--poll-interval", "0.05"]
    async with contextlib.AsyncExitStack() as stack:
        children = [
            await stack.enter_async_context(started(dsn, queue_name, LIMITED, *flags))
            for _ in range(8)
        ]
        for child in children:
            await child.wait_for("worker ready", within=30)
        await wait_until(completed(pool, queue_name, 500), within=60)
        for child in children:
            child.process.send_signal(signal.SIGTERM)
        for child in children:
            assert await child.exit_code() == 0, child.text
    assert await pool.fetchval(MAX_OVERLAP, queue_name) <= 3
    ran = await samples(pool, queue_name)
    assert sorted(ran) == sorted(ids)  # every job ran, exactly once
    assert await statuses(pool, queue_name) == {"completed": 500}
    assert await slots_in_use(pool, queue_name) == 0
    # More than one process took part.
    pids = await pool.fetchval(
        "SELECT count(DISTINCT pid) FROM limit_samples WHERE queue = $1", queue_name
    )
    assert pids > 1


async def test_slots_of_a_killed_worker_come_back_after_rescue_after(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    hung = await enqueue(pool, queue_name, 3, hang=True)
    flags = ["--concurrency", "10", "--global-limit", "3", "--rescue-after", "2"]
    async with started(dsn, queue_name, LIMITED, *flags) as child:
        await child.wait_for("worker ready")

        async def holding() -> bool:
            return len(await samples(pool, queue_name)) == 3

        await wait_until(holding)
        assert await slots_in_use(pool, queue_name) == 3
        child.process.kill()
        assert await child.exit_code() == -signal.SIGKILL
    rest = await enqueue(pool, queue_name, 5)
    # The dead worker's lease holds every slot until it runs out.
    left = await pool.fetchval(
        "SELECT extract(epoch FROM max(expires_at) - now())::float8"
        " FROM pgqueue_leases WHERE queue = $1",
        queue_name,
    )
    worker = make_worker(
        pool,
        queue_name,
        concurrency=10,
        global_limit=3,
        rescue_after=2.0,
        poll_interval=0.1,
    )
    async with running(worker):
        with anyio.move_on_after(left - 0.3):
            await wait_until(lambda: _ran(pool, queue_name, 4), within=left)
            pytest.fail("a job ran while the killed worker's lease held every slot")
        await wait_until(completed(pool, queue_name, 8), within=15)
    assert await statuses(pool, queue_name) == {"completed": 8}
    ran = await samples(pool, queue_name)
    assert sorted(set(ran)) == sorted(hung + rest)
    assert await slots_in_use(pool, queue_name) == 0


async def _ran(pool: asyncpg.Pool, queue: str, n: int) -> bool:
    return len(await samples(pool, queue)) >= n


# --------------------------------------------------------------------------
# Leases, in SQL


async def test_racing_leases_never_grant_more_than_the_limit(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    await pool.execute(SEED_LIMIT, queue_name, 3)
    connections = [
        await asyncpg.connect(dsn, server_settings=WORKER_SETTINGS) for _ in range(6)
    ]
    try:
        for round_ in range(10):
            granted: list[int] = []

            async def take(
                connection: asyncpg.Connection, worker: str, granted: list[int]
            ) -> None:
                granted.append(await lease(connection, queue_name, worker))

            async with anyio.create_task_group() as tg:
                for n, connection in enumerate(connections):
                    tg.start_soon(take, connection, f"w{round_}-{n}", granted)
            assert sum(granted) == 3
            assert sum((await recorded(pool, queue_name)).values()) == 3
            await pool.execute(
                "DELETE FROM pgqueue_leases WHERE queue = $1", queue_name
            )
    finally:
        for connection in connections:
            await connection.close()


async def test_a_lease_shrinks_to_its_fair_share_once_its_jobs_end(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    await pool.execute(SEED_LIMIT, queue_name, 3)
    assert await lease(pool, queue_name, "a") == 3  # alone: the whole limit
    assert await lease(pool, queue_name, "b") == 0  # a holds it all
    # a renews while its 3 jobs run: its share is now 2 (3 between two), but
    # its lease keeps the slots of the jobs still running.
    assert await lease(pool, queue_name, "a", held=3) == 2
    assert await recorded(pool, queue_name) == {"a": 3, "b": 0}
    assert await lease(pool, queue_name, "b") == 0
    # Once a runs no more than its share, the rest goes to b.
    assert await lease(pool, queue_name, "a", held=2) == 2
    assert await recorded(pool, queue_name) == {"a": 2, "b": 0}
    assert await lease(pool, queue_name, "b") == 1
    assert await recorded(pool, queue_name) == {"a": 2, "b": 1}
    # A worker that wants fewer than its share leaves the rest to others.
    assert await lease(pool, queue_name, "c", wanted=1) == 0
    assert await lease(pool, queue_name, "a", wanted=1, held=2) == 1
    assert await lease(pool, queue_name, "a", wanted=1, held=1) == 1
    assert await lease(pool, queue_name, "c", wanted=1) == 1
    assert sum((await recorded(pool, queue_name)).values()) == 3


async def test_an_expired_lease_counts_for_nothing_and_is_deleted(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    await pool.execute(SEED_LIMIT, queue_name, 3)
    assert await lease(pool, queue_name, "gone", ttl=0.05) == 3
    assert await lease(pool, queue_name, "b") == 0

    async def expired() -> bool:
        return await slots_in_use(pool, queue_name) == 0

    await wait_until(expired)
    assert await lease(pool, queue_name, "b") == 3
    assert await recorded(pool, queue_name) == {"b": 3}


async def test_seeding_is_idempotent_and_workers_keep_to_their_own_limit(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    await pool.execute(SEED_LIMIT, queue_name, 3)
    await pool.execute(SEED_LIMIT, queue_name, 3)
    await pool.execute(SEED_LIMIT, queue_name, 2)
    rows = await pool.fetch(
        "SELECT global_limit FROM pgqueue_limits WHERE queue = $1", queue_name
    )
    assert [tuple(r) for r in rows] == [(2,)]  # the last worker's limit, for display
    # A worker with a limit of 2 leases 2; one with 3 gets one more.
    assert await lease(pool, queue_name, "a", limit=2, wanted=2) == 2
    assert await lease(pool, queue_name, "b", limit=2, wanted=2) == 0
    assert await lease(pool, queue_name, "c", limit=3, wanted=2) == 1
    assert await slots_in_use(pool, queue_name) == 3


# --------------------------------------------------------------------------
# Workers in one process


async def test_two_workers_in_one_process_keep_to_the_limit_and_share_it(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    await pool.execute(SAMPLES)
    live = peak = 0
    ran: dict[int, int] = {0: 0, 1: 0}

    def handler(n: int) -> Any:
        async def run(_job: pgqueue.Job) -> None:
            nonlocal live, peak
            live += 1
            ran[n] += 1
            peak = max(peak, live)
            try:
                await anyio.sleep(0.01)
            finally:
                live -= 1

        return run

    workers = []
    for n in range(2):
        worker = pgqueue.Worker(
            pool, queue=queue_name, concurrency=10, global_limit=3, poll_interval=0.05
        )
        worker.register("sample", handler(n))
        workers.append(worker)
    await enqueue(pool, queue_name, 300)
    async with running(workers[0]):
        # The first worker leases the whole limit; the second gets a share
        # once the first renews.
        await wait_until(lambda: _slots(pool, queue_name, 3))
        async with running(workers[1]):
            await wait_until(completed(pool, queue_name, 300), within=30)
    assert 1 <= peak <= 3
    assert ran[1] > 0
    assert sum(ran.values()) == 300
    assert await slots_in_use(pool, queue_name) == 0


async def _slots(pool: asyncpg.Pool, queue: str, n: int) -> bool:
    return await slots_in_use(pool, queue) == n


async def test_every_way_a_run_ends_frees_its_slot(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name)
    worker = pgqueue.Worker(
        pool, queue=queue_name, concurrency=5, global_limit=2, backoff=lambda _: 60.0
    )
    seen: list[str] = []
    both = anyio.Event()
    holding = 0

    @worker.handler("snooze")
    async def snooze(_job: pgqueue.Job) -> None:
        seen.append("snooze")
        raise pgqueue.Snooze(60)

    @worker.handler("fail")
    async def fail(_job: pgqueue.Job) -> None:
        seen.append("fail")
        raise RuntimeError("boom")

    @worker.handler("permanent")
    async def permanent(_job: pgqueue.Job) -> None:
        seen.append("permanent")
        raise pgqueue.Permanent("no")

    @worker.handler("hold")
    async def hold(_job: pgqueue.Job) -> None:
        nonlocal holding
        holding += 1
        if holding == 2:
            both.set()
        with anyio.fail_after(10):
            await both.wait()

    async with running(worker):
        await queue.enqueue("snooze", {})
        await queue.enqueue("fail", {})
        await queue.enqueue("permanent", {}, max_attempts=1)

        async def written() -> bool:
            counts = await statuses(pool, queue_name)
            return counts == {"pending": 2, "dead": 1}

        await wait_until(written)
        # Both slots are free: two jobs that wait for each other both run.
        await queue.enqueue_many([("hold", {})] * 2)
        await wait_until(completed(pool, queue_name, 2))
    assert sorted(seen) == ["fail", "permanent", "snooze"]


async def test_stop_releases_prefetched_jobs_and_the_lease(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    began = anyio.Event()
    worker = pgqueue.Worker(
        pool, queue=queue_name, concurrency=1, prefetch=3, global_limit=5
    )

    @worker.handler("slow")
    async def slow(_job: pgqueue.Job) -> None:
        began.set()
        await anyio.sleep_forever()

    await pgqueue.Queue(pool, name=queue_name).enqueue_many([("slow", {})] * 6)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        with anyio.fail_after(10):
            await began.wait()

        async def all_claimed() -> bool:
            return (await statuses(pool, queue_name)).get("running") == 4

        # The lease is its capacity (1 + 3 prefetched), and it fills it.
        await wait_until(all_claimed)
        assert await slots_in_use(pool, queue_name) == 4
        with pytest.raises(TimeoutError):
            await worker.stop(timeout=0.2)
    assert await statuses(pool, queue_name) == {"pending": 6}
    assert await recorded(pool, queue_name) == {}


async def test_a_queue_row_deleted_by_hand_is_made_again(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    worker = make_worker(
        pool, queue_name, concurrency=2, global_limit=1, poll_interval=0.05
    )
    async with running(worker):
        await pool.execute("DELETE FROM pgqueue_limits WHERE queue = $1", queue_name)

        async def seeded_again() -> bool:
            return bool(
                await pool.fetchval(
                    "SELECT count(*) FROM pgqueue_limits WHERE queue = $1", queue_name
                )
            )

        await wait_until(seeded_again)
        await enqueue(pool, queue_name, 3)
        await wait_until(completed(pool, queue_name, 3))
    assert (
        await pool.fetchval(
            "SELECT global_limit FROM pgqueue_limits WHERE queue = $1", queue_name
        )
        == 1
    )


async def test_a_lease_not_renewed_stops_the_claims(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    # The lease holds rescue_after from its renewal's sending: past that, the
    # worker starts no job of the queue until a renewal gets through.
    worker = make_worker(
        pool,
        queue_name,
        concurrency=2,
        global_limit=2,
        rescue_after=0.5,
        poll_interval=0.05,
    )
    await pool.execute(SAMPLES)
    async with running(worker):
        [lane] = worker._lanes
        lease = lane.claimer.lease
        assert lease is not None
        assert lease.free(anyio.current_time()) == 2
        assert lease.free(anyio.current_time() + 0.5) == 0
        # Renewals fail while the queue's row is locked by another session.
        async with pool.acquire() as connection, connection.transaction():
            await connection.execute(
                "SELECT FROM pgqueue_limits WHERE queue = $1 FOR UPDATE", queue_name
            )
            await wait_until(lambda: _no_room(lease))
            await enqueue(pool, queue_name, 2)
            with anyio.move_on_after(0.3):
                await wait_until(lambda: _ran(pool, queue_name, 1), within=1)
                pytest.fail("a job ran under a lease that had run out")
        await wait_until(completed(pool, queue_name, 2))


async def _no_room(lease: Lease) -> bool:
    return lease.free(anyio.current_time()) == 0


# --------------------------------------------------------------------------
# Schema, options, command line


async def test_only_a_limited_worker_needs_the_limits_table(
    fresh_dsn: str, queue_name: str
) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool:
        await pool.execute("DROP TABLE pgqueue_limits, pgqueue_leases")
        queue = pgqueue.Queue(pool, name=queue_name)
        await queue.enqueue("t", {})
        done = anyio.Event()
        worker = pgqueue.Worker(pool, queue=queue_name)

        @worker.handler("t")
        async def t(_job: pgqueue.Job) -> None:
            done.set()

        async with running(worker):
            with anyio.fail_after(10):
                await done.wait()
        limited = pgqueue.Worker(pool, queue=queue_name, global_limit=2)
        with anyio.fail_after(10), pytest.raises(pgqueue.SchemaError) as raised:
            await limited.run()
        assert "pgqueue_limits" in str(raised.value)
        assert "SCHEMA_UPGRADE" in str(raised.value)
        state = await pgqueue.Admin(pool).schema_state()
        assert state.missing == ("tables pgqueue_limits and pgqueue_leases",)
        await pool.execute(pgqueue.SCHEMA_UPGRADE)
        assert (await pgqueue.Admin(pool).schema_state()).kind == "current"


def test_global_limit_is_checked(pool: asyncpg.Pool) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        pgqueue.Worker(pool, global_limit=0)
    with pytest.raises(ValueError, match="32-bit"):
        pgqueue.Worker(pool, global_limit=2**31)
    with pytest.raises(TypeError, match="mapping"):
        pgqueue.Worker(pool, queues={"a": 1, "b": 2}, global_limit=3)
    with pytest.raises(ValueError, match="does not consume"):
        pgqueue.Worker(pool, queues={"a": 1}, global_limit={"b": 3})
    worker = pgqueue.Worker(pool, queues={"a": 1, "b": 2}, global_limit={"b": 3})
    assert [lane.settings.global_limit for lane in worker._lanes] == [None, 3]
    assert (
        pgqueue.Worker(pool, queue="q", global_limit={"q": 2})
        ._lanes[0]
        .settings.global_limit
        == 2
    )


def test_global_limit_flag_gives_one_limit_or_several() -> None:
    def parse(*argv: str) -> Any:
        return build_parser().parse_args(["worker", "m:w", *argv])

    assert parse("--global-limit", "3").global_limit == 3
    assert parse("--global-limit", "none").global_limit is None
    args = parse("--global-limit", "a=3", "--global-limit", "b=1")
    assert args.global_limit == {"a": 3, "b": 1}
    command = _processes.child_command(args, 0)
    assert command[-2:] == ["--global-limit=a=3", "--global-limit=b=1"]
    assert _processes.child_command(parse("--global-limit", "3"), 0)[-1] == (
        "--global-limit=3"
    )
    for argv in (["a=3", "3"], ["3", "a=3"], ["a=3", "a=4"], ["x"]):
        with pytest.raises(SystemExit):
            parse(*[arg for value in argv for arg in ("--global-limit", value)])


async def test_several_queues_each_with_its_own_limit(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    a, b = f"{queue_name}-a", f"{queue_name}-b"
    live = {a: 0, b: 0}
    peak = {a: 0, b: 0}

    async def handler(job: pgqueue.Job) -> None:
        live[job.queue] += 1
        peak[job.queue] = max(peak[job.queue], live[job.queue])
        try:
            await anyio.sleep(0.01)
        finally:
            live[job.queue] -= 1

    worker = pgqueue.Worker(pool, queues={a: 5, b: 5}, global_limit={a: 1})
    worker.register("sample", handler)
    await enqueue(pool, a, 10)
    await enqueue(pool, b, 10)
    async with running(worker):
        await wait_until(completed(pool, a, 10))
        await wait_until(completed(pool, b, 10))
    assert peak[a] == 1
    assert peak[b] > 1
    assert await slots_in_use(pool, a) == 0
    assert (
        await pool.fetchval("SELECT count(*) FROM pgqueue_limits WHERE queue = $1", b)
        == 0
    )
    assert await recorded(pool, b) == {}
