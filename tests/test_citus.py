"""The distributed mode on a real Citus cluster: a coordinator and two worker nodes.

Each test goes through the public API (or the CLI) on the coordinator, on
queues of its own, and waits on events and rows under deadlines. The
cluster is made once for the module (`pgqueue.testing._citus`); the whole tier
is skipped, saying why, where the citus extension is not installed. Run it
alone with ``-m citus``; deselect it with ``-m 'not citus'``.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue.testing._citus import citus_cluster, citus_missing
from pgqueue.testing._clusters import binaries
from tests.helpers import row, rows, running, wait_for_row, wait_until
from tests.test_cli import EXIT_ERROR, EXIT_OK, cli

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from pgqueue.testing._citus import CitusCluster

pytestmark = [pytest.mark.citus, pytest.mark.timeout(240)]

_BINDIR = binaries()


@pytest.fixture(scope="module")
def cluster() -> Iterator[CitusCluster]:
    """A joined three-node cluster with the distributed schema applied."""
    missing = citus_missing(_BINDIR)
    if missing is not None:
        pytest.skip(f"the citus tier needs Citus: {missing}")
    assert _BINDIR is not None
    with citus_cluster(_BINDIR) as made:
        anyio.run(made.join)
        anyio.run(_install, made.coordinator.dsn)
        yield made


async def _install(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await pgqueue.install(conn, distributed=True)
    finally:
        await conn.close()


@pytest.fixture
async def pool(cluster: CitusCluster) -> AsyncIterator[asyncpg.Pool]:
    """A pool on the coordinator."""
    async with asyncpg.create_pool(
        cluster.coordinator.dsn, min_size=1, max_size=8
    ) as made:
        yield made


def _name() -> str:
    return f"q-{uuid.uuid4().hex[:10]}"


async def _node_of(pool: asyncpg.Pool, queue: str) -> int:
    """The port of the worker node holding ``queue``'s shard."""
    port: int = await pool.fetchval(
        "SELECT nodeport FROM pg_dist_shard_placement"
        " WHERE shardid = get_shard_id_for_distribution_column('pgqueue_jobs', $1::text)",
        queue,
    )
    return port


async def _queues_on_both_nodes(
    pool: asyncpg.Pool, cluster: CitusCluster, count: int
) -> list[str]:
    """``count`` new queue names, at least one on each worker node."""
    ports = {node.port for node in cluster.workers}
    for _ in range(100):
        names = [_name() for _ in range(count)]
        if {await _node_of(pool, name) for name in names} == ports:
            return names
    msg = "no spread of queue names over both nodes found"
    raise AssertionError(msg)


async def _two_phase_commits(pool: asyncpg.Pool) -> int:
    count: int = await pool.fetchval("SELECT count(*) FROM pg_dist_transaction")
    return count


async def test_the_schema_is_distributed_by_queue(
    cluster: CitusCluster, pool: asyncpg.Pool
) -> None:
    tables = {
        r["logicalrelid"]: (r["partmethod"], r["colocationid"])
        for r in await pool.fetch(
            "SELECT logicalrelid::text, partmethod::text, colocationid FROM pg_dist_partition"
            " WHERE logicalrelid::text LIKE 'pgqueue_%'"
        )
    }
    jobs = tables["pgqueue_jobs"]
    assert jobs[0] == "h"
    assert tables["pgqueue_limits"] == jobs
    assert tables["pgqueue_leases"] == jobs
    assert tables["pgqueue_periodic"][0] == "n"  # a reference table
    key = await pool.fetchval(
        "SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_index i"
        " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)"
        " WHERE i.indrelid = 'pgqueue_jobs'::regclass AND i.indisprimary"
    )
    assert key == ["id", "queue"]
    # Idempotent, and current for the library's own check.
    await pgqueue.install(pool, distributed=True)
    assert (await pgqueue.Admin(pool).schema_state()).kind == "current"


async def test_a_drain_over_eight_queues_on_both_nodes_runs_each_job_once_without_2pc(
    cluster: CitusCluster, pool: asyncpg.Pool
) -> None:
    names = await _queues_on_both_nodes(pool, cluster, 8)
    expected: set[int] = set()
    for name in names:
        queue = pgqueue.Queue(pool, name=name)
        expected.add(await queue.enqueue("t", {"one": True}))
        expected.add(await queue.enqueue("t", {}, unique_key="u"))
        expected.update(
            await queue.enqueue_many(
                [("t", {"i": i}) for i in range(40)]
                + [pgqueue.NewJob("t", {}, unique_key=f"k{i}") for i in range(5)]
            )
        )
    assert len(expected) == 8 * 47
    before = await _two_phase_commits(pool)
    ran: Counter[int] = Counter()
    worker = pgqueue.Worker(pool, queues=dict.fromkeys(names, 4))

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        ran[job.id] += 1

    with anyio.fail_after(120):
        await worker.run(until_empty=True)
    assert set(ran) == expected
    assert set(ran.values()) == {1}
    statuses = await pool.fetch(
        "SELECT status, count(*) FROM pgqueue_jobs WHERE queue = ANY($1) GROUP BY 1",
        names,
    )
    assert {r["status"]: r["count"] for r in statuses} == {"completed": len(expected)}
    # The trend, flushed at the worker's stop, a row per queue on its shard.
    trend = await pool.fetch(
        "SELECT queue, sum(completed)::int AS completed FROM pgqueue_trend"
        " WHERE queue = ANY($1) GROUP BY 1",
        names,
    )
    assert {r["queue"]: r["completed"] for r in trend} == dict.fromkeys(names, 47)
    # Every enqueue, claim, outcome write, sweep and trend flush ran on one shard.
    assert await _two_phase_commits(pool) == before


