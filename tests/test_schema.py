"""The schema, and wire compatibility with the Go module."""

from __future__ import annotations

import json

import asyncpg
import pytest

import pgqueue
from tests.go_module import GO_CLAIM, GO_COMPLETE, GO_INSERT
from tests.helpers import listening, row

# What the Go module v1.1.0 creates, column by column.
GO_COLUMNS = {
    "id": ("bigint", "NO", "nextval('pgqueue_jobs_id_seq'::regclass)"),
    "queue": ("text", "NO", "'default'::text"),
    "job_type": ("text", "NO", None),
    "payload": ("jsonb", "NO", "'{}'::jsonb"),
    "status": ("text", "NO", "'pending'::text"),
    "attempts": ("integer", "NO", "0"),
    "max_attempts": ("integer", "NO", "5"),
    "run_at": ("timestamp with time zone", "NO", "now()"),
    "last_error": ("text", "YES", None),
    "created_at": ("timestamp with time zone", "NO", "now()"),
    "updated_at": ("timestamp with time zone", "NO", "now()"),
    "completed_at": ("timestamp with time zone", "YES", None),
}

# What schema v2 adds, column by column (defaults are constants: no rewrite).
V2_COLUMNS = {
    "priority": ("smallint", "NO", "0"),
    "unique_key": ("text", "YES", None),
    "cancel_requested": ("boolean", "NO", "false"),
    "snoozes": ("integer", "NO", "0"),
    "result": ("jsonb", "YES", None),
    "tracked": ("boolean", "NO", "false"),
    "trace_context": ("text", "YES", None),
    "errors": ("jsonb", "YES", None),
    "snoozed": ("jsonb", "YES", None),
    "checkpoint": ("jsonb", "YES", None),
    "has_children": ("boolean", "NO", "false"),
    "parents_left": ("integer", "YES", None),
    "on_parent_failure": ("text", "YES", None),
    "group_key": ("text", "YES", None),
    "claimed_at": ("timestamp with time zone", "YES", None),
    "steps": ("jsonb", "YES", None),
    "signals": ("jsonb", "YES", None),
    "wait": ("jsonb", "YES", None),
    "progress": ("jsonb", "YES", None),
}


async def test_install_creates_the_go_modules_table_and_what_v2_adds(
    fresh_dsn: str,
) -> None:
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await pgqueue.uninstall(connection)
        assert await connection.fetchval("SELECT to_regclass('pgqueue_jobs')") is None
        await pgqueue.install(connection)
        columns = await connection.fetch(
            "SELECT column_name, data_type, is_nullable, column_default"
            " FROM information_schema.columns WHERE table_name = 'pgqueue_jobs'"
        )
        found = {c[0]: (c[1], c[2], c[3]) for c in columns}
        assert found == {**GO_COLUMNS, **V2_COLUMNS}
        indexes = {
            r[0]: r[1]
            for r in await connection.fetch(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'pgqueue_jobs'"
            )
        }
        assert (
            "(queue, run_at, id) WHERE (status = 'pending'::text)"
            in indexes["idx_pgqueue_jobs_claim"]
        )
        assert (
            "(updated_at) WHERE (status = 'running'::text)"
            in indexes["idx_pgqueue_jobs_rescue"]
        )
        check = await connection.fetchval(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'chk_pgqueue_jobs_status'"
        )
        # A constant array (PostgreSQL prepares the check for every statement
        # that writes the table; an IN list costs more to prepare).
        allowed = check[check.index("'{") + 2 : check.index("}'")].split(",")
        assert sorted(allowed) == sorted(status.value for status in pgqueue.Status)
        try:
            await connection.execute(
                "INSERT INTO pgqueue_jobs (job_type, status) VALUES ('t', 'bogus')"
            )
        except asyncpg.CheckViolationError:
            pass
        else:
            raise AssertionError("the status check constraint is missing")
        await pgqueue.install(connection)  # idempotent: applies what is missing
        await pgqueue.uninstall(connection)
        await pgqueue.uninstall(connection)  # idempotent, as SCHEMA_DOWN says IF EXISTS
        assert await connection.fetchval("SELECT to_regclass('pgqueue_jobs')") is None
    finally:
        await connection.close()


def test_status_values() -> None:
    assert [s.value for s in pgqueue.Status] == [
        "pending",
        "running",
        "completed",
        "dead",
        "cancelled",
        "waiting",
        "parked",
    ]
    assert str(pgqueue.Status.DEAD) == "dead"


async def test_go_producer_row_reads_like_ours(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    async with listening(dsn, pgqueue.JOBS_CHANNEL) as notifications:
        async with pool.acquire() as connection:
            go_id = await connection.fetchval(
                GO_INSERT,
                queue.name,
                "send_welcome_email",
                '{"user_id":"01J5"}',
                5,
                await connection.fetchval("SELECT now()"),
            )
            await connection.execute("SELECT pg_notify('pgqueue_jobs', $1)", queue.name)
        await notifications.wait_for(queue.name)
    our_id = await queue.enqueue("send_welcome_email", {"user_id": "01J5"})
    go_row, our_row = await row(pool, go_id), await row(pool, our_id)
    for column in (
        "queue",
        "job_type",
        "status",
        "attempts",
        "max_attempts",
        "last_error",
        "completed_at",
    ):
        assert go_row[column] == our_row[column], column
    assert json.loads(go_row["payload"]) == json.loads(our_row["payload"])


async def test_our_rows_satisfy_the_go_claim(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    first = await queue.enqueue("a", {"n": 1})
    [second] = await queue.enqueue_many([("b", {"n": 2})])
    claimed = await pool.fetch(GO_CLAIM, queue.name, 10)
    claimed = sorted(claimed, key=lambda r: r["id"])
    assert [r["id"] for r in claimed] == [first, second]
    assert [r["attempts"] for r in claimed] == [1, 1]
    assert [json.loads(r["payload"]) for r in claimed] == [{"n": 1}, {"n": 2}]
    assert await pool.execute(GO_COMPLETE, first, 1) == "UPDATE 1"
    assert (await row(pool, first))["status"] == "completed"


async def test_a_distributed_install_without_citus_fails_clearly(
    fresh_dsn: str,
) -> None:
    conn = await asyncpg.connect(fresh_dsn)
    try:
        await pgqueue.uninstall(conn)
        with pytest.raises(pgqueue.SchemaError, match="citus extension") as caught:
            await pgqueue.install(conn, distributed=True)
        assert caught.value.where is not None
        assert await conn.fetchval("SELECT to_regclass('pgqueue_jobs')") is None
        # The SQL to paste refuses too, before it creates anything.
        with pytest.raises(asyncpg.FeatureNotSupportedError, match="citus"):
            await conn.execute(pgqueue.SCHEMA_DISTRIBUTED)
        assert await conn.fetchval("SELECT to_regclass('pgqueue_jobs')") is None
    finally:
        await conn.close()
