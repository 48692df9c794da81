"""When the wakeup of an enqueued job is sent, and by whom.

An enqueue that commits by itself commits without NOTIFY; the pool's
waker (`pgqueue._wake`) sends ``pg_notify('pgqueue_jobs', queue)`` after the
commit, from a connection of its own, coalesced per queue. In the caller's
transaction the NOTIFY rides the transaction, unless the transaction is a
`Queue.transaction` block, which wakes after its commit. Every test listens
as a Go worker does (``LISTEN pgqueue_jobs``) and looks at which backend
sent each notification.
"""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap
import uuid
from typing import TYPE_CHECKING

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue._wake import waker_for
from tests.helpers import queue_count, running, wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable


class Heard:
    """Notifications on ``pgqueue_jobs``: (sending backend pid, payload), in arrival order."""

    def __init__(self) -> None:
        self.items: list[tuple[int, str]] = []
        self._arrived = anyio.Event()

    def __call__(self, _conn: object, pid: int, _channel: str, payload: object) -> None:
        self.items.append((pid, str(payload)))
        self._arrived.set()

    def of(self, queue: str) -> list[int]:
        """The pids that sent a wakeup for ``queue``."""
        return [pid for pid, payload in self.items if payload == queue]

    async def wait_for(self, queue: str, *, after: int = 0, within: float = 5.0) -> int:
        """Wait for a wakeup of ``queue`` among items[after:]; return its sender's pid."""
        with anyio.fail_after(within):
            while True:
                for pid, payload in self.items[after:]:
                    if payload == queue:
                        return pid
                self._arrived = anyio.Event()
                await self._arrived.wait()


@contextlib.asynccontextmanager
async def go_listener(dsn: str) -> AsyncIterator[Heard]:
    """LISTEN pgqueue_jobs on a connection of its own, as a Go worker does."""
    heard = Heard()
    connection = await asyncpg.connect(dsn)
    try:
        await connection.add_listener("pgqueue_jobs", heard)
        yield heard
    finally:
        await connection.close()


async def nothing_heard_for(
    heard: Heard, queue: str, pool: asyncpg.Pool, *, after: int = 0
) -> None:
    """Send a marker through the pool's waker and check nothing for ``queue`` came before it.

    Notifications reach a listener in commit order, and a wakeup the
    library owed would be sent before, or with, the marker.
    """
    marker = f"marker-{uuid.uuid4().hex[:8]}"
    waker_for(pool).wake([marker])
    await heard.wait_for(marker, after=after)
    assert [payload for _, payload in heard.items[after:] if payload == queue] == []


