"""Durable handlers: the steps, sleeps, waits, child jobs and progress of the runs a worker holds.

Each write is one statement on the worker's upkeep connection (as a
checkpoint is; the steps of concurrent runs are gathered, one statement
and one commit for those that arrive while one is written), fenced on the
job's id and the attempt its run claimed
(`pgqueue._sql.durable`), shielded from the handler's cancellation (bounded
by the connection's statement deadline instead). A write that matches
nothing raises `RunSuperseded` in the handler. A sleep or a wait that ends
the run raises `Suspended` once its row is written: the runner ends the run
with a `SUSPENDED` outcome, which the outcome writer settles without a
write (the slot is free at once).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import math
from typing import TYPE_CHECKING, Any, NoReturn, cast

import anyio
import anyio.to_thread

from pgqueue._core.checks import (
    check_callable,
    check_delay,
    check_duration,
    check_job_id,
    check_label,
    check_moment,
)
from pgqueue._core.codec import encode_payload
from pgqueue._core.errors import (
    ChildFailed,
    JobNotFoundError,
    RunSuperseded,
    Suspended,
    WaitTimeout,
)
from pgqueue._core.lifecycle import Status

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from datetime import datetime, timedelta

    import asyncpg

    from pgqueue._core.job import Job
    from pgqueue._core.outcome import Key
    from pgqueue._store.executor import Connection
    from pgqueue._wire.dedicated import DedicatedConnection

    Enqueue = Callable[[Connection, str, str, Any, dict[str, Any]], Awaitable[int]]
    """Enqueue a job (queue, type, payload, options) on a connection, in its transaction."""

__all__ = ["MAX_PROGRESS_MESSAGE", "Durable"]

PendingStep = tuple[int, int, str, str, str]
"""A step to record: job id, attempt, queue, name, result (JSON text)."""

MAX_STEP_NAME = 255
"""The most characters of a step's or a signal's name."""
MAX_PROGRESS_MESSAGE = 1000
"""The most characters of a progress message stored and announced (the rest is cut)."""
RESERVED = "pgqueue:"
"""How the names of the steps the library records start."""
SPAWN = "pgqueue:spawn:"
CHILD = "pgqueue:child:"
SIGNAL_TIMEOUT = "pgqueue:timeout:signal:"
CHILD_TIMEOUT = "pgqueue:timeout:child:"


class Durable:
    """The durable writes of the runs a worker holds (`pgqueue.Job.step` and the rest).

    ``connection``: the worker's upkeep connection. ``enqueue``: how a
    child is enqueued on a connection, in its transaction (the worker's
    `pgqueue.Queue`, which sits above the engine).
    """

    def __init__(self, connection: DedicatedConnection, enqueue: Enqueue) -> None:
        self._connection = connection
        self._enqueue = enqueue
        self._names: dict[Key, set[str]] = {}  # steps taken by each run, this run
        # Steps waiting for the statement in flight to end, and what writes them.
        self._gathered: list[tuple[PendingStep, asyncio.Future[datetime | None]]] = []
        self._flusher: asyncio.Task[None] | None = None

    def ended(self, job: Job[Any]) -> None:
        """``job``'s run has ended: forget its step names."""
        if self._names:
            self._names.pop((job.id, job.attempts), None)

    def _take(self, job: Job[Any], name: str) -> set[str]:
        """Claim ``name`` for ``job``'s run; ValueError if the run took it already."""
        taken = self._names.setdefault((job.id, job.attempts), set())
        if name in taken:
            msg = f"step {name!r} was taken already in this run of job {job.id}: step names are unique within a job"
            raise ValueError(msg)
        taken.add(name)
        return taken

    async def step(
        self,
        job: Job[Any],
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """`pgqueue.Job.step`."""
        name = _step_name(name)
        check_callable("fn", fn)
        taken = self._take(job, name)
        stored = job.steps.get(name)
        if stored is not None:
            return stored.result
        try:
            value = await _call(fn, args, kwargs)
            text = encode_payload(value)
        except BaseException:
            taken.discard(name)  # not stored: the run may try it again
            raise
        with anyio.CancelScope(shield=True):
            at = await self._record(job, name, text)
        if at is None:
            raise RunSuperseded(job.id, job.attempts)
        return json.loads(text)

    async def _record(self, job: Job[Any], name: str, text: str) -> datetime | None:
        """Record step ``name`` of ``job``'s run: when, or None if the run no longer holds its attempt.

        Steps of the worker's runs that arrive while one statement is in
        flight are written together by the next one (one commit for all),
        by a task of its own that no handler's cancellation reaches.
        """
        done: asyncio.Future[datetime | None] = (
            asyncio.get_running_loop().create_future()
        )
        self._gathered.append(((job.id, job.attempts, job.queue, name, text), done))
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())
        return await done

    async def _flush(self) -> None:
        """Write the gathered steps, a statement at a time, until none is left."""
        store = self._connection.store
        try:
            while self._gathered:
                batch, self._gathered = self._gathered, []
                batch.sort(key=_BY_ID)  # rows locked in id order
                try:
                    recorded = await store.steps(
                        self._connection, [step for step, _ in batch]
                    )
                except BaseException as exc:
                    for _, waiter in batch:
                        if not waiter.done():
                            waiter.set_exception(exc)
                    if not isinstance(exc, Exception):
                        raise
                else:
                    for (job_id, attempts, *_), waiter in batch:
                        if not waiter.done():
                            waiter.set_result(recorded.get((job_id, attempts)))
        finally:
            self._flusher = None
            for _, waiter in self._gathered:  # only if cancelled itself
                if not waiter.done():
                    waiter.set_exception(RuntimeError("step writes stopped"))
            self._gathered = []

    async def sleep(
        self,
        job: Job[Any],
        seconds: float | timedelta | None,
        until: datetime | None,
    ) -> NoReturn:
        """`pgqueue.Job.sleep`."""
        if (seconds is None) == (until is None):
            msg = "sleep takes seconds or until=, one of them"
            raise TypeError(msg)
        delay = check_delay(seconds, "seconds")
        if until is not None:
            until = check_moment("until", until)
        store = self._connection.store
        with anyio.CancelScope(shield=True):
            row = await store.sleep(
                self._connection, job.id, job.attempts, job.queue, delay, until
            )
        raise _suspended(job, row, "sleeping")

    async def wait_for(self, job: Job[Any], name: str, limit: float | None) -> Any:
        """`pgqueue.Job.wait_for`."""
        name = check_label("signal name", name, max_chars=MAX_STEP_NAME)
        limit = None if limit is None else check_duration("timeout", limit)
        if SIGNAL_TIMEOUT + name in job.steps:
            raise WaitTimeout(f"signal {name}")
        store = self._connection.store
        with anyio.CancelScope(shield=True):
            row = await store.wait_signal(
                self._connection, job.id, job.attempts, job.queue, name, limit
            )
        if row is not None and row["state"] == "signalled":
            return json.loads(row["payload"])
        if row is not None and row["state"] == "timeout":
            raise WaitTimeout(f"signal {name}")
        raise _suspended(job, row, f"waiting for signal {name!r}")

    async def spawn(
        self,
        job: Job[Any],
        name: str,
        job_type: str,
        payload: Any,
        options: dict[str, Any],
    ) -> int:
        """`pgqueue.Job.spawn`."""
        key = SPAWN + check_label("spawn name", name, max_chars=MAX_STEP_NAME)
        taken = self._take(job, key)
        stored = job.steps.get(key)
        if stored is not None:
            return int(stored.result)
        queue = options.pop("queue", job.queue)
        enqueue = self._enqueue

        def child(connection: Connection) -> Awaitable[int]:
            return enqueue(connection, queue, job_type, payload, options)

        store = self._connection.store
        try:
            with anyio.CancelScope(shield=True):
                child_id = await store.spawn(
                    self._connection, job.id, job.attempts, job.queue, key, child
                )
        except BaseException:
            taken.discard(key)
            raise
        if child_id is None:
            raise RunSuperseded(job.id, job.attempts)
        return child_id

    async def wait_child(
        self, job: Job[Any], child_id: int, limit: float | None
    ) -> Any:
        """`pgqueue.Job.wait_child`."""
        child_id = check_job_id(child_id)
        if child_id == job.id:
            msg = f"job {job.id} cannot wait for itself"
            raise ValueError(msg)
        limit = None if limit is None else check_duration("timeout", limit)
        recorded = job.steps.get(f"{CHILD}{child_id}")
        if recorded is not None:
            return _child_result(child_id, recorded.result)
        if f"{CHILD_TIMEOUT}{child_id}" in job.steps:
            raise WaitTimeout(f"child {child_id}")
        store = self._connection.store
        with anyio.CancelScope(shield=True):
            row = await store.wait_child(
                self._connection, job.id, job.attempts, job.queue, child_id, limit
            )
            if (
                row is None
                and await store.durable_state(self._connection, child_id) is None
            ):
                raise JobNotFoundError(child_id)
        if row is not None and row["state"] == "ended":
            return _child_result(child_id, json.loads(row["outcome"]))
        if row is not None and row["state"] == "timeout":
            raise WaitTimeout(f"child {child_id}")
        raise _suspended(job, row, f"waiting for child job {child_id}")

    async def progress(
        self, job: Job[Any], fraction: float, message: str | None
    ) -> None:
        """`pgqueue.Job.progress`."""
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            msg = (
                f"fraction must be a number from 0 to 1, not {type(fraction).__name__}"
            )
            raise TypeError(msg)
        if not (math.isfinite(fraction) and 0 <= fraction <= 1):
            msg = f"fraction must be a number from 0 to 1, got {fraction!r}"
            raise ValueError(msg)
        if message is not None:
            if not isinstance(cast("object", message), str):
                msg = f"message must be a str or None, not {type(message).__name__}"
                raise TypeError(msg)
            message = _storable(message[:MAX_PROGRESS_MESSAGE])
        store = self._connection.store
        with anyio.CancelScope(shield=True):
            stored = await store.progress(
                self._connection,
                job.id,
                job.attempts,
                job.queue,
                float(fraction),
                message,
            )
        if not stored:
            raise RunSuperseded(job.id, job.attempts)


