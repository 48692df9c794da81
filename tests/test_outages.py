"""What the network and the database can do to a worker, caused for real.

A long outage (a proxy that refuses every connection), half-open connections
of the worker's own (a proxy that stops forwarding a statement's
connection), a server gone during shutdown, a pool ``init`` that fails on
reconnect, a prune blocked by a lock, a missing table, a NOTIFY sent while
the worker starts. Each test failed against the worker as it was before the
redesign.
"""

from __future__ import annotations

import contextlib
import socket
import uuid
from collections import Counter
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue._core.dsn import target as pgqueue_target
from pgqueue._core.errors import is_outage
from pgqueue._core.retry import Outage
from pgqueue._sql.outcomes import COMPLETE, FINISH
from tests.helpers import (
    RecordingLogger,
    noop,
    row,
    rows,
    running,
    wait_for_row,
    wait_until,
)
from tests.tcp_proxy import proxy_to, via

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

# The first bytes of a statement's text, which a client sends when it
# prepares the statement on a connection: the proxy freezes the connection
# that sends them.
FINISH_TEXT = b"UPDATE pgqueue_jobs AS j\nSET status"
assert FINISH.strip().startswith(FINISH_TEXT.decode())
assert COMPLETE.strip().startswith(FINISH_TEXT.decode())
CLAIM_TEXT = b"SET status = 'running', attempts = attempts + 1"


async def _statuses(pool: asyncpg.Pool, queue: str) -> Counter[str]:
    return Counter(r["status"] for r in await rows(pool, queue))


