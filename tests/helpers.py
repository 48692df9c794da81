"""Shared test helpers: listening for notifications and reading rows."""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable
    from datetime import datetime

    import pgqueue


class Collected:
    """Payloads in arrival order, with a way to wait for one of them."""

    def __init__(self) -> None:
        self.payloads: list[str] = []
        self._arrived = anyio.Event()

    def add(self, payload: str) -> None:
        self.payloads.append(payload)
        self._arrived.set()

    async def wait_for(self, payload: str, within: float = 5.0) -> list[str]:
        """Wait until ``payload`` arrives; return everything that arrived before it."""
        with anyio.fail_after(within):
            while payload not in self.payloads:
                self._arrived = anyio.Event()
                await self._arrived.wait()
        return self.payloads[: self.payloads.index(payload)]


class Notifications(Collected):
    """An asyncpg listener callback that collects NOTIFY payloads on one channel."""

    def __call__(
        self, _conn: object, _pid: int, _channel: str, payload: object
    ) -> None:
        self.add(str(payload))


@contextlib.asynccontextmanager
async def listening(dsn: str, channel: str) -> AsyncIterator[Notifications]:
    """LISTEN on ``channel`` over a connection of its own."""
    notifications = Notifications()
    connection = await asyncpg.connect(dsn)
    try:
        await connection.add_listener(channel, notifications)
        yield notifications
    finally:
        await connection.close()


async def rows(pool: asyncpg.Pool, queue: str) -> list[dict[str, Any]]:
    """Every row of ``queue``, by id."""
    records = await pool.fetch(
        "SELECT * FROM pgqueue_jobs WHERE queue = $1 ORDER BY id", queue
    )
    return [dict(r) for r in records]


async def row(pool: asyncpg.Pool, job_id: int) -> dict[str, Any]:
    """One job's row."""
    record = await pool.fetchrow("SELECT * FROM pgqueue_jobs WHERE id = $1", job_id)
    assert record is not None, f"job {job_id} has no row"
    return dict(record)


async def queue_count(pool: asyncpg.Pool, queue: str) -> int:
    """Rows of ``queue`` (each test has queues of its own; the table is shared)."""
    count: int = await pool.fetchval(
        "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1", queue
    )
    return count


@contextlib.asynccontextmanager
async def running(
    worker: pgqueue.Worker, *, stop_within: float = 10
) -> AsyncIterator[pgqueue.Worker]:
    """Run ``worker`` inside the test body; stop it (draining) on the way out.

    Returns once the worker is ready (schema checked, LISTEN up).
    pytest-asyncio runs fixture setup and teardown in different tasks, so a
    task group cannot span a fixture's yield: workers run through this.
    The drain must end within ``stop_within`` seconds.
    """
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(10):
            await tg.start(worker.run)
        try:
            yield worker
        finally:
            with anyio.fail_after(stop_within):
                await worker.stop()


async def wait_for_row(
    pool: asyncpg.Pool, job_id: int, within: float = 10.0, **expected: Any
) -> dict[str, Any]:
    """Poll the job's row until its columns equal ``expected``; fail after ``within`` seconds."""
    with anyio.fail_after(within):
        while True:
            current = await row(pool, job_id)
            if all(current[k] == v for k, v in expected.items()):
                return current
            await anyio.sleep(0.01)


async def wait_until(
    predicate: Callable[[], Awaitable[bool]], within: float = 10.0
) -> None:
    """Poll ``predicate`` until it is true; fail after ``within`` seconds."""
    with anyio.fail_after(within):
        while not await predicate():
            await anyio.sleep(0.01)