async def test_a_worker_on_the_coordinator_is_woken_without_a_poll(
    pool: asyncpg.Pool,
) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    ran = anyio.Event()
    worker = pgqueue.Worker(pool, queue=name, poll_interval=3600)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        ran.set()

    async with running(worker):
        await wait_until(lambda: _idle(worker))
        async with pool.acquire() as conn, conn.transaction():
            # In the caller's transaction: the job and its wakeup ride it.
            await queue.enqueue("t", {}, connection=conn)
        with anyio.fail_after(20):
            await ran.wait()


async def test_a_worker_on_its_queues_node_drains_and_is_woken_through_the_coordinator(
    cluster: CitusCluster, pool: asyncpg.Pool
) -> None:
    # The guide's faster setup: the worker's pool on the node that holds its
    # queue's shard, LISTEN on the coordinator that producers enqueue through.
    name = _name()
    port = await _node_of(pool, name)
    node = next(node for node in cluster.workers if node.port == port)
    queue = pgqueue.Queue(pool, name=name)
    backlog = set(await queue.enqueue_many([("t", {"i": i}) for i in range(200)]))
    ran: Counter[int] = Counter()
    late = anyio.Event()
    async with asyncpg.create_pool(node.dsn, min_size=1, max_size=8) as node_pool:
        before = (
            await _two_phase_commits(pool),
            await _two_phase_commits(node_pool),
        )
        worker = pgqueue.Worker(
            node_pool,
            queue=name,
            concurrency=10,
            poll_interval=3600,
            listen=cluster.coordinator.dsn,
        )

        @worker.handler("t")
        async def handle(job: pgqueue.Job) -> None:
            ran[job.id] += 1
            if job.payload == {"late": True}:
                late.set()

        async with running(worker):
            await wait_until(lambda: _idle(worker))
            late_id = await queue.enqueue("t", {"late": True})
            with anyio.fail_after(20):
                await late.wait()
        after = (
            await _two_phase_commits(pool),
            await _two_phase_commits(node_pool),
        )
    assert set(ran) == {*backlog, late_id}
    assert set(ran.values()) == {1}
    assert after == before


async def _idle(worker: pgqueue.Worker) -> bool:
    return not any(lane.policy.more for lane in worker._lanes)


async def test_enqueue_in_the_callers_transaction_rolls_back_with_it(
    pool: asyncpg.Pool,
) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await queue.enqueue("t", {}, connection=conn)
        await queue.enqueue_many([("t", {}), ("t", {})], connection=conn)
        await tx.rollback()
        async with queue.transaction(conn), conn.transaction():
            kept = await queue.enqueue("t", {}, connection=conn)
    assert [r["id"] for r in await rows(pool, name)] == [kept]


async def test_unique_keys_are_unique_per_queue(pool: asyncpg.Pool) -> None:
    first, second = pgqueue.Queue(pool, name=_name()), pgqueue.Queue(pool, name=_name())
    one = await first.enqueue("t", {}, unique_key="k")
    assert await first.enqueue("t", {}, unique_key="k") == one
    with pytest.raises(pgqueue.DuplicateJobError):
        await first.enqueue("t", {}, unique_key="k", on_conflict="raise")
    assert await second.enqueue("t", {}, unique_key="k") != one
    many = await first.enqueue_many([pgqueue.NewJob("t", {}, unique_key="k")])
    assert many == [one]


async def test_replace_and_debounce_are_refused_and_write_nothing(
    pool: asyncpg.Pool,
) -> None:
    # The job queued after a running one of the key waits for it as a child:
    # dependencies are not supported on Citus.
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    with pytest.raises(ValueError, match="replace"):
        await queue.enqueue("t", {}, unique_key="k", on_conflict="replace")
    with pytest.raises(ValueError, match="debounce"):
        await queue.enqueue("t", {}, unique_key="k", debounce=5.0)
    with pytest.raises(ValueError, match="replace"):
        await queue.enqueue_many(
            [pgqueue.NewJob("t", {}, unique_key="k")], on_conflict="replace"
        )
    assert await rows(pool, name) == []


# enqueue_many of one queue on Citus: INSERT ... VALUES statements of its
# rows (one shard, one node), in one transaction; never an INSERT ... SELECT
# or a COPY (from 10,000 jobs on plain PostgreSQL), which Citus commits in two
# phases.


@pytest.mark.parametrize("count", [1, 50, 2_500, 12_000])
async def test_enqueue_many_of_one_queue_makes_no_two_phase_commit(
    pool: asyncpg.Pool, count: int
) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name, max_attempts=4)
    before = await _two_phase_commits(pool)
    ids = await queue.enqueue_many([("t", {"n": n}) for n in range(count)])
    assert await _two_phase_commits(pool) == before
    found = await rows(pool, name)
    assert [r["id"] for r in found] == ids
    assert [_json(r["payload"]) for r in found] == [{"n": n} for n in range(count)]
    assert {
        (
            r["job_type"],
            r["status"],
            r["max_attempts"],
            r["priority"],
            r["tracked"],
            r["unique_key"],
            r["group_key"],
            r["trace_context"],
            r["run_at"]
            == r["created_at"],  # the transaction's now(), every statement's
        )
        for r in found
    } == {("t", "pending", 4, 0, False, None, None, None, True)}


