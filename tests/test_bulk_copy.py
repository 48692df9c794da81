"""enqueue_many's COPY path (a batch of COPY_MIN_JOBS or more without unique keys)
against a real server: the same rows, ids and wakeup as the INSERT path."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue._copy import COPY_MAX_DELAY, COPY_MIN_JOBS
from pgqueue._sql.enqueue import RESERVE_IDS
from pgqueue._sql.schema import CITUS_CHECK
from tests.helpers import listening, queue_count, rows

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

LARGE = COPY_MIN_JOBS
SMALL = COPY_MIN_JOBS - 1


@dataclasses.dataclass
class Order:
    order_id: str
    total: float


# A job of each kind the INSERT path writes: the pattern repeats along a batch.
KINDS: list[pgqueue.NewJob] = [
    pgqueue.NewJob("plain", {"i": 1}),
    pgqueue.NewJob("none", None),
    pgqueue.NewJob("bytes", b'{"from": "bytes", "n": [1, 2]}'),
    pgqueue.NewJob("text", 'it\'s "quoted" \\ and \t tabbed\nüñí 🚀'),
    pgqueue.NewJob("numbers", [1e16, -1.5e300, 2**62, 0.1, -0.0, True, None]),
    pgqueue.NewJob("typed", Order("01J5", 9.99)),
    pgqueue.NewJob("attempts", {}, max_attempts=2),
    pgqueue.NewJob("high", {}, priority=5),
    pgqueue.NewJob("low", {}, priority=-5),
    pgqueue.NewJob("tracked", {}, track=True),
    pgqueue.NewJob("at", {}, run_at=datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)),
    pgqueue.NewJob("never", {}, run_at=datetime.max.replace(tzinfo=UTC)),
    # Python rounds 3.0000005 s to 3.000001 s; PostgreSQL, as rint(d * 1e6) µs, to 3 s.
    pgqueue.NewJob("delay", {}, delay=3.0000005),
    pgqueue.NewJob("delta", {}, delay=timedelta(days=400, microseconds=7)),
    pgqueue.NewJob("zero delay", {}, delay=0),
]


def batch(size: int) -> list[pgqueue.NewJob]:
    return [KINDS[i % len(KINDS)] for i in range(size)]


class Statements:
    """The statements a connection sends (asyncpg's query logger): which path ran."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def __call__(self, record: Any) -> None:
        self.sent.append(record.query)

    def copied(self) -> bool:
        return RESERVE_IDS in self.sent


@pytest.fixture
def dsn(fresh_dsn: str) -> str:
    """A database of the test's own: tens of thousands of rows in the run's
    database would make the dashboard's tests see a large table."""
    return fresh_dsn


@pytest.fixture
async def connection(pool: asyncpg.Pool) -> AsyncIterator[Any]:
    """A connection of the pool."""
    async with pool.acquire() as connection:
        yield connection


@pytest.fixture
def statements(connection: Any) -> Iterator[Statements]:
    """What ``connection`` sends."""
    statements = Statements()
    connection.add_query_logger(statements)
    yield statements
    connection.remove_query_logger(statements)


class TraceHook(pgqueue.EnqueueHook):
    """Gives each call a trace context; keeps what each call's event ended with."""

    def __init__(self) -> None:
        self.ended: list[tuple[list[int], list[bool]]] = []

    def before_enqueue(self, event: pgqueue.EnqueueEvent) -> None:
        event.trace_context = '{"traceparent": "00-abc-def-01"}'

    def after_enqueue(
        self, event: pgqueue.EnqueueEvent, state: Any, error: BaseException | None
    ) -> None:
        self.ended.append((event.ids, event.duplicates))


def comparable(stored: dict[str, Any]) -> dict[str, Any]:
    """A row without what differs between two enqueues of the same job."""
    return {
        k: v for k, v in stored.items() if k not in ("id", "created_at", "updated_at")
    }


async def test_ids_come_back_in_input_order_and_match_the_rows(
    pool: asyncpg.Pool, queue: pgqueue.Queue, connection: Any, statements: Statements
) -> None:
    jobs = [(f"type-{i % 7}", {"i": i}) for i in range(LARGE + 10)]
    async with connection.transaction():
        ids = await queue.enqueue_many(jobs, connection=connection)
    assert statements.copied()
    assert ids == sorted(ids)
    assert len(set(ids)) == len(jobs)
    stored = {r["id"]: r for r in await rows(pool, queue.name)}
    assert sorted(stored) == ids
    for (job_type, payload), job_id in zip(jobs, ids, strict=True):
        assert stored[job_id]["job_type"] == job_type
        assert json.loads(stored[job_id]["payload"]) == payload
        assert stored[job_id]["run_at"] == stored[job_id]["created_at"]


async def test_a_copied_batch_writes_the_rows_the_insert_path_writes(
    pool: asyncpg.Pool, queue_name: str, connection: Any, statements: Statements
) -> None:
    hook = TraceHook()
    queue = pgqueue.Queue(pool, name=queue_name, max_attempts=7, hooks=[hook])
    large, small = batch(LARGE), batch(SMALL)
    # One transaction: the same now() for both, so even delayed run_ats match.
    async with connection.transaction():
        copied = await queue.enqueue_many(large, connection=connection)
        assert statements.copied()
        statements.sent.clear()
        inserted = await queue.enqueue_many(small, connection=connection)
        assert not statements.copied()
    assert hook.ended == [
        (copied, [False] * len(copied)),
        (inserted, [False] * len(inserted)),
    ]
    stored = {r["id"]: r for r in await rows(pool, queue_name)}
    for i, (a, b) in enumerate(zip(copied, inserted, strict=False)):
        assert comparable(stored[a]) == comparable(stored[b]), large[i]
    # What each kind became, seen once.
    by_type = {stored[i]["job_type"]: stored[i] for i in copied}
    now = by_type["plain"]["created_at"]
    assert by_type["plain"]["run_at"] == now
    assert by_type["plain"]["max_attempts"] == 7
    assert by_type["plain"]["trace_context"] == '{"traceparent": "00-abc-def-01"}'
    assert (by_type["plain"]["status"], by_type["plain"]["attempts"]) == ("pending", 0)
    assert json.loads(by_type["none"]["payload"]) == {}
    assert json.loads(by_type["typed"]["payload"]) == {
        "order_id": "01J5",
        "total": 9.99,
    }
    assert json.loads(by_type["numbers"]["payload"]) == [
        1e16,
        -1.5e300,
        2**62,
        0.1,
        0.0,
        True,
        None,
    ]
    assert by_type["attempts"]["max_attempts"] == 2
    assert (by_type["high"]["priority"], by_type["low"]["priority"]) == (5, -5)
    assert by_type["tracked"]["tracked"] is True
    assert by_type["plain"]["tracked"] is False
    assert by_type["at"]["run_at"] == datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    assert by_type["never"]["run_at"] == datetime.max  # how asyncpg reads infinity
    assert by_type["delta"]["run_at"] == now + timedelta(days=400, microseconds=7)
    assert by_type["zero delay"]["run_at"] == now
    # The database's own sum, not the client's.
    exact = await pool.fetchval(
        "SELECT $1::timestamptz + make_interval(secs => 3.0000005)", now
    )
    assert by_type["delay"]["run_at"] == exact


async def test_a_copied_batch_on_a_connection_outside_a_transaction_commits(
    pool: asyncpg.Pool, queue: pgqueue.Queue, connection: Any, statements: Statements
) -> None:
    ids = await queue.enqueue_many(
        [("t", i) for i in range(LARGE)], connection=connection
    )
    assert statements.copied()
    # A transaction of its own, after the one look at whether the tables
    # are distributed (made on the caller's connection, not the pool).
    assert next(s for s in statements.sent if s != CITUS_CHECK) == "BEGIN;"
    assert not connection.is_in_transaction()
    assert [r["id"] for r in await rows(pool, queue.name)] == ids


async def test_a_committed_copy_wakes_the_queue_once(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue, queue_name: str
) -> None:
    marker = pgqueue.Queue(pool, name=queue_name + "-marker")
    async with listening(dsn, pgqueue.JOBS_CHANNEL) as notifications:
        await queue.enqueue_many([("t", i) for i in range(LARGE)])
        await marker.enqueue("t", {})
        # Notifications arrive in commit order.
        before_marker = await notifications.wait_for(marker.name, within=10)
    assert before_marker.count(queue.name) == 1


async def test_a_rolled_back_copy_writes_nothing_and_wakes_nobody(
    dsn: str,
    pool: asyncpg.Pool,
    queue: pgqueue.Queue,
    queue_name: str,
    connection: Any,
    statements: Statements,
) -> None:
    marker = pgqueue.Queue(pool, name=queue_name + "-marker")
    async with listening(dsn, pgqueue.JOBS_CHANNEL) as notifications:
        transaction = connection.transaction()
        await transaction.start()
        ids = await queue.enqueue_many(
            [("t", i) for i in range(LARGE)], connection=connection
        )
        assert statements.copied()
        await transaction.rollback()
        await marker.enqueue("t", {})
        before_marker = await notifications.wait_for(marker.name, within=10)
    assert queue.name not in before_marker
    assert await queue_count(pool, queue.name) == 0
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM pgqueue_jobs WHERE id = ANY($1::bigint[])", ids
        )
        == 0
    )


