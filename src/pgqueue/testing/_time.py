"""Test with time: `advance` what is due, `run_due` with a worker's handlers, `wait_for` a status.

A job due tomorrow is tested in milliseconds::

    await queue.enqueue("send_reminder", {"user": 7}, delay=86400)
    await pgqueue.testing.advance(pool, 86400)
    (outcome,) = await pgqueue.testing.run_due(worker)
    assert outcome.status == "completed"

Nothing here changes a clock: `advance` moves the jobs (their ``run_at``)
and the rate limits' recorded starts, so the database's ``now()``, the
workers and the claims stay as they are.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg

import pgqueue
from pgqueue import JobNotFoundError, OutcomeKind, Status
from pgqueue._extension import (
    check_duration,
    check_job_id,
    check_queue_name,
    clock_statements,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable, Sequence

__all__ = ["RunOutcome", "advance", "run_due", "wait_for"]

WAIT_POLL = 0.02
"""Seconds between two reads of `wait_for`."""


@dataclass(frozen=True, slots=True)
class RunOutcome:
    """What one run of a job ended as, from `run_due`.

    Attributes:
        job_id: the job's id.
        status: what the run ended as, an `pgqueue.OutcomeKind` (a str):
            ``completed``, ``pending`` (failed, to be retried), ``dead``,
            ``cancelled`` or ``snoozed``.
        job: the job as the handler saw it.
        error: the error of a failed run, else None.
    """

    job_id: int
    status: OutcomeKind
    job: pgqueue.Job[Any]
    error: str | None = None


async def advance(
    pool_or_connection: pgqueue.Executor,
    seconds: float,
    *,
    queues: Iterable[str] | None = None,
) -> int:
    """Make every pending and waiting job ``seconds`` sooner, and wake the workers of their queues.

    Delays, retries' back-offs and snoozes are ``run_at`` in the future:
    they all come ``seconds`` sooner, as if that much time had passed (the
    rate limits' windows too). Each queue with a job moved gets the wakeup
    an enqueue sends (``NOTIFY pgqueue_jobs``), so a running worker claims
    what became due at once. Running and finished jobs and periodic
    schedules are left alone. Returns how many jobs moved.

    Args:
        pool_or_connection: the database (a pool, or a connection whose
            open transaction it joins: the wakeups then go at commit).
        seconds: how far to move, a non-negative number.
        queues: only these queues' jobs (every queue's by default).
    """
    amount = check_duration("seconds", seconds)
    names = None if queues is None else [check_queue_name(q) for q in queues]
    async with _transaction(pool_or_connection) as connection:
        row = await connection.fetchrow(clock_statements.ADVANCE, amount, names)
        await connection.execute(clock_statements.ADVANCE_STARTS, amount, names)
    assert row is not None
    moved: int = row["moved"]
    return moved


async def run_due(worker: pgqueue.Worker) -> list[RunOutcome]:
    """Run every job due now with ``worker``'s handlers; return what each run ended as, in the order written.

    Runs a copy of ``worker`` (`pgqueue.Worker.with_options`, with an
    observer added) with ``run(until_empty=True)``: it claims and runs
    jobs until none of its queues has a job due and none is running, then
    stops. A job that fails and is retried at once (a back-off of 0) runs
    again within the call; one retried, snoozed or delayed to later is not
    due, so it waits for the next `advance`. ``worker`` is left unstarted:
    call `run_due` with it again after the next `advance`.

    Raises:
        pgqueue.AlreadyStartedError: ``worker`` has started.
    """
    if worker.state != "new":
        msg = "run_due() takes a worker that has not started (it runs a copy of it)"
        raise pgqueue.AlreadyStartedError(msg)
    collector = _Collector()
    copy = worker.with_options(observers=[*worker.options.observers, collector])
    await copy.run(until_empty=True)
    return collector.outcomes


async def wait_for(
    pool_or_connection: pgqueue.Executor,
    job_id: int,
    status: Status | str,
    timeout: float = 5.0,  # noqa: ASYNC109 - the wait's own bound
) -> Status:
    """Wait until job ``job_id`` has ``status``, reading its row every 20 ms; return it.

    Raises:
        TimeoutError: ``timeout`` seconds passed first (the message says
            the status it had).
        pgqueue.JobNotFoundError: no job has that id (or it was deleted
            while waiting).
        ValueError: ``status`` is not a status.
    """
    checked = check_job_id(job_id)
    wanted = Status(status)
    limit = check_duration("timeout", timeout)
    seen: str | None = None
    with anyio.move_on_after(limit):
        while True:
            seen = await pool_or_connection.fetchval(
                clock_statements.JOB_STATUS, checked
            )
            if seen is None:
                raise JobNotFoundError(checked)
            if seen == wanted:
                return wanted
            await anyio.sleep(WAIT_POLL)
    msg = f"job {checked} is {seen}, not {wanted}, after {limit:g} s"
    raise TimeoutError(msg)


class _Collector(pgqueue.Observer):
    """Keeps the outcomes a worker wrote (not those fenced off)."""

    def __init__(self) -> None:
        self.outcomes: list[RunOutcome] = []

    def on_written(
        self, written: Sequence[pgqueue.Outcome], fenced: Sequence[pgqueue.Outcome]
    ) -> None:
        self.outcomes += (
            RunOutcome(o.job.id, o.status, o.job, o.error)
            for o in written
            if o.status != OutcomeKind.RELEASED
        )


@contextlib.asynccontextmanager
async def _transaction(executor: pgqueue.Executor) -> AsyncIterator[pgqueue.Connection]:
    """A connection of ``executor`` in a transaction (a pool's own; a connection's, nested in its own)."""
    if isinstance(executor, asyncpg.Pool):
        async with executor.acquire() as connection, connection.transaction():
            yield connection
    else:
        async with executor.transaction():
            yield executor