def test_the_plan_of_a_large_batch_is_few_texts_of_bounded_statements() -> None:
    from pgqueue._core.request import check_jobs
    from pgqueue._sql.enqueue import PARAMETERS
    from pgqueue._store.plan import plan_many

    batch = check_jobs([("t", n) for n in range(2_500)], 5)
    payloads = "[" + ",".join(str(n) for n in range(2_500)) + "]"
    plan = plan_many("q", batch, payloads, None, notify=True, distributed=True)
    statements = list(plan.statements)
    sizes = [len(args) // 3 for _, args in statements]  # queue + 3 a row
    assert sizes == [1024, 1024, 256, 128, 64, 4]
    assert len({statement for statement, _ in statements}) == 5
    assert all(len(PARAMETERS[statement]) < 32_767 for statement, _ in statements)
    assert [a for _, args in statements for a in args[2::3]] == [
        str(n) for n in range(2_500)
    ]
    assert plan.wake_after
    # Each payload's text as given, whatever the spaces of the array.
    spaced = '[ {"a": [1, "],\\""]} ,\n"x" ,2.50 ]'
    three = check_jobs([("t", None)] * 3, 5)
    one = plan_many("q", three, spaced, None, notify=True, distributed=True)
    assert [a for _, args in one.statements for a in args[2::3]] == [
        '{"a": [1, "],\\""]}',
        '"x"',
        "2.50",
    ]


class _Traced(pgqueue.EnqueueHook):
    def before_enqueue(self, event: pgqueue.EnqueueEvent) -> None:
        event.trace_context = '{"traceparent": "00-1-2-01"}'


async def test_enqueue_many_on_citus_writes_each_jobs_fields_across_statements(
    pool: asyncpg.Pool,
) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name, hooks=[_Traced()])
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    count = 1_100  # more than one statement's rows
    jobs = [
        pgqueue.NewJob(
            f"t{n % 2}",
            {"n": n},
            priority=n % 3 - 1,
            track=n % 2 == 0,
            group=f"g{n % 4}" if n % 5 else None,
            max_attempts=1 + n % 7,
            run_at=at if n % 3 == 0 else None,
            delay=30.5 if n % 3 == 1 else None,
        )
        for n in range(count)
    ]
    before = await _two_phase_commits(pool)
    ids = await queue.enqueue_many(jobs)
    assert await _two_phase_commits(pool) == before
    found = await rows(pool, name)
    assert [r["id"] for r in found] == ids
    for n, r in enumerate(found):
        waits = r["run_at"] - r["created_at"]
        assert (
            r["job_type"],
            _json(r["payload"]),
            r["priority"],
            r["tracked"],
            r["group_key"],
            r["max_attempts"],
            r["trace_context"],
        ) == (
            f"t{n % 2}",
            {"n": n},
            n % 3 - 1,
            n % 2 == 0,
            f"g{n % 4}" if n % 5 else None,
            1 + n % 7,
            '{"traceparent": "00-1-2-01"}',
        )
        if n % 3 == 0:
            assert r["run_at"] == at
        else:
            assert waits == timedelta(seconds=30.5 if n % 3 == 1 else 0)


async def test_enqueue_many_with_unique_keys_on_citus_keeps_live_jobs_without_2pc(
    pool: asyncpg.Pool,
) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    kept = await queue.enqueue("t", {"v": "old"}, unique_key="k5")
    count = 1_500  # more than one statement's rows
    jobs: list[pgqueue.NewJob | tuple[str, Any]] = [
        pgqueue.NewJob("t", {"n": n}, unique_key=f"k{n}") for n in range(count)
    ]
    jobs += [
        pgqueue.NewJob("t", {"n": "again"}, unique_key="k7"),  # a duplicate of the call
        pgqueue.NewJob("u", {"n": "u"}, unique_key="k7"),  # another type's key
        ("t", {"n": "plain"}),
    ]
    before = await _two_phase_commits(pool)
    ids = await queue.enqueue_many(jobs)
    assert await _two_phase_commits(pool) == before
    assert ids[5] == kept
    assert ids[count] == ids[7]
    assert len(set(ids)) == count + 2
    found = {r["id"]: r for r in await rows(pool, name)}
    assert set(found) == set(ids)
    assert _json(found[kept]["payload"]) == {"v": "old"}
    assert [_json(found[job_id]["payload"]) for job_id in ids] == [
        {"v": "old"} if n == 5 else {"n": n} for n in range(count)
    ] + [{"n": 7}, {"n": "u"}, {"n": "plain"}]
    assert [found[job_id]["unique_key"] for job_id in ids[: count + 2]] == [
        f"k{n}" for n in range(count)
    ] + ["k7", "k7"]
    with pytest.raises(pgqueue.DuplicateJobError) as raised:
        await queue.enqueue_many(
            [
                pgqueue.NewJob("t", {}, unique_key="new"),
                pgqueue.NewJob("t", {}, unique_key="k1"),
            ],
            on_conflict="raise",
        )
    assert raised.value.job_id == ids[1]
    assert len(await rows(pool, name)) == count + 3  # the call's new job is in
    assert await _two_phase_commits(pool) == before


async def test_enqueue_many_on_citus_in_the_callers_transaction_or_its_own(
    pool: asyncpg.Pool,
) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    count = 2_500  # three statements and more
    before = await _two_phase_commits(pool)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        await queue.enqueue_many([("t", {}) for _ in range(count)], connection=conn)
        await tx.rollback()
        assert await rows(pool, name) == []
        async with conn.transaction():
            inside = await queue.enqueue_many(
                [("t", {}) for _ in range(count)], connection=conn
            )
        # Not in a transaction: the call's statements take one of their own.
        alone = await queue.enqueue_many(
            [("t", {}) for _ in range(count)], connection=conn
        )
        assert not conn.is_in_transaction()
    assert [r["id"] for r in await rows(pool, name)] == inside + alone
    assert await _two_phase_commits(pool) == before


