"""pgqueue.sync on psycopg 3: the async Queue's rows, errors and wakeups, in the caller's transaction."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import psycopg
import pytest
from psycopg.pq import TransactionStatus

import pgqueue
import pgqueue.sync
from tests.helpers import queue_count, row, rows, running

if TYPE_CHECKING:
    from collections.abc import Iterator

    import asyncpg

ORDERS = "CREATE TABLE IF NOT EXISTS sync_orders (id text PRIMARY KEY, job_id bigint)"
# Columns set by the clock or the sequence, not by the enqueue.
CLOCK = {"id", "created_at", "updated_at"}


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A psycopg connection in autocommit mode."""
    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(ORDERS)
        yield connection


@pytest.fixture
def tx_conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A psycopg connection as it comes: statements open a transaction."""
    with psycopg.connect(dsn) as connection:
        yield connection


def order_exists(conn: psycopg.Connection[Any], order_id: str) -> bool:
    found = conn.execute("SELECT 1 FROM sync_orders WHERE id = %s", [order_id])
    return found.fetchone() is not None


async def test_a_commit_writes_the_order_and_the_job_and_wakes_an_idle_worker(
    pool: asyncpg.Pool, conn: psycopg.Connection[Any], queue_name: str
) -> None:
    started = anyio.Event()
    # poll_interval=30: within the deadline only the NOTIFY runs the job.
    worker = pgqueue.Worker(pool, queue=queue_name, poll_interval=30)

    @worker.handler("ship")
    async def ship(_job: pgqueue.Job) -> None:
        started.set()

    order_id = uuid.uuid4().hex
    async with running(worker):
        with conn.transaction():
            job_id = pgqueue.sync.Queue(conn, queue_name).enqueue(
                "ship", {"order": order_id}
            )
            conn.execute("INSERT INTO sync_orders VALUES (%s, %s)", [order_id, job_id])
        with anyio.fail_after(5):
            await started.wait()
    assert order_exists(conn, order_id)
    assert (await row(pool, job_id))["payload"] == f'{{"order": "{order_id}"}}'


async def test_a_rollback_leaves_neither_order_nor_job(
    pool: asyncpg.Pool, conn: psycopg.Connection[Any], queue_name: str
) -> None:
    order_id = uuid.uuid4().hex

    def place_order() -> None:
        with conn.transaction():
            pgqueue.sync.Queue(conn, queue_name).enqueue("ship", {"order": order_id})
            conn.execute("INSERT INTO sync_orders VALUES (%s, 0)", [order_id])
            raise RuntimeError("no stock")

    with pytest.raises(RuntimeError, match="no stock"):
        place_order()
    assert not order_exists(conn, order_id)
    assert await queue_count(pool, queue_name) == 0


async def test_on_an_autocommit_connection_each_enqueue_commits_by_itself(
    pool: asyncpg.Pool, conn: psycopg.Connection[Any], queue_name: str
) -> None:
    queue = pgqueue.sync.Queue(conn, queue_name)
    first = queue.enqueue("t", {"n": 1})
    assert conn.info.transaction_status == TransactionStatus.IDLE
    assert [r["id"] for r in await rows(pool, queue_name)] == [first]


async def test_a_connection_s_open_transaction_holds_the_job_until_it_commits(
    pool: asyncpg.Pool, tx_conn: psycopg.Connection[Any], queue_name: str
) -> None:
    job_id = pgqueue.sync.Queue(tx_conn, queue_name).enqueue("t")
    assert tx_conn.info.transaction_status == TransactionStatus.INTRANS
    assert await queue_count(pool, queue_name) == 0
    tx_conn.commit()
    assert [r["id"] for r in await rows(pool, queue_name)] == [job_id]


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (lambda q: q.enqueue(""), ValueError, "job type"),
        (lambda q: q.enqueue("t", {"at": object()}), TypeError, "at"),
        (lambda q: q.enqueue("t", priority=9), ValueError, "priority"),
        (lambda q: q.enqueue("t", run_at=datetime(2030, 1, 1)), ValueError, "aware"),
        (lambda q: q.enqueue("t", delay=-1), ValueError, "delay"),
        (lambda q: q.enqueue("t", on_conflict="skip"), ValueError, "on_conflict"),
        (lambda q: q.enqueue_many([("t", {}), ("", {})]), ValueError, "job 1"),
        (lambda q: q.enqueue_many([("t", {}), 3]), TypeError, "job 1"),
        (lambda q: q.enqueue_many([("t", {"x": {1, 2}})]), TypeError, "x"),
        (lambda q: q.cancel(0), ValueError, "id"),
    ],
)
async def test_bad_input_raises_before_any_statement_runs(
    pool: asyncpg.Pool,
    tx_conn: psycopg.Connection[Any],
    queue_name: str,
    call: Any,
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error, match=message):
        call(pgqueue.sync.Queue(tx_conn, queue_name))
    # A statement would have opened a transaction.
    assert tx_conn.info.transaction_status == TransactionStatus.IDLE
    assert await queue_count(pool, queue_name) == 0


def test_the_queue_s_own_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        pgqueue.sync.Queue(None, max_attempts=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="queue"):
        pgqueue.sync.Queue(None, "")  # type: ignore[arg-type]


async def test_a_duplicate_key_returns_the_job_or_raises_and_the_transaction_goes_on(
    pool: asyncpg.Pool, conn: psycopg.Connection[Any], queue_name: str
) -> None:
    queue = pgqueue.sync.Queue(conn, queue_name)
    first = queue.enqueue("t", {"n": 1}, unique_key=queue_name)
    assert queue.enqueue("t", {"n": 2}, unique_key=queue_name) == first
    with conn.transaction():
        with pytest.raises(pgqueue.DuplicateJobError) as raised:
            queue.enqueue("t", {"n": 3}, unique_key=queue_name, on_conflict="raise")
        assert (raised.value.job_id, raised.value.unique_key) == (first, queue_name)
        other = queue.enqueue("t", {"n": 4}, unique_key="other")
    assert [r["id"] for r in await rows(pool, queue_name)] == [first, other]
    ids = queue.enqueue_many([pgqueue.NewJob("t", unique_key=queue_name), ("u", {})])
    assert ids[0] == first
    with pytest.raises(pgqueue.DuplicateJobError):
        queue.enqueue_many(
            [pgqueue.NewJob("t", unique_key=queue_name)], on_conflict="raise"
        )


OPTIONS: list[dict[str, Any]] = [
    {},
    {"max_attempts": 2, "priority": -3, "track": True},
    {"run_at": datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)},
    {"delay": timedelta(minutes=5), "unique_key": "same-row"},
]


def enqueued(job: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """A row's columns the enqueue wrote; without run_at, counted from its now()."""
    columns = {k: v for k, v in job.items() if k not in CLOCK}
    if "run_at" not in options:
        columns["run_at"] = job["run_at"] - job["created_at"]
    return columns


