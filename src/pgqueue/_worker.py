"""The worker: claims jobs from one queue and runs their handlers.

Task tree (what runs where, and what stops what)::

    run()                          host task; on outside cancellation: stop()
    └── supervisor                 shielded: only stop() and its cut-off end it
        ├── services task group    cancelled last, after the final flush
        │   ├── outcome writer     batches fenced outcome writes
        │   ├── listener           LISTEN pgqueue_jobs; wakes the claim loop
        │   ├── heartbeat          refreshes updated_at of running jobs
        │   ├── rescue sweep       at start, then every max(poll, rescue_after/2)
        │   └── retention sweep    only with retain=
        └── jobs task group        leaving it is the drain
            ├── claim loop         in the claim scope; stop() cancels it;
            │                      appends claimed jobs to a ready deque
            └── consumers          ``concurrency`` tasks running handlers
                                   from the deque; a consumer that takes a
                                   job wakes one idle consumer if more wait

Stopping: cancel the claim scope, let the consumers finish the handlers
they started (cancelling them when ``stop(timeout)`` runs out: their jobs go
back to pending), release the claimed jobs no handler started (pending
again, attempt given back), wait for the writer to settle, then cancel the
services and close the worker's connections.
"""

from __future__ import annotations

import asyncio
import heapq
import json
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar, cast

import anyio

from pgqueue import _sql
from pgqueue._backoff import Backoff, default_backoff
from pgqueue._checks import (
    check_callable,
    check_duration,
    check_int,
    check_name,
    check_queue_name,
)
from pgqueue._dedicated import DedicatedConnection
from pgqueue._errors import DATABASE_ERRORS, AlreadyStartedError, is_permanent
from pgqueue._job import Job, Status
from pgqueue._listener import (
    LISTEN_KEEPALIVE,
    LISTEN_PROBE_TIMEOUT,
    Listener,
    connect_like,
)
from pgqueue._log import Logger, default_logger
from pgqueue._writer import RELEASED, Outcome, OutcomeWriter, debug_enabled

if TYPE_CHECKING:
    import asyncpg

__all__ = ["Handler", "Middleware", "Worker"]

Handler: TypeAlias = Callable[[Job], Awaitable[None]]
"""Runs one job; returning completes it, raising fails the attempt."""

Middleware: TypeAlias = Callable[[Handler], Handler]
"""Wraps a handler (metrics, tracing, per-job setup); the first one is outermost."""

H = TypeVar("H", bound=Handler)

# How long the final flush may retry against an unreachable database before
# giving up; what is left unwritten is recovered by the rescue sweep.
FLUSH_TIMEOUT = 30.0
# A claim that takes longer is abandoned; its jobs, if claimed, are rescued.
CLAIM_TIMEOUT = 30.0
RETRY_WAKE_MARGIN = 0.01
SHUTDOWN_ERROR = "worker shut down before the job finished"
# Heartbeats sent per rescue_after: a live job's row is never older than
# rescue_after / 3 (plus a round trip), far from being taken for an orphan.
HEARTBEATS_PER_RESCUE = 3
# A place in the claim order (run_at, id); a claim takes the jobs after it.
Place: TypeAlias = tuple[datetime, int]
HEAD: Place = _sql.HEAD_OF_LINE