async def test_enqueue_many_on_citus_wakes_the_queue_after_commit(
    pool: asyncpg.Pool,
) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    heard: list[str] = []
    woken = anyio.Event()

    def hear(_conn: object, _pid: int, _channel: str, payload: object) -> None:
        heard.append(str(payload))
        woken.set()

    async with pool.acquire() as listener:
        await listener.add_listener("pgqueue_jobs", hear)
        await queue.enqueue_many([("t", {}) for _ in range(1_500)])
        with anyio.fail_after(10):
            await woken.wait()
        await listener.remove_listener("pgqueue_jobs", hear)
    assert name in heard


def test_the_sync_enqueue_many_on_citus_makes_no_two_phase_commit(
    cluster: CitusCluster,
) -> None:
    import psycopg

    import pgqueue.sync

    name = _name()
    count = 1_500
    with psycopg.connect(cluster.coordinator.dsn, autocommit=True) as conn:
        tally = "SELECT count(*) FROM pg_dist_transaction"
        before = conn.execute(tally).fetchone()
        queue = pgqueue.sync.Queue(conn, name=name)
        ids = queue.enqueue_many([("t", {"n": n}) for n in range(count)])
        assert conn.execute(tally).fetchone() == before
        found = conn.execute(
            "SELECT id, payload->>'n' FROM pgqueue_jobs WHERE queue = %s ORDER BY id",
            (name,),
        ).fetchall()
        assert [job_id for job_id, _ in found] == ids
        assert [int(n) for _, n in found] == list(range(count))
    with psycopg.connect(cluster.coordinator.dsn) as conn:  # not autocommit
        pgqueue.sync.Queue(conn, name=name).enqueue_many(
            [("t", {}) for _ in range(count)]
        )
        conn.rollback()
        left = conn.execute(
            "SELECT count(*) FROM pgqueue_jobs WHERE queue = %s", (name,)
        ).fetchone()
        assert left == (count,)  # the first connection's jobs only


async def test_retries_then_dead_with_the_history(pool: asyncpg.Pool) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name, max_attempts=2)
    job_id = await queue.enqueue("t", {})
    worker = pgqueue.Worker(pool, queue=name, backoff=lambda attempt: 0.0)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        msg = f"attempt {job.attempts}"
        raise RuntimeError(msg)

    with anyio.fail_after(60):
        await worker.run(until_empty=True)
    stored = await row(pool, job_id)
    assert (stored["status"], stored["attempts"]) == ("dead", 2)
    assert [entry["attempt"] for entry in _json(stored["errors"])] == [1, 2]


def _json(value: Any) -> Any:
    import json

    return json.loads(value) if isinstance(value, str) else value


async def test_a_job_of_a_dead_worker_is_rescued(pool: asyncpg.Pool) -> None:
    name = _name()
    job_id = await pgqueue.Queue(pool, name=name).enqueue("t", {})
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'running', attempts = 1,"
        " updated_at = now() - interval '1 hour' WHERE queue = $1 AND id = $2",
        name,
        job_id,
    )
    worker = pgqueue.Worker(pool, queue=name, rescue_after=60, poll_interval=0.2)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        pass

    async with running(worker):
        stored = await wait_for_row(pool, job_id, within=30, status="completed")
    assert stored["attempts"] == 2
    assert _json(stored["errors"])[0]["error"].startswith("no heartbeat for ")


async def test_retention_and_prune(pool: asyncpg.Pool) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    await queue.enqueue_many([("t", {}) for _ in range(5)])
    with pytest.raises(ValueError, match="dependencies"):
        await queue.enqueue("t", {}, after=[1])
    worker = pgqueue.Worker(pool, queue=name)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        pass

    with anyio.fail_after(60):
        await worker.run(until_empty=True)
    admin = pgqueue.Admin(pool)
    assert await queue.prune(3600) == 0
    assert await admin.prune(3600) == 0
    await pool.execute(
        "UPDATE pgqueue_jobs SET updated_at = now() - interval '2 hours'"
        " WHERE queue = $1 AND id IN (SELECT id FROM pgqueue_jobs WHERE queue = $1"
        " ORDER BY id LIMIT 2)",
        name,
    )
    assert await queue.prune(3600) == 2
    assert await admin.prune(0, queue=name, batch_size=2) == 3
    assert await rows(pool, name) == []
    # The worker's retention sweep.
    await queue.enqueue_many([("t", {}) for _ in range(3)])
    retaining = pgqueue.Worker(
        pool, queue=name, retain=0, poll_interval=0.2, rescue_after=1
    )
    retaining.register("t", handle)
    async with running(retaining):

        async def gone() -> bool:
            return not await rows(pool, name)

        await wait_until(gone, within=30)


