"""Fleet-wide limits: ``Worker(pool, queue=..., global_limit=N)``.

At most N jobs of a queue run at once across every worker and process,
enforced by the database (the queue's running count in ``pgqueue_limits``,
read and raised in the claim's own statement under the row's lock);
capacity a crashed worker held comes back through the rescue sweep's
recount; every way a run ends counts it out. Against a real server,
with real worker processes; waits are on rows and events, under deadlines.
"""

from __future__ import annotations

import contextlib
import signal
from typing import Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue import _sql
from pgqueue.cli import build_parser
from pgqueue.cli import worker as cli_worker
from tests.cli_apps.limited import SAMPLES, make_worker
from tests.helpers import running, wait_until
from tests.test_cli_worker import started, statuses

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
    """The queue's running count (0 without a row)."""
    count: int = await pool.fetchval(
        "SELECT coalesce(max(running), 0) FROM pgqueue_limits WHERE queue = $1", queue
    )
    return count


async def claim_limited(
    executor: asyncpg.Pool | asyncpg.Connection, queue: str, n: int, limit: int
) -> list[asyncpg.Record]:
    """A limited claim of up to ``n`` jobs under ``limit``; the jobs it took."""
    rows = await executor.fetch(
        _sql.CLAIM_LIMITED, queue, n, *_sql.claim_places({}), limit
    )
    return [row for row in rows if row["id"] is not None]


async def complete_limited(
    pool: asyncpg.Pool, queue: str, *runs: tuple[int, int]
) -> None:
    await pool.fetch(
        _sql.COMPLETE_LIMITED,
        _sql.array(run[0] for run in runs),
        _sql.array(run[1] for run in runs),
        [None] * len(runs),
        [queue],
    )


async def recount(pool: asyncpg.Pool, queue: str) -> None:
    """The rescue sweep's recount of the queue."""
    async with pool.acquire() as connection, connection.transaction():
        await connection.fetch(_sql.LOCK_LIMIT, queue)
        await connection.fetch(_sql.RECOUNT_LIMIT, queue)


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
    flags = ["--concurrency", "10", "--global-limit", "3", "--rescue-after", "1"]
    async with started(dsn, queue_name, LIMITED, *flags) as child:
        await child.wait_for("worker ready")

        async def holding() -> bool:
            return len(await samples(pool, queue_name)) == 3

        await wait_until(holding)
        assert await slots_in_use(pool, queue_name) == 3
        child.process.kill()
        assert await child.exit_code() == -signal.SIGKILL
    rest = await enqueue(pool, queue_name, 5)
    worker = make_worker(
        pool,
        queue_name,
        concurrency=10,
        global_limit=3,
        rescue_after=1.0,
        poll_interval=0.1,
    )
    async with running(worker):
        # Every slot is held by the dead worker's runs until they are rescued.
        with anyio.move_on_after(0.4):
            await wait_until(lambda: _ran(pool, queue_name, 4), within=1)
            pytest.fail("a job ran while the killed worker's runs held every slot")
        await wait_until(completed(pool, queue_name, 8), within=15)
    assert await statuses(pool, queue_name) == {"completed": 8}
    ran = await samples(pool, queue_name)
    assert sorted(set(ran)) == sorted(hung + rest)
    assert await slots_in_use(pool, queue_name) == 0


async def _ran(pool: asyncpg.Pool, queue: str, n: int) -> bool:
    return len(await samples(pool, queue)) >= n


# --------------------------------------------------------------------------
# Racing claims, in-process