@pytest.mark.parametrize("options", OPTIONS)
async def test_enqueue_writes_the_row_the_async_queue_writes(
    pool: asyncpg.Pool,
    conn: psycopg.Connection[Any],
    queue_name: str,
    options: dict[str, Any],
) -> None:
    payload = {"user": "01J5", "tags": ["a", "b"], "n": 1.5}
    async_id = await pgqueue.Queue(pool, queue_name).enqueue("t", payload, **options)
    expected = await row(pool, async_id)
    await pool.execute("DELETE FROM pgqueue_jobs WHERE id = $1", async_id)
    sync_id = pgqueue.sync.Queue(conn, queue_name).enqueue("t", payload, **options)
    assert enqueued(await row(pool, sync_id), options) == enqueued(expected, options)


async def test_the_sql_function_writes_the_same_row(
    pool: asyncpg.Pool, conn: psycopg.Connection[Any], queue_name: str
) -> None:
    options: dict[str, Any] = {
        "max_attempts": 3,
        "priority": 2,
        "track": True,
        "unique_key": "fn",
    }
    mine = pgqueue.sync.Queue(conn, queue_name).enqueue("t", {"a": 1}, **options)
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed' WHERE id = $1", mine
    )
    [function] = conn.execute(
        "SELECT pgqueue_enqueue('t', '{\"a\": 1}', queue => %s, max_attempts => 3,"
        " priority => 2, track => true, unique_key => 'fn')",
        (queue_name,),
    ).fetchone() or [None]
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed' WHERE id = $1", function
    )
    assert enqueued(await row(pool, mine), {}) == enqueued(
        await row(pool, function), {}
    )


async def test_enqueue_many_writes_the_async_queue_s_rows_in_input_order(
    pool: asyncpg.Pool, conn: psycopg.Connection[Any], queue_name: str
) -> None:
    jobs: list[Any] = [
        ("a", {"n": 1}),
        pgqueue.NewJob("b", {"n": 2}, priority=4, track=True, max_attempts=1),
        pgqueue.NewJob(
            "c", {"n": 3}, unique_key="u", run_at=datetime(2030, 1, 1, tzinfo=UTC)
        ),
        pgqueue.NewJob("c", {"n": 4}, unique_key="u"),
        ("a", None),
    ]
    async_ids = await pgqueue.Queue(pool, queue_name).enqueue_many(jobs)
    theirs = await rows(pool, queue_name)
    # Unique keys span queues: the async jobs would be the duplicates.
    await pool.execute("DELETE FROM pgqueue_jobs WHERE queue = $1", queue_name)
    ids = pgqueue.sync.Queue(conn, queue_name).enqueue_many(jobs)
    assert ids[0] < ids[1] < ids[2] == ids[3] < ids[4]
    mine = await rows(pool, queue_name)
    given = [{}, {}, {"run_at": True}, {}]  # the rows' options, in id order
    assert [enqueued(r, o) for r, o in zip(mine, given, strict=True)] == [
        enqueued(r, o) for r, o in zip(theirs, given, strict=True)
    ]
    assert len(async_ids) == len(ids) == 5
    assert pgqueue.sync.Queue(conn, queue_name).enqueue_many([]) == []


