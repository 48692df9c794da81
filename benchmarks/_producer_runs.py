"""The measurements of benchmarks.producers: concurrent producers, floods, COPY, held transactions.

Each measurement runs in a fresh database. Producers run in a spawned
process (`benchmarks._common.run_child`), as floods do beside a measured
worker (`Flood`). pgqueuer is imported only where a pgqueuer side runs, so
pgqueue's children never load it.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import multiprocessing
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, nullcontext, suppress
from typing import TYPE_CHECKING, Any

import asyncpg

import pgqueue
from benchmarks._common import (
    ChildLink,
    bench_database,
    install_pgqueue,
    process_cpu,
    run,
    run_child,
)
from benchmarks._pgqueue_runs import FLOOD_TYPE, JOB_TYPE, QUEUE

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

Call = Callable[[int], Awaitable[object]]
"""One producer call: enqueue the job numbered ``i``."""

# The floor: the row alone, no NOTIFY (RETURNING id, as enqueue returns it).
INSERT = (
    "INSERT INTO pgqueue_jobs (queue, job_type, payload)"
    " VALUES ($1, $2, $3::text::jsonb) RETURNING id"
)
# The row and its NOTIFY in one statement, as pgqueue's enqueue sends them today.
INSERT_NOTIFY = (
    f"WITH job AS ({INSERT}) SELECT job.id FROM job, pg_notify('pgqueue_jobs', $1)"
)

VARIANTS = {
    "enqueue": "pgqueue `Queue.enqueue` (commits by itself; gathered while others are in flight)",
    "enqueue_alone": "pgqueue `Queue.enqueue`, never gathered (each call its own statement)",
    "autocommit": "pgqueue `enqueue(connection=c)`, `c` held by its producer, autocommit",
    "in_tx": "pgqueue `enqueue(connection=c)` in `c.transaction()`",
    "tx_wake": "pgqueue `enqueue(connection=c)` in `queue.transaction(c)`",
    "pgqueuer": "pgqueuer `Queries.enqueue`",
    "insert": "floor: `INSERT ... RETURNING id`, no NOTIFY",
    "insert_held": "floor: `INSERT ... RETURNING id` on a connection each producer holds",
    "insert_notify": "`INSERT` + `pg_notify` in one statement",
}
FLOOR = "insert"
HAS_TX_WAKE = hasattr(pgqueue.Queue, "transaction")
"""Does this tree's Queue have ``transaction(connection)`` (the after-commit wake-up)?"""


# --- one producer call per variant ---------------------------------------------


def _enqueue(pool: asyncpg.Pool[Any]) -> Call:
    queue = pgqueue.Queue(pool)
    return lambda i: queue.enqueue(JOB_TYPE, {"i": i})


class _NeverGathered:
    """Stands in for a pool's gatherer: each enqueue its own statement on a connection of the pool.

    What an enqueue on a pool did before issue 43: acquire, one statement
    (its NOTIFY in it when alone, else the waker's), release.
    """

    def __init__(self, pool: asyncpg.Pool[Any]) -> None:
        self.pool = pool

    async def submit(
        self,
        queue: str,
        item: object,
        alone: Callable[[object, Any], Awaitable[object]],
        together: object,
    ) -> object:
        async with self.pool.acquire() as connection:
            return await alone(item, connection)


def _enqueue_alone(pool: asyncpg.Pool[Any]) -> Call:
    if _GATHERS:
        # The producer's process is the benchmark's own: no enqueue of it gathers.
        importlib.import_module("pgqueue._queue").gatherer_for = _NeverGathered
    queue = pgqueue.Queue(pool)
    return lambda i: queue.enqueue(JOB_TYPE, {"i": i})


_GATHERS = importlib.util.find_spec("pgqueue._gather") is not None
"""Does this tree gather concurrent enqueues (issue 43)?"""


class _Held:
    """Calls on a connection each producer holds (producer ``k`` makes calls ``i`` with ``i % n == k``)."""

    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        run: Callable[[Any, int], Awaitable[object]],
    ) -> None:
        self._pool = pool
        self._run = run
        self._held: dict[int, Any] = {}

    async def __call__(self, i: int) -> None:
        k = i % self._pool.get_max_size()
        connection = self._held.get(k)
        if connection is None:
            connection = self._held[k] = await self._pool.acquire()
        await self._run(connection, i)

    async def aclose(self) -> None:
        for connection in self._held.values():
            await self._pool.release(connection)


def _autocommit(pool: asyncpg.Pool[Any]) -> Call:
    queue = pgqueue.Queue(pool)
    return _Held(pool, lambda c, i: queue.enqueue(JOB_TYPE, {"i": i}, connection=c))


