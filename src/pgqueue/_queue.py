"""The producer side: enqueue jobs and prune finished ones."""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, Unpack, cast

import asyncpg

from pgqueue._copy import COPY_MAX_DELAY, COPY_MIN_JOBS, Rows, copy_jobs
from pgqueue._core.checks import (
    check_duration,
    check_job_id,
    check_max_attempts,
    check_queue_name,
    check_signal,
)
from pgqueue._core.codec import (
    encode_each,
    encode_payload,
    encode_payloads,
    payload_encoder,
)
from pgqueue._core.dsn import target_of
from pgqueue._core.errors import DuplicateJobError, JobNotFoundError, SchemaError
from pgqueue._core.hooks import EnqueueEvent, EnqueueHook, told
from pgqueue._core.job import NewJob
from pgqueue._core.log import Logger, default_logger
from pgqueue._core.request import Batch, Request, check_jobs, check_request
from pgqueue._gather import gatherer_for
from pgqueue._sql.enqueue import NOTIFY_JOBS
from pgqueue._sql.schema import (
    CITUS_INSTALLED,
    SCHEMA,
    SCHEMA_DISTRIBUTED,
    SCHEMA_DOWN,
    SCHEMA_UPGRADE,
    TABLE_EXISTS,
)
from pgqueue._store.plan import Enqueued, Plan
from pgqueue._store.postgres import Store
from pgqueue._store.schema import (
    DEPENDENCIES_MISSING,
    REPLACE_MISSING,
    SCHEMA_ERRORS,
    forget,
    schema_failure,
    store_for,
)
from pgqueue._wake import waker_for

if TYPE_CHECKING:
    import json
    from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence

    from asyncpg.pool import PoolConnectionProxy

    from pgqueue._core.job import EnqueueOptions

__all__ = [
    "Connection",
    "Executor",
    "Queue",
    "encode_batch",
    "enqueue_batch",
    "enqueue_request",
    "install",
    "send_signal",
    "uninstall",
]

Connection: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"
"""An asyncpg connection, or one acquired from a pool."""

Executor: TypeAlias = "asyncpg.Pool[Any] | Connection"
"""An asyncpg pool, or a connection (inside a transaction, writes ride it)."""


class _Deferred:
    """The queues enqueued to in a `Queue.transaction`, woken after its commit."""

    __slots__ = ("connection", "queues")

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.queues: dict[str, None] = {}


_deferred: ContextVar[_Deferred | None] = ContextVar("pgqueue_deferred", default=None)


async def install(executor: Executor, *, distributed: bool = False) -> None:
    """Create or bring up to date the ``pgqueue_jobs`` table: `SCHEMA`, then `SCHEMA_UPGRADE`.

    Idempotent: it applies only what is missing, on an empty database, on
    a table the Go module created, or on one already up to date. Meant for
    quick starts and tests; applications should put `SCHEMA` (or, for an
    existing table, `SCHEMA_UPGRADE`) in their own migrations.

    With ``distributed``, on a Citus coordinator: `SCHEMA_DISTRIBUTED`
    (jobs, limits and leases distributed by queue; see "Scaling past one
    server" in the documentation).

    Raises:
        SchemaError: ``distributed`` on a database without the citus extension.

    .. versionchanged:: 0.1
       ``distributed``.
    """
    if distributed:
        if not await executor.fetchval(CITUS_INSTALLED):
            msg = (
                "distributed=True needs the citus extension (a Citus coordinator "
                "with CREATE EXTENSION citus); this database does not have it"
            )
            raise SchemaError(msg, where=target_of(executor))
        await executor.execute(SCHEMA_DISTRIBUTED)
    else:
        if not await executor.fetchval(TABLE_EXISTS):
            await executor.execute(SCHEMA)
        await executor.execute(SCHEMA_UPGRADE)
    forget(executor)


