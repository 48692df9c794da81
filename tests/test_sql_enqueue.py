"""``pgqueue_enqueue(...)``: an enqueue in SQL, in the caller's transaction.

Called from psql, from a trigger on a business table and from asyncpg: the
row and its wakeup exist only if the caller's transaction commits; the row
is the one `Queue.enqueue` writes for the same arguments; bad arguments are
refused before anything is written.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import asyncpg
import pytest

import pgqueue
from tests.go_module import GO_SCHEMA
from tests.helpers import queue_count, running
from tests.test_wakeups import go_listener, nothing_heard_for

# The columns a producer decides (id and timestamps aside).
COLUMNS = (
    "queue, job_type, payload::text, status, attempts, max_attempts, priority, "
    "unique_key, cancel_requested, snoozes, result, tracked, trace_context, "
    "last_error, completed_at"
)


async def _producer_columns(pool: asyncpg.Pool, job_id: int) -> dict[str, Any]:
    job = await pool.fetchrow(
        f"SELECT {COLUMNS} FROM pgqueue_jobs WHERE id = $1", job_id
    )
    assert job is not None
    return dict(job)


def _idle_worker(
    pool: asyncpg.Pool, queue: str, started: anyio.Event
) -> pgqueue.Worker:
    """A worker that only a wakeup can start within a test's deadline (poll_interval=60)."""
    worker = pgqueue.Worker(pool, queue=queue, poll_interval=60)

    @worker.handler("ship")
    async def ship(_job: pgqueue.Job) -> None:
        started.set()

    return worker


async def test_psql_enqueues_in_its_transaction_and_wakes_an_idle_worker(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    started = anyio.Event()
    script = (
        "BEGIN;\n"
        "SELECT pgqueue_enqueue('ship', '{\"order\": 7}', "
        f"queue => '{queue_name}', priority => 2);\n"
        "COMMIT;\n"
    )
    async with running(_idle_worker(pool, queue_name, started)):
        await anyio.to_thread.run_sync(_psql, dsn, script)
        with anyio.fail_after(5):
            await started.wait()
    job = await pool.fetchrow(
        "SELECT payload::text, priority FROM pgqueue_jobs WHERE queue = $1", queue_name
    )
    assert job is not None
    assert json.loads(job["payload"]) == {"order": 7}
    assert job["priority"] == 2


async def test_psql_rolled_back_leaves_no_row_and_wakes_nothing(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    script = (
        f"BEGIN;\nSELECT pgqueue_enqueue('ship', queue => '{queue_name}');\nROLLBACK;\n"
    )
    async with go_listener(dsn) as heard:
        await anyio.to_thread.run_sync(_psql, dsn, script)
        await nothing_heard_for(heard, queue_name, pool)
    assert await queue_count(pool, queue_name) == 0


def _psql(dsn: str, script: str) -> None:
    subprocess.run(
        ["psql", "-X", "-v", "ON_ERROR_STOP=1", "-q", dsn],
        input=script,
        text=True,
        check=True,
        capture_output=True,
        timeout=30,
    )


@pytest.fixture
async def orders(pool: asyncpg.Pool, queue_name: str) -> str:
    """A business table whose inserts enqueue a job from a trigger."""
    table = f"orders_{uuid.uuid4().hex[:8]}"
    await pool.execute(
        f"""
        CREATE TABLE {table} (id serial PRIMARY KEY, item text NOT NULL);
        CREATE FUNCTION {table}_ship() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pgqueue_enqueue('ship', jsonb_build_object('order', NEW.id),
                                    queue => '{queue_name}');
            RETURN NEW;
        END $$;
        CREATE TRIGGER {table}_ship AFTER INSERT ON {table}
            FOR EACH ROW EXECUTE FUNCTION {table}_ship();
        """
    )
    return table


async def test_a_trigger_enqueues_with_the_business_row(
    pool: asyncpg.Pool, queue_name: str, orders: str
) -> None:
    started = anyio.Event()
    async with running(_idle_worker(pool, queue_name, started)):
        async with pool.acquire() as connection, connection.transaction():
            order = await connection.fetchval(
                f"INSERT INTO {orders} (item) VALUES ('book') RETURNING id"
            )
        with anyio.fail_after(5):
            await started.wait()
    payload = await pool.fetchval(
        "SELECT payload::text FROM pgqueue_jobs WHERE queue = $1", queue_name
    )
    assert json.loads(payload) == {"order": order}


async def test_a_trigger_rolled_back_with_its_business_row_leaves_neither(
    dsn: str, pool: asyncpg.Pool, queue_name: str, orders: str
) -> None:
    class Abort(Exception):
        pass

    async def order_then_fail(connection: pgqueue.Connection) -> None:
        async with connection.transaction():
            await connection.execute(f"INSERT INTO {orders} (item) VALUES ('book')")
            raise Abort

    async with go_listener(dsn) as heard, pool.acquire() as connection:
        with pytest.raises(Abort):
            await order_then_fail(connection)
        await nothing_heard_for(heard, queue_name, pool)
    assert await pool.fetchval(f"SELECT count(*) FROM {orders}") == 0
    assert await queue_count(pool, queue_name) == 0


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"priority": -3, "max_attempts": 2, "track": True},
        {"unique_key": "k-1"},
        {"delay": 90.0},
        {"run_at": datetime(2031, 5, 1, 12, 30, tzinfo=UTC)},
    ],
    ids=["defaults", "options", "unique", "delay", "run_at"],
)
async def test_the_function_writes_the_row_queue_enqueue_writes(
    pool: asyncpg.Pool, queue_name: str, options: dict[str, Any]
) -> None:
    payload = {"to": "a@example.com", "n": [1, 2.5, None], "ok": True}
    by_queue = await pgqueue.Queue(pool, name=queue_name).enqueue(
        "mail", payload, **options
    )
    # The same unique key would return the first job: move it out of the way.
    await pool.execute(
        "UPDATE pgqueue_jobs SET unique_key = NULL WHERE id = $1", by_queue
    )
    sql_options = {
        **options,
        **(
            {"delay": timedelta(seconds=options["delay"])} if "delay" in options else {}
        ),
    }
    names = ", ".join(f"{name} => ${i}" for i, name in enumerate(sql_options, 4))
    by_sql = await pool.fetchval(
        f"SELECT pgqueue_enqueue($1, $2::jsonb, queue => $3{', ' if names else ''}{names})",
        "mail",
        json.dumps(payload),
        queue_name,
        *sql_options.values(),
    )
    first, second = [
        await _producer_columns(pool, job_id) for job_id in (by_queue, by_sql)
    ]
    first["unique_key"] = options.get("unique_key")
    assert first == second
    times = await pool.fetch(
        "SELECT run_at - created_at AS wait FROM pgqueue_jobs WHERE id = ANY($1) ORDER BY id",
        [by_queue, by_sql],
    )
    if "delay" in options:
        assert [t["wait"] for t in times] == [timedelta(seconds=90)] * 2
    elif "run_at" not in options:
        assert [t["wait"] for t in times] == [timedelta(0)] * 2