async def test_a_copy_inside_a_committed_transaction_wakes_after_the_commit(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue, connection: Any
) -> None:
    async with listening(dsn, pgqueue.JOBS_CHANNEL) as notifications:
        async with connection.transaction():
            await queue.enqueue_many(
                [("t", i) for i in range(LARGE)], connection=connection
            )
            # Not yet: the rows and the wakeup wait for the commit.
            assert await queue_count(pool, queue.name) == 0
            assert queue.name not in notifications.payloads
        await notifications.wait_for(queue.name, within=10)
    assert await queue_count(pool, queue.name) == LARGE


async def test_concurrent_copies_get_disjoint_ids(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    got: dict[str, list[int]] = {}

    async def enqueue(name: str) -> None:
        got[name] = await queue.enqueue_many(
            [(name, {"n": n}) for n in range(LARGE * 2)]
        )

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(enqueue, "a")
        tasks.start_soon(enqueue, "b")
    assert not set(got["a"]) & set(got["b"])
    stored = {r["id"]: r for r in await rows(pool, queue.name)}
    for name, ids in got.items():
        assert ids == sorted(ids)
        assert [
            (stored[i]["job_type"], json.loads(stored[i]["payload"])) for i in ids
        ] == [(name, {"n": n}) for n in range(LARGE * 2)]


async def test_a_batch_with_unique_keys_still_dedups(
    pool: asyncpg.Pool, queue: pgqueue.Queue, connection: Any, statements: Statements
) -> None:
    existing = await queue.enqueue("t", {"first": True}, unique_key="k")
    jobs = [pgqueue.NewJob("t", {"n": n}) for n in range(LARGE)]
    jobs[3] = pgqueue.NewJob("t", {"second": True}, unique_key="k")
    ids = await queue.enqueue_many(jobs, connection=connection)
    assert not statements.copied()
    assert ids[3] == existing
    assert await queue_count(pool, queue.name) == LARGE
    with pytest.raises(pgqueue.DuplicateJobError):
        await queue.enqueue_many(jobs, on_conflict="raise")


@pytest.mark.parametrize(
    ("bad", "error", "message"),
    [
        (pgqueue.NewJob("t", {"x": {1, 2}}), TypeError, "not JSON-serializable"),
        (pgqueue.NewJob("t", {"x": float("nan")}), ValueError, "NaN"),
        (pgqueue.NewJob("t", "a\x00b"), ValueError, "NUL"),
        (pgqueue.NewJob("t", "\ud800"), ValueError, "surrogate"),
        (pgqueue.NewJob("t", b"{not json"), ValueError, "not valid JSON"),
        (pgqueue.NewJob("", {}), ValueError, "job type must not be empty"),
        (pgqueue.NewJob("t", {}, priority=9), ValueError, "priority"),
        (pgqueue.NewJob("t", {}, delay=-1), ValueError, "delay"),
    ],
    ids=["set", "nan", "nul", "surrogate", "bytes", "type", "priority", "delay"],
)
async def test_bad_input_deep_in_a_large_batch_raises_naming_it_and_writes_nothing(
    pool: asyncpg.Pool,
    queue: pgqueue.Queue,
    queue_name: str,
    bad: pgqueue.NewJob,
    error: type[Exception],
    message: str,
) -> None:
    index = LARGE + 3
    jobs = [pgqueue.NewJob("t", {"n": n}) for n in range(LARGE * 2)]
    jobs[index] = bad
    with pytest.raises(error, match=f"^job {index}: .*{message}"):
        await queue.enqueue_many(jobs)
    assert await queue_count(pool, queue.name) == 0
    # Before any SQL: a queue that cannot reach a server says the same.
    nowhere = pgqueue.Queue(
        asyncpg.create_pool("postgresql://nobody@127.0.0.1:1/none"), name=queue_name
    )
    with pytest.raises(error, match=f"^job {index}: .*{message}"):
        await nowhere.enqueue_many(jobs)


async def test_a_delay_too_long_for_a_datetime_takes_the_insert_path(
    pool: asyncpg.Pool, queue: pgqueue.Queue, connection: Any, statements: Statements
) -> None:
    jobs = [pgqueue.NewJob("t", {}) for _ in range(LARGE)]
    jobs[0] = pgqueue.NewJob("t", {}, delay=COPY_MAX_DELAY + 1)
    ids = await queue.enqueue_many(jobs, connection=connection)
    assert not statements.copied()
    assert await pool.fetchval(
        "SELECT run_at = created_at + make_interval(secs => $2)"
        " FROM pgqueue_jobs WHERE id = $1",
        ids[0],
        COPY_MAX_DELAY + 1,
    )


async def _jsonb_codec(connection: asyncpg.Connection) -> None:
    await connection.set_type_codec(
        "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
    )


async def test_a_connection_with_its_own_jsonb_codec_stores_the_same_json(
    dsn: str, queue_name: str
) -> None:
    # The codec would encode the JSON text again (a JSON string): the INSERT
    # path, which sends it as text, takes the batch.
    payloads: list[Any] = [{"n": n, "f": 1e16} for n in range(LARGE)]
    async with asyncpg.create_pool(
        dsn, min_size=1, max_size=2, init=_jsonb_codec
    ) as pool:
        queue = pgqueue.Queue(pool, name=queue_name)
        ids = await queue.enqueue_many([("t", p) for p in payloads])
        async with pool.acquire() as connection:
            statements = Statements()
            connection.add_query_logger(statements)
            ids += await queue.enqueue_many(
                [("t", p) for p in payloads], connection=connection
            )
            connection.remove_query_logger(statements)
        assert not statements.copied()
        stored = await pool.fetch(
            "SELECT id, jsonb_typeof(payload) AS kind, payload::text AS text"
            " FROM pgqueue_jobs WHERE queue = $1 ORDER BY id",
            queue_name,
        )
    assert [r["id"] for r in stored] == ids
    assert {r["kind"] for r in stored} == {"object"}
    assert [json.loads(r["text"]) for r in stored] == payloads + payloads
