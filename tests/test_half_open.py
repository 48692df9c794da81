"""A half-open LISTEN connection is found by its keepalive probe and replaced.

The LISTEN connection runs through `tests.tcp_proxy`; ``freeze()`` makes it
half-open: both sockets stay open and the server still lists the backend as
LISTENing, but nothing more gets through. Only the listener's probe (a
``SELECT 1`` every ``keepalive`` seconds that must answer within
``probe_timeout``) can find it. The bound these tests hold the listener to:

- the dead connection is given up within ``keepalive + probe_timeout``
  seconds of going silent, by the probe timing out;
- LISTEN is back, on a new connection, within that plus the reconnect
  delay: at most 0.1 s after a first failure (``0.05 * 2**failures`` with
  jitter, capped at ``max_delay``) and one connect.

Notifications sent into the dead connection are lost (pub/sub is
fire-and-forget); the worker makes up for them with a claim right after it
LISTENs again, so a job enqueued during the outage still runs at once.

The worker and the subscriber keep ``keepalive`` and ``probe_timeout``
(15 s and 5 s) in the private knobs ``_listener_keepalive`` and
``_listener_probe_timeout``; the tests shorten them before ``run()``.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel

import pgqueue
from pgqueue._pubsub import Subscriber, publish
from pgqueue._wire.listener import Listener
from pgqueue._wire.opening import connect_like
from tests.helpers import RecordingLogger, running, wait_until
from tests.tcp_proxy import TcpProxy, proxy_to, via

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    import asyncpg

KEEPALIVE = 0.5
PROBE_TIMEOUT = 0.5
# The longest first reconnect delay: 0.05 * 2**1, times jitter of at most 1.
FIRST_RECONNECT_DELAY = 0.1
# What a loaded two-core machine may add to timers and to one connect.
SLACK = 1.0
DETECTION_BOUND = KEEPALIVE + PROBE_TIMEOUT
RECONNECT_BOUND = DETECTION_BOUND + FIRST_RECONNECT_DELAY

KEEPALIVE_KNOB = "_listener_keepalive"
PROBE_TIMEOUT_KNOB = "_listener_probe_timeout"


def shorten_probe(owner: Any) -> None:
    """Make ``owner``'s listener probe every KEEPALIVE s with PROBE_TIMEOUT (before ``run()``)."""
    assert hasattr(owner, KEEPALIVE_KNOB)
    assert hasattr(owner, PROBE_TIMEOUT_KNOB)
    setattr(owner, KEEPALIVE_KNOB, KEEPALIVE)
    setattr(owner, PROBE_TIMEOUT_KNOB, PROBE_TIMEOUT)


async def backend_alive(pool: asyncpg.Pool, pid: int) -> bool:
    alive: bool = await pool.fetchval(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", pid
    )
    return alive


async def expect_half_open_recovery(
    logger: RecordingLogger,
    pool: asyncpg.Pool,
    proxy: TcpProxy,
    pid: Callable[[], int | None],
    during: Callable[[], Awaitable[object]] | None = None,
) -> None:
    """Freeze the proxy, await ``during``, and hold the listener to the bound."""
    old_pid = pid()
    assert old_pid is not None
    accepted = proxy.accepted
    proxy.freeze()
    frozen_at = anyio.current_time()
    if during is not None:
        await during()
    lost = await logger.wait_for(
        "LISTEN connection lost", within=DETECTION_BOUND + SLACK + 5
    )
    detected = anyio.current_time() - frozen_at
    assert lost["error"] == "TimeoutError()"  # the probe found it, nothing else
    # Half-open, not closed: the server still has the old backend LISTENing.
    assert await backend_alive(pool, old_pid)
    await logger.wait_for("LISTEN connection re-established", within=SLACK + 5)
    back = anyio.current_time() - frozen_at
    await wait_until(lambda: _is_new(pid(), old_pid), within=5)
    assert proxy.accepted > accepted  # the new connection came through the proxy
    assert detected <= DETECTION_BOUND + SLACK, detected
    assert back <= RECONNECT_BOUND + SLACK, back


async def _is_new(current: int | None, old: int) -> bool:
    return current is not None and current != old


class Inbox:
    """Payloads in arrival order; tests wait for one with a deadline."""

    def __init__(self) -> None:
        self.payloads: list[str] = []
        self._arrived = anyio.Event()

    def put(self, payload: str) -> None:
        self.payloads.append(payload)
        self._arrived.set()

    async def wait_for(self, payload: str, within: float = 5.0) -> None:
        with anyio.fail_after(within):
            while payload not in self.payloads:
                self._arrived = anyio.Event()
                await self._arrived.wait()


