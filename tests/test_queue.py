"""The producer API against a real server."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
import pytest

import pgqueue
from tests.helpers import listening, queue_count, row, rows


async def test_enqueue_inserts_a_pending_row(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    before = await pool.fetchval("SELECT now()")
    job_id = await queue.enqueue("send_welcome_email", {"user_id": "01J5"})
    stored = await row(pool, job_id)
    assert stored["queue"] == queue.name
    assert stored["job_type"] == "send_welcome_email"
    assert json.loads(stored["payload"]) == {"user_id": "01J5"}
    assert stored["status"] == "pending"
    assert stored["attempts"] == 0
    assert stored["max_attempts"] == 5
    assert stored["last_error"] is None
    assert stored["completed_at"] is None
    assert stored["run_at"] >= before
    assert stored["created_at"] >= before


async def test_enqueue_returns_increasing_ids(queue: pgqueue.Queue) -> None:
    first = await queue.enqueue("a", {})
    second = await queue.enqueue("a", {})
    assert second > first


@pytest.mark.parametrize(
    ("payload", "stored"),
    [
        (None, {}),
        ({}, {}),
        ([1, "two", None, True, 2.5], [1, "two", None, True, 2.5]),
        ("text", "text"),
        (42, 42),
        (b'{"user_id": "01J5"}', {"user_id": "01J5"}),
        (bytearray(b"[1, 2]"), [1, 2]),
        ({"emoji": "🚀", "quote": 'it\'s "x"', "backslash": "a\\u0000b"}, None),
    ],
)
async def test_payload_round_trips(
    pool: asyncpg.Pool, queue: pgqueue.Queue, payload: Any, stored: Any
) -> None:
    job_id = await queue.enqueue("t", payload)
    expected = payload if stored is None else stored
    assert json.loads((await row(pool, job_id))["payload"]) == expected


async def test_run_at_and_max_attempts(pool: asyncpg.Pool, queue_name: str) -> None:
    queue = pgqueue.Queue(pool, name=queue_name, max_attempts=3)
    later = datetime.now(UTC) + timedelta(hours=1)
    default_id = await queue.enqueue("t", {})
    custom_id = await queue.enqueue("t", {}, run_at=later, max_attempts=9)
    assert (await row(pool, default_id))["max_attempts"] == 3
    custom = await row(pool, custom_id)
    assert custom["max_attempts"] == 9
    assert custom["run_at"] == later


async def test_enqueue_notifies_the_queue_name(dsn: str, queue: pgqueue.Queue) -> None:
    async with listening(dsn, pgqueue.JOBS_CHANNEL) as notifications:
        await queue.enqueue("t", {})
        await notifications.wait_for(queue.name)


async def test_transactional_enqueue_commits_row_and_notify(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    async with listening(dsn, pgqueue.JOBS_CHANNEL) as notifications:
        async with pool.acquire() as connection, connection.transaction():
            job_id = await queue.enqueue("t", {"n": 1}, connection=connection)
            # Not visible outside the transaction before it commits.
            assert (
                await pool.fetchval(
                    "SELECT count(*) FROM pgqueue_jobs WHERE id = $1", job_id
                )
                == 0
            )
        await notifications.wait_for(queue.name)
    assert (await row(pool, job_id))["status"] == "pending"


async def test_calls_with_the_callers_connection_need_no_other_connection_of_the_pool(
    dsn: str, queue_name: str
) -> None:
    # A service whose transactions hold every connection of its pool, each
    # enqueueing in its own transaction: nothing may wait for the pool (a
    # first call once looked up the schema there, and waited forever).
    async with asyncpg.create_pool(dsn, min_size=1, max_size=1) as pool:
        queue = pgqueue.Queue(pool, name=queue_name)
        async with pool.acquire() as connection, connection.transaction():
            with anyio.fail_after(10):
                job_id = await queue.enqueue("t", {}, connection=connection)
                await queue.enqueue_many([("t", {})], connection=connection)
                assert await queue.cancel(job_id, connection=connection) == {
                    job_id: "cancelled"
                }
                assert await queue.prune(3600, connection=connection) == 0
        assert len(await rows(pool, queue_name)) == 2


async def test_transactional_enqueue_rolls_back_row_and_notify(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue, queue_name: str
) -> None:
    marker = pgqueue.Queue(pool, name=queue_name + "-marker")
    async with listening(dsn, pgqueue.JOBS_CHANNEL) as notifications:
        async with pool.acquire() as connection:
            transaction = connection.transaction()
            await transaction.start()
            job_id = await queue.enqueue("t", {}, connection=connection)
            await transaction.rollback()
        await marker.enqueue("t", {})
        # Notifications arrive in commit order: had the rolled-back one been
        # sent, it would come before the marker's.
        before_marker = await notifications.wait_for(marker.name)
    assert queue.name not in before_marker
    assert (
        await pool.fetchval("SELECT count(*) FROM pgqueue_jobs WHERE id = $1", job_id)
        == 0
    )


async def test_enqueue_many_keeps_input_order_with_one_notify(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue, queue_name: str
) -> None:
    later = datetime.now(UTC) + timedelta(minutes=5)
    jobs: list[pgqueue.NewJob | tuple[str, Any]] = [
        pgqueue.NewJob(f"type-{i}", {"i": i}) for i in range(200)
    ]
    jobs[7] = ("tuple-job", [7])
    jobs[9] = pgqueue.NewJob("custom", None, run_at=later, max_attempts=2)
    marker = pgqueue.Queue(pool, name=queue_name + "-marker")
    async with listening(dsn, pgqueue.JOBS_CHANNEL) as notifications:
        ids = await queue.enqueue_many(jobs)
        await marker.enqueue("t", {})
        before_marker = await notifications.wait_for(marker.name)
    assert before_marker.count(queue.name) == 1
    assert ids == sorted(ids)
    assert len(set(ids)) == 200
    stored = {r["id"]: r for r in await rows(pool, queue.name)}
    for i, job_id in enumerate(ids):
        if i in (7, 9):
            continue
        assert stored[job_id]["job_type"] == f"type-{i}"
        assert json.loads(stored[job_id]["payload"]) == {"i": i}
    assert stored[ids[7]]["job_type"] == "tuple-job"
    assert stored[ids[9]]["run_at"] == later
    assert stored[ids[9]]["max_attempts"] == 2
    assert json.loads(stored[ids[9]]["payload"]) == {}


async def test_enqueue_many_inside_a_rolled_back_transaction_writes_nothing(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    async with pool.acquire() as connection:
        transaction = connection.transaction()
        await transaction.start()
        await queue.enqueue_many([("a", 1), ("b", 2)], connection=connection)
        await transaction.rollback()
    assert await rows(pool, queue.name) == []


async def test_enqueue_many_of_nothing_sends_nothing(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    assert await queue.enqueue_many([]) == []
    assert await rows(pool, queue.name) == []


class Unserializable:
    pass


BAD_ENQUEUES: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    (
        "object payload",
        {"payload": Unserializable()},
        TypeError,
        "not JSON-serializable",
    ),
    ("set payload", {"payload": {1, 2}}, TypeError, "not JSON-serializable"),
    ("bytes not JSON", {"payload": b"{not json"}, ValueError, "not valid JSON"),
    ("bytes not UTF-8", {"payload": b"\xff\xfe"}, ValueError, "not valid JSON"),
    ("bytes NaN", {"payload": b"[NaN]"}, ValueError, "NaN"),
    ("NaN payload", {"payload": {"x": float("nan")}}, ValueError, "cannot be stored"),
    ("infinite payload", {"payload": [float("inf")]}, ValueError, "cannot be stored"),
    ("NUL in payload", {"payload": {"x": "a\x00b"}}, ValueError, "NUL"),
    ("NUL in payload key", {"payload": {"a\x00": 1}}, ValueError, "NUL"),
    ("NUL in bytes payload", {"payload": b'"a\\u0000"'}, ValueError, "NUL"),
    ("lone surrogate", {"payload": "\ud800"}, ValueError, "surrogate"),
    ("empty job type", {"job_type": ""}, ValueError, "job type must not be empty"),
    ("NUL job type", {"job_type": "a\x00"}, ValueError, "NUL"),
    ("job type not str", {"job_type": 7}, TypeError, "job type must be a str"),
    ("max_attempts zero", {"max_attempts": 0}, ValueError, "at least 1"),
    ("max_attempts negative", {"max_attempts": -3}, ValueError, "at least 1"),
    ("max_attempts bool", {"max_attempts": True}, TypeError, "must be an int"),
    ("max_attempts float", {"max_attempts": 2.0}, TypeError, "must be an int"),
    ("max_attempts huge", {"max_attempts": 2**31}, ValueError, "32-bit"),
    ("naive run_at", {"run_at": datetime(2030, 1, 1)}, ValueError, "timezone-aware"),
    ("run_at not datetime", {"run_at": 5}, TypeError, "must be a datetime"),
]


@pytest.mark.parametrize(
    ("case", "kwargs", "error", "message"),
    BAD_ENQUEUES,
    ids=[c[0] for c in BAD_ENQUEUES],
)
async def test_bad_input_raises_before_any_sql(
    pool: asyncpg.Pool,
    queue: pgqueue.Queue,
    case: str,
    kwargs: dict[str, Any],
    error: type[Exception],
    message: str,
) -> None:
    arguments: dict[str, Any] = {"job_type": "t", "payload": {}, **kwargs}
    job_type = arguments.pop("job_type")
    payload = arguments.pop("payload")
    before = await queue_count(pool, queue.name)
    with pytest.raises(error, match=message):
        await queue.enqueue(job_type, payload, **arguments)
    # enqueue_many refuses the whole batch when one job is bad.
    with pytest.raises(error, match=f"job 1: .*{message}"):
        await queue.enqueue_many(
            [("ok", {}), pgqueue.NewJob(job_type, payload, **arguments)]
        )
    assert await queue_count(pool, queue.name) == before


async def test_bad_input_without_a_database(queue_name: str) -> None:
    # A pool that cannot connect shows that the checks run before any SQL.
    pool = asyncpg.create_pool("postgresql://nobody@127.0.0.1:1/none")
    queue = pgqueue.Queue(pool, name=queue_name)
    with pytest.raises(TypeError):
        await queue.enqueue("t", object())
    with pytest.raises(TypeError, match="expected a NewJob"):
        await queue.enqueue_many(["just a string"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="non-negative"):
        await queue.prune(-1)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"name": ""}, ValueError),
        ({"name": "a\x00b"}, ValueError),
        ({"name": "x" * 8000}, ValueError),
        ({"max_attempts": 0}, ValueError),
        ({"name": None}, TypeError),
    ],
)
def test_queue_constructor_validates(
    kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        pgqueue.Queue(None, **kwargs)  # type: ignore[arg-type]


async def _age(pool: asyncpg.Pool, job_id: int, status: str, seconds: float) -> None:
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = $2, updated_at = now() - make_interval(secs => $3)"
        " WHERE id = $1",
        job_id,
        status,
        seconds,
    )


async def test_prune_deletes_only_old_finished_rows_of_its_queue(
    pool: asyncpg.Pool, queue: pgqueue.Queue, queue_name: str
) -> None:
    other = pgqueue.Queue(pool, name=queue_name + "-other")
    ids: dict[str, int] = {}
    for label, status, age in [
        ("old completed", "completed", 7200),
        ("old dead", "dead", 7200),
        ("new completed", "completed", 60),
        ("new dead", "dead", 60),
        ("old pending", "pending", 7200),
        ("old running", "running", 7200),
    ]:
        ids[label] = await queue.enqueue("t", {})
        await _age(pool, ids[label], status, age)
    other_id = await other.enqueue("t", {})
    await _age(pool, other_id, "completed", 7200)

    assert await queue.prune(3600) == 2
    left = {r["id"] for r in await rows(pool, queue.name)}
    assert left == {
        ids[k] for k in ("new completed", "new dead", "old pending", "old running")
    }
    assert (await row(pool, other_id))["status"] == "completed"
    assert await queue.prune(3600) == 0
    assert await queue.prune(0) == 2


async def test_prune_inside_a_transaction(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("t", {})
    await _age(pool, job_id, "dead", 100)
    async with pool.acquire() as connection:
        transaction = connection.transaction()
        await transaction.start()
        assert await queue.prune(10, connection=connection) == 1
        await transaction.rollback()
    assert (await row(pool, job_id))["status"] == "dead"


def test_queue_repr_and_properties() -> None:
    queue = pgqueue.Queue(None, name="emails", max_attempts=3)  # type: ignore[arg-type]
    assert (queue.name, queue.max_attempts) == ("emails", 3)
    assert repr(queue) == "Queue(name='emails', max_attempts=3)"