async def test_a_duplicate_key_returns_the_pending_job_or_raises(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    call = "SELECT pgqueue_enqueue('mail', queue => $1, unique_key => 'k', on_conflict => $2)"
    first = await pool.fetchval(call, queue_name, "return")
    assert await pool.fetchval(call, queue_name, "return") == first
    with pytest.raises(asyncpg.UniqueViolationError) as caught:
        await pool.fetchval(call, queue_name, "raise")
    assert caught.value.detail == str(first)
    assert f"job {first}" in str(caught.value)
    assert await queue_count(pool, queue_name) == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ("''", "job_type must not be empty"),
        ("NULL", "job_type must not be empty"),
        ("'t', NULL", "payload must not be NULL"),
        ("'t', queue => ''", "queue must not be empty"),
        ("'t', queue => repeat('q', 1025)", "queue name is 1025 bytes"),
        ("'t', max_attempts => 0", "max_attempts must be at least 1, got 0"),
        ("'t', priority => 6", "priority must be from -5 to 5, got 6"),
        ("'t', priority => NULL", "priority must be from -5 to 5, got NULL"),
        ("'t', unique_key => ''", "unique_key must not be empty"),
        (
            "'t', on_conflict => 'ignore'",
            "on_conflict must be 'return', 'raise' or 'replace'",
        ),
        ("'t', on_conflict => 'replace'", "on_conflict 'replace' needs a unique_key"),
        ("'t', track => NULL", "track must be true or false"),
        ("'t', delay => interval '-1 second'", "delay must not be negative"),
        (
            "'t', run_at => now(), delay => interval '1 second'",
            "give run_at or delay, not both",
        ),
    ],
)
async def test_bad_arguments_are_refused_and_write_nothing(
    pool: asyncpg.Pool, arguments: str, message: str
) -> None:
    before = await pool.fetchval("SELECT count(*) FROM pgqueue_jobs")
    with pytest.raises(asyncpg.InvalidParameterValueError, match=message):
        await pool.fetchval(f"SELECT pgqueue_enqueue({arguments})")
    assert await pool.fetchval("SELECT count(*) FROM pgqueue_jobs") == before


async def test_the_upgrade_brings_the_function_to_a_go_table_and_down_drops_it(
    fresh_dsn: str,
) -> None:
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await connection.execute(pgqueue.SCHEMA_DOWN)
        await connection.execute(GO_SCHEMA)
        exists = "SELECT to_regproc('pgqueue_enqueue') IS NOT NULL"
        assert not await connection.fetchval(exists)
        await connection.execute(pgqueue.SCHEMA_UPGRADE)
        await connection.execute(pgqueue.SCHEMA_UPGRADE)  # idempotent
        job = await connection.fetchval("SELECT pgqueue_enqueue('t', '{}')")
        assert (
            await connection.fetchval(
                "SELECT status FROM pgqueue_jobs WHERE id = $1", job
            )
            == "pending"
        )
        await connection.execute(pgqueue.SCHEMA_DOWN)
        assert not await connection.fetchval(exists)
    finally:
        await connection.close()
