"""Behind PgBouncer in transaction pooling mode: the library leaves no session state behind.

PgBouncer hands each transaction whichever server connection is free, so a
session setting (or LISTEN, prepared statement, lock, temporary table) that
the library leaves on one is seen by the application's other clients. Each
test runs one entry point through a private PgBouncer, then looks at every
server connection PgBouncer holds, through fresh clients, and compares it
with what fresh clients saw there before.

Entry points run both on a pool and on a plain connection: a pool's reset on
release (``RESET ALL``, ``UNLISTEN *``) goes through PgBouncer too, usually
to the same server connection, and could hide a leak. State that asyncpg
changes on the library's behalf counts: its type introspection (for
parameters such as ``int[]``) sets ``jit`` session-wide and restores it in
separate transactions, which PgBouncer may send to different servers.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue._copy import COPY_MIN_JOBS
from tests.helpers import listening, rows
from tests.pgbouncer import PgBouncer, pgbouncer

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

SESSION_STATE = """
SELECT pg_backend_pid() AS pid,
       current_setting('plan_cache_mode') AS plan_cache_mode,
       ARRAY(SELECT format('%s = %s (%s)', name, setting, source)
             FROM pg_settings ORDER BY name) AS settings,
       ARRAY[current_user::text, session_user::text] AS users,
       ARRAY(SELECT pg_listening_channels() ORDER BY 1) AS listening,
       ARRAY(SELECT name FROM pg_prepared_statements ORDER BY name) AS prepared,
       ARRAY(SELECT format('%s %s', locktype, objid) FROM pg_locks
             WHERE pid = pg_backend_pid() AND locktype = 'advisory') AS locks,
       ARRAY(SELECT relname::text FROM pg_class
             WHERE relnamespace = pg_my_temp_schema() ORDER BY 1) AS temporary
