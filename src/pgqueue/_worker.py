"""The worker: claims jobs from one queue, or several, and runs their handlers.

Task tree (what runs where, and what stops what)::

    run()                          host task; on outside cancellation: stop,
    │                              drain for shutdown_grace, then cut off
    └── supervisor                 shielded: only stop() and its cut-off end it;
        │                          enters the worker's own Connections, if it
        │                          made one (given none), and closes it last
        ├── services task group    cancelled last, after the outcomes settle
        │   ├── outcome writer     batches fenced outcome writes
        │   ├── listener route     LISTEN pgqueue_jobs (on the Connections'
        │   │                      LISTEN connection); wakes the claimer
        │   ├── cancel hints       reads the rows a control NOTIFY names
        │   │                      (a hint: the row decides), batched
        │   ├── heartbeats         refresh updated_at of every held claim
        │   ├── rescue sweep       at start, then every max(poll, rescue_after/2)
        │   ├── retention sweep    only with retain=
        │   └── scheduler          only with periodic(): enqueues due ticks
        └── jobs task group        leaving it is the drain; stop(timeout)
            │                      cancels it (the cut-off)
            ├── claimer            in the claim scope, which stop() cancels;
            │                      checks the schema, then claims into the
            │                      ledger when the claim policy says so
            └── consumers          ``concurrency`` tasks running handlers

Each queue of the worker is a lane (`pgqueue._engine.lanes.Lane`): its own ledger (its capacity),
claim policy (its poll timer and place in line), claimer, consumers and
lease, which it builds from the worker's `WorkerOptions`, its queue's own
settings (`pgqueue._core.options.LaneSettings`) and the services the lanes share (`LaneServices`: the claim connection, the outcome
writer, the job runner, the logger). A worker of one queue is lanes of
one. Each lane's claimer runs in the claim scope (their claims take turns
on the one claim connection; the first one checks the schema); the
listener, the heartbeats and the sweeps are shared, and the sweeps cover
every queue in one statement each. `pgqueue._engine.lanes.Routes` is the
switchboard between the lanes: a NOTIFY wakes the lane of the queue it
names; LISTEN coming up wakes every lane; an outcome made durable leaves
the ledger that held it. With ``max_concurrency`` below what the lanes
could hold between them, a `pgqueue._engine.ledger.Budget` caps the claims ready
or running across lanes.

Every claim belongs to one ledger (`pgqueue._engine.ledger.Claims`) from the
moment the claim returns until its outcome is durable: free capacity,
heartbeats, back pressure, the drain, the release of unstarted jobs and
``until_empty`` all read it.

Stopping: cancel the claim scope, let the consumers finish the handlers
they started (cutting them off when ``stop(timeout)`` runs out: their jobs
go back to pending), release the claimed jobs no handler started (pending
again, attempt given back), wait until every outcome is durable, then cancel
the services and close the worker's connections (when they are its own).

Connections: a worker uses a `pgqueue.Connections` for its claims, outcome
writes, upkeep and LISTEN: the one it is given, shared with the process's
other parts, or one of its own (`pgqueue._wire.connections.private_connections`),
so both cases run the same code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar, cast, overload

import anyio

from pgqueue._core.backoff import Backoff, SafeBackoff, default_backoff
from pgqueue._core.checks import (
    check_callable,
    check_duration,
    check_job_type,
)
from pgqueue._core.errors import AlreadyStartedError, SchemaError
from pgqueue._core.handler import Handler, SyncHandler
from pgqueue._core.hooks import Observer, call_observers
from pgqueue._core.log import Logger, default_logger
from pgqueue._core.options import RateLimit, WorkerOptions, lane_settings
from pgqueue._core.outcome import Outcome
from pgqueue._core.retry import Outage
from pgqueue._core.typed import is_async, typed_handler
from pgqueue._engine.checkpoints import Checkpoints
from pgqueue._engine.consumers import RUNNING_FOR
from pgqueue._engine.control import CancelHints, read_cancel_requested
from pgqueue._engine.durable import Durable
from pgqueue._engine.lanes import Lane, Routes
from pgqueue._engine.lease import LeaseKeeper, worker_id
from pgqueue._engine.ledger import Budget
from pgqueue._engine.periodic import Schedules, check_schedule
from pgqueue._engine.runner import JobRunner, in_thread
from pgqueue._engine.services import LaneServices
from pgqueue._engine.upkeep import Upkeep
from pgqueue._engine.watch import LoopWatch
from pgqueue._engine.writer import OutcomeWriter
from pgqueue._jobtype import JobType
from pgqueue._queue import queue_on
from pgqueue._sql.channels import CONTROL_CHANNEL, JOBS_CHANNEL
from pgqueue._wire.connections import Connections, private_connections
from pgqueue._wire.dedicated import STATEMENT_TIMEOUT
from pgqueue._wire.listener import LISTEN_KEEPALIVE, LISTEN_PROBE_TIMEOUT, ListenerRoute

if TYPE_CHECKING:
    import asyncpg
    from anyio.abc import TaskStatus

    from pgqueue._core.job import Job
    from pgqueue._core.outcome import Outcome
    from pgqueue._jobtype import HandlerDecorator

__all__ = ["Handler", "Middleware", "SyncHandler", "Worker"]

Middleware: TypeAlias = Callable[[Handler], Handler]
"""Wraps a handler (metrics, tracing, per-job setup); the first one is outermost."""

H = TypeVar("H", bound=Handler | SyncHandler)
P = TypeVar("P")


FLUSH_TIMEOUT = 30.0
"""Seconds the final flush may retry against an unreachable database; what is
left unwritten is recovered by the rescue sweep."""


class Worker:
    """Claim jobs from one queue, or several, and run their handlers.

    Constructing a worker does no I/O. The pool is borrowed, never closed,
    and left to your handlers: the worker opens four connections of its own
    with the pool's settings (claims, outcome writes, heartbeats and sweeps,
    LISTEN), so handlers holding every pool connection can neither stall it
    nor make its live jobs look dead.

    Args:
        pool: the asyncpg pool of the database holding ``pgqueue_jobs``.
        queue: the queue to consume (``"default"`` unless ``queues`` is
            given).
        concurrency: the most handlers running at once (2 unless ``queues``
            is given).
        queues: several queues to consume, each with its concurrency
            (``{"default": 10, "emails": 2}``), instead of ``queue`` and
            ``concurrency``. Each queue has its own slots, claims and poll
            timer: a queue whose handlers are all busy or slow never holds
            up another, and a NOTIFY for one queue claims for it alone.
            Handlers serve any of the queues. Giving ``queues`` with
            ``queue`` or ``concurrency`` raises `TypeError`.
        max_concurrency: the most jobs running, or claimed and waiting to
            run (with ``prefetch``), across every queue at once; ``None``
            for no cap beyond each queue's. A queue claims the fewer of
            its own free slots and the overall ones, so queues compete for
            the overall slots: when a job ends, the other queues get the
            first look at the slot it freed.
        global_limit: the most jobs of a queue running at once across every
            worker and process (a fleet-wide limit): an int for the one
            queue, or, with ``queues``, a mapping of some of those queues to
            their limits (``{"emails": 3}``); ``None`` for no limit. The
            database splits the limit among the queue's workers as leases
            (``pgqueue_leases``, renewed every ``poll_interval``; their sum
            never exceeds the limit), each at most a fair share of it; a
            worker fills its lease with jobs ready or running, prefetched
            ones included, and a slot is free again when its handler ends.
            A worker that stops gives its lease back; a crashed worker's
            lease runs out after ``rescue_after``. Each worker leases within
            its own limit, so with workers that disagree the queue runs at
            most the largest. Go workers, and workers without the limit,
            bypass it and are not counted.
        group_limit: the most jobs of one group (``enqueue(group=...)``) of
            a queue running at once across every worker and process: an int
            for the one queue or, with ``queues``, a mapping of some of them
            to their limits; ``None`` for none. With 1, each group's jobs
            run one at a time, in ``(run_at, id)`` order. Claims of such a
            queue take the groups round-robin (the first job of every
            group with room before the second of any), so a group's flood
            delays another group's job by at most one claim; they take
            turns across the fleet (a lock of the queue for each claim's
            transaction). Jobs without a group are not limited. Every
            worker of the queue must have the same limit (Go workers and
            workers without it ignore groups).
        rate_limit: at most so many job starts of a queue in any window of
            its length, across every worker and process
            (``pgqueue.RateLimit(100, per=60.0)``; with ``per_group=True``,
            of each group on its own): a `RateLimit` for the one queue or,
            with ``queues``, a mapping of some of them to theirs; ``None``
            for none. A start is a claim; jobs beyond the limit wait,
            pending, and the worker sleeps until its window has room. The
            claims of such a queue take turns across the fleet, counting
            the starts recorded in ``pgqueue_starts``. Every worker of the
            queue must have the same limit (Go workers and workers without
            it are not counted).
        prefetch: how many jobs to claim beyond ``concurrency`` (for each
            queue, with ``queues``), so the next jobs are at hand when
            handlers finish and a claim's round trip overlaps running ones.
            Held jobs are invisible to other workers until started; `stop`
            gives back those not started (their attempt uncounted).
            ``None`` (the default) claims up to ``concurrency`` more only
            while a backlog of short jobs lasts (the last claim came back
            full and the queue's handlers run under 20 ms on average), on
            a queue without a global, group or rate limit in a worker
            without ``max_concurrency``; otherwise none. ``0`` claims only
            free slots.
        poll_interval: seconds between claims when nothing wakes the worker.
            Also how long a job put back in line behind a backlog being
            drained (rescued, or enqueued with an earlier ``run_at``) may
            wait: claims start after the last job taken while the backlog
            lasts, and from the head of the line at least this often.
        listen: wake on NOTIFY over a dedicated connection. ``True`` opens it
            with the pool's connect arguments; a DSN string opens it there
            (useful when the pool goes through PgBouncer); ``False`` polls only.
        connections: a `Connections` shared with the process's other
            workers, subscribers and trackers: the worker then claims,
            writes, heartbeats and LISTENs on them instead of opening four
            connections of its own (give a LISTEN DSN to them, not to
            ``listen``).
        backoff: seconds to wait before retrying after a failed attempt. A
            value it returns out of range is clamped (0 to a year); if it
            raises or returns no number, `default_backoff` is used instead.
        rescue_after: seconds without a heartbeat after which a ``running``
            job is taken for an orphan (its worker died) and goes back to
            pending, or dead when its attempts are used up. The worker
            refreshes its held jobs' rows every ``rescue_after / 3``.
        job_timeout: seconds a handler may run before it is cancelled and its
            attempt fails; ``None`` leaves handlers unbounded.
        block_warning: seconds an ``async def`` handler may hold the event
            loop (blocking code between two awaits) before a WARNING names
            its job; ``None`` turns the watch off. It times nothing per job:
            a ticker notes the time and a thread looks at the loop's stack
            only while it is held.

            .. versionadded:: 0.1
        unknown_types: what becomes of a job whose type has no handler here.
            ``"wait"`` (the default): the worker claims only the types it
            has handlers for and leaves the others pending, attempts
            untouched, for a worker that has them: another application's
            worker on a shared queue, or a newer worker in a rolling
            deploy. Jobs left waiting are walked past by each claim, so do
            not leave a large backlog of a type no worker handles.
            ``"dead"``: such a job is dead-lettered at once ("no handler
            registered for job type ...", as the Go module does); only for
            a queue this worker's application has to itself.

            .. versionchanged:: 0.1
               ``"wait"`` is the default (it was ``"dead"``).
        retain: prune the worker's queues' completed, dead and cancelled
            jobs older than this many seconds; ``None`` never prunes.
        shutdown_grace: when the task running `run` is cancelled, how long
            in-flight handlers may take to finish before they are cut off
            (as `stop` does when its timeout runs out); ``None`` waits for
            as long as they take.
        middleware: wrappers applied to each handler when it is registered.
        observers: told what became of the outcomes written (recorded, or
            fenced off as stale) and of the rescue sweeps, for metrics
            (`pgqueue.prometheus.WorkerMetrics`); see `Observer`.
        logger: where to log; the ``pgqueue`` logger by default.

    Usage::

        worker = pgqueue.Worker(pool, concurrency=8)

        @worker.handler("send_welcome_email")
        async def send_welcome_email(job: pgqueue.Job) -> None: ...

        await worker.run()

    .. versionchanged:: 0.1
       ``queues`` and ``max_concurrency``: several queues per worker;
       ``global_limit``: fleet-wide limits. ``group_limit``: per-group limits
       with fair claims. ``rate_limit``: fleet-wide rate limits.
       The options are one checked `WorkerOptions` (`options`);
       `with_options` copies a worker with some of them changed.
    """

    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        *,
        queue: str | None = None,
        concurrency: int | None = None,
        queues: Mapping[str, int] | None = None,
        max_concurrency: int | None = None,
        global_limit: int | Mapping[str, int] | None = None,
        group_limit: int | Mapping[str, int] | None = None,
        rate_limit: RateLimit | Mapping[str, RateLimit] | None = None,
        prefetch: int | None = None,
        poll_interval: float = 5.0,
        listen: bool | str = True,
        connections: Connections | None = None,
        backoff: Backoff = default_backoff,
        rescue_after: float = 300.0,
        job_timeout: float | None = None,
        block_warning: float | None = 0.5,
        unknown_types: Literal["dead", "wait"] = "wait",
        retain: float | None = None,
        shutdown_grace: float | None = 30.0,
        middleware: Sequence[Middleware] = (),
        observers: Sequence[Observer] = (),
        logger: Logger | None = None,
    ) -> None:
        self._init(
            pool,
            WorkerOptions(
                queue=queue,
                concurrency=concurrency,
                queues=queues,
                max_concurrency=max_concurrency,
                global_limit=global_limit,
                group_limit=group_limit,
                rate_limit=rate_limit,
                prefetch=prefetch,
                poll_interval=poll_interval,
                listen=listen,
                connections=connections,
                backoff=backoff,
                rescue_after=rescue_after,
                job_timeout=job_timeout,
                block_warning=block_warning,
                unknown_types=unknown_types,
                retain=retain,
                shutdown_grace=shutdown_grace,
                middleware=middleware,
                observers=observers,
                logger=logger,
            ),
        )

    def _init(self, pool: asyncpg.Pool[Any], options: WorkerOptions) -> None:
        """Set the worker up from checked ``options`` (no I/O)."""
        self._options = options
        self._pool = pool
        # The methods the observers have (each one is optional), looked up once.
        self._observe_written = _methods(options.observers, "on_written")
        self._observe_rescued = _methods(options.observers, "on_rescued")
        self._logger = default_logger(options.logger)
        self._handlers: dict[str, Handler] = {}
        self._registered: dict[str, Handler] = {}  # unwrapped, for with_options
        self._schedules = Schedules()
        self._state: Literal["new", "running", "stopped"] = "new"
        self._stop_requested = False
        self._fatal: BaseException | None = None
        self._statement_timeout = STATEMENT_TIMEOUT
        self._listener_keepalive = LISTEN_KEEPALIVE
        self._listener_probe_timeout = LISTEN_PROBE_TIMEOUT
        self._listener: ListenerRoute | None = None
        self._lanes = tuple(Lane(lane, options) for lane in lane_settings(options))
        self._fields: dict[str, object] = (
            {"queue": options.queue}
            if options.queues is None
            else {"queues": list(options.queues)}
        )
        cap = options.max_concurrency
        self._budget = (
            Budget(cap, [lane.claims for lane in self._lanes])
            if cap is not None
            and cap < sum(lane.claims.capacity for lane in self._lanes)
            else None
        )
        # The one queue's ledger (the first queue's, with several).
        self._claims = self._lanes[0].claims
        # Made in run(): they need a running event loop.
        self._finished: anyio.Event
        self._claim_scope: anyio.CancelScope
        self._jobs_scope: anyio.CancelScope | None = None
        self._keeper: LeaseKeeper | None = None
        self._threads: anyio.CapacityLimiter | None = None

    @property
    def options(self) -> WorkerOptions:
        """The options this worker was made with, checked.

        .. versionadded:: 0.1
        """
        return self._options

    @property
    def pool(self) -> asyncpg.Pool[Any]:
        """The pool the worker was given (borrowed; the worker never closes it).

        .. versionadded:: 0.1
        """
        return self._pool

    @property
    def job_types(self) -> Sequence[str]:
        """The job types with a handler, in the order they were registered.

        .. versionadded:: 0.1
        """
        return tuple(self._registered)

    @property
    def state(self) -> Literal["new", "running", "stopped"]:
        """``"new"`` until `run` starts, ``"running"``, then ``"stopped"`` once it has returned.

        .. versionadded:: 0.1
        """
        return self._state

    @property
    def queue(self) -> str:
        """The queue this worker consumes (in the one-queue form).

        Raises:
            AttributeError: the worker consumes several queues (see `queues`).
        """
        queue = self._options.queue
        if queue is None:
            msg = f"this worker consumes several queues ({', '.join(self.queues)}); see Worker.queues"
            raise AttributeError(msg)
        return queue

    @property
    def queues(self) -> Mapping[str, int]:
        """Every queue this worker consumes, with its concurrency (one entry in the one-queue form)."""
        return {lane.settings.name: lane.settings.concurrency for lane in self._lanes}

    @property
    def running_jobs(self) -> int:
        """How many handlers are running now (across every queue)."""
        return sum(lane.claims.running for lane in self._lanes)

    @property
    def listener_pid(self) -> int | None:
        """The backend pid of the LISTEN connection while it is up."""
        return None if self._listener is None else self._listener.pid

    def register(
        self, job_type: str | JobType[P], handler: Callable[[Job[P]], Any]
    ) -> None:
        """Run ``handler`` for jobs of ``job_type``, wrapped in the worker's middleware.

        ``job_type`` may be a `JobType`: the handler then gets ``job.payload``
        as its payload type.

        An async handler runs on the event loop. Any other callable (a plain
        ``def``) runs in a worker thread, at most as many at once as the
        worker runs jobs. A thread cannot be interrupted: a handler past
        ``job_timeout`` runs to its end and its attempt then fails as timed
        out; `stop` whose timeout runs out waits for it and records what it
        returned (raising `TimeoutError` all the same).

        Raises:
            AlreadyStartedError: the worker has started.
            TypeError, ValueError: a bad job type or a handler that is not
                callable; a `JobType` of a queue this worker does not consume.
        """
        if self._state != "new":
            msg = "register() called after run() started; register every handler first"
            raise AlreadyStartedError(msg)
        if isinstance(job_type, JobType):
            handler = job_type._handler(handler, self.queues)
            job_type = job_type.name
        check_job_type(job_type)
        check_callable("handler", handler)
        self._registered[job_type] = handler
        if not is_async(handler):
            handler = in_thread(handler, self._thread_limiter)
        handler = typed_handler(handler)
        for wrap in reversed(self._options.middleware):
            handler = wrap(handler)
        self._handlers[job_type] = handler

    @overload
    def handler(self, job_type: str) -> Callable[[H], H]: ...
    @overload
    def handler(self, job_type: JobType[P]) -> HandlerDecorator[P]: ...
    def handler(self, job_type: str | JobType[Any]) -> Callable[[Any], Any]:
        """Register the decorated function (async, or a plain ``def``) for jobs of ``job_type`` (a str or a `JobType`).

        The function is returned unwrapped, so it can still be called directly.
        """

        def decorate(fn: Any) -> Any:
            self.register(job_type, fn)
            return fn

        return decorate

    def periodic(
        self,
        name: str,
        cron: str | None = None,
        *,
        every: float | None = None,
        job_type: str,
        payload: Any = None,
        queue: str | None = None,
        tz: str = "UTC",
        unique: bool = True,
        max_lateness: float = 600.0,
        max_attempts: int = 5,
    ) -> None:
        """Enqueue a job of ``job_type`` at every tick of a schedule, once however many workers run it.

        Every worker (in any process) that registers the schedule runs it,
        without a leader: the tick's job is inserted by the statement that
        advances the schedule's row in ``pgqueue_periodic``, so one of them
        enqueues it and the others nothing. Ticks are due by the database's
        clock. A new schedule starts with the first tick after it is first
        registered. When no worker ran at a tick, the latest tick missed
        is run once when one starts, if it is at most ``max_lateness``
        seconds old; earlier ones are never run. The job is an ordinary job
        (retries, dead letters, listings); its tick is `Job.tick` (kept in
        its ``unique_key``, ``periodic:<name>@<tick>``). ``pgqueue periodic
        remove NAME`` forgets a schedule's row; a worker that still
        registers it makes it again at its next tick.

        Args:
            name: the schedule's name, the same in every worker that runs it.
            cron: a cron expression in ``tz`` (the ``cron`` extra): 5 fields
                (minute hour day month weekday), or 6 with seconds first;
                ``@hourly``, ``@daily`` and such; ``H`` fields are hashed
                from the name.
            every: instead of ``cron``, a period in seconds; ticks are
                multiples of it since the Unix epoch (UTC), the same in
                every process.
            job_type: the type of the jobs enqueued.
            payload: their payload (JSON, as `Queue.enqueue` takes it).
            queue: their queue; this worker's by default (of several, the
                first in ``queues``).
            tz: the IANA time zone ``cron`` is read in.
            unique: skip a tick while the previous job of the schedule is
                pending or running (the tick still counts as run).
            max_lateness: the most seconds a tick may be late and still run.
            max_attempts: the attempts of each job.

        Raises:
            AlreadyStartedError: the worker has started.
            TypeError, ValueError: a bad argument, an invalid cron
                expression or time zone, both or neither of cron and every,
                a name already registered (nothing is registered).
            ModuleNotFoundError: a cron schedule without croniter installed.

        .. versionadded:: 0.1
        """
        if self._state != "new":
            msg = "periodic() called after run() started; register every schedule first"
            raise AlreadyStartedError(msg)
        self._schedules.add(
            check_schedule(
                name=name,
                cron=cron,
                every=every,
                job_type=job_type,
                payload=payload,
                queue=queue,
                tz=tz,
                unique=unique,
                max_lateness=max_lateness,
                max_attempts=max_attempts,
            )
        )

    def _thread_limiter(self) -> anyio.CapacityLimiter | None:
        """What bounds the threads of sync handlers (made in run())."""
        return self._threads

    @property
    def _default_queue(self) -> str:
        """The queue of schedules registered without one: the worker's first."""
        return next(iter(self.queues))

    def with_options(self, **changes: Any) -> Worker:
        """A new, unstarted worker with ``changes`` to this one's options and the same handlers and schedules.

        Every option left out keeps its value; the handlers are registered
        again, so new ``middleware`` wraps them too. ``queues`` replaces
        ``queue`` and ``concurrency``, and ``queue`` replaces ``queues``
        (the copy consumes that one queue, with its ``concurrency`` if
        given). This worker is left as it is, started or not.

        Raises:
            TypeError, ValueError: an option `Worker` does not take, or a
                bad value (as `Worker` raises them); nothing is copied.

        .. versionadded:: 0.1
        """
        copy = object.__new__(type(self))
        copy._init(self._pool, self._options.changed(**changes))
        for job_type, handler in self._registered.items():
            copy.register(job_type, handler)
        copy._schedules = self._schedules.copy()
        return copy

    async def run(
        self,
        *,
        until_empty: bool = False,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Claim and run jobs until `stop` is called or this task is cancelled.

        Returns after the drain: in-flight handlers finished, every outcome
        written, connections closed. Cancelling the task that runs it stops
        the worker the same way, cutting handlers off after
        ``shutdown_grace``, and then propagates the cancellation.

        ``await task_group.start(worker.run)`` returns once the worker is
        ready: the schema checked and, with ``listen``, LISTEN up (so a job
        enqueued from then on wakes it at once).

        Args:
            until_empty: return once no job is ready to run and none is
                running (retries scheduled for later do not count). Meant
                for tests of handlers and for batch jobs; no LISTEN is used.

        Raises:
            AlreadyStartedError: ``run()`` was called before.
            SchemaError: the ``pgqueue_jobs`` table, or a column of it, is
                missing (raised at once, before any job is claimed).
            SystemExit, KeyboardInterrupt: a handler raised it; the worker
                stopped first, cutting the other handlers off, and wrote
                every outcome (the jobs cut off are pending again).
        """
        if self._state != "new":
            msg = "this worker has already been started; create a new Worker"
            raise AlreadyStartedError(msg)
        self._state = "running"  # not a status
        self._finished = anyio.Event()
        self._claim_scope = anyio.CancelScope()
        if self._stop_requested:
            self._claim_scope.cancel()
        started = False
        try:
            self._start(until_empty=until_empty)
            async with anyio.create_task_group() as host:
                host.start_soon(self._supervise, until_empty)
                try:
                    await self._ready_or_finished()
                    if not self._finished.is_set():
                        task_status.started()
                        started = True
                    await self._finished.wait()
                except anyio.get_cancelled_exc_class():
                    self._request_stop()
                    with anyio.CancelScope(shield=True):
                        await self._drain_within(self._options.shutdown_grace)
                    raise
        finally:
            self._state = "stopped"
            # Set by the supervisor when it ran; not when the start-up failed.
            self._finished.set()
        if self._fatal is not None:
            raise self._fatal
        if not started:
            task_status.started()

    async def stop(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 - the drain's own bound
        """Stop claiming, wait for in-flight handlers, write their outcomes, close.

        Safe to call more than once, before or without `run`, and after
        `run` ended however it ended (a failed start included). Called
        from inside one of this worker's handlers (or a task it started),
        it asks the worker to stop and returns at once: the drain waits for
        that handler.

        Args:
            timeout: seconds to wait for in-flight handlers; ``None`` waits
                for as long as they take.

        Raises:
            TimeoutError: the handlers did not finish in time. They were
                cut off, and their jobs are back in ``pending`` (attempt
                counted; dead if that was their last) by the time this is
                raised.
            ValueError, TypeError: a negative or non-number ``timeout``
                (nothing is stopped).
        """
        bound = None if timeout is None else check_duration("timeout", timeout)
        self._request_stop()
        if self._state == "new" or RUNNING_FOR.get(None) is self:
            return
        if bound is None:
            await self._finished.wait()
            return
        with anyio.move_on_after(bound):
            await self._finished.wait()
            return
        cut_off = self._cut_off()
        await self._finished.wait()
        msg = f"worker did not drain within {bound:g} s; {cut_off} job(s) returned to pending"
        raise TimeoutError(msg)

    def _start(self, *, until_empty: bool) -> None:
        """Build the worker's parts and say it starts (what may fail before the supervisor runs)."""
        self._build(until_empty=until_empty)
        options = self._options
        self._logger.info(
            "worker starting",
            extra={"queue": options.queue, "concurrency": options.concurrency}
            if options.queues is None
            else {"queues": self.queues, "max_concurrency": options.max_concurrency},
        )

    def _build(self, *, until_empty: bool) -> None:
        """Make the worker's parts; they need a running event loop."""
        logger, options = self._logger, self._options
        # Given none, the worker makes a Connections of its own, entered and
        # closed by the supervisor (a shared one is its owner's to close).
        self._private: Connections | None = None
        # A Connections (checked by the options, which sit below its module).
        connections = cast("Connections | None", options.connections)
        if connections is None:
            connections = self._private = private_connections(
                self._pool,
                logger=logger,
                listen=options.listen if isinstance(options.listen, str) else None,
                statement_timeout=self._statement_timeout,
                keepalive=self._listener_keepalive,
                probe_timeout=self._listener_probe_timeout,
            )
        else:
            connections.check_entered()  # before any task starts
        self._connections_used = connections
        claim_connection = connections.claims
        write_connection = connections.writes
        upkeep_connection = connections.upkeep
        slots = sum(lane.settings.concurrency for lane in self._lanes)
        if options.max_concurrency is not None:
            slots = min(slots, options.max_concurrency)
        self._threads = anyio.CapacityLimiter(slots)
        self._runner = JobRunner(
            self._handlers,
            job_timeout=options.job_timeout,
            backoff=SafeBackoff(options.backoff, logger),
            logger=logger,
            checkpoints=Checkpoints(upkeep_connection),
            durable=Durable(upkeep_connection, _enqueue_child),
        )
        self._routes = routes = Routes(self._lanes, self._runner)
        self._writer = OutcomeWriter(
            write_connection,
            routes.settled,
            logger=logger,
            fields=self._fields,
            on_written=self._on_written,
        )
        worker = worker_id()
        leases = routes.build(
            LaneServices(
                connection=claim_connection,
                put=self._writer.put,
                runner=self._runner,
                logger=logger,
                worker=worker,
                owner=self,
                cut_off=self._cut_off_called,
                on_exit=self._exit,
                budget=self._budget,
                types=list(self._handlers) if options.unknown_types == "wait" else None,
            ),
        )
        self._upkeep = Upkeep(
            upkeep_connection,
            routes.held_keys_by_queue,
            options,
            fields=self._fields,
            logger=logger,
            on_rescued=routes.wake_queues,
            on_cancel_requested=routes.cancel,
            on_swept=self._on_swept if self._observe_rescued else None,
        )
        self._keeper = (
            LeaseKeeper(
                upkeep_connection,
                leases,
                options,
                worker=worker,
                logger=logger,
                fields=self._fields,
                on_room=routes.wake,
            )
            if leases
            else None
        )
        self._hints = CancelHints(
            read_cancel_requested(upkeep_connection),
            holds=routes.holds,
            cancel=routes.cancel,
            logger=logger,
            fields=self._fields,
        )
        self._listening = anyio.Event()
        self._listens = options.listen is not False and not until_empty
        if not self._listens:
            self._listening.set()

    async def _supervise(self, until_empty: bool) -> None:
        connections = self._connections_used
        # One warning when the database becomes unavailable, one line when back.
        outage = Outage(self._logger, fields=self._fields)
        try:
            with anyio.CancelScope(shield=True):
                async with self._private or contextlib.nullcontext():
                    connections._watch(outage)
                    async with anyio.create_task_group() as services:
                        services.start_soon(self._writer.run)
                        block_warning = self._options.block_warning
                        if block_warning is not None:
                            watch = LoopWatch(block_warning, self._logger, self._fields)
                            services.start_soon(watch.run)
                        if self._listens:
                            self._listener = connections.route(
                                [JOBS_CHANNEL, CONTROL_CHANNEL],
                                self._on_notify,
                                on_connect=self._on_listen,
                            )
                            services.start_soon(self._listener.run)
                            services.start_soon(self._after_check, self._hints.run)
                        services.start_soon(self._after_check, self._upkeep.heartbeats)
                        services.start_soon(self._after_check, self._upkeep.rescue)
                        if self._keeper is not None:
                            services.start_soon(self._after_check, self._keeper.run)
                        if self._options.retain is not None:
                            services.start_soon(
                                self._after_check, self._upkeep.retention
                            )
                        if self._schedules:
                            services.start_soon(
                                self._after_check,
                                self._schedules.run,
                                connections.upkeep,
                                self._default_queue,
                                self._logger,
                            )
                        try:
                            await self._run_jobs(until_empty)
                        finally:
                            await self._settle()
                            services.cancel_scope.cancel()
                    if self._keeper is not None:
                        await self._keeper.release()
        finally:
            connections._unwatch(outage)
            try:
                self._logger.info("worker stopped", extra=self._fields)
            finally:
                self._finished.set()

    async def _run_jobs(self, until_empty: bool) -> None:
        routes = self._routes
        try:
            async with anyio.create_task_group() as jobs:
                self._jobs_scope = jobs.cancel_scope
                for lane in routes.lanes:
                    for _ in range(lane.settings.concurrency):
                        jobs.start_soon(lane.consumers.run)
                try:
                    with self._claim_scope:
                        await routes.claim(until_empty=until_empty)
                except Exception as exc:
                    # Stop as stop() would, so that every outcome is written.
                    if not isinstance(exc, SchemaError):
                        self._logger.error(
                            "worker failed; stopping",
                            exc_info=exc,
                            extra=self._fields,
                        )
                    self._fatal = exc
                    self._request_stop()
                finally:
                    routes.close(stopping=self._stop_requested)
        finally:
            routes.give_back(self._writer.put)

    async def _settle(self) -> None:
        """Wait until every outcome is durable, for at most FLUSH_TIMEOUT."""
        with anyio.move_on_after(FLUSH_TIMEOUT):
            await self._routes.wait_empty()
            return
        self._logger.error(
            "could not write every job outcome before stopping; "
            "the rescue sweep will re-run those jobs",
            extra={
                "count": self._routes.held,
                **self._fields,
            },
        )

    async def _after_check(self, loop: Callable[..., Any], *args: object) -> None:
        """Run an upkeep loop once the schema is known to be there."""
        await self._routes.checked.wait()
        await loop(*args)

    async def _ready_or_finished(self) -> None:
        async with anyio.create_task_group() as tg:

            async def ready() -> None:
                await self._routes.checked.wait()
                await self._listening.wait()
                tg.cancel_scope.cancel()

            async def finished() -> None:
                await self._finished.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(ready)
            tg.start_soon(finished)

    async def _drain_within(self, grace: float | None) -> None:
        """Wait for the drain, cutting handlers off once ``grace`` runs out."""
        with anyio.move_on_after(grace if grace is not None else float("inf")):
            await self._finished.wait()
            return
        self._cut_off()
        await self._finished.wait()

    def _request_stop(self) -> None:
        self._stop_requested = True
        if self._state == "running":  # not a status
            self._claim_scope.cancel()

    def _cut_off(self) -> int:
        """Cancel every running handler (their jobs go back to pending); return how many."""
        running = self.running_jobs
        if self._jobs_scope is not None:
            self._jobs_scope.cancel()
        return running

    def _cut_off_called(self) -> bool:
        """Whether running handlers are being cancelled by the worker itself."""
        return self._jobs_scope is not None and self._jobs_scope.cancel_called

    def _exit(self, exc: BaseException) -> None:
        """A handler raised ``SystemExit`` or ``KeyboardInterrupt``: stop now, then raise it."""
        self._logger.warning(
            "a handler asked the process to exit; stopping",
            extra={"error": type(exc).__name__, **self._fields},
        )
        if self._fatal is None:
            self._fatal = exc
        self._request_stop()
        self._cut_off()

    def _on_written(
        self, outcomes: Sequence[Outcome], fenced: Sequence[Outcome]
    ) -> None:
        self._routes.written(outcomes)
        if self._observe_written:
            if fenced:
                stale = {outcome.key for outcome in fenced}
                outcomes = [o for o in outcomes if o.key not in stale]
            call_observers(self._observe_written, self._logger, outcomes, fenced)

    def _on_swept(self, queue: str, statuses: Mapping[str, int]) -> None:
        call_observers(self._observe_rescued, self._logger, queue, statuses)

    def _on_notify(self, channel: str, payload: str) -> None:
        if channel == JOBS_CHANNEL:
            # Only the lane of the queue named: the others claim nothing.
            self._routes.wake(payload)
        else:  # the control channel: a hint of a cancel request
            self._hints.hint(payload)

    async def _on_listen(self, _reconnected: bool) -> None:
        # Enqueues may have been missed while the connection was not up:
        # while starting as much as after a loss; for every queue.
        self._listening.set()
        self._routes.wake_all()

    def __repr__(self) -> str:
        options = self._options
        if options.queues is not None:
            return f"Worker(queues={options.queues!r}, max_concurrency={options.max_concurrency}, state={self._state!r})"
        return f"Worker(queue={options.queue!r}, concurrency={options.concurrency}, state={self._state!r})"


async def _enqueue_child(
    connection: Any, queue: str, job_type: str, payload: Any, options: dict[str, Any]
) -> int:
    """A durable handler's child job (`pgqueue.Job.spawn`), enqueued on ``connection``, in its transaction."""
    return await queue_on(connection, queue).enqueue(
        job_type, payload, connection=connection, **options
    )


def _methods(observers: Sequence[Observer], name: str) -> list[Callable[..., Any]]:
    """The methods called ``name`` of those ``observers`` that have one."""
    methods = []
    for observer in observers:
        method = getattr(observer, name, None)
        if method is not None:  # callable: WorkerOptions checked it
            methods.append(method)
    return methods