async def test_cancel_and_retry_by_id(pool: asyncpg.Pool) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    admin = pgqueue.Admin(pool)
    pending = await queue.enqueue("t", {})
    other = await pgqueue.Queue(pool, name=_name()).enqueue("t", {})
    assert await queue.cancel(pending, other, 2**62) == {
        pending: "cancelled",
        other: "cancelled",
        2**62: "not_found",
    }
    assert (await row(pool, pending))["status"] == "cancelled"
    assert await admin.retry(pending, 2**62) == {
        pending: "retried",
        2**62: "not_found",
    }
    assert (await row(pool, pending))["status"] == "pending"
    assert await admin.cancel(pending) == {pending: "cancelled"}

    # A in_progress job: cancelled by request, its handler cut off.
    started = anyio.Event()
    in_progress = await queue.enqueue("t", {})
    worker = pgqueue.Worker(pool, queue=name)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        started.set()
        await anyio.sleep_forever()

    async with running(worker):
        with anyio.fail_after(20):
            await started.wait()
        assert await admin.cancel(in_progress) == {in_progress: "requested"}
        await wait_for_row(pool, in_progress, within=20, status="cancelled")


async def test_a_tracker_hears_outcomes(pool: asyncpg.Pool) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    done = await queue.enqueue("t", {"x": 1}, track=True)
    worker = pgqueue.Worker(pool, queue=name)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> dict[str, int]:
        return {"got": job.payload["x"]}

    async with pgqueue.Tracker(pool, poll_interval=3600) as tracker, running(worker):
        with anyio.fail_after(20):
            outcome = await tracker.wait(done)
    assert outcome.status == "completed"
    assert outcome.result == {"got": 1}


async def test_publish_and_subscribe_on_the_coordinator(
    cluster: CitusCluster, pool: asyncpg.Pool
) -> None:
    heard: list[str] = []
    got = anyio.Event()
    subscriber = pgqueue.Subscriber(pool)

    @subscriber.handler("orders")
    async def on_order(payload: str) -> None:
        heard.append(payload)
        got.set()

    async with anyio.create_task_group() as tg:
        await tg.start(subscriber.run)
        await pgqueue.publish(pool, "orders", "42")
        with anyio.fail_after(20):
            await got.wait()
        subscriber.stop()
    assert heard == ["42"]


async def test_the_cli_prints_applies_and_reads(
    cluster: CitusCluster, pool: asyncpg.Pool
) -> None:
    dsn = cluster.coordinator.dsn
    printed = await cli(None, "schema", "print", "--distributed")
    assert printed.code == EXIT_OK
    assert printed.out.strip() == pgqueue.SCHEMA_DISTRIBUTED.strip()
    applied = await cli(dsn, "schema", "apply", "--distributed")
    assert applied.code == EXIT_OK, applied
    assert "current" in applied.out
    assert (await cli(dsn, "schema", "check")).code == EXIT_OK

    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    job_id = await queue.enqueue("t", {})
    stats = await cli(dsn, "stats", "--json")
    assert stats.code == EXIT_OK, stats
    assert any(entry["queue"] == name for entry in stats.json())
    listed = await cli(dsn, "jobs", "list", "--queue", name, "--json")
    assert listed.code == EXIT_OK, listed
    assert [job["id"] for job in listed.json()] == [job_id]
    cancelled = await cli(dsn, "cancel", str(job_id), str(2**62))
    assert cancelled.code == EXIT_ERROR
    assert cancelled.out.splitlines()[0] == f"{job_id}\tcancelled"
    retried = await cli(dsn, "retry", str(job_id), "--json")
    assert retried.code == EXIT_OK, retried
    assert retried.json() == [{"id": job_id, "result": "retried", "reason": None}]


async def test_a_periodic_job_is_enqueued_once_per_tick_by_two_workers(
    pool: asyncpg.Pool,
) -> None:
    name = _name()
    ran: list[int] = []
    enough = anyio.Event()
    workers = [pgqueue.Worker(pool, queue=name) for _ in range(2)]
    for worker in workers:
        worker.periodic(f"every-second-{name}", every=1.0, job_type="tick")

        @worker.handler("tick")
        async def handle(job: pgqueue.Job) -> None:
            ran.append(job.id)
            if len(ran) >= 2:
                enough.set()

    async with running(workers[0]), running(workers[1]):
        with anyio.fail_after(30):
            await enough.wait()
    assert len(ran) == len(set(ran))
    keys = [r["unique_key"] for r in await rows(pool, name) if r["job_type"] == "tick"]
    assert len(keys) == len(set(keys))  # one job per tick
    schedules = await pgqueue.Admin(pool).schedules()
    assert any(s.name == f"every-second-{name}" for s in schedules)
    assert await pgqueue.Admin(pool).remove_schedule(f"every-second-{name}")


async def test_a_fleet_wide_limit_holds_across_workers(pool: asyncpg.Pool) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    await queue.enqueue_many([("t", {}) for _ in range(12)])
    in_flight = 0
    most = 0
    done = 0
    finished = anyio.Event()
    workers = [
        pgqueue.Worker(pool, queue=name, concurrency=4, global_limit=2)
        for _ in range(2)
    ]
    for worker in workers:

        @worker.handler("t")
        async def handle(job: pgqueue.Job) -> None:
            nonlocal in_flight, most, done
            in_flight += 1
            most = max(most, in_flight)
            await anyio.sleep(0.05)
            in_flight -= 1
            done += 1
            if done == 12:
                finished.set()

    async with running(workers[0]), running(workers[1]):
        with anyio.fail_after(60):
            await finished.wait()
    assert most <= 2
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM pgqueue_leases WHERE queue = $1", name
        )
        == 0
    )


