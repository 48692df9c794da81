"""Enqueues on a pool awaited at once share a statement and a commit, each caller its own result."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg

import pgqueue
from pgqueue._gather import MAX_IN_FLIGHT, gatherer_for
from tests.helpers import wait_until

if TYPE_CHECKING:
    from collections.abc import Awaitable, Sequence

    import pytest


async def _all_idle(pool: asyncpg.Pool) -> bool:
    """Whether every connection of ``pool`` is back in it."""
    return pool.get_idle_size() == pool.get_size()


async def _outcomes(calls: Sequence[Awaitable[int]]) -> list[int | BaseException]:
    return list(await asyncio.gather(*calls, return_exceptions=True))


async def _written(pool: asyncpg.Pool, queue: str) -> list[tuple[int, str]]:
    """The id and payload ``n`` of each job of type ``t`` in ``queue``, by id."""
    rows = await pool.fetch(
        "SELECT id, payload->>'n' AS n FROM pgqueue_jobs"
        " WHERE queue = $1 AND job_type = 't' ORDER BY id",
        queue,
    )
    return [(r["id"], r["n"]) for r in rows]


async def _hold_key(
    blocker: asyncpg.Connection, queue: str, job_type: str, key: str
) -> None:
    """``blocker`` inserts a job with ``key`` in a transaction it leaves open."""
    await blocker.execute("BEGIN")
    await blocker.execute(
        "INSERT INTO pgqueue_jobs (queue, job_type, payload, unique_key)"
        " VALUES ($1, $2, '{}', $3)",
        queue,
        job_type,
        key,
    )


async def _waited_on(pool: asyncpg.Pool, blocker: asyncpg.Connection) -> bool:
    """Whether a backend waits for a lock ``blocker`` holds."""
    found: bool = await pool.fetchval(
        "SELECT EXISTS (SELECT FROM pg_stat_activity"
        " WHERE $1 = ANY(pg_blocking_pids(pid)))",
        blocker.get_server_pid(),
    )
    return found


async def test_fifty_at_once_share_statements_each_with_its_own_id_and_error(
    pool: asyncpg.Pool, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = pgqueue.Queue(pool, queue_name)
    taken = await queue.enqueue("t", {"n": -1}, unique_key="taken")
    special: dict[int, tuple[Any, dict[str, Any]]] = {
        10: ({"n": 10}, {"unique_key": "taken", "on_conflict": "raise"}),
        20: ({"n": 20}, {"unique_key": "taken"}),
        30: ({1, 2}, {}),  # a set: not JSON
        40: ({"n": 40}, {"unique_key": "fresh", "delay": 3600}),
    }
    calls = [
        queue.enqueue("t", special[n][0], **special[n][1])
        if n in special
        else queue.enqueue("t", {"n": n}, priority=n % 3, group=f"g{n % 4}")
        for n in range(50)
    ]
    with caplog.at_level(logging.DEBUG, logger="pgqueue"):
        results = await _outcomes(calls)
    assert isinstance(results[10], pgqueue.DuplicateJobError)
    assert results[10].job_id == taken
    assert results[20] == taken
    assert isinstance(results[30], TypeError)
    ids = {n: r for n, r in enumerate(results) if n not in (10, 20, 30)}
    assert all(isinstance(i, int) for i in ids.values())
    assert len(set(ids.values())) == 47
    rows = {
        r["id"]: r
        for r in await pool.fetch(
            "SELECT id, payload::text, priority, group_key, unique_key,"
            " run_at > now() + interval '59 minutes' AS later"
            " FROM pgqueue_jobs WHERE queue = $1",
            queue_name,
        )
    }
    assert set(rows) == {*ids.values(), taken}
    for n, job_id in ids.items():
        row = rows[job_id]
        assert row["payload"] == f'{{"n": {n}}}'
        if n == 40:
            assert (row["unique_key"], row["later"]) == ("fresh", True)
        else:
            assert (row["priority"], row["group_key"]) == (n % 3, f"g{n % 4}")
    gathered = [r for r in caplog.records if r.getMessage() == "enqueues gathered"]
    assert gathered
    assert sum(r.__dict__["count"] for r in gathered) + 2 >= 46


async def test_a_job_the_server_refuses_fails_only_its_caller(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    await pool.execute(
        """
        CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.job_type = 'poison' THEN RAISE EXCEPTION 'no poison here'; END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_poison BEFORE INSERT ON pgqueue_jobs
            FOR EACH ROW EXECUTE FUNCTION refuse_poison();
        """
    )
    try:
        queue = pgqueue.Queue(pool, queue_name)
        calls = [
            queue.enqueue("poison" if n == 7 else "t", {"n": n}) for n in range(20)
        ]
        results = await _outcomes(calls)
    finally:
        await pool.execute(
            "DROP TRIGGER refuse_poison ON pgqueue_jobs; DROP FUNCTION refuse_poison()"
        )
    assert isinstance(results[7], asyncpg.RaiseError)
    ids = [r for n, r in enumerate(results) if n != 7]
    assert all(isinstance(i, int) for i in ids)
    count = await pool.fetchval(
        "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1", queue_name
    )
    assert count == 19


async def test_nothing_is_acknowledged_before_its_commit_when_connections_drop(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    name = f"gather-{queue_name}"[:60]
    acknowledged: list[int] = []
    failed = 0
    async with asyncpg.create_pool(
        dsn, min_size=4, max_size=4, server_settings={"application_name": name}
    ) as producers:
        queue = pgqueue.Queue(producers, queue_name)

        async def produce(n: int) -> None:
            nonlocal failed
            for m in range(40):
                try:
                    acknowledged.append(await queue.enqueue("t", {"n": n, "m": m}))
                except Exception:
                    failed += 1

        async def drop_connections() -> None:
            while len(acknowledged) < 200:
                await asyncio.sleep(0.001)
            for _ in range(3):
                await pool.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name = $1",
                    name,
                )
                await asyncio.sleep(0.01)

        await asyncio.gather(*(produce(n) for n in range(32)), drop_connections())
    assert failed > 0  # the drops hit statements in flight
    found = await pool.fetchval(
        "SELECT count(*) FROM pgqueue_jobs WHERE id = ANY($1::bigint[])", acknowledged
    )
    assert found == len(acknowledged)


async def test_enqueues_with_parents_replaces_or_a_trace_go_alone(
    pool: asyncpg.Pool, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    queue = pgqueue.Queue(pool, queue_name)
    parent = await queue.enqueue("t")
    calls: list[Awaitable[Any]] = [
        queue.enqueue("t", {"n": n}, after=[parent]) for n in range(10)
    ]
    calls += [
        queue.enqueue("t", {"n": n}, unique_key="same", on_conflict="replace")
        for n in range(10)
    ]
    with caplog.at_level(logging.DEBUG, logger="pgqueue"):
        results = await _outcomes(calls)
    assert all(isinstance(r, int) for r in results), results
    assert not [r for r in caplog.records if r.getMessage() == "enqueues gathered"]
    waiting = await pool.fetchval(
        "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1 AND status = 'waiting'",
        queue_name,
    )
    assert waiting == 10
    assert len(set(results[10:])) == 1


async def test_callers_cancelled_in_line_write_nothing_and_the_next_leads(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, queue_name)
    blockers = [await asyncpg.connect(dsn) for _ in range(2)]
    try:
        # Two enqueues in flight, each waiting on a row another transaction holds.
        held = []
        for n, blocker in enumerate(blockers):
            await _hold_key(blocker, queue_name, "held", f"held-{n}")
            held.append(
                asyncio.ensure_future(queue.enqueue("held", {}, unique_key=f"held-{n}"))
            )
        for blocker in blockers:
            await wait_until(functools.partial(_waited_on, pool, blocker), within=5)
        first = asyncio.ensure_future(queue.enqueue("t", {"n": "first"}))
        second = asyncio.ensure_future(queue.enqueue("t", {"n": "second"}))
        third = asyncio.ensure_future(queue.enqueue("t", {"n": "third"}))
        await asyncio.sleep(0)  # all three in line; the first leads, waiting to write
        first.cancel()
        second.cancel()
        for blocker in blockers:
            await blocker.execute("ROLLBACK")
        with anyio.fail_after(5):
            kept = await third
            await asyncio.gather(*held)
        assert first.cancelled()
        assert second.cancelled()
    finally:
        for blocker in blockers:
            await blocker.close()
    assert await _written(pool, queue_name) == [(kept, "third")]


async def test_a_leader_cancelled_during_its_write_leaves_the_others_their_results(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, queue_name)
    blockers = [await asyncpg.connect(dsn) for _ in range(MAX_IN_FLIGHT + 1)]
    try:
        for n, blocker in enumerate(blockers):
            job_type = "held" if n < MAX_IN_FLIGHT else "t"
            await _hold_key(blocker, queue_name, job_type, f"held-{n}")
        # Every write in flight waits for a blocker's row...
        held = [
            asyncio.ensure_future(queue.enqueue("held", {}, unique_key=f"held-{n}"))
            for n in range(MAX_IN_FLIGHT)
        ]
        for blocker in blockers[:MAX_IN_FLIGHT]:
            await wait_until(functools.partial(_waited_on, pool, blocker), within=5)
        # ...so these three line up; the first leads, and their one statement
        # will wait for the last blocker's row too.
        lead = asyncio.ensure_future(queue.enqueue("t", {"n": "lead"}))
        key = f"held-{MAX_IN_FLIGHT}"
        keyed = asyncio.ensure_future(queue.enqueue("t", {"n": "key"}, unique_key=key))
        last = asyncio.ensure_future(queue.enqueue("t", {"n": "last"}))
        for blocker in blockers[:MAX_IN_FLIGHT]:
            await blocker.execute("ROLLBACK")
        await wait_until(functools.partial(_waited_on, pool, blockers[-1]), within=5)
        lead.cancel()
        await blockers[-1].execute("ROLLBACK")
        with anyio.fail_after(5):
            ids = await asyncio.gather(keyed, last, *held)
        assert lead.cancelled()
    finally:
        for blocker in blockers:
            await blocker.close()
    # The statement had started: the leader's job is written all the same.
    written = await _written(pool, queue_name)
    assert [n for _, n in written] == ["lead", "key", "last"]
    assert [job_id for job_id, _ in written][1:] == ids[:2]


async def test_a_burst_holds_two_connections_of_the_pool_and_gives_them_back(
    dsn: str, queue_name: str
) -> None:
    async with asyncpg.create_pool(dsn, min_size=8, max_size=8) as pool:
        queue = pgqueue.Queue(pool, queue_name)
        gatherer = gatherer_for(pool)
        before = gatherer.acquired
        results = await _outcomes([queue.enqueue("t", {"n": n}) for n in range(200)])
        assert all(isinstance(r, int) for r in results), results
        # The writes of the burst ran on the two connections they first took:
        # one acquire each, no reset of the pool between them.
        assert gatherer.acquired - before == MAX_IN_FLIGHT
        # Once the burst is over, the pool has every connection back.
        await wait_until(functools.partial(_all_idle, pool), within=5)
        with anyio.fail_after(5):
            await pool.close()
        reader = await asyncpg.connect(dsn)
        try:
            found = await reader.fetchval(
                "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1", queue_name
            )
        finally:
            await reader.close()
        assert found == 200


async def test_a_write_cancelled_mid_statement_gives_its_connection_back(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, queue_name)
    gatherer = gatherer_for(pool)
    blocker = await asyncpg.connect(dsn)
    try:
        await _hold_key(blocker, queue_name, "held", "held")
        blocked = asyncio.ensure_future(queue.enqueue("held", {}, unique_key="held"))

        async def none_waiting() -> bool:
            return not await _waited_on(pool, blocker)

        await wait_until(functools.partial(_waited_on, pool, blocker), within=5)
        acquired = gatherer.acquired
        blocked.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await blocked
        # The next write takes a connection of its own from the pool: the
        # cancelled one went back, and the pool cancels its statement.
        job_id = await queue.enqueue("t", {})
        assert gatherer.acquired == acquired + 1
        await wait_until(none_waiting, within=5)
        await wait_until(functools.partial(_all_idle, pool), within=5)
        await blocker.execute("ROLLBACK")
    finally:
        await blocker.close()
    rows = await pool.fetch("SELECT id FROM pgqueue_jobs WHERE queue = $1", queue_name)
    assert [r["id"] for r in rows] == [job_id]


async def test_a_pool_of_one_connection_busy_elsewhere_stalls_no_enqueue(
    dsn: str, queue_name: str
) -> None:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=1) as pool:
        queue = pgqueue.Queue(pool, queue_name)
        with anyio.fail_after(10):
            first = await _outcomes([queue.enqueue("t", {"n": n}) for n in range(20)])
            # The pool's one connection held by the application meanwhile:
            # the enqueues wait for it, and none keeps it from another.
            async with pool.acquire() as held:
                calls = asyncio.gather(*(queue.enqueue("t", {}) for _ in range(5)))

                async def writes_wait_for_the_pool() -> bool:
                    return gatherer_for(pool).acquiring == MAX_IN_FLIGHT

                await wait_until(writes_wait_for_the_pool)
                assert not calls.done()
                await held.execute("SELECT 1")
            second = await calls
    assert all(isinstance(r, int) for r in [*first, *second]), first