"""

State = dict[str, Any]


@pytest.fixture
def bouncer(dsn: str) -> Iterator[PgBouncer]:
    """A PgBouncer of the test's own in front of this run's database."""
    with pgbouncer(dsn, pool_size=2) as running_bouncer:
        yield running_bouncer


@contextlib.asynccontextmanager
async def bounced_pool(bouncer: PgBouncer) -> AsyncIterator[asyncpg.Pool]:
    """A pool through PgBouncer, made as the README asks."""
    async with asyncpg.create_pool(
        bouncer.dsn, min_size=1, max_size=4, statement_cache_size=0
    ) as pool:
        yield pool


async def server_sessions(bouncer: PgBouncer, rounds: int = 3) -> dict[int, State]:
    """Every server connection's session state, as fresh clients see it, by backend pid.

    Each round opens ``pool_size`` new clients and keeps a transaction open
    on each, so each holds a server connection of its own: together, every
    one PgBouncer may hold.
    """
    seen: dict[int, State] = {}
    for _ in range(rounds):
        clients: list[asyncpg.Connection] = []
        pids = set()
        try:
            for _ in range(bouncer.pool_size):
                client = await asyncpg.connect(bouncer.dsn, statement_cache_size=0)
                clients.append(client)
                await client.execute("BEGIN")
                record = await client.fetchrow(SESSION_STATE)
                assert record is not None
                state = dict(record)
                pid = state.pop("pid")
                pids.add(pid)
                assert seen.setdefault(pid, state) == state, f"backend {pid} changed"
            assert len(pids) == bouncer.pool_size
        finally:
            for client in clients:
                # PgBouncer closes the server connection of a client that
                # leaves inside a transaction: end it first.
                with contextlib.suppress(asyncpg.PostgresError, OSError):
                    await client.execute("ROLLBACK")
                await client.close()
    return seen


def differences(before: State, after: State) -> list[str]:
    """What differs between two session states, item by item.

    A setting that appears at its default is not one: a library the session
    loaded (PL/pgSQL, at the first call of one of the schema's functions)
    registered it, as any session that calls a PL/pgSQL function does.
    """
    found = []
    for key, value in after.items():
        if isinstance(value, list):
            found += [
                f"{key}: + {item}"
                for item in value
                if item not in before[key]
                and not (key == "settings" and item.endswith("(default)"))
            ]
            found += [f"{key}: - {item}" for item in before[key] if item not in value]
        elif value != before[key]:
            found.append(f"{key}: {before[key]!r} -> {value!r}")
    return found


async def baseline(bouncer: PgBouncer) -> State:
    """The session state fresh clients see before the library runs (the same everywhere)."""
    states = list((await server_sessions(bouncer)).values())
    assert states[0]["plan_cache_mode"] == "auto"
    for state in states[1:]:
        assert differences(states[0], state) == []
    return states[0]


async def assert_untouched(bouncer: PgBouncer, before: State) -> None:
    """Fail, naming each difference, unless every server connection still looks fresh."""
    sessions = await server_sessions(bouncer)
    plan_cache_modes = {
        pid: state["plan_cache_mode"] for pid, state in sessions.items()
    }
    assert plan_cache_modes == dict.fromkeys(sessions, "auto"), (
        "plan_cache_mode left on server connections, by backend pid"
    )
    changed = {
        pid: found
        for pid, state in sessions.items()
        if (found := differences(before, state))
    }
    assert changed == {}, "session state left on server connections, by backend pid"


@pytest.mark.parametrize(
    "limits",
    [
        {},
        {"global_limit": 3},
        {"group_limit": 1},
        {"rate_limit": pgqueue.RateLimit(100, per=1.0)},
        {"group_limit": 2, "rate_limit": pgqueue.RateLimit(100, per_group=True)},
    ],
    ids=["unlimited", "limited", "grouped", "rated", "grouped-and-rated"],
)
async def test_worker_leaves_no_session_state(
    bouncer: PgBouncer, pool: asyncpg.Pool, queue_name: str, limits: dict[str, Any]
) -> None:
    before = await baseline(bouncer)
    queue = pgqueue.Queue(pool, name=queue_name)
    if "group_limit" in limits:
        # Group and rate limits: claims in transactions, after a lock of the
        # queue that the transaction's end releases.
        ids = [await queue.enqueue("t", {"n": n}, group=f"g{n % 3}") for n in range(10)]
    else:
        ids = await queue.enqueue_many([("t", {"n": n}) for n in range(10)])
    runs: Counter[int] = Counter()
    async with bounced_pool(bouncer) as bounced:
        # A fleet-wide limit's leases are taken in transactions, as a pooler needs.
        worker = pgqueue.Worker(
            bounced,
            queue=queue_name,
            listen=False,
            poll_interval=0.05,
            **limits,
        )

        @worker.handler("t")
        async def handle(job: pgqueue.Job) -> None:
            runs[job.id] += 1

        with anyio.fail_after(10):
            await worker.run(until_empty=True)
    assert runs == dict.fromkeys(ids, 1)
    assert [r["status"] for r in await rows(pool, queue_name)] == ["completed"] * 10
    leases = await pool.fetchval(
        "SELECT count(*) FROM pgqueue_leases WHERE queue = $1", queue_name
    )
    assert leases == 0  # given back as it stopped
    await assert_untouched(bouncer, before)


async def test_enqueue_leaves_no_session_state(
    bouncer: PgBouncer, pool: asyncpg.Pool, queue_name: str
) -> None:
    before = await baseline(bouncer)
    async with bounced_pool(bouncer) as bounced:
        queue = pgqueue.Queue(bounced, name=queue_name)
        ids = [await queue.enqueue("t", {"n": n}) for n in range(3)]
        connection = await asyncpg.connect(bouncer.dsn, statement_cache_size=0)
        try:
            ids.append(await queue.enqueue("t", {"n": 3}, connection=connection))
        finally:
            await connection.close()
    assert ids == sorted(set(ids))
    stored = {r["id"]: json.loads(r["payload"]) for r in await rows(pool, queue_name)}
    assert stored == {job_id: {"n": n} for n, job_id in enumerate(ids)}
    await assert_untouched(bouncer, before)


async def test_enqueue_many_leaves_no_session_state(
    bouncer: PgBouncer, pool: asyncpg.Pool, queue_name: str
) -> None:
    await _enqueue_many_through(bouncer, pool, queue_name, 5)


async def test_a_copied_enqueue_many_leaves_no_session_state(
    fresh_dsn: str, queue_name: str
) -> None:
    # A database of its own: its rows would make the dashboard's tests see a large table.
    with pgbouncer(fresh_dsn, pool_size=2) as bouncer:
        async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=2) as pool:
            await _enqueue_many_through(bouncer, pool, queue_name, COPY_MIN_JOBS)


async def _enqueue_many_through(
    bouncer: PgBouncer, pool: asyncpg.Pool, queue_name: str, size: int
) -> None:
    """Two calls of ``size`` jobs through the bouncer, on a pool and a connection."""
    before = await baseline(bouncer)
    async with bounced_pool(bouncer) as bounced:
        queue = pgqueue.Queue(bounced, name=queue_name)
        ids = await queue.enqueue_many([("t", {"n": n}) for n in range(size)])
        connection = await asyncpg.connect(bouncer.dsn, statement_cache_size=0)
        try:
            ids += await queue.enqueue_many(
                [("t", {"n": n}) for n in range(size, 2 * size)], connection=connection
            )
        finally:
            await connection.close()
    assert ids == sorted(set(ids))
    stored = {r["id"]: json.loads(r["payload"]) for r in await rows(pool, queue_name)}
    assert stored == {job_id: {"n": n} for n, job_id in enumerate(ids)}
    await assert_untouched(bouncer, before)


async def test_publish_leaves_no_session_state(bouncer: PgBouncer, dsn: str) -> None:
    before = await baseline(bouncer)
    channel = f"pgbouncer-{uuid.uuid4().hex[:8]}"
    async with listening(dsn, channel) as notifications:
        async with bounced_pool(bouncer) as bounced:
            await pgqueue.publish(bounced, channel, "through the pool")
            connection = await asyncpg.connect(bouncer.dsn, statement_cache_size=0)
            try:
                await pgqueue.publish(connection, channel, "on a connection")
            finally:
                await connection.close()
        assert await notifications.wait_for("on a connection") == ["through the pool"]
    await assert_untouched(bouncer, before)