async def uninstall(executor: Executor) -> None:
    """Drop the ``pgqueue_jobs`` table by running `SCHEMA_DOWN`."""
    await executor.execute(SCHEMA_DOWN)
    forget(executor)


class Queue:
    """Enqueue jobs onto one named queue.

    The pool is borrowed, never closed. Constructing a queue does no I/O.

    Args:
        pool: the asyncpg pool to write through.
        name: the queue's name; workers consume one queue each.
        max_attempts: the default for jobs enqueued without their own.
        logger: where to log; the ``pgqueue`` logger by default.
        hooks: told of every enqueue, for metrics and tracing
            (`pgqueue.prometheus.ProducerMetrics`, `pgqueue.otel.Tracing`);
            see `EnqueueHook`.
        json_encoder: called, as ``json.dumps``'s ``default``, with each
            value of a payload that JSON has no type for (a ``datetime``, a
            ``UUID``...); it returns a value JSON can hold (``str`` will
            do) or raises ``TypeError``. What it returns is held to the
            rules of any payload. (Dataclass and pydantic payloads encode
            those types without it.)

    Usage::

        queue = pgqueue.Queue(pool)
        job_id = await queue.enqueue("send_welcome_email", {"user_id": "01J5"})
    """

    __slots__ = (
        "_encoder",
        "_executor",
        "_hooks",
        "_logger",
        "_max_attempts",
        "_name",
        "_store",
        "_waker_pool",
    )

    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        name: str = "default",
        max_attempts: int = 5,
        *,
        logger: Logger | None = None,
        hooks: Sequence[EnqueueHook] = (),
        json_encoder: Callable[[Any], Any] | None = None,
    ) -> None:
        # Wakeups after commit need a pool to open the waker's connection like.
        waker_pool = pool if isinstance(cast("object", pool), asyncpg.Pool) else None
        self._setup(pool, waker_pool, name, max_attempts, logger, hooks, json_encoder)

    @classmethod
    def _on(
        cls,
        connection: Connection,
        name: str = "default",
        max_attempts: int = 5,
        *,
        json_encoder: Callable[[Any], Any] | None = None,
    ) -> Queue:
        """A queue that writes on ``connection`` alone, never through a pool.

        Its enqueues without ``connection=`` run on ``connection`` too, with
        their wakeup in the statement (there is no pool for a waker).
        """
        queue = cls.__new__(cls)
        queue._setup(connection, None, name, max_attempts, None, (), json_encoder)
        return queue

    def _setup(
        self,
        executor: Executor,
        waker_pool: asyncpg.Pool[Any] | None,
        name: str,
        max_attempts: int,
        logger: Logger | None,
        hooks: Sequence[EnqueueHook],
        json_encoder: Callable[[Any], Any] | None,
    ) -> None:
        self._executor = executor
        self._waker_pool = waker_pool
        self._name = check_queue_name(name)
        self._max_attempts = check_max_attempts(max_attempts)
        self._logger = default_logger(logger)
        self._hooks = tuple(hooks)
        self._encoder = payload_encoder(json_encoder)
        self._store: Store | None = None

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._name

    @property
    def max_attempts(self) -> int:
        """The default number of attempts for a job."""
        return self._max_attempts

    async def enqueue(
        self,
        job_type: str,
        payload: Any = None,
        *,
        connection: Connection | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> int:
        """Insert a job and wake the queue's workers.

        Without ``connection``: one round trip, which returns once the row
        is committed. The wakeup (a NOTIFY on ``pgqueue_jobs``) rides that
        statement when no other enqueue of the pool is in flight and no
        wakeup is pending (a lone notifying commit holds up nobody); else
        it is sent after the commit, from a connection of pgqueue's own,
        coalesced with the wakeups of other enqueues in this process.
        With ``connection`` inside a transaction, the row and its wakeup
        (sent in that transaction) become visible only if it commits; in a
        `transaction` block, the wakeup is sent after the block commits.

        Args:
            job_type: selects the handler that runs the job.
            payload: any JSON-serializable value (``None`` is stored as
                ``{}``), a dataclass or a pydantic model, or ``bytes``
                holding JSON text.
            run_at: a timezone-aware time before which the job does not run.
            delay: instead of ``run_at``, seconds (or a ``timedelta``)
                before the job may run, counted from the database's
                ``now()`` (the transaction's start, with ``connection``
                inside one), not from this machine's clock.
            max_attempts: overrides the queue's default.
            priority: from -5 to 5; a worker takes higher priorities first,
                and jobs of one priority by ``run_at``, then id. (A Go worker
                ignores priority.)
            unique_key: while a job of the same ``job_type`` and key is
                pending or running, enqueueing another inserts nothing and
                returns the existing job's id (no wakeup either). Once that
                job is completed, dead or cancelled, the key is free again.
            on_conflict: ``"raise"`` raises `DuplicateJobError` for such a
                duplicate instead of returning the existing id.
                ``"replace"``: a pending job of the key that has not started
                an attempt takes this job's payload and options (its id is
                returned); if it has started (running, or pending for a
                retry), it is left alone and this job is enqueued to run
                after it ends (``waiting`` until then), and its id is
                returned. See :doc:`/howto/priorities-and-unique-jobs`.
            debounce: seconds (or a ``timedelta``) with ``unique_key``: the
                job runs that long after the last enqueue of its key, with
                the last enqueue's payload (``on_conflict="replace"`` with
                ``delay=debounce``). Not with ``run_at``, ``delay`` or
                ``on_conflict="raise"``.
            track: announce the job's outcome to `Tracker` waits at once (an
                untracked job's outcome is found by the tracker's poll).
            after: ids of jobs this one waits for (its parents): it is
                ``waiting`` until each has ended, then ``pending``, in the
                transaction of the last parent's outcome; its handler reads
                their results as `Job.parent_results`. A parent already
                ended counts at once. Not with ``unique_key``. See
                :doc:`/howto/workflows`.
            on_parent_failure: what a parent ending ``dead`` or
                ``cancelled`` does: ``"cancel"`` cancels this job (and its
                own waiting children, in turn); ``"run"`` lets it run once
                every parent has ended, however.
            group: the job's group (a tenant, a customer: ``"customer:42"``):
                a worker with a ``group_limit`` runs at most that many jobs
                of one group at once, groups taken round-robin (see
                :doc:`/howto/flow-control`). Not with ``after``.
            connection: run on this connection (and its transaction).

        Returns:
            The new job's id (or the existing one's, for a duplicate key;
            for a replacing enqueue, the id of the job that runs with this
            payload: the replaced one's, or the new one's queued after a
            started job).

        Raises:
            DuplicateJobError: a duplicate key, with ``on_conflict="raise"``.
            JobNotFoundError: a parent in ``after`` that no job has
                (nothing is written).
            TypeError: a payload that is not JSON-serializable (the message
                names the field), or an argument of the wrong type.
            ValueError: bytes that are not JSON, a NUL character, an empty
                job type or key, ``max_attempts < 1``, a priority out of
                range, a naive ``run_at``, a negative ``delay``, or both
                ``run_at`` and ``delay``; ``on_conflict="replace"`` or
                ``debounce`` without a key, a ``debounce`` that is not
                positive or comes with ``run_at``, ``delay`` or
                ``on_conflict="raise"``.
        """
        request = check_request(
            job_type, payload, default_attempts=self._max_attempts, **options
        )
        text = encode_payload(payload, self._encoder)
        if not self._hooks:
            return await self._enqueue(request, text, connection)
        fields: dict[str, Any] = {
            name: value for name, value in options.items() if name != "on_conflict"
        }
        new_job = NewJob(
            request.job_type,
            payload,
            **{
                **fields,  # as given: delay, max_attempts, debounce
                "run_at": request.run_at,
                "priority": request.priority,
                "unique_key": request.unique_key,
                "track": request.track,
                "after": request.after,
                "on_parent_failure": request.on_parent_failure,
                "group": request.group,
            },
        )
        event = EnqueueEvent(self._name, (new_job,), batch=False)
        return await told(
            self._hooks,
            event,
            self._logger,
            lambda: self._enqueue(request, text, connection, event),
        )

    async def _enqueue(
        self,
        request: Request,
        payload: str,
        connection: Connection | None,
        event: EnqueueEvent | None = None,
    ) -> int:
        """`enqueue` once its arguments are checked (and its hooks told)."""
        trace_context = None if event is None else event.trace_context
        if (
            connection is None
            and self._waker_pool is not None
            and trace_context is None
            and not request.after
            and not request.replaces
        ):
            done: Enqueued = await gatherer_for(self._waker_pool).submit(
                self._name, (request, payload), self._alone, self._together
            )
        else:
            done = await self._one(request, payload, connection, trace_context)
        job_id, duplicate = done.ids[0], done.duplicates[0]
        if event is not None:
            event.ids.append(job_id)
            event.duplicates.append(duplicate)
        extra = {"job_id": job_id, "job_type": request.job_type, "queue": self._name}
        if done.existing is not None:
            if request.conflict == "raise":
                raise DuplicateJobError(*done.existing)
            self._logger.debug("job already enqueued with its unique key", extra=extra)
        elif duplicate:
            self._logger.debug(
                "job replaced by an enqueue of its unique key", extra=extra
            )
        else:
            self._logger.debug("job enqueued", extra=extra)
        return job_id

    async def _one(
        self,
        request: Request,
        payload: str,
        connection: Connection | None,
        trace_context: str | None,
        *,
        held: Connection | None = None,
    ) -> Enqueued:
        """The statement of one enqueue, on ``connection`` or the pool.

        ``held``: without ``connection``, the pool's connection to run on
        (one `pgqueue._gather` holds); the statement commits by itself.
        """
        executor = (held or self._executor) if connection is None else connection
        store = self._store or await self._store_of(executor)
        with self._wakeup(connection) as wake:
            plan = store.plan_one(
                self._name, request, payload, trace_context, notify=wake is None
            )
            return await self._write(executor, connection, plan, wake)

    async def _alone(self, item: tuple[Request, str], held: Connection) -> Enqueued:
        """An enqueue on the pool that found room (`pgqueue._gather`): its own statement."""
        return await self._one(*item, None, None, held=held)

    async def _together(
        self, items: Sequence[tuple[Request, str]], held: Connection
    ) -> list[Enqueued | BaseException]:
        """Enqueues gathered on the pool (`pgqueue._gather`): one statement, each its share.

        A job that takes another's place (its key's, pending or running or
        earlier in the batch) is a duplicate for its caller, as it would
        be alone.
        """
        batch = Batch()
        for index, (request, _) in enumerate(items):
            batch.add(request, index)
        # A job whose key an earlier one of the batch has is that one's row
        # (none replaces: those go alone).
        texts: dict[int, str] = {}
        for (_, payload), row in zip(items, batch.index_of, strict=True):
            texts.setdefault(row, payload)
        payloads = "[" + ",".join(texts.values()) + "]"
        store = self._store or await self._store_of(held)
        with self._wakeup(None) as wake:
            plan = store.plan_many(
                self._name, batch, payloads, None, notify=wake is None
            )
            done = await self._write(held, None, plan, wake)
        self._logger.debug(
            "enqueues gathered", extra={"count": len(items), "queue": self._name}
        )
        shares: list[Enqueued | BaseException] = []
        for (request, _), job_id, duplicate in zip(
            items, done.ids, done.duplicates, strict=True
        ):
            key = request.unique_key
            existing = (job_id, key) if duplicate and key is not None else None
            shares.append(Enqueued([job_id], [duplicate], existing, woke=done.woke))
        return shares

    async def _write(
        self,
        executor: Executor,
        connection: Connection | None,
        plan: Plan,
        wake: Callable[[], None] | None,
    ) -> Enqueued:
        """Run ``plan`` on ``executor``; then send its wakeup, if the statement did not."""
        try:
            if plan.dependent and connection is not None:
                # An unknown parent fails a savepoint: the caller's transaction stays usable.
                async with connection.transaction():
                    rows = await connection.fetch(plan.statement, *plan.args)
            elif plan.then:
                rows = await _fetch_all(executor, plan)
            else:
                rows = await executor.fetch(plan.statement, *plan.args)
        except asyncpg.ForeignKeyViolationError as exc:
            if not plan.dependent:
                raise
            raise JobNotFoundError(int(exc.detail or 0)) from exc
        except SCHEMA_ERRORS as exc:
            raise await schema_failure(executor, str(exc)) from exc
        except asyncpg.UndefinedFunctionError as exc:
            missing = DEPENDENCIES_MISSING if plan.dependent else REPLACE_MISSING
            raise SchemaError(
                missing, where=target_of(executor), apply="SCHEMA_UPGRADE"
            ) from exc
        done = plan.read(rows)
        if done.woke:
            if wake is not None:
                wake()
            elif plan.wake_after:
                await executor.execute(NOTIFY_JOBS, self._name)
        return done

    async def _store_of(self, executor: Executor) -> Store:
        """The store of the queue's database: looked up once, on ``executor``.

        The caller's connection when it gave one: the pool may have no
        connection to spare while the caller's transactions hold them all.
        Plain PostgreSQL's while there is no table (not remembered).
        """
        found = await store_for(executor)
        if found is None:
            return Store()
        self._store = found
        return found

    async def enqueue_many(
        self,
        jobs: Iterable[NewJob | tuple[str, Any]],
        *,
        on_conflict: Literal["return", "raise", "replace"] = "return",
        connection: Connection | None = None,
    ) -> list[int]:
        """Insert many jobs in one transaction with a single wakeup (sent as `enqueue` sends it).

        All jobs are checked before anything is sent; one bad job means none
        is written. Returns the ids in input order. One statement inserts
        them, in one round trip; a call of 10,000 jobs or more without a
        ``unique_key`` is copied instead (COPY, faster for large calls:
        the ids, the rows and the wakeup in a few round trips, in a
        transaction of its own unless ``connection`` is in one). One
        statement's payloads travel as one JSON array, so they must stay
        under 256 MB (PostgreSQL's limit for a jsonb value); beyond it the
        server refuses the call and nothing is written.

        Jobs with a ``unique_key`` behave as in `enqueue`: a duplicate of a
        pending or running job gets that job's id, and two jobs of one call
        with the same type and key get the same id (the first one's payload
        and options; with ``on_conflict="replace"`` or ``debounce``, the
        last one's).

        Args:
            jobs: `NewJob` values or ``(job_type, payload)`` tuples.
            on_conflict: ``"raise"`` raises `DuplicateJobError` (for the first
                duplicate of a job already pending or running, after the
                call's new jobs were inserted) instead of returning its id.
                ``"replace"``: each job with a key replaces its key's job,
                as `enqueue` says (jobs with ``debounce`` do in any call).
            connection: run on this connection (and its transaction).

        Raises:
            DuplicateJobError: a duplicate key, with ``on_conflict="raise"``.
            TypeError, ValueError: as `enqueue`, naming the bad job's index.
        """
        hooked = bool(self._hooks)
        new_jobs: list[NewJob] = []
        batch = check_jobs(
            jobs, self._max_attempts, new_jobs if hooked else None, on_conflict
        )
        if not batch.types:
            return []
        payloads = encode_batch(batch, self._encoder)
        if not hooked:
            return await self._enqueue_many(batch, payloads, on_conflict, connection)
        event = EnqueueEvent(self._name, new_jobs, batch=True)
        return await told(
            self._hooks,
            event,
            self._logger,
            lambda: self._enqueue_many(batch, payloads, on_conflict, connection, event),
        )

    async def _enqueue_many(
        self,
        batch: Batch,
        payloads: str | list[str],
        conflict: str,
        connection: Connection | None,
        event: EnqueueEvent | None = None,
    ) -> list[int]:
        """`enqueue_many` once its jobs are checked (and its hooks told).

        ``payloads``: one JSON array for the INSERT path, or each job's JSON
        text for the COPY path (a large batch without unique keys).
        """
        trace_context = None if event is None else event.trace_context
        executor = self._executor if connection is None else connection
        store = self._store or await self._store_of(executor)
        with self._wakeup(connection) as wake:
            done = None
            # Not on Citus: a COPY into the distributed table is a
            # two-phase commit, the plan's INSERTs of one queue are not.
            if isinstance(payloads, list) and store.copies:
                try:
                    ids = await copy_jobs(
                        executor,
                        self._name,
                        _rows(batch, payloads),
                        trace_context,
                        notify=wake is None,
                    )
                except SCHEMA_ERRORS as exc:
                    raise await schema_failure(executor, str(exc)) from exc
                if ids is None:  # COPY was refused (a jsonb codec)
                    payloads = "[" + ",".join(payloads) + "]"
                else:
                    done = Enqueued(ids, [False] * len(ids), None, woke=True)
                    if wake is not None:
                        wake()
            if done is None:
                plan = store.plan_many(
                    self._name, batch, payloads, trace_context, notify=wake is None
                )
                done = await self._write(executor, connection, plan, wake)
        if event is not None:
            event.ids, event.duplicates = done.ids, done.duplicates
        if done.existing is not None and conflict == "raise":
            raise DuplicateJobError(*done.existing)
        self._logger.debug(
            "jobs enqueued", extra={"count": len(done.ids), "queue": self._name}
        )
        return done.ids

    async def cancel(
        self, *job_ids: int, connection: Connection | None = None
    ) -> dict[int, str]:
        """Cancel jobs, in one statement; return what became of each id.

        - ``"cancelled"``: it was pending (or waiting for its parents); now
          it is ``cancelled`` and no worker will claim it (a Go worker
          neither). Its waiting children that cancel on a parent's failure
          are cancelled too, and theirs in turn (see ``after``).
        - ``"requested"``: it was running; the worker running it cancels the
          handler (within a second through a NOTIFY, or at its next
          heartbeat) and the job ends ``cancelled``, never retried, unless
          the handler finishes its work and returns anyway. A Go worker
          ignores the request.
        - ``"finished"``: it was completed, dead or cancelled already;
          nothing is written.
        - ``"not_found"``: no job has that id.

        Any id of any queue may be given. With ``connection`` inside a
        transaction, nothing happens unless it commits.

        Raises:
            TypeError, ValueError: an id that is not a positive int.
        """
        ids = [check_job_id(job_id) for job_id in job_ids]
        if not ids:
            return {}
        executor: Executor = connection if connection is not None else self._executor
        store = self._store or await self._store_of(executor)
        done = await store.cancel(executor, ids)
        self._logger.debug("cancel", extra={"results": done, "queue": self._name})
        return {job_id: done[job_id] for job_id in ids}

    async def signal(
        self,
        job_id: int,
        name: str,
        payload: Any = None,
        *,
        connection: Connection | None = None,
    ) -> bool:
        """Send the signal ``name``, with ``payload``, to the durable handler of job ``job_id``.

        The handler's `Job.wait_for` of ``name`` returns ``payload`` (the
        first signal of a name; later ones are kept as history), whether it
        waits already or not yet: a job parked for it is due at once, and an
        idle worker is woken. Any job of any queue may be signalled. With
        ``connection`` inside a transaction, the signal exists only if it
        commits (and wakes nothing before). The same as
        ``SELECT pgqueue_signal(job_id, name, payload)`` in SQL.

        Returns:
            True once stored; False if the job has ended (completed, dead
            or cancelled): nothing is stored.

        Raises:
            JobNotFoundError: no job has that id.
            TypeError, ValueError: a job id that is not a positive int, a
                name that is empty, over 255 characters or holds a control
                character, a payload that is not JSON or over 64 kB of it
                (before any SQL).
            SchemaError: the schema lacks ``pgqueue_signal`` (apply
                `pgqueue.SCHEMA_UPGRADE`).

        .. versionadded:: 0.1
        """
        text = "null" if payload is None else encode_payload(payload, self._encoder)
        checked, name = check_signal(job_id, name, text)
        executor: Executor = connection if connection is not None else self._executor
        store = self._store or await self._store_of(executor)
        return await send_signal(executor, store, checked, name, text)

    async def prune(
        self, older_than: float, *, connection: Connection | None = None
    ) -> int:
        """Delete this queue's completed, dead and cancelled jobs last updated over ``older_than`` seconds ago.

        Pending and running jobs are never touched. Returns how many rows
        were deleted.

        Raises:
            ValueError: ``older_than`` is negative or not finite.
        """
        seconds = check_duration("older_than", older_than)
        executor: Executor = connection if connection is not None else self._executor
        store = self._store or await self._store_of(executor)
        removed = await store.prune(executor, self._name, seconds)
        if removed:
            self._logger.debug(
                "pruned finished jobs",
                extra={"count": removed, "queue": self._name},
            )
        return removed

    @contextlib.asynccontextmanager
    async def transaction(self, connection: Connection) -> AsyncIterator[None]:
        """A transaction on ``connection`` whose enqueues wake workers after it commits.

        Enqueues with ``connection=`` inside the block (of this queue or any
        other) send no NOTIFY from the transaction: once it commits, one
        wakeup per queue is sent by the pool's waker, from a connection of
        pgqueue's own (always, even when no other enqueue is in flight).
        If the block raises, the transaction rolls back and nothing is
        woken. A NOTIFY in a
        transaction makes its commit wait for every other notifying
        commit; this is the way out for services that commit many
        enqueueing transactions at once.

        Entered while ``connection`` is already in a transaction (which
        commits later, outside the block), the block is a savepoint and the
        enqueues keep their NOTIFY in the transaction.

        Usage::

            async with pool.acquire() as conn, queue.transaction(conn):
                await conn.execute("INSERT INTO orders ...")
                await queue.enqueue("ship", {"order": 42}, connection=conn)
        """
        if connection.is_in_transaction() or self._waker_pool is None:
            async with connection.transaction():
                yield
            return
        deferred = _Deferred(connection)
        token = _deferred.set(deferred)
        try:
            async with connection.transaction():
                yield
        finally:
            _deferred.reset(token)
        if deferred.queues:
            waker_for(self._waker_pool, self._logger).wake(deferred.queues)

    @contextlib.contextmanager
    def _wakeup(
        self, connection: Connection | None
    ) -> Iterator[Callable[[], None] | None]:
        """For the time of an enqueue on ``connection``: what to call after it commits; None: its statement NOTIFYs.

        Without ``connection``, the statement commits by itself on the pool,
        and the pool's waker counts it while it runs (`Waker.enqueuing`):
        alone, it keeps its NOTIFY (a lone notifying commit contends with
        nobody); while other enqueues of the pool are in flight or the
        waker is busy, it is silent and the waker sends its wakeup once it
        has committed. So does one on ``connection`` outside a transaction
        (autocommit). In a `transaction` block on ``connection``, the block
        sends the wakeup after its commit. Otherwise the job rides the
        caller's transaction, and so does its NOTIFY. (A queue on one
        connection, without a pool, always NOTIFYs.)
        """
        if connection is None:
            if self._waker_pool is None:
                yield None
                return
            waker = waker_for(self._waker_pool, self._logger)
            with waker.enqueuing() as alone:
                yield None if alone else lambda: waker.wake((self._name,))
            return
        deferred = _deferred.get()
        if deferred is not None and deferred.connection is connection:
            yield lambda: deferred.queues.setdefault(self._name)
        elif self._waker_pool is not None and not connection.is_in_transaction():
            # Autocommit: the statement commits by itself, as on the pool.
            waker = waker_for(self._waker_pool, self._logger)
            with waker.enqueuing() as alone:
                yield None if alone else lambda: waker.wake((self._name,))
        else:
            yield None

    def __repr__(self) -> str:
        return f"Queue(name={self._name!r}, max_attempts={self._max_attempts})"


def _copies(batch: Batch) -> bool:
    """Whether a batch takes the COPY path: large, without unique keys, groups or a delay past COPY_MAX_DELAY."""
    return (
        len(batch.types) >= COPY_MIN_JOBS
        and not batch.keyed
        and not batch.grouped
        and batch.parents is None
        and (
            not batch.delayed
            or max(d for d in batch.delays if d is not None) <= COPY_MAX_DELAY
        )
    )


def _rows(batch: Batch, payloads: list[str]) -> Rows:
    """The columns of the COPY path, with each job's payload as JSON text."""
    return Rows(
        batch.types,
        payloads,
        batch.attempts,
        batch.run_ats,
        batch.delays,
        batch.priorities,
        batch.tracked,
    )


def queue_on(
    connection: Connection, name: str = "default", max_attempts: int = 5
) -> Queue:
    """A `Queue` that writes on ``connection`` alone, never through a pool (the CLI's)."""
    return Queue._on(connection, name, max_attempts)


async def send_signal(
    executor: Executor, store: Store, job_id: int, name: str, payload: str
) -> bool:
    """`Queue.signal` of checked arguments (``payload``: JSON text): whether it was stored.

    On a connection, in a savepoint: an unknown id leaves the caller's
    transaction usable.
    """
    try:
        if isinstance(executor, asyncpg.Pool):
            return await store.signal(executor, job_id, name, payload)
        async with executor.transaction():
            return await store.signal(executor, job_id, name, payload)
    except asyncpg.NoDataFoundError as exc:
        raise JobNotFoundError(job_id) from exc
    except asyncpg.UndefinedFunctionError as exc:
        raise SchemaError(
            "the function pgqueue_signal is missing",
            where=target_of(executor),
            apply="SCHEMA_UPGRADE",
        ) from exc


async def _fetch_all(executor: Executor, plan: Plan) -> list[asyncpg.Record]:
    """The rows of each statement of ``plan``, run in one transaction (the
    caller's, when ``executor`` is a connection in one)."""
    if isinstance(executor, asyncpg.Pool):
        async with executor.acquire() as connection:
            return await _fetch_all(connection, plan)
    if executor.is_in_transaction():
        return [
            row
            for statement, args in plan.statements
            for row in await executor.fetch(statement, *args)
        ]
    async with executor.transaction():
        return await _fetch_all(executor, plan)


def encode_batch(batch: Batch, encoder: json.JSONEncoder) -> str | list[str]:
    """The payloads of ``batch``: one JSON array, or each job's JSON text for the COPY path."""
    if _copies(batch):
        return encode_each(batch.payloads, encoder)
    return encode_payloads(batch.payloads, encoder)


async def enqueue_request(
    connection: Connection, queue: str, request: Request, payload: str
) -> int:
    """`Queue.enqueue` of a checked ``request`` (its ``payload`` encoded) on ``connection``, in its transaction.

    For an extra that checks a call before it begins the transaction.
    """
    return await Queue._on(connection, queue)._enqueue(request, payload, connection)


async def enqueue_batch(
    connection: Connection,
    queue: str,
    batch: Batch,
    payloads: str | list[str],
    on_conflict: str,
) -> list[int]:
    """`Queue.enqueue_many` of a checked ``batch`` (its payloads from `encode_batch`) on ``connection``."""
    return await Queue._on(connection, queue)._enqueue_many(
        batch, payloads, on_conflict, connection
    )
