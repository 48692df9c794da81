"""Running one job: every way a handler can end becomes an outcome (no database)."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
import anyio.lowlevel
import pytest

import pgqueue
from pgqueue._core.backoff import MAX_BACKOFF, SafeBackoff
from pgqueue._core.errors import MAX_ERROR_LENGTH
from pgqueue._core.job import Job
from pgqueue._core.lifecycle import OutcomeKind
from pgqueue._engine.runner import JobRunner
from tests.helpers import RecordingLogger

if TYPE_CHECKING:
    from collections.abc import Callable

    from pgqueue._core.outcome import Outcome

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def job(attempts: int = 1, max_attempts: int = 5) -> Job:
    return Job(
        id=7,
        queue="q",
        type="t",
        payload={},
        attempts=attempts,
        max_attempts=max_attempts,
        run_at=NOW,
        created_at=NOW,
    )


def runner(
    handler: Callable[[Job], Any],
    *,
    backoff: Callable[[int], Any] = lambda _attempt: 1.5,
    job_timeout: float | None = None,
    logger: RecordingLogger | None = None,
) -> JobRunner:
    logger = logger or RecordingLogger()
    return JobRunner(
        {"t": handler},
        job_timeout=job_timeout,
        backoff=SafeBackoff(backoff, logger),
        logger=logger,
    )


def never_cut_off() -> bool:
    return False


async def run(r: JobRunner, j: Job | None = None) -> Outcome:
    with anyio.fail_after(5):
        return await r.run(j or job(), never_cut_off)


async def test_returning_completes() -> None:
    async def handler(_job: Job) -> None:
        pass

    outcome = await run(runner(handler))
    assert (outcome.status, outcome.error) == ("completed", None)


async def test_raising_retries_after_the_backoff_then_dies_on_the_last_attempt() -> (
    None
):
    async def handler(_job: Job) -> None:
        raise ValueError("bad row 1")

    r = runner(handler)
    first = await run(r)
    assert (first.status, first.delay, first.error) == (
        "pending",
        1.5,
        "ValueError: bad row 1",
    )
    last = await run(r, job(attempts=5))
    assert (last.status, last.error) == ("dead", "ValueError: bad row 1")


async def test_permanent_dies_at_once() -> None:
    async def handler(_job: Job) -> None:
        raise pgqueue.Permanent("no")

    assert (await run(runner(handler))).status == "dead"


async def test_a_handler_that_awaits_a_task_someone_cancelled_fails_its_attempt() -> (
    None
):
    async def handler(_job: Job) -> None:
        task = asyncio.create_task(asyncio.sleep(10))
        await asyncio.sleep(0)
        task.cancel()
        await task

    outcome = await run(runner(handler))
    assert (outcome.status, outcome.error) == ("pending", "CancelledError")
    await anyio.lowlevel.checkpoint()  # still alive: not cancelled


async def test_gather_over_a_cancelled_task_fails_its_attempt() -> None:
    async def handler(_job: Job) -> None:
        task = asyncio.create_task(asyncio.sleep(10))
        task.cancel()
        await asyncio.gather(task)

    assert (await run(runner(handler))).status == "pending"


async def test_a_handler_that_cancels_its_own_task_fails_its_attempt() -> None:
    async def handler(_job: Job) -> None:
        current = asyncio.current_task()
        assert current is not None
        current.cancel()
        await asyncio.sleep(1)

    outcome = await run(runner(handler))
    assert outcome.status == "pending"
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
    await anyio.sleep(0.01)  # the request was withdrawn: nothing cancels us now


async def test_the_workers_own_cut_off_propagates() -> None:
    started = anyio.Event()

    async def handler(_job: Job) -> None:
        started.set()
        await anyio.sleep_forever()

    r = runner(handler)
    caught: list[BaseException] = []
    async with anyio.create_task_group() as tg:

        async def consume() -> None:
            try:
                await r.run(job(), lambda: tg.cancel_scope.cancel_called)
            except BaseException as exc:
                caught.append(exc)
                raise

        tg.start_soon(consume)
        await started.wait()
        tg.cancel_scope.cancel()
    assert len(caught) == 1
    assert isinstance(caught[0], anyio.get_cancelled_exc_class())


async def test_job_timeout_fails_the_attempt() -> None:
    async def handler(_job: Job) -> None:
        await anyio.sleep_forever()

    outcome = await run(runner(handler, job_timeout=0.05))
    assert outcome.error == "job timed out after 0.05 s"


async def test_a_handler_that_swallows_its_timeout_and_returns_still_timed_out() -> (
    None
):
    async def handler(_job: Job) -> None:
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            return

    outcome = await run(runner(handler, job_timeout=0.05))
    assert (outcome.status, outcome.error) == ("pending", "job timed out after 0.05 s")


async def test_a_handler_that_never_yields_past_its_timeout_timed_out() -> None:
    clock = anyio.current_time

    async def handler(_job: Job) -> None:
        start = clock()
        while clock() - start < 0.06:
            pass  # CPU-bound: no checkpoint for the deadline to act at

    outcome = await run(runner(handler, job_timeout=0.05))
    assert outcome.error == "job timed out after 0.05 s"


class BrokenStr(Exception):
    def __str__(self) -> str:
        raise RuntimeError("str() of this exception raises")


async def test_an_exception_whose_str_raises_is_recorded() -> None:
    async def handler(_job: Job) -> None:
        raise BrokenStr

    outcome = await run(runner(handler))
    assert outcome.status == "pending"
    assert outcome.error is not None
    assert outcome.error.startswith("BrokenStr")


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        ("bad row a\x00b", "ValueError: bad row a\\x00b"),
        ("file \udc80.txt", "ValueError: file \\udc80.txt"),
    ],
)
async def test_error_text_the_database_refuses_is_made_storable(
    text: str, stored: str
) -> None:
    async def handler(_job: Job) -> None:
        raise ValueError(text)

    outcome = await run(runner(handler))
    assert outcome.error == stored
    outcome.error.encode("utf-8")


async def test_a_long_error_is_capped() -> None:
    async def handler(_job: Job) -> None:
        raise ValueError("x" * 100_000)

    outcome = await run(runner(handler))
    assert outcome.error is not None
    assert len(outcome.error) <= MAX_ERROR_LENGTH
    assert outcome.error.endswith("more characters)")


async def test_an_unregistered_type_dies_at_once() -> None:
    outcome = await run(runner(lambda _job: None), replace(job(), type="other"))
    assert (outcome.status, outcome.error) == (
        "dead",
        "no handler registered for job type 'other'",
    )


class Weird:
    pass


async def _nan(_attempt: int) -> float:
    return 1.0


@pytest.mark.parametrize(
    ("backoff", "expected"),
    [
        (lambda _a: float("nan"), "default"),
        (lambda _a: math.inf, MAX_BACKOFF),
        (lambda _a: -math.inf, 0.0),
        (lambda _a: -3, 0.0),
        (lambda _a: 10**400, MAX_BACKOFF),
        (lambda _a: 1e300, MAX_BACKOFF),
        (lambda _a: None, "default"),
        (lambda _a: "3", "default"),
        (lambda _a: True, "default"),
        (lambda _a: Weird(), "default"),
        (lambda _a: 1 / 0, "default"),
        (_nan, "default"),  # async: never awaited, never run
        (lambda _a: 2, 2.0),
    ],
)
async def test_a_backoff_that_misbehaves_gives_a_usable_delay(
    backoff: Callable[[int], Any], expected: float | str
) -> None:
    async def handler(_job: Job) -> None:
        raise ValueError

    logger = RecordingLogger()
    r = runner(handler, backoff=backoff, logger=logger)
    outcomes = [await run(r) for _ in range(3)]
    for outcome in outcomes:
        assert outcome.status == "pending"
        if expected == "default":
            assert 2.0 <= outcome.delay <= 2.5  # default_backoff(1)
        else:
            assert outcome.delay == expected
    warned = [m for m in logger.messages("warning") if "backoff" in m]
    assert len(warned) == (0 if expected == 2.0 else 1)  # logged once


async def test_outcome_kinds_are_named_and_compare_as_the_strings_observers_see() -> (
    None
):
    async def snoozes(_job: Job) -> None:
        raise pgqueue.Snooze(5)

    async def fails(_job: Job) -> None:
        raise ValueError

    snoozed = await run(runner(snoozes))
    retried = await run(runner(fails))
    # Observers written against the strings keep working.
    assert snoozed.status == "snoozed"
    assert retried.status == "pending"
    assert (snoozed.status, retried.status) == (
        OutcomeKind.SNOOZED,
        OutcomeKind.PENDING,
    )
    assert {str(kind) for kind in OutcomeKind} == {
        "completed",
        "pending",
        "dead",
        "cancelled",
        "snoozed",
        "released",
        "suspended",
    }
    # Every job status an outcome can write is the kind of the same name.
    for status in ("completed", "dead", "cancelled", "pending"):
        assert OutcomeKind(status) == str(pgqueue.Status(status))
