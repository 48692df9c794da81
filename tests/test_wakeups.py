"""When the wakeup of an enqueued job is sent, and by whom.

An enqueue that commits by itself, alone (no other of its pool in flight,
the pool's waker idle), NOTIFYs from its own statement. While another is in
flight it commits without NOTIFY, and the pool's waker (`pgqueue._wake`)
sends ``pg_notify('pgqueue_jobs', queue)`` after the commit, from a
connection of its own, coalesced per queue. The tests hold an enqueue in
flight for real: its unique key is taken by a row another connection has
inserted and not committed (`an_enqueue_in_flight`). In the caller's
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


@contextlib.asynccontextmanager
async def an_enqueue_in_flight(
    dsn: str, pool: asyncpg.Pool, queue: str
) -> AsyncIterator[None]:
    """An enqueue to ``queue`` on ``pool`` without ``connection=``, in flight until the block ends.

    Its statement waits on the lock of a row of its queue, type and unique
    key that another connection inserted and has not committed (`holding`).
    When the block ends, that transaction rolls back, and the enqueue
    inserts its job and returns.
    """
    key = f"held-{uuid.uuid4().hex[:8]}"

    async def enqueue() -> None:
        await pgqueue.Queue(pool, name=queue).enqueue("held", {}, unique_key=key)

    # On the way out, the row's transaction rolls back first; then the task
    # group waits for the enqueue, which can insert its job.
    async with (
        anyio.create_task_group() as tg,
        holding(dsn, queue, key) as blocker_pid,
    ):
        tg.start_soon(enqueue)
        await wait_until(lambda: _waits_on(pool, blocker_pid), within=5)
        yield


@contextlib.asynccontextmanager
async def holding(dsn: str, queue: str, key: str) -> AsyncIterator[int]:
    """A job of type ``held`` with unique ``key``, inserted and not committed until the block ends.

    Yields the pid of the backend holding it. Its transaction
    rolls back at the end: the row never existed, and wakes nothing.
    """
    blocker = await asyncpg.connect(dsn)
    try:
        transaction = blocker.transaction()
        await transaction.start()
        await blocker.execute(_HOLD, queue, key)
        try:
            yield blocker.get_server_pid()
        finally:
            await transaction.rollback()
    finally:
        await blocker.close()


_HOLD = """
INSERT INTO pgqueue_jobs (queue, job_type, payload, max_attempts, unique_key)
VALUES ($1, 'held', '{}', 1, $2)
"""


async def _waits_on(pool: asyncpg.Pool, pid: int) -> bool:
    """Whether a backend waits on a lock the backend ``pid`` holds."""
    waiting: bool = await pool.fetchval(
        "SELECT EXISTS (SELECT FROM pg_stat_activity"
        " WHERE $1 = ANY (pg_blocking_pids(pid)))",
        pid,
    )
    return waiting


async def test_a_lone_enqueue_is_woken_by_its_own_statement(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    started = anyio.Event()
    # poll_interval=60: within the deadline only a wakeup runs the job.
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        started.set()

    waker = waker_for(pool)
    async with go_listener(dsn) as heard, running(worker):
        await queue.enqueue("t", {})
        sender = await heard.wait_for(queue.name)
        with anyio.fail_after(5):
            await started.wait()
    # A backend of the pool sent it, with the commit; the waker sent nothing.
    assert sender in await _pool_pids(pool)
    assert sender != waker.connection_pid
    assert waker.sent == 0
    assert heard.of(queue.name) == [sender]


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
async def test_an_enqueue_beside_another_in_flight_is_woken_by_the_waker(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue, many: bool
) -> None:
    other = f"{queue.name}-other"
    async with go_listener(dsn) as heard:
        async with an_enqueue_in_flight(dsn, pool, other):
            if many:
                await queue.enqueue_many([("t", {}), ("t", {})])
            else:
                await queue.enqueue("t", {})
            sender = await heard.wait_for(queue.name)
            waker = waker_for(pool)
            assert sender == waker.connection_pid
            # Its count follows the NOTIFY's round trip back to the waker.
            await wait_until(lambda: _true(waker.sent == 1), within=5)
            # Every backend of the pool, and none of them sent it.
            assert sender not in await _pool_pids(pool)
        # The held enqueue started alone: its own statement wakes its queue.
        held_sender = await heard.wait_for(other)
        assert held_sender != waker.connection_pid
    assert heard.of(queue.name) == [sender]


@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside_another"])
async def test_an_autocommit_connection_takes_the_pool_path(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue, beside: bool
) -> None:
    """``connection=`` outside a transaction commits by itself: alone, its own
    statement wakes; beside another enqueue in flight, the waker does."""
    other = f"{queue.name}-other"
    async with go_listener(dsn) as heard, pool.acquire() as connection:
        own = await connection.fetchval("SELECT pg_backend_pid()")
        if beside:
            async with an_enqueue_in_flight(dsn, pool, other):
                await queue.enqueue("t", {}, connection=connection)
                sender = await heard.wait_for(queue.name)
            assert sender == waker_for(pool).connection_pid
        else:
            await queue.enqueue("t", {}, connection=connection)
            assert await heard.wait_for(queue.name) == own


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


@pytest.mark.parametrize("beside", [False, True], ids=["alone", "beside_another"])
async def test_a_duplicate_unique_key_wakes_nothing(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue, beside: bool
) -> None:
    async with go_listener(dsn) as heard:
        first = await queue.enqueue("t", {}, unique_key=queue.name)
        await heard.wait_for(queue.name)
        after = len(heard.items)
        async with contextlib.AsyncExitStack() as stack:
            if beside:  # the duplicates take the silent statements
                await stack.enter_async_context(
                    an_enqueue_in_flight(dsn, pool, f"{queue.name}-other")
                )
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

    async with go_listener(dsn) as heard, running(worker):

        async def produce() -> None:
            for _ in range(each):
                await queue.enqueue("t", {})

        async with anyio.create_task_group() as tg:
            for _ in range(producers):
                tg.start_soon(produce)
        with anyio.fail_after(10):
            await all_handled.wait()
        # The pool's waker since the first wakeup it sent: it lingers. (One
        # made before an enqueue that went alone, and sent nothing, is
        # dropped as that enqueue ends.)
        waker = waker_for(pool)
    # Coalesced: a pool of 8 commits in parallel, the waker one at a time;
    # only an enqueue that found none of the others in flight sent its own.
    assert 1 <= waker.sent < total
    assert 1 <= len(heard.of(queue.name)) < total
    assert waker.connection_pid in heard.of(queue.name)


async def test_a_lost_waker_connection_is_replaced(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    async with (
        go_listener(dsn) as heard,
        an_enqueue_in_flight(dsn, pool, f"{queue.name}-other"),
    ):
        await queue.enqueue("t", {})
        old = await heard.wait_for(queue.name)
        assert old == waker_for(pool).connection_pid
        await pool.execute("SELECT pg_terminate_backend($1)", old)
        after = len(heard.items)
        await queue.enqueue("t", {})
        new = await heard.wait_for(queue.name, after=after)
        assert new == waker_for(pool).connection_pid
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
        waker = waker_for(app_pool)
        waker.wake([name])
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

    BLOCKED = "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)))"

    async def main() -> None:
        dsn, name, blocker_pid, key = sys.argv[1:]
        pool = await asyncpg.create_pool(dsn, min_size=2, max_size=2)
        queue = pgqueue.Queue(pool, name=name)
        # In flight until the test rolls back the row holding its key.
        held = pgqueue.Queue(pool, name=name + "-other").enqueue(
            "held", {}, unique_key=key
        )
        task = asyncio.ensure_future(held)
        while not await pool.fetchval(BLOCKED, int(blocker_pid)):
            await asyncio.sleep(0.01)
        await queue.enqueue("t", {})
        # Committed silently (another enqueue is in flight); the waker's
        # task has not run yet (nothing awaited since).
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

    key = f"held-{uuid.uuid4().hex[:8]}"
    async with (
        go_listener(dsn) as heard,
        running(worker),
        holding(dsn, f"{queue.name}-other", key) as blocker_pid,
    ):
        with anyio.fail_after(30):
            result = await anyio.run_process(
                [
                    sys.executable,
                    "-c",
                    PRODUCER,
                    dsn,
                    queue.name,
                    str(blocker_pid),
                    key,
                ],
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
        async with asyncpg.create_pool(sys.argv[1], min_size=2, max_size=2) as pool:
            async with pool.acquire() as a, pool.acquire() as b:
                print(a.get_server_pid(), b.get_server_pid())
            # The first to hold a connection starts alone and NOTIFYs itself;
            # the other, started while it is in flight, is left to the waker.
            await asyncio.gather(
                pgqueue.Queue(pool, name=sys.argv[2]).enqueue("t", {}),
                pgqueue.Queue(pool, name=sys.argv[2] + "-2").enqueue("t", {}),
            )

    asyncio.run(main())
    """
)


async def test_a_script_that_enqueues_and_exits_still_wakes_the_workers(
    dsn: str, queue: pgqueue.Queue
) -> None:
    async with go_listener(dsn) as heard:
        with anyio.fail_after(30):
            result = await anyio.run_process(
                [sys.executable, "-W", "error", "-c", SCRIPT, dsn, queue.name],
                check=False,
            )
        assert result.returncode == 0, result.stderr.decode()
        assert result.stderr == b""
        pool_pids = {int(pid) for pid in result.stdout.split()}
        senders = [await heard.wait_for(q) for q in (queue.name, f"{queue.name}-2")]
        # One by its own statement; one by the waker, as the loop shut down.
        assert sorted(sender in pool_pids for sender in senders) == [False, True]