async def test_cancel_answers_as_the_async_queue(
    conn: psycopg.Connection[Any], queue_name: str
) -> None:
    queue = pgqueue.sync.Queue(conn, queue_name)
    job_id = queue.enqueue("t")
    assert queue.cancel(job_id, 2**62) == {job_id: "cancelled", 2**62: "not_found"}
    assert queue.cancel(job_id) == {job_id: "finished"}
    assert queue.cancel() == {}


async def test_admin_reads_what_the_async_admin_reads(
    pool: asyncpg.Pool, conn: psycopg.Connection[Any], queue_name: str
) -> None:
    queue = pgqueue.sync.Queue(conn, queue_name)
    ids = queue.enqueue_many([("a", {"n": n}) for n in range(3)])
    queue.enqueue("b", delay=3600)
    await pool.execute("UPDATE pgqueue_jobs SET status = 'dead' WHERE id = $1", ids[0])
    admin, async_admin = pgqueue.sync.Admin(conn), pgqueue.Admin(pool)
    [stats] = admin.stats(queue_name)
    [async_stats] = await async_admin.stats(queue_name)
    assert (stats.ready, stats.scheduled, stats.dead) == (2, 1, 1)
    assert stats.lag is not None
    assert async_stats.lag is not None
    assert stats.to_json() | {"lag": 0} == async_stats.to_json() | {"lag": 0}
    assert any(s.queue == queue_name for s in admin.stats())
    listed = admin.jobs(queue=queue_name, limit=2)
    assert listed == await async_admin.jobs(queue=queue_name, limit=2)
    assert admin.jobs(queue=queue_name, after_id=ids[0]) == await async_admin.jobs(
        queue=queue_name, after_id=ids[0]
    )
    assert admin.job_summaries(queue=queue_name, status="ready") == (
        await async_admin.job_summaries(queue=queue_name, status="ready")
    )
    assert admin.job(ids[1]) == await async_admin.job(ids[1])
    assert admin.job(2**62) is None
    assert admin.dead_count(queue=queue_name) == 1
    assert admin.dead_count(queue=queue_name, job_type="b") == 0
    with pytest.raises(ValueError, match="status"):
        admin.jobs(status="lost")


async def test_a_missing_table_raises_schema_error_naming_the_database(
    pool: asyncpg.Pool, dsn: str
) -> None:
    await pool.execute("CREATE SCHEMA IF NOT EXISTS sync_empty")
    with psycopg.connect(
        dsn, autocommit=True, options="-c search_path=sync_empty"
    ) as c:
        with pytest.raises(
            pgqueue.SchemaError, match="no table pgqueue_jobs"
        ) as raised:
            pgqueue.sync.Queue(c).enqueue("t")
        assert (
            raised.value.where
            == f"{c.info.user}@{c.info.host}:{c.info.port}/{c.info.dbname}"
        )
        with pytest.raises(pgqueue.SchemaError, match="no table"):
            pgqueue.sync.Admin(c).stats()
        # In a transaction the error aborted, the statement's error is all there is.
        with (
            pytest.raises(pgqueue.SchemaError, match="pgqueue_jobs") as raised,
            c.transaction(),
        ):
            pgqueue.sync.Queue(c).enqueue_many([("t", {})])
        assert raised.value.where is not None


async def test_jobs_with_parents_wait_for_them_and_an_unknown_parent_writes_nothing(
    pool: asyncpg.Pool, conn: psycopg.Connection[Any], queue_name: str
) -> None:
    queue = pgqueue.sync.Queue(conn, queue_name)
    first, second = queue.enqueue_many([("a", {}), pgqueue.NewJob("b", after=[-1])])
    third = queue.enqueue("c", after=[first, second], on_parent_failure="run")
    statuses = await pool.fetch(
        "SELECT id, status FROM pgqueue_jobs WHERE queue = $1 ORDER BY id", queue_name
    )
    assert [(r["id"], r["status"]) for r in statuses] == [
        (first, "pending"),
        (second, "waiting"),
        (third, "waiting"),
    ]
    with conn.transaction():
        conn.execute("SELECT 1")
        with pytest.raises(pgqueue.JobNotFoundError):
            queue.enqueue("d", after=[2**62])
        # The savepoint failed, not the transaction.
        assert conn.execute("SELECT 2").fetchone() == (2,)
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1", queue_name
        )
        == 3
    )