async def test_a_checkpoint_is_stored_on_the_shard_without_2pc(
    pool: asyncpg.Pool,
) -> None:
    name = _name()
    job_id = await pgqueue.Queue(pool, name=name).enqueue("t", {})
    worker = pgqueue.Worker(pool, queue=name)
    stored: list[bool] = []

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        stored.append(await job.checkpoint({"step": 3}))
        raise pgqueue.Permanent("stop here")

    before = await _two_phase_commits(pool)
    with anyio.fail_after(60):
        await worker.run(until_empty=True)
    assert stored == [True]
    assert _json((await row(pool, job_id))["checkpoint"]) == {"step": 3}
    assert await _two_phase_commits(pool) == before


async def test_priorities_and_types_on_the_shard(pool: asyncpg.Pool) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    low = await queue.enqueue("t", {}, priority=-2)
    high = await queue.enqueue("t", {}, priority=3)
    plain = await queue.enqueue("t", {})
    other = await queue.enqueue("unknown", {})
    order: list[int] = []
    worker = pgqueue.Worker(pool, queue=name, concurrency=1, unknown_types="wait")

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        order.append(job.id)

    with anyio.fail_after(60):
        await worker.run(until_empty=True)
    assert order == [high, plain, low]
    assert (await row(pool, other))["status"] == "pending"


async def test_a_job_with_a_priority_enqueued_mid_drain_is_taken_by_the_second_claim(
    pool: asyncpg.Pool,
) -> None:
    # Claims of priority 0's line only, while no job of another priority is
    # pending: the next claim sees the new job, the one after takes it.
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    backlog = await queue.enqueue_many([("t", {"n": n}) for n in range(40)])
    order: list[int] = []
    urgent: list[int] = []
    worker = pgqueue.Worker(pool, queue=name, concurrency=1, prefetch=0)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        order.append(job.id)
        if len(order) == 10:
            urgent.append(await queue.enqueue("t", {}, priority=3))

    with anyio.fail_after(60):
        await worker.run(until_empty=True)
    assert sorted(order) == sorted([*backlog, *urgent])
    assert order.index(urgent[0]) <= 11  # enqueued during the 10th run
    assert [job for job in order if job != urgent[0]] == backlog


async def test_a_paused_queue_waits_then_its_groups_run_one_job_at_a_time(
    pool: asyncpg.Pool,
) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    admin = pgqueue.Admin(pool)
    assert await admin.pause(name)
    ids = await queue.enqueue_many(
        [
            pgqueue.NewJob("t", {"group": f"g{n % 3}"}, group=f"g{n % 3}")
            for n in range(18)
        ]
    )
    before = await _two_phase_commits(pool)
    busy: Counter[str] = Counter()
    most: Counter[str] = Counter()
    done: list[int] = []
    started = anyio.Event()
    finished = anyio.Event()
    # Two workers: the group limit holds across them.
    workers = [
        pgqueue.Worker(
            pool, queue=name, concurrency=4, group_limit=1, poll_interval=0.2
        )
        for _ in range(2)
    ]

    async def handle(job: pgqueue.Job) -> None:
        group = job.payload["group"]
        started.set()
        busy[group] += 1
        most[group] = max(most[group], busy[group])
        await anyio.sleep(0.02)
        busy[group] -= 1
        done.append(job.id)
        if len(done) == len(ids):
            finished.set()

    for worker in workers:
        worker.register("t", handle)
    async with running(workers[0]), running(workers[1]):
        # Paused: five polls of each worker find nothing to claim.
        with anyio.move_on_after(1.0):
            await started.wait()
        assert not started.is_set()
        assert await admin.resume(name)
        with anyio.fail_after(60):
            await finished.wait()
    assert sorted(done) == sorted(ids)
    assert set(most.values()) == {1}
    assert await _two_phase_commits(pool) == before


async def test_a_rate_limit_holds_across_workers_on_the_shard(
    pool: asyncpg.Pool,
) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    ids = await queue.enqueue_many([("t", {}) for _ in range(25)])
    before = await _two_phase_commits(pool)
    starts: list[float] = []
    ran: Counter[int] = Counter()
    finished = anyio.Event()
    workers = [
        pgqueue.Worker(
            pool, queue=name, concurrency=10, rate_limit=pgqueue.RateLimit(10, per=1)
        )
        for _ in range(2)
    ]

    async def handle(job: pgqueue.Job) -> None:
        starts.append(time.monotonic())
        ran[job.id] += 1
        if len(ran) == len(ids):
            finished.set()

    for worker in workers:
        worker.register("t", handle)
    async with running(workers[0]), running(workers[1]):
        with anyio.fail_after(60):
            await finished.wait()
    assert sorted(ran) == sorted(ids)
    assert set(ran.values()) == {1}
    first = min(starts)
    # A job starts after its claim: the first half second's starts were all
    # claimed within one window, and 25 jobs at 10 a second take 3 windows.
    assert sum(1 for at in starts if at < first + 0.5) <= 10
    assert max(starts) - first >= 1.5
    assert await _two_phase_commits(pool) == before


async def test_the_web_dashboard_reads_the_cluster(pool: asyncpg.Pool) -> None:
    import httpx

    from pgqueue.web import create_app

    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    job_id = await queue.enqueue("mail", {"n": 1})
    await queue.enqueue_many([("mail", {}) for _ in range(2)])
    transport = httpx.ASGITransport(app=create_app(pool))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        page = await c.get("/")
        assert page.status_code == 200
        assert f'data-queue="{name}"' in page.text
        frame = (await c.get("/api/frame")).json()
        [ours] = [q for q in frame["queues"] if q["queue"] == name]
        assert ours["ready"] == 3
        listing = await c.get("/jobs", params={"queue": name})
        assert listing.status_code == 200
        assert str(job_id) in listing.text
        assert (await c.get(f"/jobs/{job_id}")).status_code == 200


