"""Pub/sub against a real server: publish, Subscriber delivery, drops, reconnects, bad input."""

from __future__ import annotations

import contextlib
import logging
import uuid
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import anyio.lowlevel
import asyncpg
import pytest

import pgqueue
from pgqueue import Subscriber, publish
from tests.helpers import Collected, RecordingLogger, listening, wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

CRAB = "\N{CRAB}"  # four bytes of UTF-8

ODD_CHANNELS = [
    "Robert'); DROP TABLE x;--",
    '"quoted"',
    'a"b',
    "MixedCase",
    "mixedcase",
    "with space",
    "back\\slash",
    "$1",
    "-- comment",
    "\u00fcn\u00efc\u00f8d\u00e9",
    CRAB * 15 + "abc",  # exactly 63 bytes
    "x" * 63,
]


@pytest.fixture
def channel() -> str:
    """A channel no other test uses."""
    return f"pubsub_{uuid.uuid4().hex[:12]}"


class Inbox(Collected):
    """A subscriber callback that keeps every payload and lets tests wait for one."""

    async def __call__(self, payload: str) -> None:
        self.add(payload)


@contextlib.asynccontextmanager
async def subscribed(sub: Subscriber) -> AsyncIterator[Subscriber]:
    """Run ``sub`` inside the test body until it listens; stop it on the way out."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(sub.run)
        with anyio.fail_after(10):
            await sub.wait_listening()
        try:
            yield sub
        finally:
            sub.stop()


def _with_user(dsn: str, user: str, password: str) -> str:
    parts = urlsplit(dsn)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:{password}@{host}"))


async def test_round_trip(dsn: str, pool: asyncpg.Pool, channel: str) -> None:
    inbox = Inbox()
    sub = Subscriber(dsn)
    assert sub.handler(channel)(inbox) is inbox
    async with subscribed(sub):
        await publish(pool, channel, "hello")
        await publish(pool, channel, b'{"order_id": 42}')
        async with pool.acquire() as proxy:
            await publish(proxy, channel, "from a pooled connection")
        connection = await asyncpg.connect(dsn)
        try:
            await publish(connection, channel, CRAB + " \u00e9t\u00e9")
        finally:
            await connection.close()
        await inbox.wait_for(CRAB + " \u00e9t\u00e9")
    assert inbox.payloads == [
        "hello",
        '{"order_id": 42}',
        "from a pooled connection",
        CRAB + " \u00e9t\u00e9",
    ]


async def test_largest_payload_round_trips(pool: asyncpg.Pool, channel: str) -> None:
    inbox = Inbox()
    sub = Subscriber(pool)
    sub.handle(channel, inbox)
    largest = CRAB * 1999 + "abc"  # 7999 bytes
    async with subscribed(sub):
        await publish(pool, channel, largest)
        await inbox.wait_for(largest)
    with pytest.raises(pgqueue.PayloadTooLargeError, match="8000"):
        await publish(pool, channel, largest + "d")


async def test_a_borrowed_pool_is_not_closed_and_the_listen_connection_is(
    pool: asyncpg.Pool, channel: str
) -> None:
    sub = Subscriber(pool)
    sub.handle(channel, Inbox())
    async with subscribed(sub):
        pid = sub.listener_pid
        assert pid is not None
    assert sub.listener_pid is None

    async def gone() -> bool:
        count: int = await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid
        )
        return count == 0

    await wait_until(gone)
    assert not pool.is_closing()
    assert await pool.fetchval("SELECT 1") == 1


async def test_two_subscribers_on_one_channel_both_receive(
    dsn: str, pool: asyncpg.Pool, channel: str
) -> None:
    first, second = Inbox(), Inbox()
    one, two = Subscriber(dsn), Subscriber(pool)
    one.handle(channel, first)
    two.handle(channel, second)
    async with subscribed(one), subscribed(two):
        for payload in ("a", "b", "c"):
            await publish(pool, channel, payload)
        await first.wait_for("c")
        await second.wait_for("c")
    assert first.payloads == second.payloads == ["a", "b", "c"]


async def test_callbacks_of_one_channel_run_in_registration_order(
    pool: asyncpg.Pool, channel: str
) -> None:
    calls: list[tuple[str, str]] = []
    last = Inbox()
    sub = Subscriber(pool)

    @sub.handler(channel)
    async def first(payload: str) -> None:
        await anyio.lowlevel.checkpoint()
        calls.append(("first", payload))

    @sub.handler(channel)
    async def second(payload: str) -> None:
        calls.append(("second", payload))

    sub.handle(channel, last)
    assert sub.channels == [channel]
    async with subscribed(sub):
        await publish(pool, channel, "1")
        await publish(pool, channel, "2")
        await last.wait_for("2")
    assert calls == [("first", "1"), ("second", "1"), ("first", "2"), ("second", "2")]


async def test_publish_in_a_committed_transaction_is_delivered_at_commit(
    pool: asyncpg.Pool, channel: str
) -> None:
    inbox = Inbox()
    sub = Subscriber(pool)
    sub.handle(channel, inbox)
    async with subscribed(sub), pool.acquire() as connection:
        async with connection.transaction():
            await publish(connection, channel, "in transaction")
            # Commits on its own while the transaction is open.
            await publish(pool, channel, "outside")
            assert await inbox.wait_for("outside") == []
        await inbox.wait_for("in transaction")
    assert inbox.payloads == ["outside", "in transaction"]


async def test_publish_in_a_rolled_back_transaction_is_never_delivered(
    pool: asyncpg.Pool, channel: str
) -> None:
    inbox = Inbox()
    sub = Subscriber(pool)
    sub.handle(channel, inbox)
    async with subscribed(sub), pool.acquire() as connection:
        transaction = connection.transaction()
        await transaction.start()
        await publish(connection, channel, "rolled back")
        await transaction.rollback()
        # A savepoint rolled back inside a committed transaction: same.
        async with connection.transaction():
            await publish(connection, channel, "kept")
            savepoint = connection.transaction()
            await savepoint.start()
            await publish(connection, channel, "savepoint rolled back")
            await savepoint.rollback()
        # Notifications arrive in commit order: nothing else came before this.
        await publish(pool, channel, "marker")
        assert await inbox.wait_for("marker") == ["kept"]
    assert inbox.payloads == ["kept", "marker"]


async def test_a_burst_of_1000_arrives_in_order_one_callback_at_a_time(
    pool: asyncpg.Pool, channel: str
) -> None:
    count = 1000
    received: list[str] = []
    done = anyio.Event()
    active = most_active = 0
    sub = Subscriber(pool)

    @sub.handler(channel)
    async def record(payload: str) -> None:
        nonlocal active, most_active
        active += 1
        most_active = max(most_active, active)
        await anyio.lowlevel.checkpoint()  # another callback would start here
        received.append(payload)
        active -= 1
        if len(received) == count:
            done.set()

    async with subscribed(sub), pool.acquire() as connection:
        for i in range(count):
            await publish(connection, channel, str(i))
        with anyio.fail_after(10):
            await done.wait()
    assert received == [str(i) for i in range(count)]
    assert most_active == 1


async def test_a_failing_callback_is_logged_and_delivery_goes_on(
    pool: asyncpg.Pool, channel: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="pgqueue")
    inbox = Inbox()
    failed: list[str] = []
    sub = Subscriber(pool)  # the default logger: the standard library's

    @sub.handler(channel)
    async def explode(payload: str) -> None:
        if payload.startswith("secret"):
            failed.append(payload)
            msg = "callback blew up"
            raise RuntimeError(msg)

    sub.handle(channel, inbox)
    async with subscribed(sub):
        await publish(pool, channel, "secret-1")
        await publish(pool, channel, "fine")
        await publish(pool, channel, "secret-2")
        await publish(pool, channel, "last")
        await inbox.wait_for("last")
    assert failed == ["secret-1", "secret-2"]
    assert inbox.payloads == ["secret-1", "fine", "secret-2", "last"]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2
    for record in errors:
        assert record.getMessage() == "subscriber callback failed"
        assert record.__dict__["channel"] == channel
        assert record.exc_info is not None
        assert isinstance(record.exc_info[1], RuntimeError)
        assert "secret" not in record.getMessage()
        assert "secret" not in repr(record.__dict__)


async def test_a_flood_with_a_slow_callback_stays_bounded_and_reports_drops(
    pool: asyncpg.Pool, channel: str
) -> None:
    max_pending = 10
    published = 500
    logger = RecordingLogger()
    release = anyio.Event()
    delivered: list[str] = []
    most_pending = 0
    sub = Subscriber(pool, logger=logger, max_pending=max_pending)

    @sub.handler(channel)
    async def slow(payload: str) -> None:
        nonlocal most_pending
        most_pending = max(most_pending, sub.pending)
        delivered.append(payload)
        await release.wait()  # the first call blocks until the flood is over

    def drop_warnings() -> list[dict[str, Any]]:
        return [
            extra
            for level, msg, extra in logger.records
            if level == "warning" and "dropped" in msg
        ]

    def reported() -> int:
        return sum(extra["count"] for extra in drop_warnings())

    async def accounted_for() -> bool:
        # Every notification is either delivered, buffered, or dropped and reported.
        return len(delivered) + sub.pending + reported() == published

    async with subscribed(sub):
        async with pool.acquire() as connection, connection.transaction():
            for i in range(published):
                await publish(connection, channel, str(i))
        await wait_until(accounted_for, within=5)
        assert len(delivered) == 1
        assert sub.pending == max_pending
        release.set()
        await publish(pool, channel, "marker")
        with anyio.fail_after(5):
            while "marker" not in delivered:
                await anyio.sleep(0.01)
    assert most_pending <= max_pending
    expected = [str(i) for i in range(max_pending + 1)] + ["marker"]
    assert delivered == expected
    assert reported() == published + 1 - len(delivered)
    # Rate-limited: the drops of one burst are not logged one by one.
    assert 1 <= len(drop_warnings()) <= 2
    assert all(extra["max_pending"] == max_pending for extra in drop_warnings())


async def test_reconnects_after_the_backend_is_terminated(
    pool: asyncpg.Pool, channel: str
) -> None:
    logger = RecordingLogger()
    inbox = Inbox()
    reconnected = anyio.Event()
    events: list[str] = []

    async def on_reconnect() -> None:
        events.append("reconnect")
        reconnected.set()

    sub = Subscriber(pool, logger=logger, on_reconnect=on_reconnect)

    @sub.handler(channel)
    async def record(payload: str) -> None:
        events.append(payload)
        await inbox(payload)

    async with subscribed(sub):
        await publish(pool, channel, "before")
        await inbox.wait_for("before")
        old_pid = sub.listener_pid
        before = len(logger.records)
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", old_pid)
        with anyio.fail_after(10):
            await reconnected.wait()
            await sub.wait_listening()
        assert sub.listener_pid not in (None, old_pid)
        extra = await logger.wait_for("notifications sent while it was down")
        assert extra["channels"] == [channel]
        await publish(pool, channel, "after")
        await inbox.wait_for("after")
        since = logger.records[before:]
    assert events == ["before", "reconnect", "after"]
    # No outage line of a worker's here: the loss and the reconnect say it,
    # one WARNING each (what was published meanwhile is lost to the subscriber).
    missed = (
        "LISTEN connection re-established; "
        "notifications sent while it was down were missed"
    )
    assert [(lv, m) for lv, m, _ in since if lv != "debug"] == [
        ("warning", "LISTEN connection lost; reconnecting"),
        ("warning", missed),
    ]


async def test_a_failing_on_reconnect_is_logged_and_delivery_goes_on(
    pool: asyncpg.Pool, channel: str
) -> None:
    logger = RecordingLogger()
    inbox = Inbox()

    async def on_reconnect() -> None:
        msg = "resync failed"
        raise RuntimeError(msg)

    sub = Subscriber(pool, logger=logger, on_reconnect=on_reconnect)
    sub.handle(channel, inbox)
    async with subscribed(sub):
        old_pid = sub.listener_pid
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", old_pid)
        extra = await logger.wait_for("on_reconnect failed")
        assert extra["channels"] == [channel]
        with anyio.fail_after(10):
            await sub.wait_listening()
        await publish(pool, channel, "after")
        await inbox.wait_for("after")


async def test_odd_channel_names_round_trip(pool: asyncpg.Pool) -> None:
    inboxes = {name: Inbox() for name in ODD_CHANNELS}
    sub = Subscriber(pool)
    for name, inbox in inboxes.items():
        sub.handle(name, inbox)
    async with subscribed(sub):
        for name in ODD_CHANNELS:
            await publish(pool, name, name)
        # Callbacks run in arrival order: the last one done means all are.
        await inboxes[ODD_CHANNELS[-1]].wait_for(ODD_CHANNELS[-1])
    for name, inbox in inboxes.items():
        assert inbox.payloads == [name]
    assert await pool.fetchval("SELECT to_regclass('pgqueue_jobs') IS NOT NULL")


BAD_INPUT: list[tuple[object, object, type[Exception]]] = [
    ("", "payload", ValueError),
    ("x" * 64, "payload", ValueError),
    (CRAB * 16, "payload", ValueError),  # 16 characters, 64 bytes
    ("a\x00b", "payload", ValueError),
    (42, "payload", TypeError),
    (None, "payload", TypeError),
    ("{channel}", "x" * 8000, pgqueue.PayloadTooLargeError),
    ("{channel}", CRAB * 2000, pgqueue.PayloadTooLargeError),  # 2000 characters
    ("{channel}", b"x" * 8000, pgqueue.PayloadTooLargeError),
    ("{channel}", "nul \x00 inside", ValueError),
    ("{channel}", b"\xff\xfe", ValueError),
    ("{channel}", "\ud800", ValueError),
    ("{channel}", 42, TypeError),
    ("{channel}", None, TypeError),
]


def _bad_cases(channel: str) -> list[tuple[Any, Any, type[Exception]]]:
    return [
        (channel if name == "{channel}" else name, payload, error)
        for name, payload, error in BAD_INPUT
    ]


async def test_bad_input_raises_before_any_sql(dsn: str, channel: str) -> None:
    # A closed connection fails any statement with InterfaceError, so each
    # expected error below proves the input was refused before any SQL.
    closed = await asyncpg.connect(dsn)
    await closed.close()
    with pytest.raises(asyncpg.InterfaceError):
        await publish(closed, channel, "fine")
    for name, payload, error in _bad_cases(channel):
        with pytest.raises(error):
            await publish(closed, name, payload)
    assert issubclass(pgqueue.PayloadTooLargeError, ValueError)


async def test_bad_input_sends_nothing(
    dsn: str, pool: asyncpg.Pool, channel: str
) -> None:
    async with listening(dsn, channel) as notifications:
        for name, payload, error in _bad_cases(channel):
            with pytest.raises(error):
                await publish(pool, name, payload)
        await publish(pool, channel, "marker")
        assert await notifications.wait_for("marker") == []


async def test_bad_registrations_raise(dsn: str, channel: str) -> None:
    sub = Subscriber(dsn)
    for name, _, error in _bad_cases(channel):
        if name != channel:
            with pytest.raises(error):
                sub.handle(name, Inbox())
    with pytest.raises(TypeError):
        sub.handle(channel, "not callable")  # type: ignore[arg-type]
    assert sub.channels == []
    with pytest.raises(TypeError):
        Subscriber(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_pending"):
        Subscriber(dsn, max_pending=0)
    with pytest.raises(TypeError):
        Subscriber(dsn, on_reconnect="not callable")  # type: ignore[arg-type]


async def test_second_run_and_late_registration_raise(
    pool: asyncpg.Pool, channel: str
) -> None:
    inbox = Inbox()
    sub = Subscriber(pool)
    sub.handle(channel, inbox)
    async with subscribed(sub):
        with pytest.raises(pgqueue.AlreadyStartedError):
            await sub.run()
        with pytest.raises(pgqueue.AlreadyStartedError):
            sub.handle(channel, Inbox())
        with pytest.raises(pgqueue.AlreadyStartedError):
            sub.handler("another")(Inbox())
        await publish(pool, channel, "still delivering")
        await inbox.wait_for("still delivering")
    with pytest.raises(pgqueue.AlreadyStartedError):
        await sub.run()
    assert sub.channels == [channel]


async def test_stop_ends_run_and_is_safe_before_run_and_twice(
    pool: asyncpg.Pool, channel: str
) -> None:
    early = Subscriber(pool)
    early.handle(channel, Inbox())
    early.stop()
    early.stop()
    with anyio.fail_after(5):
        await early.run()  # returns at once
    assert early.listener_pid is None

    sub = Subscriber(pool)
    sub.handle(channel, Inbox())
    returned = anyio.Event()

    async def run() -> None:
        await sub.run()
        returned.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await sub.wait_listening()
            sub.stop()
            sub.stop()
            await returned.wait()
    assert sub.listener_pid is None
    assert sub.pending == 0


async def test_a_callback_may_stop_its_subscriber(
    pool: asyncpg.Pool, channel: str
) -> None:
    sub = Subscriber(pool)

    @sub.handler(channel)
    async def stop(_payload: str) -> None:
        sub.stop()
        await anyio.sleep_forever()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(sub.run)
            await sub.wait_listening()
            await publish(pool, channel, "stop")


async def test_cancellation_is_prompt_during_a_callback(
    pool: asyncpg.Pool, channel: str
) -> None:
    started = anyio.Event()
    sub = Subscriber(pool)

    @sub.handler(channel)
    async def hang(_payload: str) -> None:
        started.set()
        await anyio.sleep_forever()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(sub.run)
            await sub.wait_listening()
            await publish(pool, channel, "hang")
            await started.wait()
            tg.cancel_scope.cancel()
    assert sub.listener_pid is None


async def test_run_retries_an_unreachable_server_until_stopped_or_cancelled(
    channel: str,
) -> None:
    for how in ("stop", "cancel"):
        logger = RecordingLogger()
        sub = Subscriber("postgresql://postgres@127.0.0.1:1/test", logger=logger)
        sub.handle(channel, Inbox())
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(sub.run)
                extra = await logger.wait_for("LISTEN connection failed; retrying")
                assert extra["channels"] == [channel]
                if how == "stop":
                    sub.stop()
                else:
                    tg.cancel_scope.cancel()
        assert sub.listener_pid is None


async def test_run_keeps_retrying_the_first_connection_until_it_succeeds(
    dsn: str, pool: asyncpg.Pool, channel: str
) -> None:
    # The subscriber's role does not exist yet: its connections are refused.
    role = f"pgqueue_pubsub_{uuid.uuid4().hex[:8]}"
    logger = RecordingLogger()
    inbox = Inbox()
    resynced = anyio.Event()

    async def on_reconnect() -> None:
        resynced.set()

    sub = Subscriber(
        _with_user(dsn, role, "pw"), logger=logger, on_reconnect=on_reconnect
    )
    sub.handle(channel, inbox)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sub.run)
            await logger.wait_for("LISTEN connection failed; retrying")
            await pool.execute(f"CREATE ROLE \"{role}\" LOGIN PASSWORD 'pw'")
            with anyio.fail_after(10):
                await sub.wait_listening()
                # The first connection came late: the app may have missed some.
                await resynced.wait()
            await publish(pool, channel, "finally")
            await inbox.wait_for("finally")
            sub.stop()
    finally:
        await pool.execute(f'DROP ROLE IF EXISTS "{role}"')


async def test_start_returns_once_the_subscriber_listens(
    pool: asyncpg.Pool, channel: str
) -> None:
    inbox = Inbox()
    sub = Subscriber(pool)
    sub.handle(channel, inbox)
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(10):
            await tg.start(sub.run)
        assert sub.listener_pid is not None
        # No wait_listening(): a notification published now is delivered.
        await publish(pool, channel, "right away")
        await inbox.wait_for("right away")
        sub.stop()


async def test_start_of_a_subscriber_stopped_before_it_listens_returns(
    channel: str,
) -> None:
    sub = Subscriber("postgresql://postgres@127.0.0.1:1/none")
    sub.handle(channel, Inbox())
    sub.stop()
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(sub.run)
