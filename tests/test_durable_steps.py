"""Durable handlers' steps and sleeps: ``job.step``, ``job.sleep``, ``job.progress``.

Through the public API on a real server: a step's function runs once however
often the job runs (a retry, a SIGKILLed worker process and a rescue in
another), a raising step is not stored, a name is taken once per run, a
stale run's step and progress never land (and the run is told), a sleep
frees the slot and resumes on time without a poll, and the Go module's claim
never takes a sleeping row before its time.
"""

from __future__ import annotations

import dataclasses
import decimal
import json
import signal
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import pgqueue
from tests.go_module import GO_CLAIM
from tests.helpers import (
    RecordingLogger,
    no_backoff,
    row,
    running,
    wait_for_row,
    wait_until,
)

if TYPE_CHECKING:
    import asyncpg
    from anyio.abc import Process

DURABLE_WORKER = Path(__file__).with_name("durable_worker.py")


@dataclasses.dataclass
class Charge:
    charge: str
    amount: decimal.Decimal
    key: uuid.UUID


async def test_a_retried_handler_replays_its_recorded_steps_without_calling_them(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    calls: list[str] = []
    seen: list[dict[str, Any]] = []
    worker = pgqueue.Worker(
        pool, queue=queue.name, poll_interval=0.1, backoff=no_backoff
    )

    async def charge(amount: int) -> Charge:
        calls.append("charge")
        return Charge("ch_1", decimal.Decimal(amount), uuid.UUID(int=7))

    def reserve(sku: str, *, count: int) -> list[Any]:  # a plain def: a thread
        calls.append("reserve")
        return [sku, count]

    @worker.handler("order")
    async def order(job: pgqueue.Job) -> list[Any]:
        seen.append({name: step.result for name, step in job.steps.items()})
        charged = await job.step("charge", charge, 42)
        reserved = await job.step("reserve", reserve, "sku-1", count=2)
        if job.attempts == 1:
            raise RuntimeError("the carrier is down")
        return [charged, reserved]

    job_id = await queue.enqueue("order", {})
    async with running(worker):
        stored = await wait_for_row(pool, job_id, status="completed")
    assert calls == ["charge", "reserve"]
    # Every run sees the stored JSON values: the first one too.
    charged = {"charge": "ch_1", "amount": "42", "key": str(uuid.UUID(int=7))}
    reserved = ["sku-1", 2]
    assert json.loads(stored["result"]) == [charged, reserved]
    assert seen == [{}, {"charge": charged, "reserve": reserved}]
    steps = json.loads(stored["steps"])
    assert list(steps) == ["charge", "reserve"]
    assert steps["charge"]["result"] == charged
    assert datetime.fromisoformat(steps["charge"]["at"]) <= stored["completed_at"]
    assert stored["attempts"] == 2


async def test_a_raising_step_is_not_stored_and_a_name_is_taken_once_per_run(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    calls: list[int] = []
    raised: list[BaseException] = []
    worker = pgqueue.Worker(
        pool, queue=queue.name, poll_interval=0.1, backoff=no_backoff
    )

    async def flaky() -> int:
        calls.append(len(calls))
        if len(calls) == 1:
            raise ConnectionError("the payment provider timed out")
        return len(calls)

    @worker.handler("t")
    async def handler(job: pgqueue.Job) -> int:
        with pytest.raises(ConnectionError):
            await job.step("pay", flaky)
        assert "pay" not in job.steps
        paid: int = await job.step("pay", flaky)  # the same run may try again
        try:
            await job.step("pay", flaky)
        except ValueError as exc:
            raised.append(exc)
        for bad in ("", "pgqueue:mine", "a\x07b", "x" * 256):
            with pytest.raises(ValueError, match="step name"):
                await job.step(bad, flaky)
        with pytest.raises(TypeError, match=r"cannot be serialized|JSON"):
            await job.step("bytes", lambda: object())
        return paid

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        stored = await wait_for_row(pool, job_id, status="completed")
    assert calls == [0, 1]
    assert json.loads(stored["result"]) == 2
    assert list(json.loads(stored["steps"])) == ["pay"]
    assert len(raised) == 1
    assert "taken already" in str(raised[0])


async def test_step_outside_a_worker_raises() -> None:
    job: pgqueue.Job[Any] = pgqueue.Job(
        id=1,
        queue="q",
        type="t",
        payload={},
        attempts=1,
        max_attempts=1,
        run_at=datetime.now(UTC),
        created_at=datetime.now(UTC),
    )
    with pytest.raises(pgqueue.PgQueueError, match="not run by a worker"):
        await job.step("s", lambda: 1)
    with pytest.raises(pgqueue.PgQueueError, match="not run by a worker"):
        await job.sleep(1)


async def test_a_stale_runs_step_and_progress_never_land_and_it_is_told(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # Worker A runs attempt 1 and records a step; its row is made to look
    # orphaned; worker B rescues the job and runs attempt 2, which replays
    # A's step. A's next step and progress are refused with RunSuperseded.
    first_done, release_first = anyio.Event(), anyio.Event()
    second_done, release_second = anyio.Event(), anyio.Event()
    told: list[str] = []
    calls: list[str] = []
    logger = RecordingLogger()
    stale = pgqueue.Worker(pool, queue=queue.name, rescue_after=3 * 3600, logger=logger)
    fresh = pgqueue.Worker(pool, queue=queue.name, rescue_after=60)

    def called(name: str) -> str:
        calls.append(name)
        return name

    @stale.handler("t")
    async def first_run(job: pgqueue.Job) -> None:
        await job.step("one", called, "one by A")
        first_done.set()
        await release_first.wait()
        try:
            await job.progress(0.5, "from the stale run")
        except pgqueue.RunSuperseded as exc:
            told.append(f"progress: {exc}")
        try:
            await job.step("two", called, "two by A")
        except Exception:  # what a handler might write
            told.append("swallowed")
        except pgqueue.RunSuperseded as exc:
            told.append(f"step: {exc}")
            raise

    @fresh.handler("t")
    async def second_run(job: pgqueue.Job) -> None:
        assert await job.step("one", called, "one by B") == "one by A"
        await job.progress(0.25, "from the fresh run")
        second_done.set()
        await release_second.wait()
        await job.step("two", called, "two by B")

    job_id = await queue.enqueue("t", {})
    async with running(stale):
        with anyio.fail_after(10):
            await first_done.wait()
        await pool.execute(
            "UPDATE pgqueue_jobs SET updated_at = now() - interval '1 hour' WHERE id = $1",
            job_id,
        )
        async with running(fresh):
            with anyio.fail_after(10):
                await second_done.wait()
            release_first.set()
            await logger.wait_for("stale run superseded")
            stored = await row(pool, job_id)
            assert (stored["status"], stored["attempts"]) == ("running", 2)
            assert list(json.loads(stored["steps"])) == ["one"]
            progress = json.loads(stored["progress"])
            assert (progress["fraction"], progress["message"]) == (
                0.25,
                "from the fresh run",
            )
            release_second.set()
            stored = await wait_for_row(pool, job_id, status="completed")
    assert calls == ["one by A", "two by A", "two by B"]
    assert [t.split(":")[0] for t in told] == ["progress", "step"]
    assert "superseded" in told[1]
    assert json.loads(stored["steps"])["two"]["result"] == "two by B"


async def _start(dsn: str, queue: str, calls: Path, log: Path, *hang: str) -> Process:
    with log.open("ab") as out:
        return await anyio.open_process(
            [sys.executable, str(DURABLE_WORKER), dsn, queue, str(calls), *hang],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


async def _kill(process: Process) -> None:
    if process.returncode is None:
        process.kill()
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            await process.wait()


@pytest.mark.slow
async def test_a_handler_killed_after_step_two_resumes_in_another_process_with_step_three_only(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue, tmp_path: Path
) -> None:
    calls = tmp_path / "calls.txt"
    calls.touch()
    job_id = await queue.enqueue("three_steps", {})
    first = await _start(dsn, queue.name, calls, tmp_path / "first.log", "hang")
    try:
        await wait_until(lambda: _steps_stored(pool, job_id, 2), within=20)
        assert calls.read_text().split() == ["one", "two"]
        assert (await row(pool, job_id))["status"] == "running"
    finally:
        first.send_signal(signal.SIGKILL)  # no drain, no outcome
        await _kill(first)
    second = await _start(dsn, queue.name, calls, tmp_path / "second.log")
    try:
        stored = await wait_for_row(pool, job_id, within=30, status="completed")
    finally:
        await _kill(second)
    assert calls.read_text().split() == ["one", "two", "three"]
    assert json.loads(stored["result"]) == ["one", "two", "three"]
    assert stored["attempts"] == 2
    assert "no heartbeat" in json.loads(stored["errors"])[0]["error"]


async def test_a_sleep_frees_the_slot_and_resumes_on_time_without_a_poll(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    logger = RecordingLogger()
    worker = pgqueue.Worker(
        pool, queue=queue.name, concurrency=1, poll_interval=60, logger=logger
    )
    ran: list[tuple[str, int]] = []
    other_ran = anyio.Event()

    @worker.handler("sleeper")
    async def sleeper(job: pgqueue.Job) -> str:
        ran.append(("sleeper", job.attempts))
        woke: str = await job.step("before", lambda: "slept")
        if "after" not in job.steps:
            await job.step("after", lambda: "marked")
            await job.sleep(2)
        return woke

    @worker.handler("other")
    async def other(job: pgqueue.Job) -> None:
        ran.append(("other", job.attempts))
        other_ran.set()

    sleeper_id = await queue.enqueue("sleeper", {})
    async with running(worker):
        await wait_until(lambda: _has_waited(pool, sleeper_id))
        slept = await row(pool, sleeper_id)
        assert slept["status"] == "pending"
        # The row sleeps: due in 2 s, its attempt given back, its steps kept.
        assert slept["attempts"] == 0
        assert 1.0 < (slept["run_at"] - slept["updated_at"]).total_seconds() <= 2.0
        assert json.loads(slept["wait"])["until"] is not None
        assert set(json.loads(slept["steps"])) == {"before", "after"}
        # The Go module's claim never takes a sleeping row before its time.
        async with pool.acquire() as connection:
            assert await connection.fetch(GO_CLAIM, queue.name, 10) == []
        # The one slot is free: another job runs meanwhile.
        await queue.enqueue("other", {})
        with anyio.fail_after(5):
            await other_ran.wait()
        assert (await row(pool, sleeper_id))["status"] == "pending"
        done = await wait_for_row(pool, sleeper_id, within=6, status="completed")
    late = (done["completed_at"] - slept["run_at"]).total_seconds()
    assert 0 <= late < 1.0, late  # on time, though the poll is 60 s
    assert ran == [("sleeper", 1), ("other", 1), ("sleeper", 1)]
    assert json.loads(done["result"]) == "slept"
    assert logger.messages("warning") + logger.messages("error") == []
    assert "ended for now" in " ".join(logger.messages("info"))


async def test_sleep_until_a_time_and_bad_sleeps(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=0.2)
    until = datetime.now(UTC) + timedelta(hours=3)
    refused: list[type[BaseException]] = []

    @worker.handler("t")
    async def handler(job: pgqueue.Job) -> None:
        for bad in ((), (1,), (-1,), (float("nan"),)):
            try:
                if bad == (1,):
                    await job.sleep(1, until=until)
                elif bad:
                    await job.sleep(bad[0])
                else:
                    await job.sleep()
            except (TypeError, ValueError) as exc:
                refused.append(type(exc))
        try:
            await job.sleep(until=until.replace(tzinfo=None))
        except ValueError as exc:
            refused.append(type(exc))
        await job.sleep(until=until)

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        await wait_until(lambda: _has_waited(pool, job_id))
    slept = await row(pool, job_id)
    assert (slept["status"], slept["attempts"]) == ("pending", 0)
    assert refused == [TypeError, TypeError, ValueError, ValueError, ValueError]
    assert abs((slept["run_at"] - until).total_seconds()) < 0.001


async def _has_waited(pool: asyncpg.Pool, job_id: int) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT wait IS NOT NULL FROM pgqueue_jobs WHERE id = $1", job_id
        )
    )


async def _steps_stored(pool: asyncpg.Pool, job_id: int, count: int) -> bool:
    stored = await pool.fetchval("SELECT steps FROM pgqueue_jobs WHERE id = $1", job_id)
    return stored is not None and len(json.loads(stored)) == count


async def test_progress_is_stored_fenced_and_followed_by_a_tracker(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=0.2)
    following, go_on = anyio.Event(), anyio.Event()
    refused: list[type[BaseException]] = []

    @worker.handler("report")
    async def report(job: pgqueue.Job) -> None:
        for bad in (-0.1, 1.5, float("nan"), "half", True):
            try:
                await job.progress(bad)  # type: ignore[arg-type]
            except (TypeError, ValueError) as exc:
                refused.append(type(exc))
        await job.progress(0.1, "started")
        await following.wait()
        for n in (2, 3, 4):
            await job.progress(n / 10, f"page {n}")
            await go_on.wait()
        await job.progress(1, "x" * 5000)

    seen: list[pgqueue.JobProgress] = []
    job_id = await queue.enqueue("report", {}, track=True)
    async with running(worker), pgqueue.Tracker(pool) as tracker:
        async for p in tracker.progress(job_id):
            seen.append(p)
            following.set()
            if p.fraction >= 0.4:
                go_on.set()
            if p.fraction == 0.2:
                go_on.set()
    assert refused == [ValueError, ValueError, ValueError, TypeError, TypeError]
    assert seen[0] == pgqueue.JobProgress(id=job_id, fraction=0.1, message="started")
    assert [p.fraction for p in seen] == sorted(p.fraction for p in seen)
    assert seen[-1].fraction == 1.0
    assert seen[-1].message == "x" * 1000  # cut to 1000 characters
    stored = await row(pool, job_id)
    assert stored["status"] == "completed"
    assert json.loads(stored["progress"])["fraction"] == 1.0


async def test_a_sleep_inside_a_task_group_ends_the_run_and_other_groups_fail_it(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=0.2)

    @worker.handler("grouped")
    async def grouped(job: pgqueue.Job) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(job.sleep, 3600)

    @worker.handler("failing")
    async def failing(_job: pgqueue.Job) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_raise_value_error)

    slept_id = await queue.enqueue("grouped", {})
    failed_id = await queue.enqueue("failing", {}, max_attempts=1)
    async with running(worker):
        await wait_until(lambda: _has_waited(pool, slept_id))
        failed = await wait_for_row(pool, failed_id, status="dead")
    slept = await row(pool, slept_id)
    assert (slept["status"], slept["attempts"]) == ("pending", 0)
    assert (
        "ValueError" in failed["last_error"] or "ExceptionGroup" in failed["last_error"]
    )


async def _raise_value_error() -> None:
    raise ValueError("a failure in a task group")