async def test_racing_claims_never_take_more_than_the_free_slots(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    await enqueue(pool, queue_name, 200)
    await pool.execute(_sql.SEED_LIMIT, queue_name, 3)
    connections = [
        await asyncpg.connect(dsn, server_settings=_sql.WORKER_SETTINGS)
        for _ in range(6)
    ]
    try:
        for _ in range(15):
            claimed: list[asyncpg.Record] = []

            async def claim(
                connection: asyncpg.Connection, claimed: list[asyncpg.Record]
            ) -> None:
                claimed.extend(await claim_limited(connection, queue_name, 10, 3))

            async with anyio.create_task_group() as tg:
                for connection in connections:
                    tg.start_soon(claim, connection, claimed)
            assert 1 <= len(claimed) <= 3
            running_now = await pool.fetchval(
                "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1 AND status = 'running'",
                queue_name,
            )
            assert running_now == len(claimed) == await slots_in_use(pool, queue_name)
            await complete_limited(
                pool, queue_name, *((r["id"], r["attempts"]) for r in claimed)
            )
            assert await slots_in_use(pool, queue_name) == 0
    finally:
        for connection in connections:
            await connection.close()


async def test_two_workers_in_one_process_keep_to_the_limit(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    await pool.execute(SAMPLES)
    live = peak = 0

    async def handler(_job: pgqueue.Job) -> None:
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        try:
            await anyio.sleep(0.005)
        finally:
            live -= 1

    workers = []
    for _ in range(2):
        worker = pgqueue.Worker(
            pool, queue=queue_name, concurrency=10, global_limit=3, poll_interval=0.05
        )
        worker.register("sample", handler)
        workers.append(worker)
    await enqueue(pool, queue_name, 120)
    async with running(workers[0]), running(workers[1]):
        await wait_until(completed(pool, queue_name, 120), within=30)
    assert 1 <= peak <= 3
    assert await slots_in_use(pool, queue_name) == 0


# --------------------------------------------------------------------------
# Every way a run ends counts it out


async def test_snooze_retry_and_dead_free_their_slots(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name)
    worker = pgqueue.Worker(
        pool, queue=queue_name, concurrency=5, global_limit=2, backoff=lambda _: 60.0
    )
    ended = anyio.Event()
    seen: list[str] = []

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
        if len(seen) == 3:
            ended.set()
        raise pgqueue.Permanent("no")

    async with running(worker):
        await queue.enqueue("snooze", {})
        await queue.enqueue("fail", {})
        await queue.enqueue("permanent", {}, max_attempts=1)

        async def written() -> bool:
            counts = await statuses(pool, queue_name)
            return counts == {"pending": 2, "dead": 1}

        await wait_until(written)
        assert await slots_in_use(pool, queue_name) == 0
    assert sorted(seen) == ["fail", "permanent", "snooze"]


async def test_a_fenced_stale_write_counts_nothing_out(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    release = anyio.Event()
    began = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue_name, concurrency=2, global_limit=2)

    @worker.handler("slow")
    async def slow(_job: pgqueue.Job) -> None:
        began.set()
        await release.wait()

    async with running(worker):
        job_id = await pgqueue.Queue(pool, name=queue_name).enqueue("slow", {})
        with anyio.fail_after(10):
            await began.wait()
        assert await slots_in_use(pool, queue_name) == 1
        # Another process's rescue sweep takes the run for an orphan: the job is
        # pending again and the recount frees its room; a claim elsewhere runs
        # attempt 2.
        await pool.fetch(_sql.RESCUE, [queue_name], 0.0, 1000)
        await recount(pool, queue_name)
        assert await slots_in_use(pool, queue_name) == 0
        [again] = await claim_limited(pool, queue_name, 5, 2)
        assert (again["id"], again["attempts"]) == (job_id, 2)
        assert await slots_in_use(pool, queue_name) == 1
        release.set()  # the stale run of attempt 1 ends: its write is fenced off

        async def stale_written() -> bool:
            return worker.running_jobs == 0 and worker._claims.held == 0

        await wait_until(stale_written)
        # Attempt 2 still counts; attempt 1's write counted nothing out.
        assert await slots_in_use(pool, queue_name) == 1
    await complete_limited(pool, queue_name, (job_id, 2))
    assert await slots_in_use(pool, queue_name) == 0


async def test_stop_releases_prefetched_jobs_and_their_slots(
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

    await pgqueue.Queue(pool, name=queue_name).enqueue_many([("slow", {})] * 4)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        with anyio.fail_after(10):
            await began.wait()

        async def all_claimed() -> bool:
            return await slots_in_use(pool, queue_name) == 4

        await wait_until(all_claimed)
        with pytest.raises(TimeoutError):
            await worker.stop(timeout=0.2)
    assert await statuses(pool, queue_name) == {"pending": 4}
    assert await slots_in_use(pool, queue_name) == 0


async def test_the_rescue_sweep_recounts_runs_that_ended_elsewhere(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    # A Go worker (or a worker without the limit, or an edit by hand) ended a
    # run a limited claim counted: the next rescue sweep of a limited worker
    # gives its room back.
    await enqueue(pool, queue_name, 1)
    await pool.execute(_sql.SEED_LIMIT, queue_name, 1)
    [claimed] = await claim_limited(pool, queue_name, 5, 1)
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'pending' WHERE id = $1", claimed["id"]
    )
    assert await slots_in_use(pool, queue_name) == 1
    worker = make_worker(
        pool, queue_name, concurrency=2, global_limit=1, poll_interval=0.1
    )
    async with running(worker):
        await wait_until(completed(pool, queue_name, 1))
    assert await slots_in_use(pool, queue_name) == 0


async def test_a_claim_the_limit_cut_short_is_woken_by_the_write_that_frees_room(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    # Workers elsewhere learn of freed room by a NOTIFY on the jobs channel,
    # sent only by a write (or a recount) that frees room in a starved queue.
    await enqueue(pool, queue_name, 3)
    await pool.execute(_sql.SEED_LIMIT, queue_name, 2)
    wakeups: list[str] = []
    woken = anyio.Event()

    def on_notify(*args: Any) -> None:
        if args[3] == queue_name:
            wakeups.append(args[3])
            woken.set()

    listener = await asyncpg.connect(dsn)
    try:
        await listener.add_listener(_sql.JOBS_CHANNEL, on_notify)
        first = await claim_limited(pool, queue_name, 1, 2)  # room left: not starved
        await complete_limited(pool, queue_name, (first[0]["id"], 1))
        taken = await claim_limited(pool, queue_name, 5, 2)  # cut short: starved
        assert len(taken) == 2
        assert await claim_limited(pool, queue_name, 5, 2) == []
        assert await pool.fetchval(
            "SELECT starved FROM pgqueue_limits WHERE queue = $1", queue_name
        )
        assert wakeups == []
        await complete_limited(pool, queue_name, (taken[0]["id"], 1))
        with anyio.fail_after(5):
            await woken.wait()
        assert not await pool.fetchval(
            "SELECT starved FROM pgqueue_limits WHERE queue = $1", queue_name
        )
        assert wakeups == [queue_name]
        # The recount wakes too, when it frees room in a starved queue.
        assert len(await claim_limited(pool, queue_name, 5, 2)) == 0  # no job left
        woken = anyio.Event()
        await enqueue(pool, queue_name, 2)
        with anyio.fail_after(5):
            await woken.wait()  # the enqueue's own wakeup
        wakeups.clear()
        woken = anyio.Event()
        assert len(await claim_limited(pool, queue_name, 5, 2)) == 1  # starved again
        await pool.execute(
            "UPDATE pgqueue_jobs SET status = 'completed' WHERE queue = $1 AND id = $2",
            queue_name,
            taken[1]["id"],
        )
        await recount(pool, queue_name)
        with anyio.fail_after(5):
            await woken.wait()
        assert wakeups == [queue_name]
    finally:
        await listener.close()


async def test_a_queue_row_deleted_by_hand_is_made_again(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    worker = make_worker(
        pool, queue_name, concurrency=2, global_limit=1, poll_interval=0.1
    )
    async with running(worker):
        await pool.execute("DELETE FROM pgqueue_limits WHERE queue = $1", queue_name)
        await enqueue(pool, queue_name, 3)
        await wait_until(completed(pool, queue_name, 3))
    assert await pool.fetchval(
        "SELECT (global_limit, running) FROM pgqueue_limits WHERE queue = $1",
        queue_name,
    ) == (1, 0)


# --------------------------------------------------------------------------
# Schema, options, command line


async def test_only_a_limited_worker_needs_the_limits_table(
    fresh_dsn: str, queue_name: str
) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool:
        await pool.execute("DROP TABLE pgqueue_limits")
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
        assert state.missing == ("table pgqueue_limits",)
        await pool.execute(pgqueue.SCHEMA_UPGRADE)
        assert (await pgqueue.Admin(pool).schema_state()).kind == "current"


async def test_seeding_is_idempotent_and_workers_keep_to_their_own_limit(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    await pool.execute(_sql.SEED_LIMIT, queue_name, 3)
    await pool.execute(_sql.SEED_LIMIT, queue_name, 3)
    await pool.execute(_sql.SEED_LIMIT, queue_name, 2)
    rows = await pool.fetch(
        "SELECT global_limit, running FROM pgqueue_limits WHERE queue = $1", queue_name
    )
    assert [tuple(r) for r in rows] == [(2, 0)]  # the last worker's limit, for display
    await enqueue(pool, queue_name, 5)
    # A worker with a limit of 2 takes 2, one with 3 one more.
    assert len(await claim_limited(pool, queue_name, 5, 2)) == 2
    assert len(await claim_limited(pool, queue_name, 5, 2)) == 0
    assert len(await claim_limited(pool, queue_name, 5, 3)) == 1
    assert await slots_in_use(pool, queue_name) == 3


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
    assert [lane.global_limit for lane in worker._lanes] == [None, 3]
    assert (
        pgqueue.Worker(pool, queue="q", global_limit={"q": 2})._lanes[0].global_limit
        == 2
    )


def test_global_limit_flag_gives_one_limit_or_several() -> None:
    def parse(*argv: str) -> Any:
        return build_parser().parse_args(["worker", "m:w", *argv])

    assert parse("--global-limit", "3").global_limit == 3
    assert parse("--global-limit", "none").global_limit is None
    args = parse("--global-limit", "a=3", "--global-limit", "b=1")
    assert args.global_limit == {"a": 3, "b": 1}
    command = cli_worker.child_command(args, 0)
    assert command[-2:] == ["--global-limit=a=3", "--global-limit=b=1"]
    assert cli_worker.child_command(parse("--global-limit", "3"), 0)[-1] == (
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