class RecordingLogger:
    """A logger that keeps every message (with its extra) and lets tests wait for one."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, dict[str, Any]]] = []
        self._arrived = anyio.Event()

    def _log(self, level: str, msg: str, *args: Any, **kwargs: Any) -> None:
        self.records.append((level, msg, dict(kwargs.get("extra") or {})))
        self._arrived.set()

    def debug(self, msg: str, /, *args: Any, **kwargs: Any) -> None:
        self._log("debug", msg, *args, **kwargs)

    def info(self, msg: str, /, *args: Any, **kwargs: Any) -> None:
        self._log("info", msg, *args, **kwargs)

    def warning(self, msg: str, /, *args: Any, **kwargs: Any) -> None:
        self._log("warning", msg, *args, **kwargs)

    def error(self, msg: str, /, *args: Any, **kwargs: Any) -> None:
        self._log("error", msg, *args, **kwargs)

    def messages(self, level: str | None = None) -> list[str]:
        return [m for lv, m, _ in self.records if level is None or lv == level]

    async def wait_for(self, fragment: str, within: float = 10.0) -> dict[str, Any]:
        """Wait for a message containing ``fragment``; return its extra fields."""
        with anyio.fail_after(within):
            while True:
                for _, msg, extra in self.records:
                    if fragment in msg:
                        return extra
                self._arrived = anyio.Event()
                await self._arrived.wait()

    async def wait_until_logged(
        self,
        predicate: Callable[[str, str, dict[str, Any]], bool],
        within: float = 10.0,
    ) -> None:
        """Wait for a record ``predicate(level, msg, extra)`` holds for."""
        with anyio.fail_after(within):
            while not any(predicate(*record) for record in self.records):
                self._arrived = anyio.Event()
                await self._arrived.wait()


def no_backoff(_attempt: int) -> float:
    """A worker's backoff that retries a failed job at once."""
    return 0.0


async def drain(worker: pgqueue.Worker, within: float = 15.0) -> None:
    """Run ``worker`` until its queues are empty; fail after ``within`` seconds."""
    with anyio.fail_after(within):
        await worker.run(until_empty=True)


async def noop(_job: pgqueue.Job) -> None:
    """A handler that completes its job."""


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    """Every node of a JSON plan tree, depth first."""
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(plan_nodes(child))
    return found


def plan_buffers(node: dict[str, Any]) -> int:
    """Shared buffers a plan node touched (hit + read), its children included."""
    return int(node["Shared Hit Blocks"]) + int(node["Shared Read Blocks"])


async def explain_analyze(
    connection: asyncpg.Connection, sql: str, *args: object
) -> dict[str, Any]:
    """EXPLAIN (ANALYZE, BUFFERS) ``sql`` in a transaction that is rolled back."""
    transaction = connection.transaction()
    await transaction.start()
    try:
        raw = await connection.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, *args
        )
    finally:
        await transaction.rollback()
    document: list[dict[str, Any]] = json.loads(raw)
    root: dict[str, Any] = document[0]["Plan"]
    return root


class TableClock:
    """A periodic scheduler's clock that tests move: the time is one row of a table.

    ``now()`` reads ``SELECT t FROM <table>`` on the scheduler's connection,
    so every scheduler of a test (and every process) sees the same time,
    moved in steps; sleeps are short. ``wait_pass()`` waits for the
    scheduler's next pass. One per scheduler: pass it to the worker's
    ``Schedules``.
    """

    def __init__(self, table: str, max_sleep: float = 0.02) -> None:
        self.query = f"SELECT t FROM {table}"
        self._max_sleep = max_sleep
        self._started = 0
        self._done = 0
        self._passed: anyio.Event | None = None

    async def now(self, connection: Any) -> datetime:
        self._started += 1  # a pass starts by reading the time
        row = await connection.fetchrow(self.query)
        assert row is not None
        now: datetime = row[0]
        return now

    async def sleep(self, seconds: float) -> None:
        self._done += 1  # and ends by sleeping, whether it failed or not
        if self._passed is not None:
            self._passed.set()
            self._passed = None
        await anyio.sleep(min(seconds, self._max_sleep))

    async def wait_pass(self) -> None:
        """Wait until a pass that starts after this call is done."""
        target = self._started + 1
        while self._done < target:
            if self._passed is None:
                self._passed = anyio.Event()
            await self._passed.wait()