async def test_pgqueue_enqueue_from_sql_wakes_a_worker(pool: asyncpg.Pool) -> None:
    name = _name()
    ran = anyio.Event()
    worker = pgqueue.Worker(pool, queue=name, poll_interval=3600)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        ran.set()

    async with running(worker):
        await wait_until(lambda: _idle(worker))
        first = await pool.fetchval(
            "SELECT pgqueue_enqueue('t', '{}', $1, unique_key => 'k')", name
        )
        with anyio.fail_after(20):
            await ran.wait()
    again = await pool.fetchval(
        "SELECT pgqueue_enqueue('t', '{}', $1, unique_key => 'k')", name
    )
    assert again != first  # the first one completed: its key is free again


async def test_the_frames_of_pgqueue_top_read_the_cluster(pool: asyncpg.Pool) -> None:
    from pgqueue._dashboard import Sampler

    name = _name()
    await pgqueue.Queue(pool, name=name).enqueue_many([("t", {}) for _ in range(4)])
    async with pool.acquire() as conn:
        sampler = Sampler(conn, queue=name)
        await sampler.frame()
        frame = await sampler.frame()
    [line] = frame.queues
    assert (line.queue, line.ready) == (name, 4)


# Durable handlers on the cluster: each run's writes on its job's shard.


async def test_a_durable_sleep_frees_the_slot_and_resumes_on_the_shard_without_2pc(
    pool: asyncpg.Pool,
) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    calls: Counter[str] = Counter()
    order: list[str] = []
    done = anyio.Event()
    worker = pgqueue.Worker(pool, queue=name, concurrency=1, poll_interval=3600)

    @worker.handler("nap")
    async def nap(job: pgqueue.Job) -> dict[str, Any]:
        async def before() -> int:
            calls["before"] += 1
            return 41

        slept = "before" in job.steps  # the guard of a sleep: its step
        first = await job.step("before", before)
        await job.progress(0.5, "half way")
        if not slept:
            order.append(f"nap {job.attempts}")
            await job.sleep(0.5)
        order.append("woke")
        return {"first": first + 1}

    @worker.handler("other")
    async def other(job: pgqueue.Job) -> None:
        order.append("other")

    @worker.handler("last")
    async def last(job: pgqueue.Job) -> None:
        done.set()

    async with running(worker):
        await wait_until(lambda: _idle(worker))
        before = await _two_phase_commits(pool)
        nap_id = await queue.enqueue("nap", {})
        await wait_for_row(pool, nap_id, within=20, status="pending", attempts=0)
        await queue.enqueue("other", {})  # runs in the slot the sleep gave back
        stored = await wait_for_row(pool, nap_id, within=20, status="completed")
        await queue.enqueue("last", {})
        with anyio.fail_after(20):
            await done.wait()
        after = await _two_phase_commits(pool)
    assert order == ["nap 1", "other", "woke"]
    assert calls["before"] == 1  # the step's value came from the row
    assert _json(stored["result"]) == {"first": 42}
    assert set(_json(stored["steps"])) == {"before"}
    assert _json(stored["progress"])["fraction"] == 0.5
    assert after == before


async def test_signals_wake_a_parked_job_on_its_shard_without_a_poll_or_2pc(
    pool: asyncpg.Pool,
) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    admin = pgqueue.Admin(pool)
    worker = pgqueue.Worker(pool, queue=name, poll_interval=3600)

    @worker.handler("approve")
    async def approve(job: pgqueue.Job) -> list[Any]:
        return [
            await job.wait_for("early"),
            await job.wait_for("sql"),
            await job.wait_for("admin"),
        ]

    job_id = await queue.enqueue("approve", {}, unique_key="k")
    # Sent before the wait: there when it asks.
    assert await queue.signal(job_id, "early", {"n": 1})
    async with running(worker):
        await wait_until(lambda: _idle(worker))
        before = await _two_phase_commits(pool)
        parked = await wait_for_row(pool, job_id, within=20, status="parked")
        assert parked["attempts"] == 0
        assert _json(parked["wait"]) == {"signal": "sql", "until": None}
        # Parked: it holds its key, and retention leaves it.
        assert await queue.enqueue("approve", {}, unique_key="k") == job_id
        assert await admin.prune(0, queue=name) == 0
        async with pool.acquire() as conn:
            tx = conn.transaction()
            await tx.start()
            assert await conn.fetchval(
                "SELECT pgqueue_signal($1, 'sql', '\"rolled back\"')", job_id
            )
            await tx.rollback()  # a signal exists only if it commits
            assert await conn.fetchval("SELECT pgqueue_signal($1, 'sql', '2')", job_id)
        await wait_for_row(
            pool,
            job_id,
            within=20,
            status="parked",
            wait='{"until": null, "signal": "admin"}',
        )
        assert await admin.signal(job_id, "admin", [3])
        stored = await wait_for_row(pool, job_id, within=20, status="completed")
        after = await _two_phase_commits(pool)
    assert _json(stored["result"]) == [{"n": 1}, 2, [3]]
    assert [s["name"] for s in _json(stored["signals"])] == ["early", "sql", "admin"]
    assert after == before


async def test_a_wait_that_times_out_raises_in_the_next_run(pool: asyncpg.Pool) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    runs: list[int] = []
    worker = pgqueue.Worker(pool, queue=name, poll_interval=3600)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> str:
        runs.append(job.attempts)
        try:
            await job.wait_for("never", timeout=0.5)
        except pgqueue.WaitTimeout:
            return "timed out"
        return "signalled"

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        stored = await wait_for_row(pool, job_id, within=20, status="completed")
    assert _json(stored["result"]) == "timed out"
    assert runs == [1, 1]  # the wait gave its attempt back
    assert "pgqueue:timeout:signal:never" in _json(stored["steps"])