class Worker:
    """Claim jobs from one queue and run their handlers.

    Constructing a worker does no I/O. The pool is borrowed, never closed,
    and left to your handlers: the worker opens four connections of its own
    with the pool's settings (claims, outcome writes, heartbeats and sweeps,
    LISTEN), so handlers holding every pool connection can neither stall it
    nor make its live jobs look dead.

    Args:
        pool: the asyncpg pool of the database holding ``pgqueue_jobs``.
        queue: the queue to consume.
        concurrency: the most handlers running at once.
        prefetch: how many jobs to claim beyond ``concurrency``, so the next
            jobs are at hand when handlers finish and a claim's round trip
            overlaps running ones. Held jobs are invisible to other workers
            until started; `stop` gives back those not started (their
            attempt uncounted). Worth it for short jobs; keep 0 when jobs
            are long and other workers could take them.
        poll_interval: seconds between claims when nothing wakes the worker.
            Also how long a job put back in line behind a backlog being
            drained (rescued, or enqueued with an earlier ``run_at``) may
            wait: claims start after the last job taken while the backlog
            lasts, and from the head of the line at least this often.
        listen: wake on NOTIFY over a dedicated connection. ``True`` opens it
            with the pool's connect arguments; a DSN string opens it there
            (useful when the pool goes through PgBouncer); ``False`` polls only.
        backoff: seconds to wait before retrying after a failed attempt.
        rescue_after: seconds without a heartbeat after which a ``running``
            job is taken for an orphan (its worker died) and goes back to
            pending, or dead when its attempts are used up. The worker
            refreshes its running jobs' rows every ``rescue_after / 3``.
        job_timeout: seconds a handler may run before it is cancelled and its
            attempt fails; ``None`` leaves handlers unbounded.
        retain: prune this queue's completed and dead jobs older than this
            many seconds; ``None`` never prunes.
        middleware: wrappers applied to each handler when it is registered.
        logger: where to log; the ``pgqueue`` logger by default.

    Usage::

        worker = pgqueue.Worker(pool, concurrency=8)

        @worker.handler("send_welcome_email")
        async def send_welcome_email(job: pgqueue.Job) -> None: ...

        await worker.run()
    """

    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        *,
        queue: str = "default",
        concurrency: int = 2,
        prefetch: int = 0,
        poll_interval: float = 5.0,
        listen: bool | str = True,
        backoff: Backoff = default_backoff,
        rescue_after: float = 300.0,
        job_timeout: float | None = None,
        retain: float | None = None,
        middleware: Sequence[Middleware] = (),
        logger: Logger | None = None,
    ) -> None:
        check_callable("backoff", backoff)
        for wrap in middleware:
            check_callable("middleware", wrap)
        if not isinstance(cast("object", listen), bool | str):
            msg = f"listen must be a bool or a DSN string, not {type(listen).__name__}"
            raise TypeError(msg)
        self._pool = pool
        self._queue = check_queue_name(queue)
        self._concurrency = check_int("concurrency", concurrency)
        self._prefetch = check_int("prefetch", prefetch, minimum=0)
        self._capacity = self._concurrency + self._prefetch
        # With jobs in hand, wait for a batch worth claiming; without, claim
        # for every slot as it frees.
        self._claim_at = max(1, min(self._prefetch, self._capacity // 2))
        self._poll_interval = check_duration(
            "poll_interval", poll_interval, positive=True
        )
        self._listen = listen
        self._backoff = backoff
        self._rescue_after = check_duration("rescue_after", rescue_after, positive=True)
        self._job_timeout = (
            None
            if job_timeout is None
            else check_duration("job_timeout", job_timeout, positive=True)
        )
        self._retain = None if retain is None else check_duration("retain", retain)
        self._middleware = tuple(middleware)
        self._logger = default_logger(logger)
        self._handlers: dict[str, Handler] = {}
        self._state: Literal["new", "running", "stopped"] = "new"
        self._stop_requested = False
        self._held: dict[tuple[int, int], Job] = {}  # claimed, outcome not yet put
        self._active = 0  # handlers running
        self._saturated = False
        self._after = HEAD  # where the next claim starts in line
        self._head_due = 0.0  # loop time of the next claim from the head
        self._until_empty = False
        self._retries_due: list[float] = []  # a heap of local deadlines
        self._listener_keepalive = LISTEN_KEEPALIVE
        self._listener_probe_timeout = LISTEN_PROBE_TIMEOUT
        self._listener: Listener | None = None
        # Made in run(): they need a running event loop.
        self._wake: asyncio.Event
        self._finished: anyio.Event
        self._claim_scope: anyio.CancelScope
        self._jobs_scope: anyio.CancelScope | None = None
        self._writer: OutcomeWriter

    @property
    def queue(self) -> str:
        """The queue this worker consumes."""
        return self._queue

    @property
    def running_jobs(self) -> int:
        """How many handlers are running now."""
        return self._active

    @property
    def listener_pid(self) -> int | None:
        """The backend pid of the LISTEN connection while it is up."""
        return None if self._listener is None else self._listener.pid

    def register(self, job_type: str, handler: Handler) -> None:
        """Run ``handler`` for jobs of ``job_type``, wrapped in the worker's middleware.

        Raises:
            AlreadyStartedError: the worker has started.
            TypeError, ValueError: a bad job type or a handler that is not callable.
        """
        if self._state != "new":
            msg = "register() called after run() started; register every handler first"
            raise AlreadyStartedError(msg)
        check_name("job type", job_type)
        check_callable("handler", handler)
        for wrap in reversed(self._middleware):
            handler = wrap(handler)
        self._handlers[job_type] = handler

    def handler(self, job_type: str) -> Callable[[H], H]:
        """Register the decorated async function for jobs of ``job_type``.

        The function is returned unwrapped, so it can still be called directly.
        """

        def decorate(fn: H) -> H:
            self.register(job_type, fn)
            return fn

        return decorate

    async def run(self, *, until_empty: bool = False) -> None:
        """Claim and run jobs until `stop` is called or this task is cancelled.

        Returns after the drain: in-flight handlers finished, every outcome
        written, connections closed. Cancelling the task that runs it stops
        the worker the same way (waiting for in-flight handlers without a
        limit) and then propagates the cancellation.

        Args:
            until_empty: return once no job is ready to run and none is
                running (retries scheduled for later do not count). Meant
                for tests of handlers and for batch jobs; no LISTEN is used.

        Raises:
            AlreadyStartedError: ``run()`` was called before.
            ExceptionGroup: a bug inside the worker itself (never a handler's
                exception: those fail the job, not the worker).
        """
        if self._state != "new":
            msg = "this worker has already been started; create a new Worker"
            raise AlreadyStartedError(msg)
        self._state = "running"
        self._until_empty = until_empty
        self._wake = asyncio.Event()
        self._finished = anyio.Event()
        self._claim_scope = anyio.CancelScope()
        if self._stop_requested:
            self._claim_scope.cancel()
        self._claimer = DedicatedConnection(connect_like(self._pool))
        self._upkeep = DedicatedConnection(connect_like(self._pool))
        self._writer = OutcomeWriter(
            DedicatedConnection(connect_like(self._pool)),
            logger=self._logger,
            queue=self._queue,
            on_retry=self._on_retry_written,
        )
        self._logger.info(
            "pgqueue: worker starting",
            extra={"queue": self._queue, "concurrency": self._concurrency},
        )
        try:
            async with anyio.create_task_group() as host:
                host.start_soon(self._supervise)
                try:
                    await self._finished.wait()
                except anyio.get_cancelled_exc_class():
                    self._request_stop()
                    raise
        finally:
            self._state = "stopped"

    async def stop(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 - the drain's own bound
        """Stop claiming, wait for in-flight handlers, write their outcomes, close.

        Safe to call more than once, and before or without `run`.

        Args:
            timeout: seconds to wait for in-flight handlers; ``None`` waits
                for as long as they take.

        Raises:
            TimeoutError: the handlers did not finish in time. They were
                cancelled and their jobs are back in ``pending`` (attempt
                counted) by the time this is raised.
        """
        self._request_stop()
        if self._state == "new":
            return
        if timeout is None:
            await self._finished.wait()
            return
        with anyio.move_on_after(check_duration("timeout", timeout)):
            await self._finished.wait()
            return
        cut_off = self._active
        if self._jobs_scope is not None:
            self._jobs_scope.cancel()
        await self._finished.wait()
        msg = f"worker did not drain within {timeout:g} s; {cut_off} job(s) returned to pending"
        raise TimeoutError(msg)

    def _request_stop(self) -> None:
        self._stop_requested = True
        if self._state == "running":
            self._claim_scope.cancel()

    async def _supervise(self) -> None:
        try:
            with anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as services:
                    services.start_soon(self._writer.run)
                    if self._listen is not False and not self._until_empty:
                        self._listener = Listener(
                            connect_like(
                                self._pool if self._listen is True else self._listen
                            ),
                            [_sql.JOBS_CHANNEL],
                            self._on_notify,
                            logger=self._logger,
                            on_connect=self._on_listen,
                            keepalive=self._listener_keepalive,
                            probe_timeout=self._listener_probe_timeout,
                        )
                        services.start_soon(self._listener.run)
                    services.start_soon(self._heartbeat_loop)
                    services.start_soon(self._rescue_loop)
                    if self._retain is not None:
                        services.start_soon(self._retention_loop, self._retain)
                    try:
                        await self._run_jobs()
                    finally:
                        with anyio.move_on_after(FLUSH_TIMEOUT) as flush:
                            await self._writer.settled()
                        if flush.cancelled_caught:
                            self._logger.error(
                                "pgqueue: could not write every job outcome before stopping; "
                                "the rescue sweep will re-run those jobs",
                                extra={
                                    "count": self._writer.backlog,
                                    "queue": self._queue,
                                },
                            )
                        services.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await self._claimer.aclose()
                await self._writer.aclose()
                await self._upkeep.aclose()
            self._logger.info("pgqueue: worker stopped", extra={"queue": self._queue})
            self._finished.set()

    async def _run_jobs(self) -> None:
        # Long-lived consumer tasks cost far less per job than a task each.
        self._ready: deque[Job] = deque()
        self._idle: list[asyncio.Future[None]] = []
        self._waking = 0  # consumers woken that have not resumed yet
        self._claiming = True
        try:
            async with anyio.create_task_group() as jobs:
                self._jobs_scope = jobs.cancel_scope
                for _ in range(self._concurrency):
                    jobs.start_soon(self._consume)
                try:
                    with self._claim_scope:
                        await self._claim_loop()
                finally:
                    self._claiming = False
                    while self._idle:
                        self._wake_consumer()
        finally:
            # Claimed, never started: give them back as they were.
            for job in self._ready:
                self._writer.put(Outcome(job, RELEASED))
            self._ready.clear()
            self._held.clear()

    async def _consume(self) -> None:
        loop = asyncio.get_running_loop()
        ready = self._ready
        while True:
            while ready and not self._stop_requested:
                job = ready.popleft()
                if ready and not self._waking:
                    self._wake_consumer()
                await self._execute(job)
            if not self._claiming:
                return
            idle = loop.create_future()
            self._idle.append(idle)
            await idle
            self._waking -= 1

    def _wake_consumer(self) -> None:
        """Wake one idle consumer; it wakes the next if jobs still wait."""
        while self._idle:
            idle = self._idle.pop()
            if not idle.done():
                idle.set_result(None)
                self._waking += 1
                return

    def _free(self) -> int:
        """How many more jobs the worker may claim now."""
        return self._capacity - len(self._held)

    def _on_notify(self, _channel: str, payload: str) -> None:
        if payload == self._queue:
            self._wake.set()

    async def _on_listen(self, reconnected: bool) -> None:
        # Enqueues may have been missed while the connection was down.
        if reconnected:
            self._wake.set()

    async def _claim_loop(self) -> None:
        failures = 0
        while True:
            wake = self._wake = asyncio.Event()
            free = self._free()
            if self._stop_requested:
                return
            if free >= self._claim_at:
                flushed_before = self._writer.flushed
                after = self._claim_start()
                try:
                    rows = await self._claim(free, after)
                except DATABASE_ERRORS as exc:
                    failures += 1
                    self._logger.error(
                        "pgqueue: claim failed; retrying",
                        extra={
                            "error": repr(exc),
                            "queue": self._queue,
                            "failures": failures,
                        },
                    )
                    await anyio.sleep(min(self._poll_interval, 0.05 * 2**failures))
                    continue
                failures = 0
                for row in rows:
                    job, undecodable = _job_from_row(row)
                    if undecodable is not None:
                        self._logger.error(
                            "pgqueue: job dead",
                            extra={
                                "job_id": job.id,
                                "job_type": job.type,
                                "queue": job.queue,
                                "error": undecodable,
                            },
                        )
                        self._writer.put(Outcome(job, Status.DEAD, error=undecodable))
                        continue
                    self._held[job.id, job.attempts] = job
                    self._ready.append(job)
                if self._ready and not self._waking:
                    self._wake_consumer()
                full = len(rows) == free
                self._after = _last_in_line(rows) if full else HEAD
                # A short claim from past the head has yet to look behind
                # its starting place: claim again, from the head.
                self._saturated = full or after is not HEAD
                if self._saturated:
                    continue
                if self._until_empty and not rows and not self._held:
                    # A retry may have been written since the claim began.
                    await self._writer.settled()
                    if self._writer.flushed == flushed_before:
                        return
                    continue
            with anyio.move_on_after(self._next_wait()):
                await wake.wait()

    def _on_retry_written(self, delay: float) -> None:
        """Wake for our own retry when it falls due, not at the next poll."""
        if delay >= self._poll_interval:
            return
        # run_at was set from the database clock during the write that just
        # finished, so a claim started after this local deadline sees it due.
        due = anyio.current_time() + delay + RETRY_WAKE_MARGIN
        if not self._retries_due or due < self._retries_due[0]:
            self._wake.set()  # so the claim loop shortens its wait
        heapq.heappush(self._retries_due, due)

    def _next_wait(self) -> float:
        """Seconds until the next poll, or sooner when one of our retries falls due."""
        now = anyio.current_time()
        due = self._retries_due
        if due and due[0] <= now:
            # Due since the claim that just ran began: claim again at once.
            while due and due[0] <= now:
                heapq.heappop(due)
            return 0.0
        return min(self._poll_interval, due[0] - now) if due else self._poll_interval

    def _claim_start(self) -> Place:
        """Where the next claim starts: past the last job taken while a backlog
        lasts, and from the head at least every ``poll_interval``, so that jobs
        put back in line behind that place (rescued, or enqueued with an
        earlier ``run_at``) wait no longer than a poll."""
        now = asyncio.get_running_loop().time()
        if self._after is HEAD or now >= self._head_due:
            self._head_due = now + self._poll_interval
            return HEAD
        return self._after

    async def _claim(self, limit: int, after: Place) -> list[asyncpg.Record]:
        # Never cancel a claim in flight: the server may commit it after the
        # client gave up, leaving claimed jobs nobody runs until rescue.
        with anyio.fail_after(CLAIM_TIMEOUT, shield=True):
            return await self._claimer.fetch(_sql.CLAIM, self._queue, limit, *after)

    async def _execute(self, job: Job) -> None:
        self._active += 1
        try:
            handler = self._handlers.get(job.type)
            if handler is None:
                error = f"no handler registered for job type {job.type!r}"
                self._logger.error(
                    "pgqueue: job dead", extra={**_fields(job), "error": error}
                )
                self._writer.put(Outcome(job, Status.DEAD, error=error))
                return
            debug = debug_enabled(self._logger)
            if debug:
                self._logger.debug("pgqueue: job started", extra=_fields(job))
            try:
                failure = await self._call(handler, job)
            except anyio.get_cancelled_exc_class():
                self._logger.warning(
                    "pgqueue: job cut off by shutdown; returned to pending",
                    extra=_fields(job),
                )
                self._writer.put(Outcome(job, Status.PENDING, error=SHUTDOWN_ERROR))
                raise
            if failure is None:
                if debug:
                    self._logger.debug("pgqueue: job completed", extra=_fields(job))
                self._writer.put(Outcome(job, Status.COMPLETED))
            else:
                self._writer.put(self._failed(job, failure))
        finally:
            self._active -= 1
            del self._held[job.id, job.attempts]
            if self._until_empty or (
                self._saturated and self._free() >= self._claim_at
            ):
                self._wake.set()

    async def _call(self, handler: Handler, job: Job) -> BaseException | str | None:
        """Run the handler; return its exception, a timeout message, or None."""
        try:
            if self._job_timeout is None:
                await handler(job)
                return None
            with anyio.move_on_after(self._job_timeout) as scope:
                await handler(job)
            if scope.cancelled_caught:
                return f"job timed out after {self._job_timeout:g} s"
        except Exception as exc:
            return exc
        return None

    def _failed(self, job: Job, failure: BaseException | str) -> Outcome:
        fields = _fields(job)
        error = failure if isinstance(failure, str) else _describe(failure)
        exc_info = None if isinstance(failure, str) else failure
        permanent = exc_info is not None and is_permanent(exc_info)
        if permanent or job.attempts >= job.max_attempts:
            self._logger.error(
                "pgqueue: job dead", extra={**fields, "error": error}, exc_info=exc_info
            )
            return Outcome(job, Status.DEAD, error=error)
        delay = max(float(self._backoff(job.attempts)), 0.0)
        self._logger.warning(
            "pgqueue: job failed; will retry",
            extra={**fields, "error": error, "retry_in": delay},
            exc_info=exc_info,
        )
        return Outcome(job, Status.PENDING, delay=delay, error=error)

    async def _heartbeat_loop(self) -> None:
        # Rescue then measures liveness, not runtime: a long handler on a live
        # worker keeps its row fresh, a dead worker's rows go stale.
        interval = self._rescue_after / HEARTBEATS_PER_RESCUE
        while True:
            await anyio.sleep(interval)
            if not self._held:
                continue
            held = list(self._held)
            try:
                await self._upkeep.fetch(
                    _sql.TOUCH, [key[0] for key in held], [key[1] for key in held]
                )
            except DATABASE_ERRORS as exc:
                self._logger.error(
                    "pgqueue: heartbeat failed",
                    extra={"error": repr(exc), "queue": self._queue},
                )

    async def _rescue_loop(self) -> None:
        interval = max(self._poll_interval, self._rescue_after / 2)
        while True:
            try:
                rows = await self._upkeep.fetch(
                    _sql.RESCUE, self._queue, self._rescue_after
                )
            except DATABASE_ERRORS as exc:
                self._logger.error(
                    "pgqueue: rescue sweep failed",
                    extra={"error": repr(exc), "queue": self._queue},
                )
            else:
                dead = sum(1 for row in rows if row[0] == Status.DEAD)
                if len(rows) > dead:
                    self._logger.warning(
                        "pgqueue: rescued stuck jobs",
                        extra={"count": len(rows) - dead, "queue": self._queue},
                    )
                    self._wake.set()
                if dead:
                    self._logger.error(
                        "pgqueue: dead-lettered stuck jobs that exhausted their attempts",
                        extra={"count": dead, "queue": self._queue},
                    )
            await anyio.sleep(interval)

    async def _retention_loop(self, retain: float) -> None:
        interval = max(self._poll_interval, self._rescue_after / 2)
        while True:
            try:
                status = await self._upkeep.execute(_sql.PRUNE, self._queue, retain)
            except DATABASE_ERRORS as exc:
                self._logger.error(
                    "pgqueue: retention sweep failed",
                    extra={"error": repr(exc), "queue": self._queue},
                )
            else:
                removed = int(status.rsplit(" ", 1)[-1])
                if removed:
                    self._logger.info(
                        "pgqueue: pruned finished jobs",
                        extra={"count": removed, "queue": self._queue},
                    )
            await anyio.sleep(interval)

    def __repr__(self) -> str:
        return f"Worker(queue={self._queue!r}, concurrency={self._concurrency}, state={self._state!r})"


def _job_from_row(row: asyncpg.Record) -> tuple[Job, str | None]:
    """Return the job, and why its payload cannot be decoded if it cannot."""
    undecodable = None
    try:
        payload = json.loads(row[3])
    except (ValueError, RecursionError) as exc:
        # Written by another producer (a 5000-digit number, deep nesting).
        payload = None
        undecodable = f"payload could not be decoded: {_describe(exc)}"[:1000]
    job = Job(
        id=row[0],
        queue=row[1],
        type=row[2],
        payload=payload,
        attempts=row[4],
        max_attempts=row[5],
        run_at=row[6],
        created_at=row[7],
        last_error=row[8],
    )
    return job, undecodable


def _last_in_line(rows: list[asyncpg.Record]) -> Place:
    """The (run_at, id) of the last claimed row in claim order."""
    # asyncpg reads run_at '-infinity' as a naive datetime.min.
    return max(
        (row[6] if row[6].tzinfo is not None else HEAD[0], row[0]) for row in rows
    )


def _fields(job: Job) -> dict[str, Any]:
    """What every log record about ``job`` carries."""
    return {
        "job_id": job.id,
        "job_type": job.type,
        "queue": job.queue,
        "attempt": job.attempts,
    }


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
