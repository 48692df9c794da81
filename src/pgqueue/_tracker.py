"""Awaited outcomes: `Tracker` waits for jobs to end and returns what they left.

A job enqueued with ``track=True`` announces its end: the write that makes
it completed, dead or cancelled also runs ``pg_notify('pgqueue_outcomes',
<id>)``, in the same transaction. A tracker LISTENs on that channel over one
connection of its own and reads the rows it is told about. Task tree of an
open tracker::

    async with tracker:        host task: its task group spans the body
    ├── listener               LISTEN pgqueue_outcomes; marks notified ids
    ├── reader                 reads every marked row in one statement and
    │                          settles the waits of rows that have ended
    └── poller                 while waits are pending, marks them all every
                               poll_interval

No outcome is missed, because a waited row is read again after every event
that may have ended it, and only a row read with a final status settles a
wait (a notification alone never does):

- a wait is registered before its row is first read, so an outcome written
  before the wait, or during its first read, is seen (the second through the
  notification that follows the commit);
- every LISTEN, and so every reconnect, marks every waited row: outcomes
  notified while the connection was down are read then;
- the poll reads outcomes that send no notification (a Go worker, a job not
  tracked, a manual ``UPDATE``) within about ``poll_interval``.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Self

import anyio

from pgqueue._core.checks import check_dsn_or_pool, check_duration, check_job_id
from pgqueue._core.dsn import target_of
from pgqueue._core.errors import (
    AlreadyStartedError,
    JobNotFoundError,
    SchemaError,
    TrackerClosedError,
)
from pgqueue._core.lifecycle import Status
from pgqueue._core.log import Logger, default_logger
from pgqueue._core.retry import Failures
from pgqueue._core.taskgroup import BlockTaskGroup
from pgqueue._sql.channels import OUTCOMES_CHANNEL
from pgqueue._sql.durable import JOB_STATE, PROGRESS_CHANNEL
from pgqueue._sql.literals import array
from pgqueue._sql.outcomes import OUTCOMES
from pgqueue._store.schema import SCHEMA_ERRORS
from pgqueue._wire.connections import (
    Connections,
    check_connections,
    private_connections,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable
    from types import TracebackType

    import asyncpg

    from pgqueue._wire.dedicated import DedicatedConnection
    from pgqueue._wire.listener import ListenerRoute

__all__ = ["JobOutcome", "JobProgress", "Tracker"]

POLL_INTERVAL = 1.0
"""Seconds between two reads of every waited row, for outcomes sent without a notification."""

STATEMENT_TIMEOUT = 10.0
"""Seconds a read may take (a pool acquire, or connecting, included) before it is retried."""

_ENDED = frozenset({Status.COMPLETED, Status.DEAD, Status.CANCELLED})


@dataclass(frozen=True, slots=True, kw_only=True)
class JobOutcome:
    """How a job ended, as `Tracker.wait` returns it.

    ``status`` is completed, dead or cancelled. ``result`` is the handler's
    return value as decoded from JSON (``None`` when there is none).
    ``last_error`` is the last failure recorded: set for a dead job, and
    possibly for one that completed after failed attempts. ``attempts``
    counts the attempts made.
    """

    id: int
    status: Status
    result: Any = None
    last_error: str | None = None
    attempts: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class JobProgress:
    """How far a durable handler's run has come, as `Tracker.progress` yields it.

    ``fraction`` is from 0 to 1; ``message`` what the handler said, if
    anything (`pgqueue.Job.progress`).

    .. versionadded:: 0.1
    """

    id: int
    fraction: float
    message: str | None = None


class _Wait:
    """What every wait for one job id shares: one read, one outcome."""

    __slots__ = ("done", "error", "outcome", "waiters")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.outcome: JobOutcome | None = None
        # Makes the exception each waiter raises (one instance per waiter).
        self.error: Callable[[], BaseException] | None = None
        self.waiters = 0


class Tracker:
    """Wait for jobs to end, and get their outcome: status, result, last error.

    Use it as an async context manager: entering opens a LISTEN connection of
    its own on ``pgqueue_outcomes`` and returns once it listens (retrying,
    with backoff, for as long as connecting fails: bound it with a deadline
    such as ``anyio.fail_after``). Any number of concurrent `wait` calls share
    that one connection, and waits for the same job share each read. Rows are
    read through the pool given; given a DSN, through one more connection of
    the tracker's own, opened on first use and reopened after a loss.

    Jobs enqueued with ``track=True`` are settled as soon as their end is
    notified. Every waited row is also read every ``poll_interval`` seconds
    while waits are pending, and after every reconnect, so jobs that send no
    notification (ended by a Go worker, or not tracked) and notifications
    sent while the connection was down are not missed, only seen later.

    Leaving the context closes the tracker's connections (a pool is borrowed,
    never closed); waits still pending in other tasks raise
    `TrackerClosedError`. An exception raised in the block (``wait``'s
    ``TimeoutError`` included) leaves it as itself; only when one of the
    tracker's background tasks failed too (a ``logger`` that raises, say)
    does an ``ExceptionGroup`` leave, holding theirs and the block's.

    Constructing a tracker does no I/O.

    Args:
        dsn_or_pool: an asyncpg pool (its connect arguments and ``init`` hook
            are reused for the LISTEN connection), or a DSN.
        poll_interval: seconds between reads of the rows still waited for.
        logger: where to log; the ``pgqueue`` logger by default.
        connections: a `Connections` shared with the process's workers and
            subscribers: the tracker then LISTENs on its one LISTEN
            connection instead of a connection of its own.

    Usage::

        async with pgqueue.Tracker(pool) as tracker:
            job_id = await queue.enqueue("render", {"page": 1}, track=True)
            outcome = await tracker.wait(job_id, timeout=5)
    """

    def __init__(
        self,
        dsn_or_pool: str | asyncpg.Pool[Any],
        *,
        poll_interval: float = POLL_INTERVAL,
        logger: Logger | None = None,
        connections: Connections | None = None,
    ) -> None:
        check_dsn_or_pool(dsn_or_pool)
        check_connections(connections)
        self._target = dsn_or_pool
        self._shared = connections
        self._poll_interval = check_duration(
            "poll_interval", poll_interval, positive=True
        )
        self._logger = default_logger(logger)
        self._state: Literal["new", "open", "closed"] = "new"
        self._waits: dict[int, _Wait] = {}
        self._marked: set[int] = set()
        self._followers: dict[int, set[Callable[[JobProgress | None], None]]] = {}
        self._listener: ListenerRoute | None = None
        self._connection: DedicatedConnection | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        # Made on entry: anyio primitives need an event loop.
        self._read_needed: anyio.Event
        self._has_waits: anyio.Event

    @property
    def listener_pid(self) -> int | None:
        """The backend pid of the LISTEN connection while it is up."""
        return None if self._listener is None else self._listener.pid

    @property
    def waiting(self) -> int:
        """How many job ids pending waits are for."""
        return len(self._waits)

    async def __aenter__(self) -> Self:
        if self._state != "new":
            msg = "this tracker has already been entered; create a new Tracker"
            raise AlreadyStartedError(msg)
        self._state = "closed"  # unless everything below succeeds
        self._read_needed = anyio.Event()
        self._has_waits = anyio.Event()
        async with contextlib.AsyncExitStack() as stack:
            connections = self._shared
            if connections is None:  # one of its own, closed with the tracker
                connections = await stack.enter_async_context(
                    private_connections(
                        self._target,
                        logger=self._logger,
                        statement_timeout=STATEMENT_TIMEOUT,
                    )
                )
            self._listener = connections.route(
                [OUTCOMES_CHANNEL, PROGRESS_CHANNEL],
                self._on_notify,
                on_connect=self._on_connect,
            )
            if isinstance(self._target, str):  # else it reads from the pool
                self._connection = connections.upkeep
            tg = await stack.enter_async_context(BlockTaskGroup())
            stack.callback(tg.cancel_scope.cancel)
            await tg.start(self._listener.run)
            tg.start_soon(self._read)
            tg.start_soon(self._poll)
            self._stack = stack.pop_all()
        self._state = "open"
        self._logger.info("tracker started", extra={"channel": OUTCOMES_CHANNEL})
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._state = "closed"
        pending = len(self._waits)
        for entry in self._waits.values():
            entry.error = _closed
            entry.done.set()
        self._waits.clear()
        self._marked.clear()
        stack, self._stack = self._stack, None
        try:
            if stack is None:
                return False
            return bool(await stack.__aexit__(exc_type, exc, tb))
        finally:
            self._logger.info(
                "tracker stopped",
                extra={"channel": OUTCOMES_CHANNEL, "pending_waits": pending},
            )

    async def wait(
        self,
        job_id: int,
        timeout: float | None = None,  # noqa: ASYNC109 - the wait's own bound
    ) -> JobOutcome:
        """Wait until the job is completed, dead or cancelled; return its outcome.

        Returns after one read for a job that has already ended. The job must
        be committed before the call. ``timeout`` bounds the whole call, its
        first read included; the job itself goes on either way. Cancelling a
        wait is safe, and leaves other waits for the same job waiting.

        Args:
            job_id: the id `Queue.enqueue` returned.
            timeout: seconds to wait at most; ``None`` waits for as long as
                the job takes.

        Raises:
            TimeoutError: the job did not end within ``timeout`` seconds.
            JobNotFoundError: no row has this id (a ``LookupError``).
            TrackerClosedError: the tracker is not open, or closed while
                this call waited.
            SchemaError: ``pgqueue_jobs`` lacks the table or a column.
            TypeError, ValueError: a ``job_id`` that is not a positive int
                (booleans refused), or a negative or non-finite ``timeout``;
                raised before any SQL runs.
        """
        job_id = check_job_id(job_id)
        seconds = None if timeout is None else check_duration("timeout", timeout)
        if self._state != "open":
            state = "has not been entered" if self._state == "new" else "is closed"
            msg = f"this tracker {state}: wait inside `async with tracker:`"
            raise TrackerClosedError(msg)
        entry = self._waits.get(job_id)
        if entry is None:
            entry = self._waits[job_id] = _Wait()
            self._mark((job_id,))
            self._has_waits.set()
        entry.waiters += 1
        try:
            with anyio.move_on_after(seconds):
                await entry.done.wait()
        finally:
            entry.waiters -= 1
            if entry.waiters == 0 and self._waits.get(job_id) is entry:
                del self._waits[job_id]
        if entry.outcome is not None:
            return entry.outcome
        if entry.error is not None:
            raise entry.error()
        msg = f"job {job_id} did not end within {seconds:g} s"
        raise TimeoutError(msg)

    def _mark(self, job_ids: Iterable[int]) -> None:
        """Have the reader read these rows (again) as soon as it can."""
        self._marked.update(job_ids)
        self._read_needed.set()

    async def progress(
        self, job_id: int, *, poll_interval: float | None = None
    ) -> AsyncIterator[JobProgress]:
        """Follow a durable handler's progress (`pgqueue.Job.progress`) until its job ends.

        Yields the progress stored when the call begins (if any), then each
        one announced, as it comes; a follower too slow to take them misses
        some in between, never the last. Ends once the job has ended
        (completed, dead or cancelled), after its last progress; its end
        is seen by its outcome's notification (a tracked job) or a read
        every ``poll_interval`` seconds (the tracker's by default).

        Usage::

            async for p in tracker.progress(job_id):
                print(f"{p.fraction:.0%} {p.message or ''}")

        Raises:
            JobNotFoundError: no row has this id.
            TrackerClosedError: the tracker is not open.
            TypeError, ValueError: a bad ``job_id`` (before any SQL).

        .. versionadded:: 0.1
        """
        job_id = check_job_id(job_id)
        every = (
            self._poll_interval
            if poll_interval is None
            else check_duration("poll_interval", poll_interval, positive=True)
        )
        if self._state != "open":
            msg = (
                "this tracker is not open: follow progress inside `async with tracker:`"
            )
            raise TrackerClosedError(msg)
        send, receive = anyio.create_memory_object_stream[JobProgress | None](16)

        def deliver(item: JobProgress | None) -> None:
            with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError):
                send.send_nowait(item)

        followers = self._followers.setdefault(job_id, set())
        followers.add(deliver)
        last: JobProgress | None = None
        try:
            with send, receive:
                while True:
                    ended, stored = await self._progress_now(job_id)
                    if stored is not None and stored != last:
                        last = stored
                        yield stored
                    if ended:
                        return
                    item: JobProgress | None = None
                    with anyio.move_on_after(every):
                        item = await receive.receive()
                    while item is not None:
                        if item != last:
                            last = item
                            yield item
                        try:
                            item = receive.receive_nowait()
                        except anyio.WouldBlock:
                            item = None
        finally:
            followers.discard(deliver)
            if not followers:
                self._followers.pop(job_id, None)

    async def _progress_now(self, job_id: int) -> tuple[bool, JobProgress | None]:
        """Whether job ``job_id`` has ended, and its stored progress."""
        if self._connection is not None:
            row = await self._connection.fetchrow(JOB_STATE, job_id)
        else:
            pool = self._target
            assert not isinstance(pool, str)
            with anyio.fail_after(STATEMENT_TIMEOUT):
                row = await pool.fetchrow(JOB_STATE, job_id)
        if row is None:
            raise JobNotFoundError(job_id)
        stored = None
        if row["progress"] is not None:
            stored = _progress(job_id, json.loads(row["progress"]))
        return row["status"] in _ENDED, stored

    def _on_notify(self, channel: str, payload: str) -> None:
        # Called by asyncpg on the event loop for every notification.
        if channel == PROGRESS_CHANNEL:
            self._on_progress(payload)
            return
        try:
            job_id = int(payload)
        except ValueError:
            self._logger.warning(
                "outcome notification without a job id; ignored",
                extra={"channel": OUTCOMES_CHANNEL},
            )
            return
        if job_id in self._waits:
            self._mark((job_id,))
        for deliver in self._followers.get(job_id, ()):
            deliver(None)  # its end, maybe: read it again

    def _on_progress(self, payload: str) -> None:
        try:
            announced = json.loads(payload)
            job_id = int(announced["id"])
            progress = _progress(job_id, announced)
        except (ValueError, KeyError, TypeError, RecursionError):
            self._logger.warning(
                "progress notification that is not a job's progress; ignored",
                extra={"channel": PROGRESS_CHANNEL},
            )
            return
        for deliver in list(self._followers.get(job_id, ())):
            deliver(progress)

    async def _on_connect(self, _reconnected: bool) -> None:
        # Awaited by the listener after every LISTEN: what was notified
        # while it was down (or before it first listened) is read now.
        self._mark(self._waits)

    async def _poll(self) -> None:
        while True:
            while not self._waits:
                self._has_waits = anyio.Event()
                await self._has_waits.wait()
            await anyio.sleep(self._poll_interval)
            self._mark(self._waits)

    async def _read(self) -> None:
        """Read the marked rows, one statement at a time, until cancelled."""
        failures = Failures(self._logger, "reading job outcomes failed; retrying")
        while True:
            while not self._marked:
                self._read_needed = anyio.Event()
                await self._read_needed.wait()
            batch = {i: self._waits[i] for i in self._marked if i in self._waits}
            self._marked.clear()
            if not batch:
                continue
            try:
                rows = await self._fetch(sorted(batch))
            except SCHEMA_ERRORS as exc:
                self._logger.error(
                    "job outcomes cannot be read: pgqueue_jobs lacks the table or a column",
                    extra={"error": repr(exc), "jobs": len(batch)},
                )
                self._settle_all(batch, _schema_error(exc, target_of(self._target)))
                continue
            except Exception as exc:
                wait = failures.failed(exc, jobs=len(batch))
                self._marked.update(batch)
                await anyio.sleep(wait)
                continue
            failures.succeeded()
            ended = self._settle(batch, rows)
            self._logger.debug(
                "job outcomes read", extra={"jobs": len(batch), "ended": ended}
            )

    async def _fetch(self, job_ids: list[int]) -> list[asyncpg.Record]:
        ids = array(job_ids)
        if self._connection is not None:
            return await self._connection.fetch(OUTCOMES, ids)
        pool = self._target
        assert not isinstance(pool, str)  # with a DSN, it reads on its connection
        with anyio.fail_after(STATEMENT_TIMEOUT):
            rows: list[asyncpg.Record] = await pool.fetch(OUTCOMES, ids)
        return rows

    def _settle(self, batch: dict[int, _Wait], rows: list[asyncpg.Record]) -> int:
        """Settle the waits of ``batch`` whose row has ended or is gone; return how many."""
        found = {row["id"]: row for row in rows}
        settled = 0
        for job_id, entry in batch.items():
            if entry.done.is_set() or self._waits.get(job_id) is not entry:
                continue  # every waiter left, or the tracker closed
            row = found.get(job_id)
            if row is None:
                entry.error = _not_found(job_id)
            elif row["status"] in _ENDED:
                try:
                    entry.outcome = _outcome(row)
                except (ValueError, RecursionError) as exc:
                    entry.error = _undecodable(job_id, exc)
            else:
                continue  # pending or running: a later read settles it
            del self._waits[job_id]
            entry.done.set()
            settled += 1
        return settled

    def _settle_all(
        self, batch: dict[int, _Wait], error: Callable[[], BaseException]
    ) -> None:
        for job_id, entry in batch.items():
            if entry.done.is_set() or self._waits.get(job_id) is not entry:
                continue
            entry.error = error
            del self._waits[job_id]
            entry.done.set()


def _outcome(row: asyncpg.Record) -> JobOutcome:
    text: str | None = row["result"]
    return JobOutcome(
        id=row["id"],
        status=Status(row["status"]),
        result=None if text is None else json.loads(text),
        last_error=row["last_error"],
        attempts=row["attempts"],
    )


def _progress(job_id: int, stored: Any) -> JobProgress:
    """A job's progress as stored or announced (``{"fraction", "message"}``)."""
    message = stored.get("message")
    return JobProgress(
        id=job_id,
        fraction=float(stored["fraction"]),
        message=message if isinstance(message, str) else None,
    )


def _closed() -> BaseException:
    return TrackerClosedError("the tracker closed while this wait was pending")


def _not_found(job_id: int) -> Callable[[], BaseException]:
    return lambda: JobNotFoundError(job_id)


def _undecodable(job_id: int, exc: BaseException) -> Callable[[], BaseException]:
    def error() -> BaseException:
        failure = ValueError(f"job {job_id}'s result cannot be decoded: {exc!r}")
        failure.__cause__ = exc
        return failure

    return error


def _schema_error(exc: BaseException, where: str | None) -> Callable[[], BaseException]:
    def error() -> BaseException:
        failure = SchemaError(
            f"job outcomes cannot be read ({exc}): apply pgqueue.SCHEMA, or "
            "pgqueue.SCHEMA_UPGRADE on an older table, in a migration",
            where=where,
        )
        failure.__cause__ = exc
        return failure

    return error
