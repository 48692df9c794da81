"""Synchronous handlers run in worker threads, against a real server.

A plain ``def`` handler used to run its body and then fail every attempt
(its return value was awaited), so a charge was made once per attempt until
the job was dead. Now it runs in a thread of its own, at most
``concurrency`` at once; a thread cannot be interrupted, so ``job_timeout``
and ``stop(timeout)`` let it run to its end, and the outcome is written,
fenced, once it returns.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import pgqueue
from tests.helpers import drain, no_backoff, row, running, wait_for_row, wait_until

if TYPE_CHECKING:
    import asyncpg

WITHIN = 10.0


@dataclass(frozen=True)
class Charge:
    cents: int


async def test_a_sync_handler_completes_its_job_once(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name)
    charges: list[int] = []
    threads: set[int] = set()

    @worker.handler("charge")
    def charge(job: pgqueue.Job[Charge]) -> dict[str, int]:
        threads.add(threading.get_ident())
        charges.append(job.payload.cents)
        return {"charged": job.payload.cents}

    job_id = await queue.enqueue("charge", {"cents": 250})
    await drain(worker)
    stored = await row(pool, job_id)
    assert (stored["status"], stored["attempts"], stored["last_error"]) == (
        "completed",
        1,
        None,
    )
    assert charges == [250]
    assert threading.get_ident() not in threads  # not on the event loop's thread


async def test_a_sync_handler_of_a_job_type_gets_its_typed_payload_in_a_thread(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    charge_type = pgqueue.JobType("charge", Charge, queue=queue.name)
    worker = pgqueue.Worker(pool, queue=queue.name)
    charges: list[Charge] = []
    threads: set[int] = set()

    @worker.handler(charge_type)
    def charge(job: pgqueue.Job[Charge]) -> None:
        threads.add(threading.get_ident())
        charges.append(job.payload)

    job_id = await charge_type.enqueue(queue, Charge(cents=99))
    await drain(worker)
    assert (await row(pool, job_id))["status"] == "completed"
    assert charges == [Charge(cents=99)]
    assert threads
    assert threading.get_ident() not in threads


async def test_a_sync_handler_that_raises_is_retried(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, backoff=no_backoff)
    calls: list[int] = []

    def flaky(job: pgqueue.Job) -> None:
        calls.append(job.attempts)
        if job.attempts == 1:
            msg = "card declined"
            raise ValueError(msg)

    worker.register("flaky", flaky)
    job_id = await queue.enqueue("flaky", {})
    await drain(worker)
    stored = await row(pool, job_id)
    assert (stored["status"], stored["attempts"]) == ("completed", 2)
    assert calls == [1, 2]


async def test_a_sync_handler_that_always_raises_goes_dead_with_its_error(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, backoff=no_backoff)

    def broken(_job: pgqueue.Job) -> None:
        msg = "no such account"
        raise LookupError(msg)

    worker.register("broken", broken)
    job_id = await queue.enqueue("broken", {}, max_attempts=3)
    await drain(worker)
    stored = await row(pool, job_id)
    assert (stored["status"], stored["attempts"], stored["last_error"]) == (
        "dead",
        3,
        "LookupError: no such account",
    )


class Counter:
    """A callable object with a sync ``__call__``."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def __call__(self, job: pgqueue.Job, tag: str = "object") -> None:
        self.seen.append((tag, threading.get_ident()))