def _insert_held(pool: asyncpg.Pool[Any]) -> Call:
    return _Held(
        pool, lambda c, i: c.fetchval(INSERT, QUEUE, JOB_TYPE, json.dumps({"i": i}))
    )


def _in_tx(pool: asyncpg.Pool[Any]) -> Call:
    queue = pgqueue.Queue(pool)

    async def call(i: int) -> None:
        async with pool.acquire() as c, c.transaction():
            await queue.enqueue(JOB_TYPE, {"i": i}, connection=c)

    return call


def _tx_wake(pool: asyncpg.Pool[Any]) -> Call:
    queue = pgqueue.Queue(pool)
    transaction = getattr(queue, "transaction", None)
    if transaction is None:
        msg = "this tree's pgqueue.Queue has no transaction()"
        raise RuntimeError(msg)

    async def call(i: int) -> None:
        async with pool.acquire() as c, transaction(c):
            await queue.enqueue(JOB_TYPE, {"i": i}, connection=c)

    return call


def _pgqueuer(pool: asyncpg.Pool[Any]) -> Call:
    from pgqueuer.db import AsyncpgPoolDriver
    from pgqueuer.queries import Queries

    queries = Queries(AsyncpgPoolDriver(pool))
    return lambda i: queries.enqueue(JOB_TYPE, json.dumps({"i": i}).encode())


def _statement(sql: str) -> Callable[[asyncpg.Pool[Any]], Call]:
    def make(pool: asyncpg.Pool[Any]) -> Call:
        return lambda i: pool.fetchval(sql, QUEUE, JOB_TYPE, json.dumps({"i": i}))

    return make


CALLS: dict[str, Callable[[asyncpg.Pool[Any]], Call]] = {
    "enqueue": _enqueue,
    "enqueue_alone": _enqueue_alone,
    "autocommit": _autocommit,
    "insert_held": _insert_held,
    "in_tx": _in_tx,
    "tx_wake": _tx_wake,
    "pgqueuer": _pgqueuer,
    "insert": _statement(INSERT),
    "insert_notify": _statement(INSERT_NOTIFY),
}


# --- concurrent producers --------------------------------------------------------