def _by_id(item: tuple[PendingStep, Any]) -> int:
    return item[0][0]


_BY_ID = _by_id


def _step_name(name: object) -> str:
    text = check_label("step name", name, max_chars=MAX_STEP_NAME)
    if text.startswith(RESERVED):
        msg = f"step names starting {RESERVED!r} are the library's: {text!r:.80}"
        raise ValueError(msg)
    return text


def _storable(text: str) -> str:
    """``text`` without NUL characters or lone surrogates (what PostgreSQL text refuses)."""
    text = text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


async def _call(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``fn(*args, **kwargs)``: awaited if async, in a worker thread if a plain ``def``."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004  (an object whose __call__ is async)
    ):
        value = fn(*args, **kwargs)
    else:
        value = await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))
    if inspect.isawaitable(value):
        value = await value
    return value


def _suspended(
    job: Job[Any], row: asyncpg.Record | None, what: str
) -> Suspended | RunSuperseded:
    """What ends the run: its row is written (``row``), or the run was superseded (None)."""
    if row is None:
        return RunSuperseded(job.id, job.attempts)
    if row["status"] == Status.CANCELLED:
        return Suspended("cancelled by request", None)
    due_in = row["due_in"] if row["status"] == Status.PENDING else None
    return Suspended(what, None if due_in is None else max(due_in, 0.0))


def _child_result(child_id: int, outcome: Any) -> Any:
    """The result of a child that ended as ``outcome`` records; ChildFailed if it failed."""
    if not isinstance(outcome, dict):
        outcome = {}
    status = outcome.get("status")
    if status == Status.COMPLETED:
        return outcome.get("result")
    error = outcome.get("error")
    raise ChildFailed(child_id, str(status), error if isinstance(error, str) else None)