async def test_signals_to_unknown_and_finished_jobs(pool: asyncpg.Pool) -> None:
    name = _name()
    queue = pgqueue.Queue(pool, name=name)
    admin = pgqueue.Admin(pool)
    with pytest.raises(pgqueue.JobNotFoundError):
        await queue.signal(2**62, "go")
    with pytest.raises(pgqueue.JobNotFoundError):
        await admin.signal(2**62, "go")
    with pytest.raises(asyncpg.NoDataFoundError):
        await pool.fetchval("SELECT pgqueue_signal($1, 'go', NULL)", 2**62)
    job_id = await queue.enqueue("t", {})
    assert await queue.cancel(job_id) == {job_id: "cancelled"}
    assert not await queue.signal(job_id, "go", {"late": True})
    assert not await pool.fetchval("SELECT pgqueue_signal($1, 'go', NULL)", job_id)
    assert (await row(pool, job_id))["signals"] is None
    live = await queue.enqueue("t", {})
    with pytest.raises(ValueError, match="at most 65536"):
        await queue.signal(live, "big", "x" * 70_000)
    with pytest.raises(asyncpg.ProgramLimitExceededError):
        await pool.fetchval(
            "SELECT pgqueue_signal($1, 'big', to_jsonb(repeat('x', 70000)))", live
        )
    assert (await row(pool, live))["signals"] is None


async def test_spawn_and_wait_child_across_nodes(
    cluster: CitusCluster, pool: asyncpg.Pool
) -> None:
    # The parent's queue on one node, its children's on the other.
    parents, children = await _queues_on_both_nodes(pool, cluster, 2)
    spawned: list[tuple[int, int]] = []
    failed: list[pgqueue.ChildFailed] = []
    release = anyio.Event()
    worker = pgqueue.Worker(pool, queues={parents: 1, children: 2}, poll_interval=3600)

    @worker.handler("order")
    async def order(job: pgqueue.Job) -> Any:
        ok = await job.spawn("label", "label", {"fail": False}, queue=children)
        bad = await job.spawn(
            "customs", "label", {"fail": True}, queue=children, max_attempts=1
        )
        spawned.append((ok, bad))
        try:
            await job.wait_child(bad)
        except pgqueue.ChildFailed as exc:
            failed.append(exc)
        return await job.wait_child(ok)

    @worker.handler("label")
    async def label(job: pgqueue.Job) -> str:
        if job.payload["fail"]:
            raise pgqueue.Permanent("no customs form")
        await release.wait()
        return "TRK-1"

    order_id = await pgqueue.Queue(pool, name=parents).enqueue("order", {})
    async with running(worker):
        # Parked on the label (not on the customs job, which it waits for
        # first), and the label waits for the test.

        async def parked_on_the_label() -> bool:
            current = await row(pool, order_id)
            return (
                bool(spawned)
                and current["status"] == "parked"
                and _json(current["wait"])["child"] == spawned[0][0]
            )

        await wait_until(parked_on_the_label, within=20)
        label_id = _json((await row(pool, order_id))["wait"])["child"]
        await wait_for_row(pool, label_id, within=20, status="running")
        release.set()
        stored = await wait_for_row(pool, order_id, within=20, status="completed")
    assert _json(stored["result"]) == "TRK-1"
    assert len(set(spawned)) == 1  # each run spawned the same two children
    [(ok, bad)] = set(spawned)
    assert label_id == ok
    assert [(f.child_id, f.status, f.error) for f in failed][-1] == (
        bad,
        "dead",
        "Permanent: no customs form",
    )
    assert sorted(r["id"] for r in await rows(pool, children)) == sorted([ok, bad])


async def test_a_parent_is_woken_when_its_child_is_cancelled_or_deleted(
    pool: asyncpg.Pool,
) -> None:
    name, held = _name(), _name()  # no worker takes the children's queue
    queue = pgqueue.Queue(pool, name=name)
    admin = pgqueue.Admin(pool)
    seen: list[Any] = []
    # The rescue sweep (every poll here) is the safety net of a deleted child.
    worker = pgqueue.Worker(pool, queue=name, poll_interval=0.5, rescue_after=1)

    @worker.handler("parent")
    async def parent(job: pgqueue.Job) -> None:
        child = await job.spawn("child", "held", {}, queue=held)
        try:
            await job.wait_child(child)
        except (pgqueue.ChildFailed, pgqueue.JobNotFoundError) as exc:
            seen.append(type(exc).__name__)

    cancelled = await queue.enqueue("parent", {})
    deleted = await queue.enqueue("parent", {})
    async with running(worker):
        for parent_id in (cancelled, deleted):
            await wait_for_row(pool, parent_id, within=20, status="parked")
        cancelled_child = _json((await row(pool, cancelled))["wait"])["child"]
        deleted_child = _json((await row(pool, deleted))["wait"])["child"]
        assert await admin.cancel(cancelled_child) == {cancelled_child: "cancelled"}
        await wait_for_row(pool, cancelled, within=20, status="completed")
        assert await admin.delete(filter=pgqueue.JobFilter(ids=[deleted_child])) == 1
        await wait_for_row(pool, deleted, within=20, status="completed")
    assert sorted(seen) == ["ChildFailed", "JobNotFoundError"]