async def open_pool(dsn: str, size: int, patience: float = 60) -> asyncpg.Pool[Any]:
    """A pool of ``size`` connections, waiting for room on a server shared with others."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return await asyncpg.create_pool(dsn, min_size=size, max_size=size)
        except asyncpg.TooManyConnectionsError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1)


async def hammer(
    call: Call, producers: int, seconds: float, warmup: float
) -> dict[str, float]:
    """``producers`` tasks call ``call`` back to back; the rate over ``seconds`` after ``warmup``."""
    done = 0
    stop = asyncio.Event()

    async def producer(first: int) -> None:
        nonlocal done
        i = first
        while not stop.is_set():
            await call(i)
            done += 1
            i += producers

    async with asyncio.TaskGroup() as group:
        for k in range(producers):
            group.create_task(producer(k))
        await asyncio.sleep(warmup)
        n0, t0 = done, time.perf_counter()
        await asyncio.sleep(seconds)
        n1, t1 = done, time.perf_counter()
        stop.set()
    return {"jobs_per_s": (n1 - n0) / (t1 - t0), "enqueued": done}


def producers_child(
    connection: Connection,
    dsn: str,
    variant: str,
    producers: int,
    seconds: float,
    warmup: float,
) -> None:
    """Producer process: a pool of ``producers`` connections, one task per connection."""
    asyncio.run(
        _producers(ChildLink(connection), dsn, variant, producers, seconds, warmup)
    )


async def _producers(
    link: ChildLink,
    dsn: str,
    variant: str,
    producers: int,
    seconds: float,
    warmup: float,
) -> None:
    async with await open_pool(dsn, producers) as pool:
        call = CALLS[variant](pool)
        await link.ready()
        cpu0 = process_cpu()
        result = await hammer(call, producers, seconds, warmup)
        if isinstance(call, _Held):
            await call.aclose()
        await link.done({**result, "producer_cpu_s": process_cpu() - cpu0})


def produce(
    dsn: str, variant: str, producers: int, seconds: float, warmup: float
) -> dict[str, Any]:
    """One verified run of ``variant`` from ``producers`` concurrent producers.

    The result's ``waits``: where the database's backends were during the
    measured window (`wait_events`).
    """
    from benchmarks import _pgqueuer_runs as pgqr

    name = f"prod_{variant}_{producers}"
    theirs = variant == "pgqueuer"
    setup = pgqr.install if theirs else install_pgqueue
    waits: dict[str, float] = {}

    def sample(db: str) -> None:
        time.sleep(warmup)
        waits.update(run(wait_events(db, seconds)))

    with bench_database(dsn, name, setup) as db:
        result = run_child(
            producers_child,
            db,
            variant,
            producers,
            seconds,
            warmup,
            database=f"pgq_bench_{name}",
            while_running=lambda: sample(db),
        )
        table = "pgqueuer" if theirs else "pgqueue_jobs"
        expect_rows(db, table, int(result["enqueued"]), variant)
    return {**result, "waits": waits}


async def wait_events(
    dsn: str, seconds: float, every: float = 0.05
) -> dict[str, float]:
    """How many of the database's other backends were in each state, on average.

    Keys: ``idle`` (waiting for their client), ``CPU`` (active, no wait
    event) or ``<wait_event_type>:<wait_event>`` (``Lock:object`` is the
    lock NOTIFY takes at commit).
    """
    connection = await asyncpg.connect(dsn)
    seen: dict[str, int] = {}
    samples = 0
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            rows = await connection.fetch(
                "SELECT state, wait_event_type, wait_event FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'"
            )
            for state, kind, event in rows:
                key = (
                    "idle" if state == "idle" else f"{kind}:{event}" if kind else "CPU"
                )
                seen[key] = seen.get(key, 0) + 1
            samples += 1
            await asyncio.sleep(every)
    finally:
        await connection.close()
    return {k: n / max(samples, 1) for k, n in seen.items()}


async def count_rows(dsn: str, table: str) -> int:
    """``count(*)`` of ``table``."""
    connection = await asyncpg.connect(dsn)
    try:
        count: int = await connection.fetchval(f"SELECT count(*) FROM {table}")
    finally:
        await connection.close()
    return count


def expect_rows(dsn: str, table: str, n: int, who: str) -> None:
    """Fail unless ``table`` holds ``n`` rows."""
    if (got := run(count_rows(dsn, table))) != n:
        msg = f"{who}: {got} rows in {table}, expected {n}"
        raise AssertionError(msg)


# --- a flood beside a measured worker ---------------------------------------------


def _flood_call(
    lib: str, pool: asyncpg.Pool[Any], queue: str, chunk: int
) -> Callable[[int], Awaitable[int]]:
    """Enqueue one job (``chunk == 1``) or a chunk into ``queue``; how many."""
    if lib == "pgqueue":
        into = pgqueue.Queue(pool, queue)

        async def ours(i: int) -> int:
            if chunk == 1:
                await into.enqueue(FLOOD_TYPE, {"i": i})
            else:
                await into.enqueue_many((FLOOD_TYPE, {"i": j}) for j in range(chunk))
            return chunk

        return ours
    from pgqueuer.db import AsyncpgPoolDriver
    from pgqueuer.queries import Queries

    queries = Queries(AsyncpgPoolDriver(pool))

    async def theirs(i: int) -> int:
        if chunk == 1:
            await queries.enqueue(queue, json.dumps({"i": i}).encode())
        else:
            payloads: list[bytes | None] = [
                json.dumps({"i": j}).encode() for j in range(chunk)
            ]
            await queries.enqueue([queue] * chunk, payloads, [0] * chunk)
        return chunk

    return theirs


def flood_child(
    connection: Connection,
    dsn: str,
    lib: str,
    queue: str,
    producers: int,
    chunk: int,
    rate: float,
) -> None:
    """Flood process: ``producers`` tasks enqueue into ``queue`` until told to stop.

    ``rate``: at most that many jobs a second in all (0: as fast as they can).
    """
    asyncio.run(_flood(connection, dsn, lib, queue, producers, chunk, rate))


async def _flood(
    connection: Connection,
    dsn: str,
    lib: str,
    queue: str,
    producers: int,
    chunk: int,
    rate: float,
) -> None:
    async with await open_pool(dsn, producers) as pool:
        call = _flood_call(lib, pool, queue, chunk)
        connection.send(("ready", None))
        enqueued = 0
        stop = asyncio.Event()
        # Each producer's seconds per call at the capped rate.
        interval = producers * chunk / rate if rate > 0 else 0.0

        async def producer(first: int) -> None:
            nonlocal enqueued
            i = first
            due = time.monotonic()
            while not stop.is_set():
                # Not `enqueued += await ...`: that reads the total before the await.
                n = await call(i)
                enqueued += n
                i += producers
                if interval:
                    # Late calls are not made up for in a burst.
                    due = max(due + interval, time.monotonic() - interval)
                    with suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), due - time.monotonic())

        start = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for k in range(producers):
                group.create_task(producer(k))
            await asyncio.to_thread(connection.recv)
            stop.set()
        seconds = time.perf_counter() - start
    connection.send(("done", {"enqueued": enqueued, "seconds": seconds}))


class Flood:
    """A context (given a DSN) that floods a queue from a process of its own meanwhile."""

    def __init__(
        self, lib: str, queue: str, producers: int, chunk: int, rate: float = 0
    ) -> None:
        self.args = (lib, queue, producers, chunk, rate)
        self.jobs_per_s = 0.0
        """The flood's rate, once the context is left."""

    @contextmanager
    def __call__(self, dsn: str) -> Iterator[None]:
        """Start the flood, wait until its pool is up; stop it on the way out."""
        context = multiprocessing.get_context("spawn")
        parent, child = context.Pipe()
        process = context.Process(
            target=flood_child, args=(child, dsn, *self.args), daemon=True
        )
        process.start()
        try:
            _receive(parent, process, "ready")
            yield
            parent.send("stop")
            result = _receive(parent, process, "done")
            self.jobs_per_s = result["enqueued"] / result["seconds"]
            process.join(30)
        finally:
            if process.is_alive():
                process.kill()
                process.join()