class AsyncCounter:
    """A callable object with an async ``__call__``: it runs on the event loop."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    async def __call__(self, _job: pgqueue.Job) -> None:
        self.seen.append(threading.get_ident())


async def test_callable_objects_and_partials_are_told_apart(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name)
    sync_object, async_object = Counter(), AsyncCounter()
    worker.register("object", sync_object)
    worker.register("partial", functools.partial(sync_object, tag="partial"))
    worker.register("async", async_object)
    await queue.enqueue_many([("object", {}), ("partial", {}), ("async", {})])
    await drain(worker)
    loop_thread = threading.get_ident()
    assert sorted(tag for tag, _ in sync_object.seen) == ["object", "partial"]
    assert all(thread != loop_thread for _, thread in sync_object.seen)
    assert async_object.seen == [loop_thread]
    statuses = {r["status"] for r in await queue_rows(pool, queue.name)}
    assert statuses == {"completed"}


async def queue_rows(pool: asyncpg.Pool, name: str) -> list[asyncpg.Record]:
    return await pool.fetch("SELECT status FROM pgqueue_jobs WHERE queue = $1", name)


async def test_middleware_wraps_a_sync_handler(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    seen: list[str] = []

    def middleware(handler: pgqueue.Handler) -> pgqueue.Handler:
        async def wrapped(job: pgqueue.Job) -> Any:
            seen.append("before")
            value = await handler(job)
            seen.append("after")
            return value

        return wrapped

    worker = pgqueue.Worker(pool, queue=queue.name, middleware=[middleware])

    @worker.handler("t")
    def handle(_job: pgqueue.Job) -> None:
        seen.append("handler")

    job_id = await queue.enqueue("t", {})
    await drain(worker)
    assert seen == ["before", "handler", "after"]
    assert (await row(pool, job_id))["status"] == "completed"


async def test_sync_handlers_run_at_most_concurrency_at_once(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    concurrency, jobs = 3, 12
    worker = pgqueue.Worker(
        pool, queue=queue.name, concurrency=concurrency, prefetch=concurrency
    )
    lock = threading.Lock()
    now_running = 0
    most = 0
    done = 0
    release = threading.Event()

    @worker.handler("t")
    def handle(_job: pgqueue.Job) -> None:
        nonlocal now_running, most, done
        with lock:
            now_running += 1
            most = max(most, now_running)
        try:
            assert release.wait(WITHIN), "never released"
        finally:
            with lock:
                now_running -= 1
                done += 1

    async def full() -> bool:
        return now_running == concurrency

    await queue.enqueue_many([("t", n) for n in range(jobs)])
    async with running(worker):
        await wait_until(full)
        # Every thread that could start has: the bound, not a lack of jobs.
        held = await pool.fetchval(
            "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1 AND status = 'running'",
            queue.name,
        )
        assert held == 2 * concurrency
        release.set()

        async def all_done() -> bool:
            return done == jobs

        await wait_until(all_done)
    assert most == concurrency


async def test_job_timeout_lets_a_sync_handler_finish_then_fails_the_attempt(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    """A thread cannot be interrupted: it runs to its end, then the attempt fails as timed out."""
    worker = pgqueue.Worker(pool, queue=queue.name, job_timeout=0.2)
    finished = threading.Event()

    @worker.handler("slow")
    def slow(_job: pgqueue.Job) -> None:
        time.sleep(0.6)  # the job's own work, three times its timeout
        finished.set()

    job_id = await queue.enqueue("slow", {}, max_attempts=1)
    started = time.monotonic()
    await drain(worker)
    stored = await row(pool, job_id)
    assert (stored["status"], stored["last_error"]) == (
        "dead",
        "job timed out after 0.2 s",
    )
    assert finished.is_set()
    assert time.monotonic() - started >= 0.6


async def test_stop_waits_for_a_sync_handler_and_records_what_it_returned(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    """stop(timeout) cannot cut a thread off: it waits for it, then raises TimeoutError."""
    worker = pgqueue.Worker(pool, queue=queue.name)
    entered = threading.Event()

    @worker.handler("slow")
    def slow(_job: pgqueue.Job) -> str:
        entered.set()
        time.sleep(0.6)
        return "done"

    job_id = await queue.enqueue("slow", {})
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(WITHIN):
            await tg.start(worker.run)
        await wait_for_row(pool, job_id, status="running")
        assert await anyio.to_thread.run_sync(entered.wait, WITHIN)
        with anyio.fail_after(WITHIN), pytest.raises(TimeoutError):
            await worker.stop(timeout=0.05)
    stored = await row(pool, job_id)
    assert (stored["status"], stored["attempts"]) == ("completed", 1)


@pytest.mark.parametrize("ends", ["returns", "raises"])
async def test_a_cancel_request_waits_for_a_sync_handlers_thread(
    pool: asyncpg.Pool, queue: pgqueue.Queue, ends: str
) -> None:
    """The job is not marked cancelled while its thread still runs.

    A handler that returns anyway completes its job (its work is done), as
    an async one that swallows the cancellation does; one that raises ends
    cancelled.
    """
    worker = pgqueue.Worker(pool, queue=queue.name)
    entered, release, ended = threading.Event(), threading.Event(), threading.Event()

    @worker.handler("t")
    def handle(_job: pgqueue.Job) -> None:
        entered.set()
        try:
            assert release.wait(WITHIN), "never released"
        finally:
            ended.set()
        if ends == "raises":
            msg = "gave up"
            raise RuntimeError(msg)

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        assert await anyio.to_thread.run_sync(entered.wait, WITHIN)
        assert await queue.cancel(job_id) == {job_id: "requested"}

        async def request_arrived() -> bool:
            return (
                job_id in worker._runner._cancelled
                or (await row(pool, job_id))["status"] != "running"
            )

        await wait_until(request_arrived)
        assert (await row(pool, job_id))["status"] == "running"
        release.set()
        expected = "completed" if ends == "returns" else "cancelled"
        await wait_for_row(pool, job_id, status=expected)
    assert ended.is_set()


async def test_a_sync_handler_calls_the_durable_methods_through_anyio(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    """``anyio.from_thread.run(job.step, ...)`` from a handler's thread: a step once, a sleep that frees the slot."""
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=0.2)
    charges: list[int] = []
    runs: list[int] = []

    def charge() -> dict[str, int]:
        charges.append(1)
        return {"charge": len(charges)}

    @worker.handler("order")
    def order(job: pgqueue.Job) -> dict[str, int]:
        runs.append(job.attempts)
        charged: dict[str, int] = anyio.from_thread.run(job.step, "charge", charge)
        if len(runs) == 1:
            anyio.from_thread.run(job.sleep, 0.2)  # ends this run
        anyio.from_thread.run(job.progress, 1.0, "shipped")
        return charged

    job_id = await queue.enqueue("order", {})
    async with running(worker):
        stored = await wait_for_row(pool, job_id, within=WITHIN, status="completed")
    assert charges == [1]  # the replay took the recorded step
    assert runs == [1, 1]  # the sleep gave its attempt back
    assert stored["result"] == '{"charge": 1}'
    assert '"shipped"' in (await row(pool, job_id))["progress"]