def completed(pool: asyncpg.Pool, queue: str, n: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return (await _statuses(pool, queue))["completed"] >= n

    return check


# --- 6. a long outage ------------------------------------------------------------


async def test_thousands_of_failures_in_a_row_are_waited_out(
    pool: asyncpg.Pool, queue: pgqueue.Queue, dsn: str
) -> None:
    """More than 1,024 failed claims in a row (0.05 * 2**1024 overflowed a float)."""
    logger = RecordingLogger()
    done = anyio.Event()
    async with (
        proxy_to(dsn) as proxy,
        asyncpg.create_pool(via(dsn, proxy.port), min_size=1) as proxied,
    ):
        # The retry delay of claims is capped at poll_interval: 2 ms here,
        # so that a long outage's worth of failures happens in seconds.
        worker = pgqueue.Worker(
            proxied,
            queue=queue.name,
            listen=False,
            poll_interval=0.002,
            logger=logger,
        )

        @worker.handler("t")
        async def handle(_job: pgqueue.Job) -> None:
            done.set()

        async with running(worker):
            proxy.refuse()

            async def many_failures() -> bool:
                extra = [
                    e for _, m, e in logger.records if m == "claim failed; retrying"
                ]
                return bool(extra) and extra[-1]["failures"] > 1_100

            await wait_until(many_failures, within=60)
            proxy.accept()
            await queue.enqueue("t", {})
            with anyio.fail_after(10):
                await done.wait()
    # One warning for the whole outage, naming the server; each retry at DEBUG.
    assert logger.messages("warning") == [
        "database %s unavailable (%s); retrying until it is back"
    ]
    assert logger.messages("error") == []
    assert [e["database"] for _, m, e in logger.records if "unavailable" in m] == [
        pgqueue_target(via(dsn, proxy.port))
    ]
    assert any(
        level == "debug" and m == "claim failed; retrying"
        for level, m, _ in logger.records
    )
    assert (
        logger.messages("info").count("database %s available again after %.1f s") == 1
    )


# --- 7. half-open connections of the worker's own ---------------------------------


@pytest.mark.parametrize(("prefetch", "most"), [(0, 8), (None, 12)])
async def test_a_black_holed_writer_stops_claims_keeps_heartbeats_and_loses_nothing(
    dsn: str, queue_name: str, prefetch: int | None, most: int
) -> None:
    """While outcomes cannot be written: claims stop, heartbeats go on, no job runs twice."""
    rescue_after = 1.2
    runs: Counter[int] = Counter()
    logger = RecordingLogger()
    async with proxy_to(dsn) as proxy, asyncpg.create_pool(dsn, min_size=1) as pool:
        ids = await pgqueue.Queue(pool, name=queue_name).enqueue_many(
            [("t", n) for n in range(30)]
        )
        async with asyncpg.create_pool(via(dsn, proxy.port), min_size=1) as proxied:
            worker = pgqueue.Worker(
                proxied,
                queue=queue_name,
                concurrency=4,
                # prefetch=0: claims of free slots only. By default a backlog
                # of short jobs is claimed ahead (4 more) while the writer
                # keeps up: a stuck writer stops claims one batch later.
                prefetch=prefetch,
                listen=False,
                poll_interval=0.05,
                rescue_after=rescue_after,
                logger=logger,
            )
            worker._statement_timeout = 0.5

            @worker.handler("t")
            async def handle(job: pgqueue.Job) -> None:
                runs[job.id] += 1

            proxy.freeze(matching=FINISH_TEXT)
            async with running(worker):
                # 4 running slots, and 4 outcomes may wait for the writer:
                # then no more claims until outcomes are written.
                await wait_until(lambda: _ran(runs, 8))
                since = await pool.fetchval("SELECT clock_timestamp()")

                async def writer_replaced_and_rescue_due() -> bool:
                    elapsed: float = await pool.fetchval(
                        "SELECT extract(epoch FROM clock_timestamp() - $1)", since
                    )
                    return proxy.frozen_by_pattern >= 3 and elapsed > 2 * rescue_after

                await wait_until(writer_replaced_and_rescue_due, within=30)
                ran = sum(runs.values())
                assert 8 <= ran <= most, "claimed while outcomes could not be written"
                stale: float = await pool.fetchval(
                    "SELECT max(extract(epoch FROM now() - updated_at)) FROM pgqueue_jobs"
                    " WHERE queue = $1 AND status = 'running'",
                    queue_name,
                )
                assert stale < rescue_after, "held jobs were not heartbeaten"
                proxy.thaw()
                await wait_until(completed(pool, queue_name, len(ids)), within=30)
        final = await rows(pool, queue_name)
    assert Counter(r["status"] for r in final) == {"completed": len(ids)}
    assert {r["attempts"] for r in final} == {1}
    assert runs == dict.fromkeys(ids, 1)
    failures = [
        e for _, m, e in logger.records if m == "writing job outcomes failed; retrying"
    ]
    assert failures
    assert failures[0]["error"] == "TimeoutError()"


async def _ran(runs: Counter[int], n: int) -> bool:
    return sum(runs.values()) >= n


async def test_a_black_holed_claim_connection_is_replaced(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    logger = RecordingLogger()
    async with proxy_to(dsn) as proxy:
        # Terminated, not closed: a polite close of a frozen connection never ends.
        proxied = await asyncpg.create_pool(via(dsn, proxy.port), min_size=1)
        try:
            worker = pgqueue.Worker(
                proxied,
                queue=queue.name,
                listen=False,
                poll_interval=0.05,
                logger=logger,
            )
            worker._statement_timeout = 0.5
            worker.register("t", noop)
            first = await queue.enqueue("t", {})
            async with running(worker):
                await wait_for_row(pool, first, status="completed")
                # Every claim connection from now on goes dead when it claims.
                proxy.freeze(matching=CLAIM_TEXT)
                proxy.freeze()  # and so does the one in use

                async def replaced_twice() -> bool:
                    return proxy.frozen_by_pattern >= 2

                await wait_until(replaced_twice, within=15)
                later = await queue.enqueue_many([("t", n) for n in range(5)])
                proxy.thaw()
                for job_id in later:
                    await wait_for_row(pool, job_id, status="completed", within=15)
        finally:
            proxied.terminate()
    timeouts = [e for _, m, e in logger.records if m == "claim failed; retrying"]
    assert timeouts
    assert timeouts[0]["error"] == "TimeoutError()"


# --- 8. a server gone during shutdown -------------------------------------------


async def test_stop_returns_within_its_bound_when_the_server_is_gone(
    dsn: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every connection half-open, new ones (and cancel requests) refused: stop() returns.

    The outcome write in flight is cut off when the final flush gives up;
    asyncpg then asks the server to cancel it, which fails, and a polite
    close of that connection raises.
    """
    monkeypatch.setattr("pgqueue._worker.FLUSH_TIMEOUT", 1.0)
    started, release = anyio.Event(), anyio.Event()
    async with proxy_to(dsn) as proxy, asyncpg.create_pool(dsn, min_size=1) as pool:
        queue = pgqueue.Queue(pool, name=queue_name)
        proxied = await asyncpg.create_pool(via(dsn, proxy.port), min_size=1)
        try:
            worker = pgqueue.Worker(
                proxied, queue=queue_name, listen=False, poll_interval=0.05
            )
            worker._statement_timeout = 5.0

            @worker.handler("t")
            async def handle(job: pgqueue.Job) -> None:
                if job.payload == "hold":
                    started.set()
                    await release.wait()

            async with anyio.create_task_group() as tg:
                tg.start_soon(worker.run)
                # Every connection of the worker's own is open ...
                await wait_for_row(
                    pool, await queue.enqueue("t", {}), status="completed"
                )
                held = await queue.enqueue("t", "hold")
                with anyio.fail_after(10):
                    await started.wait()
                # ... when the network drops them and the server goes away.
                proxy.freeze()
                proxy.refuse()
                release.set()
                # The flush (1 s, cut off mid-statement) and the closes (2 s).
                with anyio.fail_after(10):
                    await worker.stop()
        finally:
            proxied.terminate()
        # Nothing was written: the rescue sweep will find the job.
        assert (await row(pool, held))["status"] == "running"


class CloseFails(asyncpg.Connection):
    """A connection class whose close raises, as a close does when the server
    goes away in the middle of it (asyncpg passes it a pool's connections)."""

    async def close(self, *, timeout: float | None = None) -> None:  # noqa: ASYNC109 - asyncpg's signature
        await super().close(timeout=timeout)
        msg = "server went away during close"
        raise ConnectionResetError(msg)


async def test_stop_returns_when_closing_a_connection_fails(
    dsn: str, queue_name: str
) -> None:
    async with asyncpg.create_pool(
        dsn, min_size=1, connection_class=CloseFails
    ) as pool:
        worker = pgqueue.Worker(pool, queue=queue_name, rescue_after=60)
        worker.register("t", noop)
        job_id = await pgqueue.Queue(pool, name=queue_name).enqueue("t", {})
        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            await wait_for_row(pool, job_id, status="completed")
            with anyio.fail_after(10):
                await worker.stop()
        assert worker.listener_pid is None
        pool.terminate()  # its own closes would raise too


# --- 11. a background part that fails --------------------------------------------


async def test_a_pool_init_that_fails_on_reconnect_is_retried_and_jobs_finish(
    dsn: str, queue_name: str
) -> None:
    logger = RecordingLogger()
    failing = False
    started, release = anyio.Event(), anyio.Event()

    async def init(_connection: asyncpg.Connection) -> None:
        if failing:
            msg = "init hook failed"
            raise RuntimeError(msg)

    async with asyncpg.create_pool(dsn, min_size=1, init=init) as pool:
        queue = pgqueue.Queue(pool, name=queue_name)
        worker = pgqueue.Worker(pool, queue=queue_name, poll_interval=60, logger=logger)

        @worker.handler("t")
        async def handle(job: pgqueue.Job) -> None:
            if job.payload == "hold":
                started.set()
                await release.wait()

        async with running(worker):
            # Every connection of the worker's own is open ...
            await wait_for_row(pool, await queue.enqueue("t", {}), status="completed")
            held = await queue.enqueue("t", "hold")
            with anyio.fail_after(10):
                await started.wait()
            # ... when the init hook starts failing, and LISTEN must reconnect.
            failing = True
            old = worker.listener_pid
            await _terminate(dsn, old)
            extra = await logger.wait_for("LISTEN connection failed; retrying")
            assert "init hook failed" in extra["error"]
            release.set()
            await wait_for_row(pool, held, status="completed")
            failing = False

            async def listening_again() -> bool:
                return worker.listener_pid not in (None, old)

            await wait_until(listening_again)
            woken = await queue.enqueue("t", {})
            await wait_for_row(pool, woken, status="completed", within=5)


async def _terminate(dsn: str, pid: int | None) -> None:
    assert pid is not None
    connection = await asyncpg.connect(dsn)
    try:
        assert await connection.fetchval("SELECT pg_terminate_backend($1)", pid)
    finally:
        await connection.close()


# --- 12. heartbeats never wait behind a sweep ---------------------------------------


async def test_a_prune_blocked_by_a_lock_does_not_delay_heartbeats(
    dsn: str, queue_name: str
) -> None:
    """Worker A prunes, B rescues: A's live job must not look dead to B."""
    rescue_after = 1.0
    runs: list[str] = []
    release = anyio.Event()
    async with (
        asyncpg.create_pool(dsn, min_size=1, max_size=4) as pool,
        asyncpg.create_pool(dsn, min_size=1, max_size=2) as other,
    ):
        queue = pgqueue.Queue(pool, name=queue_name)
        old = await queue.enqueue("t", {})
        await pool.execute(
            "UPDATE pgqueue_jobs SET status = 'completed', run_at = now() + interval '1 day',"
            " updated_at = now() - interval '1 day' WHERE id = $1",
            old,
        )
        a = pgqueue.Worker(
            pool,
            queue=queue_name,
            retain=1.0,
            rescue_after=rescue_after,
            poll_interval=0.1,
        )
        b = pgqueue.Worker(
            other, queue=queue_name, rescue_after=rescue_after, poll_interval=0.1
        )

        @a.handler("t")
        async def long_job(_job: pgqueue.Job) -> None:
            runs.append("a")
            await release.wait()

        @b.handler("t")
        async def other_run(_job: pgqueue.Job) -> None:
            runs.append("b")

        locker = await asyncpg.connect(dsn)
        try:
            async with locker.transaction():
                # Another session holds the prunable row: a prune that waits
                # for it would hold A's upkeep connection, and its heartbeats.
                await locker.execute(
                    "SELECT 1 FROM pgqueue_jobs WHERE id = $1 FOR UPDATE", old
                )
                job_id = await queue.enqueue("t", {})
                async with running(a):
                    await wait_until(lambda: _started(runs))
                    async with running(b):
                        since = await pool.fetchval("SELECT clock_timestamp()")

                        async def three_periods() -> bool:
                            elapsed: float = await pool.fetchval(
                                "SELECT extract(epoch FROM clock_timestamp() - $1)",
                                since,
                            )
                            return elapsed > 3 * rescue_after

                        await wait_until(three_periods)
                        release.set()
                        stored = await wait_for_row(pool, job_id, status="completed")
            # Released: the next sweep prunes the row.
            async with running(
                pgqueue.Worker(pool, queue=queue_name, retain=1.0, poll_interval=0.1)
            ):

                async def pruned() -> bool:
                    gone: bool = await pool.fetchval(
                        "SELECT NOT EXISTS (SELECT 1 FROM pgqueue_jobs WHERE id = $1)",
                        old,
                    )
                    return gone

                await wait_until(pruned)
        finally:
            await locker.close()
    assert runs == ["a"]
    assert stored["attempts"] == 1


async def _started(runs: list[str]) -> bool:
    return bool(runs)


# --- 14. a missing table -----------------------------------------------------------


@pytest.fixture
async def empty_dsn(admin_dsn: str) -> AsyncIterator[str]:
    """A database without pgqueue's table."""
    from pgqueue.testing import with_database

    name = f"pgqueue_empty_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield with_database(admin_dsn, name)
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def test_a_missing_table_fails_at_once_and_says_to_apply_the_schema(
    empty_dsn: str,
) -> None:
    async with asyncpg.create_pool(empty_dsn, min_size=1) as pool:
        worker = pgqueue.Worker(pool)
        with anyio.fail_after(10), pytest.raises(pgqueue.SchemaError) as raised:
            await worker.run()
        assert "pgqueue_jobs" in str(raised.value)
        assert "pgqueue.SCHEMA" in str(raised.value)
        # The readiness idiom raises it too.
        async with anyio.create_task_group() as tg:
            with anyio.fail_after(10), pytest.raises(pgqueue.SchemaError):
                await tg.start(pgqueue.Worker(pool).run)


async def test_a_missing_column_is_named(empty_dsn: str) -> None:
    async with asyncpg.create_pool(empty_dsn, min_size=1) as pool:
        await pgqueue.install(pool)
        await pool.execute("ALTER TABLE pgqueue_jobs DROP COLUMN completed_at")
        with (
            anyio.fail_after(10),
            pytest.raises(pgqueue.SchemaError, match="completed_at"),
        ):
            await pgqueue.Worker(pool).run(until_empty=True)


# --- 15. a NOTIFY sent while the worker starts ----------------------------------------


async def test_a_notify_sent_before_listen_is_up_is_not_lost_until_the_poll(
    pool: asyncpg.Pool, queue: pgqueue.Queue, dsn: str
) -> None:
    async with proxy_to(dsn) as proxy:
        proxy.hold()  # the LISTEN connection is slow to come up
        worker = pgqueue.Worker(
            pool, queue=queue.name, poll_interval=60, listen=via(dsn, proxy.port)
        )
        worker.register("t", noop)
        first = await queue.enqueue("t", {})
        async with anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            # The first claim ran (LISTEN is not up yet) ...
            await wait_for_row(pool, first, status="completed")
            assert worker.listener_pid is None
            # ... so this job's NOTIFY reaches no worker.
            second = await queue.enqueue("t", {})
            proxy.release()
            await wait_for_row(pool, second, status="completed", within=10)
            with anyio.fail_after(10):
                await worker.stop()


# --- readiness ------------------------------------------------------------------------


async def test_start_returns_once_the_worker_listens(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60)
    worker.register("t", noop)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(10):
            await tg.start(worker.run)
        assert worker.listener_pid is not None
        job_id = await queue.enqueue("t", {})
        await wait_for_row(pool, job_id, status="completed", within=5)
        await worker.stop()


async def test_an_outage_is_one_warning_naming_the_server_then_one_line_when_back(
    pool: asyncpg.Pool, queue: pgqueue.Queue, dsn: str
) -> None:
    """Every connection of the worker fails, many times: one WARNING, one INFO."""
    logger = RecordingLogger()
    done = anyio.Event()
    async with proxy_to(dsn) as proxy:
        # A password in the DSN (trust auth ignores it): never in a log line.
        parts = urlsplit(via(dsn, proxy.port))
        secret_dsn = urlunsplit(
            parts._replace(netloc=parts.netloc.replace("@", ":hunter2-secret@", 1))
        )
        async with asyncpg.create_pool(secret_dsn, min_size=1) as proxied:
            worker = pgqueue.Worker(
                proxied, queue=queue.name, poll_interval=0.05, logger=logger
            )

            @worker.handler("t")
            async def handle(_job: pgqueue.Job) -> None:
                done.set()

            async with running(worker):
                proxy.refuse()
                began = anyio.current_time()

                def retried(what: str) -> Callable[[str, str, dict[str, Any]], bool]:
                    return lambda level, msg, extra: (
                        level == "debug"
                        and msg.startswith(what)
                        and extra["failures"] > 3
                    )

                # Claims and LISTEN both fail again and again.
                await logger.wait_until_logged(retried("claim failed"), within=20)
                await logger.wait_until_logged(retried("LISTEN connection"), within=20)
                down_for = anyio.current_time() - began
                proxy.accept()
                await logger.wait_for("available again", within=20)
                await queue.enqueue("t", {})
                with anyio.fail_after(10):
                    await done.wait()
    where = pgqueue_target(via(dsn, proxy.port))
    warnings = [(m, e) for lv, m, e in logger.records if lv == "warning"]
    assert warnings == [
        (
            "database %s unavailable (%s); retrying until it is back",
            {
                "database": where,
                "error": warnings[0][1]["error"],
                "queue": queue.name,
            },
        )
    ]
    assert "@" in where
    assert "hunter2" not in where
    assert logger.messages("error") == []
    back = [e for lv, m, e in logger.records if lv == "info" and "available again" in m]
    assert len(back) == 1
    assert back[0]["database"] == where
    assert back[0]["seconds"] >= down_for
    assert "hunter2-secret" not in repr(logger.records)


UNAVAILABLE = "database %s unavailable (%s); retrying until it is back"
BACK = "database %s available again after %.1f s"


def loud(records: list[tuple[str, str, dict[str, Any]]]) -> list[tuple[str, str]]:
    """The (level, message) of the records at INFO and above."""
    return [(lv, m) for lv, m, _ in records if lv != "debug"]


async def test_the_end_of_an_outage_of_a_dropped_listen_connection_is_one_line(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    """Its LISTEN backend terminated: one WARNING, then one INFO line when LISTEN is back."""
    logger = RecordingLogger()
    done = anyio.Event()
    # poll_interval=60: within this test only a wakeup (LISTEN back) runs the job.
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60, logger=logger)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        done.set()

    async with running(worker):
        old_pid = worker.listener_pid
        assert old_pid is not None
        before = len(logger.records)
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", old_pid)
        await logger.wait_for("available again", within=20)
        await queue.enqueue("t", {})
        with anyio.fail_after(10):
            await done.wait()
        since = logger.records[before:]
    assert loud(since) == [("warning", UNAVAILABLE), ("info", BACK)]
    # The reconnect is part of the outage: said at DEBUG.
    assert [lv for lv, m, _ in since if "re-established" in m] == ["debug"]


async def test_every_outage_of_a_worker_whose_backends_are_terminated_ends_in_one_line(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    """Every backend of the worker terminated: each outage starts and ends in one line."""
    logger = RecordingLogger()
    done = anyio.Event()
    app = f"pgqueue-outage-{uuid.uuid4().hex[:8]}"
    async with asyncpg.create_pool(
        dsn, min_size=1, server_settings={"application_name": app}
    ) as own:
        worker = pgqueue.Worker(
            own, queue=queue.name, poll_interval=0.05, logger=logger
        )

        @worker.handler("t")
        async def handle(_job: pgqueue.Job) -> None:
            done.set()

        async with running(worker):
            await queue.enqueue("t", {})  # every connection of the worker in use
            with anyio.fail_after(10):
                await done.wait()
            done = anyio.Event()
            before = len(logger.records)
            terminated = await pool.fetchval(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
                " FROM pg_stat_activity WHERE application_name = $1",
                app,
            )
            assert terminated >= 4  # claims, writes, upkeep, LISTEN (and the pool's)
            await logger.wait_for("available again", within=20)
            await queue.enqueue("t", {})
            with anyio.fail_after(10):
                await done.wait()
            await anyio.sleep(0.5)  # a part that finds its loss later says so now
            since = logger.records[before:]
    said = loud(since)
    assert ("warning", UNAVAILABLE) in said
    # Nothing but outages' starts and ends, each start followed by one end.
    pairs = [("warning", UNAVAILABLE), ("info", BACK)] * (len(said) // 2)
    assert said in (pairs, [*pairs, ("warning", UNAVAILABLE)]), said
    assert not [lv for lv, m, _ in since if "re-established" in m and lv != "debug"]


def closed_port() -> int:
    """A local port nothing listens on (connecting to it is refused)."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port: int = free.getsockname()[1]
    return port


async def test_an_outage_names_the_server_used_not_every_host_of_the_dsn(
    dsn: str,
) -> None:
    """A multi-host DSN: the outage names the server the connections were on.

    The write connection never opened: it fails its first connect, and is
    named after the server its sibling opened on, not after the DSN's list.
    """
    logger = RecordingLogger()
    outage = Outage(logger)
    async with proxy_to(dsn) as proxy:
        used = via(dsn, proxy.port)
        parts = urlsplit(used)
        hosts = f"127.0.0.1:{closed_port()},127.0.0.1:{proxy.port}"
        user = parts.netloc.rpartition("@")[0]
        multi = urlunsplit(parts._replace(netloc=f"{user}@{hosts}" if user else hosts))
        assert "," in pgqueue_target(multi)
        async with pgqueue.Connections(multi) as connections:
            connections._watch(outage)
            assert connections.writes.where == pgqueue_target(multi)
            await connections.claims.fetch("SELECT 1")
            assert connections.writes.where == pgqueue_target(used)
            proxy.refuse()
            failed: Exception | None = None
            try:
                await connections.writes.fetch("SELECT 1")
            except Exception as exc:  # whatever the connect raised
                failed = exc
            assert failed is not None
            assert is_outage(failed)
            proxy.accept()
            with anyio.fail_after(10):
                while outage.ongoing:  # until the proxy listens again
                    with contextlib.suppress(Exception):
                        await connections.writes.fetch("SELECT 1")
                    await anyio.sleep(0.05)
    named = [(m, e["database"]) for _, m, e in logger.records]
    assert named == [
        (UNAVAILABLE, pgqueue_target(used)),
        (BACK, pgqueue_target(used)),
    ]
