"""One set of connections per process: ``pgqueue.Connections``.

Workers (of one queue and of several), a subscriber and a tracker given the
same ``Connections`` open four connections between them, and a spare for
claims that overlap, whatever the number of queues; every wakeup, cancel request, tracked outcome and pub/sub
message crosses the one LISTEN connection; killing it wakes every part
again. Against a real server; waits are on events and rows, under deadlines.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgqueue
from tests.helpers import running, wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

# Long enough that a job found within a test's deadline was found by a NOTIFY.
NO_POLL = 60.0


def with_application_name(dsn: str, name: str) -> str:
    return f"{dsn}{'&' if '?' in dsn else '?'}application_name={name}"


async def sessions(pool: asyncpg.Pool, name: str) -> int:
    """How many server sessions carry the application name ``name``."""
    count: int = await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name
    )
    return count


class Fleet:
    """Three workers (five queues), a subscriber and a tracker on one Connections."""

    def __init__(
        self, pool: asyncpg.Pool, shared: pgqueue.Connections, prefix: str
    ) -> None:
        self.queues = [f"{prefix}-{n}" for n in range(5)]
        q = self.queues
        self.workers = [
            pgqueue.Worker(
                pool,
                queues={q[0]: 2, q[1]: 2, q[2]: 2},
                global_limit={q[2]: 1},
                poll_interval=NO_POLL,
                connections=shared,
            ),
            pgqueue.Worker(pool, queue=q[3], poll_interval=NO_POLL, connections=shared),
            pgqueue.Worker(pool, queue=q[4], poll_interval=NO_POLL, connections=shared),
        ]
        self.done: dict[int, anyio.Event] = {}
        self.hold = anyio.Event()
        self.held = anyio.Event()
        for worker in self.workers:
            worker.register("echo", self.echo)
            worker.register("hold", self.hold_job)
        self.channel = f"{prefix}-news"
        self.received: list[str] = []
        self.news = anyio.Event()
        self.reconnects = 0
        self.subscriber = pgqueue.Subscriber(
            pool, connections=shared, on_reconnect=self.on_reconnect
        )
        self.subscriber.handle(self.channel, self.on_news)
        self.tracker = pgqueue.Tracker(pool, connections=shared)

    async def echo(self, job: pgqueue.Job) -> Any:
        self.done.setdefault(job.id, anyio.Event()).set()
        return {"queue": job.queue}

    async def hold_job(self, _job: pgqueue.Job) -> None:
        self.held.set()
        await self.hold.wait()

    async def on_news(self, payload: str) -> None:
        self.received.append(payload)
        self.news.set()

    async def on_reconnect(self) -> None:
        self.reconnects += 1

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for worker in self.workers:
                await stack.enter_async_context(running(worker))
            tg = await stack.enter_async_context(anyio.create_task_group())
            await tg.start(self.subscriber.run)
            stack.callback(self.subscriber.stop)
            await stack.enter_async_context(self.tracker)
            yield

    async def round_trip(self, pool: asyncpg.Pool, payload: str) -> None:
        """A tracked job on every queue completes, and a message arrives, by NOTIFY alone."""
        for name in self.queues:
            job_id = await pgqueue.Queue(pool, name=name).enqueue(
                "echo", {}, track=True
            )
            with anyio.fail_after(10):
                outcome = await self.tracker.wait(job_id)
            assert outcome.status == pgqueue.Status.COMPLETED
            assert outcome.result == {"queue": name}
        self.news = anyio.Event()
        await pgqueue.publish(pool, self.channel, payload)
        with anyio.fail_after(10):
            await self.news.wait()
        assert self.received[-1] == payload


@pytest.fixture
def app_name() -> str:
    return f"pgq-shared-{uuid.uuid4().hex[:8]}"


async def test_a_process_opens_at_most_five_connections_whatever_the_number_of_queues(
    dsn: str, pool: asyncpg.Pool, queue_name: str, app_name: str
) -> None:
    async with pgqueue.Connections(with_application_name(dsn, app_name)) as shared:
        fleet = Fleet(pool, shared, queue_name)
        async with fleet.running():
            await fleet.round_trip(pool, "hello")
            # Claims, writes, upkeep (the sweeps ran at start) and LISTEN, and
            # the claims' spare if two claims overlapped (at start, likely).
            opened = await sessions(pool, app_name)
            assert opened in (4, 5), opened
            listener = shared.listener_pid
            assert listener is not None
            assert {w.listener_pid for w in fleet.workers} == {listener}
            assert fleet.subscriber.listener_pid == listener
            assert fleet.tracker.listener_pid == listener
        assert all(worker.listener_pid is None for worker in fleet.workers)
        # Stopping the parts leaves the connections to their owner.
        assert await sessions(pool, app_name) == opened

    async def closed() -> bool:
        return await sessions(pool, app_name) == 0

    await wait_until(closed)


async def test_without_connections_each_worker_opens_its_own(
    dsn: str, app_name: str, queue_name: str
) -> None:
    # The footprint the shared set replaces: four connections per worker.
    async with asyncpg.create_pool(
        with_application_name(dsn, app_name), min_size=1, max_size=2
    ) as pool:
        workers = [
            pgqueue.Worker(pool, queue=f"{queue_name}-{n}", poll_interval=NO_POLL)
            for n in range(2)
        ]
        done = anyio.Event()
        finished = 0

        async def echo(_job: pgqueue.Job) -> None:
            nonlocal finished
            finished += 1
            if finished == 2:
                done.set()

        for worker in workers:
            worker.register("echo", echo)
        async with running(workers[0]), running(workers[1]):
            for n in range(2):
                await pgqueue.Queue(pool, name=f"{queue_name}-{n}").enqueue("echo", {})
            with anyio.fail_after(10):
                await done.wait()
            # Each worker's four (the writes' once the outcomes are written)
            # and the pool's own; no waker's: each enqueue ran alone and sent
            # its wakeup from its own statement.

            async def all_open() -> bool:
                return await sessions(pool, app_name) == 2 * 4 + pool.get_size()

            await wait_until(all_open)


async def test_killing_the_shared_listen_connection_wakes_every_part_again(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    async with pgqueue.Connections(dsn) as shared:
        fleet = Fleet(pool, shared, queue_name)
        async with fleet.running():
            await fleet.round_trip(pool, "before")
            old = shared.listener_pid
            assert old is not None
            await pool.execute("SELECT pg_terminate_backend($1)", old)

            async def relistening() -> bool:
                pid = shared.listener_pid
                return pid is not None and pid != old

            await wait_until(relistening)
            await wait_until(lambda: _true(fleet.reconnects == 1))
            # Every worker, the subscriber and the tracker hear again.
            await fleet.round_trip(pool, "after")


async def test_a_cancel_request_reaches_a_worker_through_the_shared_connection(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    async with pgqueue.Connections(dsn) as shared:
        fleet = Fleet(pool, shared, queue_name)
        async with fleet.running():
            queue = pgqueue.Queue(pool, name=fleet.queues[4])
            job_id = await queue.enqueue("hold", {}, track=True)
            with anyio.fail_after(10):
                await fleet.held.wait()
            assert await queue.cancel(job_id) == {job_id: "requested"}
            with anyio.fail_after(10):  # far below the heartbeat's 100 s
                outcome = await fleet.tracker.wait(job_id)
            assert outcome.status == pgqueue.Status.CANCELLED


async def test_connections_must_be_entered_and_given_rightly(
    dsn: str, pool: asyncpg.Pool
) -> None:
    shared = pgqueue.Connections(dsn)
    worker = pgqueue.Worker(pool, connections=shared)
    with (
        anyio.fail_after(10),
        pytest.raises(RuntimeError, match="enter the Connections"),
    ):
        await worker.run()
    with pytest.raises(TypeError, match=r"pgqueue\.Connections"):
        pgqueue.Worker(pool, connections=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Connections\\(listen="):
        pgqueue.Worker(pool, connections=shared, listen=dsn)
    with pytest.raises(TypeError, match=r"pgqueue\.Connections"):
        pgqueue.Subscriber(pool, connections="x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="DSN string"):
        pgqueue.Connections(3)  # type: ignore[arg-type]
    async with shared:
        pass
    with pytest.raises(RuntimeError, match="already been entered"):
        async with shared:
            pass


async def _true(value: bool) -> bool:
    return value


async def test_a_dsn_tracker_reads_on_the_shared_upkeep_connection(
    dsn: str, pool: asyncpg.Pool, queue_name: str, app_name: str
) -> None:
    # A tracker given a DSN reads outcomes on a connection of pgqueue's own:
    # with Connections, the shared upkeep connection; a LISTEN DSN of its own
    # carries the LISTEN connection.
    shared_dsn = with_application_name(dsn, app_name)
    async with pgqueue.Connections(shared_dsn, listen=shared_dsn) as shared:
        worker = pgqueue.Worker(
            pool, queue=queue_name, poll_interval=NO_POLL, connections=shared
        )

        @worker.handler("echo")
        async def echo(job: pgqueue.Job) -> int:
            return job.id

        async with (
            running(worker),
            pgqueue.Tracker(shared_dsn, connections=shared) as tracker,
        ):
            job_id = await pgqueue.Queue(pool, name=queue_name).enqueue(
                "echo", {}, track=True
            )
            with anyio.fail_after(10):
                outcome = await tracker.wait(job_id)
            assert outcome.result == job_id
            assert await sessions(pool, app_name) == 4


async def test_a_claim_never_waits_behind_another_queues_claim_in_flight(
    dsn: str, app_name: str
) -> None:
    """While one statement holds the claim connection, the next runs at once on its spare.

    The lanes of a worker (and the workers sharing a ``Connections``) share
    the claim connection: a flooded queue's claims would otherwise delay
    every other queue's by their round trips.
    """
    async with pgqueue.Connections(with_application_name(dsn, app_name)) as shared:
        claims = shared.claims
        first_pid = await claims.fetchrow("SELECT pg_backend_pid() AS pid")
        assert first_pid is not None
        held = anyio.Event()
        release = anyio.Event()

        async def hold(connection: asyncpg.Connection[Any]) -> None:
            held.set()
            await release.wait()  # a claim in flight, as long as the test likes

        async with anyio.create_task_group() as tg:
            tg.start_soon(claims.run_in_transaction, hold)
            with anyio.fail_after(10):
                await held.wait()
                second = await claims.fetchrow("SELECT pg_backend_pid() AS pid")
            assert second is not None
            assert second["pid"] != first_pid["pid"]
            release.set()
        # The claim connection and its spare, which stays open (the others
        # open on first use).
        assert await sessions_of(dsn, app_name) == 2
        again = await claims.fetchrow("SELECT pg_backend_pid() AS pid")
        assert again is not None
        assert again["pid"] == first_pid["pid"]  # free again: the first one


async def sessions_of(dsn: str, name: str) -> int:
    connection = await asyncpg.connect(dsn)
    try:
        count: int = await connection.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", name
        )
    finally:
        await connection.close()
    return count