async def test_an_enqueue_by_itself_is_woken_after_its_commit_by_the_waker(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    started = anyio.Event()
    # poll_interval=60: within the deadline only a wakeup runs the job.
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        started.set()

    async with go_listener(dsn) as heard, running(worker):
        await queue.enqueue("t", {})
        sender = await heard.wait_for(queue.name)
        with anyio.fail_after(5):
            await started.wait()
    assert sender == waker_for(pool).connection_pid


async def test_the_waker_sends_from_its_own_connection(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    async with go_listener(dsn) as heard:
        await queue.enqueue("t", {})
        sender = await heard.wait_for(queue.name)
        assert sender == waker_for(pool).connection_pid
        # Every backend of the pool, and none of them sent it.
        pool_pids = await _pool_pids(pool)
        assert sender not in pool_pids


async def _pool_pids(pool: asyncpg.Pool) -> set[int]:
    size = pool.get_size()
    async with contextlib.AsyncExitStack() as stack:
        connections = [
            await stack.enter_async_context(pool.acquire()) for _ in range(size)
        ]
        return {await c.fetchval("SELECT pg_backend_pid()") for c in connections}


async def test_a_committed_transaction_wakes_from_inside_it(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    async with go_listener(dsn) as heard, pool.acquire() as connection:
        pid = await connection.fetchval("SELECT pg_backend_pid()")
        async with connection.transaction():
            await queue.enqueue("t", {}, connection=connection)
            await queue.enqueue_many([("t", {})], connection=connection)
        assert await heard.wait_for(queue.name) == pid


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
async def test_a_transaction_block_wakes_after_its_commit(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue, many: bool
) -> None:
    other = pgqueue.Queue(pool, name=f"{queue.name}-other")
    started = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        started.set()

    async with go_listener(dsn) as heard, running(worker):
        async with pool.acquire() as connection:
            async with queue.transaction(connection):
                if many:
                    await queue.enqueue_many(
                        [("t", {}), ("t", {})], connection=connection
                    )
                else:
                    await queue.enqueue("t", {}, connection=connection)
                await other.enqueue("t", {}, connection=connection)
                # Not committed: nothing sent yet, from anyone.
                assert heard.of(queue.name) == []
            sender = await heard.wait_for(queue.name)
            assert await heard.wait_for(other.name) == sender
            assert sender == waker_for(pool).connection_pid
        with anyio.fail_after(5):
            await started.wait()


async def test_a_block_inside_a_transaction_keeps_the_notify_in_it(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    async with go_listener(dsn) as heard, pool.acquire() as connection:
        pid = await connection.fetchval("SELECT pg_backend_pid()")
        # The block is a savepoint of the caller's transaction.
        async with connection.transaction(), queue.transaction(connection):
            await queue.enqueue("t", {}, connection=connection)
        assert await heard.wait_for(queue.name) == pid


@pytest.mark.parametrize("block", [False, True], ids=["transaction", "block"])
async def test_a_rolled_back_transaction_wakes_nothing_and_leaves_no_row(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue, block: bool
) -> None:
    class Abort(Exception):
        pass

    async with go_listener(dsn) as heard, pool.acquire() as connection:
        scope = queue.transaction(connection) if block else connection.transaction()

        async def enqueue_then_fail() -> None:
            async with scope:
                await queue.enqueue("t", {}, connection=connection)
                await queue.enqueue_many([("t", {})], connection=connection)
                raise Abort

        with pytest.raises(Abort):
            await enqueue_then_fail()
        await nothing_heard_for(heard, queue.name, pool)
    assert await queue_count(pool, queue.name) == 0


async def test_a_duplicate_unique_key_wakes_nothing(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    async with go_listener(dsn) as heard:
        first = await queue.enqueue("t", {}, unique_key=queue.name)
        await heard.wait_for(queue.name)
        after = len(heard.items)
        assert await queue.enqueue("t", {}, unique_key=queue.name) == first
        assert await queue.enqueue_many(
            [pgqueue.NewJob("t", {}, unique_key=queue.name)]
        ) == [first]
        await nothing_heard_for(heard, queue.name, pool, after=after)


async def test_many_producers_share_few_wakeups_and_strand_no_job(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    producers, each = 8, 25
    total = producers * each
    handled = 0
    all_handled = anyio.Event()
    # poll_interval=60: a job committed after the worker's last claim and
    # never woken for would wait a minute.
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=4, poll_interval=60)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        nonlocal handled
        handled += 1
        if handled == total:
            all_handled.set()

    waker = waker_for(pool)
    async with go_listener(dsn) as heard, running(worker):

        async def produce() -> None:
            for _ in range(each):
                await queue.enqueue("t", {})

        async with anyio.create_task_group() as tg:
            for _ in range(producers):
                tg.start_soon(produce)
        with anyio.fail_after(10):
            await all_handled.wait()
    assert waker_for(pool) is waker
    # Coalesced: a pool of 8 commits in parallel, the waker one at a time.
    assert 1 <= waker.sent < total
    assert 1 <= len(heard.of(queue.name)) < total


async def test_a_lost_waker_connection_is_replaced(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    async with go_listener(dsn) as heard:
        await queue.enqueue("t", {})
        old = await heard.wait_for(queue.name)
        await pool.execute("SELECT pg_terminate_backend($1)", old)
        after = len(heard.items)
        await queue.enqueue("t", {})
        new = await heard.wait_for(queue.name, after=after)
    assert new != old


async def test_the_waker_closes_its_connection_when_the_pool_closes(
    dsn: str, pool: asyncpg.Pool
) -> None:
    name = f"pgq-waker-{uuid.uuid4().hex[:8]}"

    async def sessions() -> int:
        count: int = await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name
        )
        return count

    async with asyncpg.create_pool(
        dsn, min_size=1, max_size=1, server_settings={"application_name": name}
    ) as app_pool:
        await pgqueue.Queue(app_pool, name=name).enqueue("t", {})
        waker = waker_for(app_pool)
        await wait_until(lambda: _true(waker.connection_pid is not None))
        assert await sessions() == 2  # the pool's and the waker's
    # Well before LINGER: the waker sees its pool close.
    await wait_until(lambda: _no(sessions), within=2)


async def _true(value: bool) -> bool:
    return value


async def _no(count: Callable[[], Awaitable[int]]) -> bool:
    return await count() == 0


PRODUCER = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    import asyncpg, pgqueue

    async def main() -> None:
        pool = await asyncpg.create_pool(sys.argv[1], min_size=1, max_size=1)
        await pgqueue.Queue(pool, name=sys.argv[2]).enqueue("t", {})
        # Committed; the waker's task has not run yet (nothing awaited since).
        os.kill(os.getpid(), signal.SIGKILL)

    asyncio.run(main())
    """
)


async def test_a_producer_killed_between_commit_and_wakeup_loses_no_job(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    poll = 1.0
    started = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=poll)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        started.set()

    async with go_listener(dsn) as heard, running(worker):
        result = await anyio.run_process(
            [sys.executable, "-c", PRODUCER, dsn, queue.name],
            check=False,
            env={**os.environ},
        )
        assert result.returncode == -9, result.stderr.decode()
        assert await queue_count(pool, queue.name) == 1  # committed
        killed_at = anyio.current_time()
        with anyio.fail_after(poll + 5):
            await started.wait()
        waited = anyio.current_time() - killed_at
        await nothing_heard_for(heard, queue.name, pool)
    # Found by the worker's poll (with slack for a loaded machine).
    assert waited <= poll + 3.0, waited


SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    import asyncpg, pgqueue

    async def main() -> None:
        async with asyncpg.create_pool(sys.argv[1], min_size=1, max_size=1) as pool:
            await pgqueue.Queue(pool, name=sys.argv[2]).enqueue("t", {})

    asyncio.run(main())
    """
)


async def test_a_script_that_enqueues_and_exits_still_wakes_the_workers(
    dsn: str, queue: pgqueue.Queue
) -> None:
    async with go_listener(dsn) as heard:
        result = await anyio.run_process(
            [sys.executable, "-W", "error", "-c", SCRIPT, dsn, queue.name],
            check=False,
        )
        assert result.returncode == 0, result.stderr.decode()
        assert result.stderr == b""
        await heard.wait_for(queue.name)