async def test_listener_replaces_a_half_open_connection(
    pool: asyncpg.Pool, dsn: str
) -> None:
    channel = f"half_open_{uuid.uuid4().hex[:12]}"
    logger = RecordingLogger()
    inbox = Inbox()
    reconnects: list[bool] = []

    async def on_connect(reconnected: bool) -> None:
        reconnects.append(reconnected)

    async with proxy_to(dsn) as proxy, anyio.create_task_group() as tg:
        listener = Listener(
            connect_like(via(dsn, proxy.port)),
            [channel],
            lambda _channel, payload: inbox.put(payload),
            logger=logger,
            on_connect=on_connect,
            keepalive=KEEPALIVE,
            probe_timeout=PROBE_TIMEOUT,
        )
        with anyio.fail_after(5):
            await tg.start(listener.run)
        await pool.execute("SELECT pg_notify($1, $2)", channel, "before")
        await inbox.wait_for("before")

        await expect_half_open_recovery(
            logger,
            pool,
            proxy,
            lambda: listener.pid,
            during=lambda: pool.execute("SELECT pg_notify($1, $2)", channel, "lost"),
        )
        assert reconnects == [False, True]
        await pool.execute("SELECT pg_notify($1, $2)", channel, "after")
        await inbox.wait_for("after")
        tg.cancel_scope.cancel()
    assert inbox.payloads == ["before", "after"]


async def test_worker_replaces_a_half_open_listen_connection(
    pool: asyncpg.Pool, queue: pgqueue.Queue, dsn: str
) -> None:
    logger = RecordingLogger()
    inbox = Inbox()
    after_reconnect: dict[str, bool] = {}

    async with proxy_to(dsn) as proxy:
        # poll_interval=60: within these deadlines only a wakeup runs a job.
        worker = pgqueue.Worker(
            pool,
            queue=queue.name,
            poll_interval=60,
            listen=via(dsn, proxy.port),
            logger=logger,
        )

        @worker.handler("t")
        async def handle(job: pgqueue.Job) -> None:
            after_reconnect[job.payload] = any(
                "re-established" in m for m in logger.messages()
            )
            inbox.put(job.payload)

        shorten_probe(worker)
        async with running(worker):
            await wait_until(lambda: _is_listening(worker))
            await queue.enqueue("t", "a")
            await inbox.wait_for("a")

            # b's NOTIFY goes into the dead connection; the claim the worker
            # makes when it LISTENs again runs it.
            await expect_half_open_recovery(
                logger,
                pool,
                proxy,
                lambda: worker.listener_pid,
                during=lambda: queue.enqueue("t", "b"),
            )
            await inbox.wait_for("b")

            # Wakeups flow through the new connection.
            await queue.enqueue("t", "c")
            await inbox.wait_for("c")
    assert after_reconnect == {"a": False, "b": True, "c": True}


async def _is_listening(owner: Any) -> bool:
    return owner.listener_pid is not None


async def test_subscriber_replaces_a_half_open_connection(
    pool: asyncpg.Pool, dsn: str
) -> None:
    channel = f"half_open_{uuid.uuid4().hex[:12]}"
    logger = RecordingLogger()
    inbox = Inbox()
    resynced = anyio.Event()

    async def on_reconnect() -> None:
        resynced.set()

    async def on_message(payload: str) -> None:
        inbox.put(payload)

    async with proxy_to(dsn) as proxy:
        sub = Subscriber(via(dsn, proxy.port), logger=logger, on_reconnect=on_reconnect)
        sub.handle(channel, on_message)
        shorten_probe(sub)
        async with anyio.create_task_group() as tg:
            tg.start_soon(sub.run)
            with anyio.fail_after(5):
                await sub.wait_listening()
            await publish(pool, channel, "before")
            await inbox.wait_for("before")

            await expect_half_open_recovery(
                logger,
                pool,
                proxy,
                lambda: sub.listener_pid,
                during=lambda: publish(pool, channel, "lost"),
            )
            with anyio.fail_after(5):
                await resynced.wait()
            await publish(pool, channel, "after")
            await inbox.wait_for("after")
            sub.stop()
    # Published into the dead connection: lost, as fire-and-forget allows.
    assert inbox.payloads == ["before", "after"]