def _receive(parent: Connection, process: Any, kind: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while not parent.poll(0.2):
        if not process.is_alive() or time.monotonic() > deadline:
            msg = f"flood process sent no {kind!r} (exit code {process.exitcode})"
            raise RuntimeError(msg)
    got, value = parent.recv()
    if got != kind:
        msg = f"expected {kind!r} from the flood process, got {got!r}"
        raise RuntimeError(msg)
    return value


# --- bulk: the COPY floor ------------------------------------------------------------


async def _copy(dsn: str, n: int, chunk: int) -> float:
    connection = await asyncpg.connect(dsn)
    try:
        chunks = [
            [{"i": i} for i in range(s, min(s + chunk, n))] for s in range(0, n, chunk)
        ]
        start = time.perf_counter()
        for payloads in chunks:
            # Encoding the payloads is part of the call, as it is for enqueue_many.
            await connection.copy_records_to_table(
                "pgqueue_jobs",
                records=[(QUEUE, JOB_TYPE, json.dumps(p)) for p in payloads],
                columns=["queue", "job_type", "payload"],
            )
        return time.perf_counter() - start
    finally:
        await connection.close()


def copy_floor(dsn: str, n: int, chunk: int, name: str = "prod_copy") -> float:
    """Jobs per second written by ``COPY`` in calls of ``chunk`` rows (no NOTIFY)."""
    with bench_database(dsn, name) as db:
        seconds = run(_copy(db, n, chunk))
        expect_rows(db, "pgqueue_jobs", n, "COPY floor")
    return n / seconds


# --- a transaction held open ------------------------------------------------------------


class Horizon:
    """A context (given a DSN) that holds a transaction open (or not) and counts dead tuples.

    With ``hold``, a connection to the database runs ``BEGIN; SELECT
    txid_current()`` and stays idle in that transaction until the context is
    left, so no row version deleted meanwhile can be removed. When the body
    is done (still holding), ``dead`` is the database's ``n_dead_tup``, then
    ``VACUUM`` runs and ``unremovable`` is what it had to leave.
    """

    def __init__(self, hold: bool) -> None:
        self.hold = hold
        self.dead = 0
        self.unremovable = 0

    @contextmanager
    def __call__(self, dsn: str) -> Iterator[None]:
        """Hold the transaction (if asked) while the body runs."""
        with _idle_in_transaction(dsn) if self.hold else nullcontext():
            yield
            # The worker's backends report their counts as they exit.
            time.sleep(0.5)
            self.dead, self.unremovable = run(_dead_tuples(dsn))


async def _dead_tuples(dsn: str) -> tuple[int, int]:
    """The database's dead tuples before and after a ``VACUUM``."""
    count = "SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables"
    connection = await asyncpg.connect(dsn)
    try:
        before = await connection.fetchval(count)
        await connection.execute("VACUUM")
        after = await connection.fetchval(count)
    finally:
        await connection.close()
    return int(before), int(after)


@contextmanager
def _idle_in_transaction(dsn: str) -> Iterator[None]:
    """A thread holds ``BEGIN; SELECT txid_current()`` on its own connection meanwhile."""
    began = threading.Event()
    release = threading.Event()
    failed: list[BaseException] = []

    async def hold() -> None:
        connection = await asyncpg.connect(dsn)
        try:
            transaction = connection.transaction()
            await transaction.start()
            await connection.fetchval("SELECT txid_current()")
            began.set()
            await asyncio.to_thread(release.wait)
            await transaction.rollback()
        finally:
            await connection.close()

    def main() -> None:
        try:
            asyncio.run(hold())
        except BaseException as exc:
            failed.append(exc)
            began.set()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    began.wait(30)
    try:
        if failed or not began.is_set():
            msg = "could not open the idle transaction"
            raise RuntimeError(msg) from (failed[0] if failed else None)
        yield
    finally:
        release.set()
        thread.join(30)
