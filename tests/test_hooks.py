"""Enqueue hooks and worker observers: what they are told, and that they cannot hurt."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgqueue
from tests.helpers import (
    RecordingLogger,
    no_backoff,
    row,
    running,
    wait_for_row,
    wait_until,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


class Recorder(pgqueue.EnqueueHook):
    """Records each call's event as the hooks saw it, and sets a trace context."""

    def __init__(self, context: str | None = None) -> None:
        self.context = context
        self.calls: list[tuple[str, Any]] = []

    def before_enqueue(self, event: pgqueue.EnqueueEvent) -> Any:
        self.calls.append(("before", (list(event.jobs), event.batch, list(event.ids))))
        if self.context is not None:
            event.trace_context = self.context
        return len(self.calls)

    def after_enqueue(
        self, event: pgqueue.EnqueueEvent, state: Any, error: BaseException | None
    ) -> None:
        self.calls.append(
            ("after", (state, list(event.ids), list(event.duplicates), error))
        )


async def test_hooks_see_each_enqueue_with_its_ids_and_duplicates(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    k, k2 = f"{queue_name}-k", f"{queue_name}-k2"  # keys are global to a type
    hook = Recorder()
    queue = pgqueue.Queue(pool, name=queue_name, hooks=[hook])
    first = await queue.enqueue("t", {"n": 1}, priority=2, unique_key=k)
    again = await queue.enqueue("t", {"n": 2}, unique_key=k)
    assert again == first
    ids = await queue.enqueue_many(
        [
            ("u", {}),
            pgqueue.NewJob("t", {}, unique_key=k),
            pgqueue.NewJob("t", {}, unique_key=k2),
            pgqueue.NewJob("t", {}, unique_key=k2),
        ]
    )
    assert ids[1] == first
    assert ids[2] == ids[3]
    assert await queue.enqueue_many([]) == []  # nothing sent, no hook
    assert hook.calls == [
        (
            "before",
            ([pgqueue.NewJob("t", {"n": 1}, priority=2, unique_key=k)], False, []),
        ),
        ("after", (1, [first], [False], None)),
        ("before", ([pgqueue.NewJob("t", {"n": 2}, unique_key=k)], False, [])),
        ("after", (3, [first], [True], None)),
        (
            "before",
            (
                [
                    pgqueue.NewJob("u", {}),
                    pgqueue.NewJob("t", {}, unique_key=k),
                    pgqueue.NewJob("t", {}, unique_key=k2),
                    pgqueue.NewJob("t", {}, unique_key=k2),
                ],
                True,
                [],
            ),
        ),
        ("after", (5, ids, [False, True, False, True], None)),
    ]


async def test_a_duplicate_raised_still_tells_the_hooks_the_ids(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    k = f"{queue_name}-k"  # keys are global to a job type
    hook = Recorder()
    queue = pgqueue.Queue(pool, name=queue_name, hooks=[hook])
    first = await queue.enqueue("t", {}, unique_key=k)
    with pytest.raises(pgqueue.DuplicateJobError) as raised:
        await queue.enqueue("t", {}, unique_key=k, on_conflict="raise")
    assert hook.calls[-1] == ("after", (3, [first], [True], raised.value))
    with pytest.raises(pgqueue.DuplicateJobError) as raised:
        await queue.enqueue_many(
            [("t", {}), pgqueue.NewJob("t", {}, unique_key=k)], on_conflict="raise"
        )
    _, (_, ids, duplicates, error) = hook.calls[-1]
    assert ids[1] == first
    assert duplicates == [False, True]
    assert error is raised.value


async def test_a_failed_enqueue_tells_the_hooks_its_error(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    hook = Recorder()
    queue = pgqueue.Queue(pool, name=queue_name, hooks=[hook])
    async with pool.acquire() as connection:
        closed: Any = connection
    with pytest.raises(asyncpg.InterfaceError) as raised:
        await queue.enqueue("t", {}, connection=closed)
    assert hook.calls[-1] == ("after", (1, [], [], raised.value))
    # Bad input raises before any hook runs.
    with pytest.raises(TypeError):
        await queue.enqueue("t", {1, 2})
    with pytest.raises(ValueError, match="job 0"):
        await queue.enqueue_many([("", {})])
    assert len(hook.calls) == 2


async def test_the_trace_context_a_hook_gives_is_stored_and_claimed(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    k, k2 = f"{queue_name}-k", f"{queue_name}-k2"  # keys are global to a type
    plain = pgqueue.Queue(pool, name=queue_name)
    traced = pgqueue.Queue(pool, name=queue_name, hooks=[Recorder("ctx-1")])
    ids = [
        await plain.enqueue("t", {}),
        await traced.enqueue("t", {}),
        await traced.enqueue("t", {}, unique_key=k),
        *await traced.enqueue_many([("t", {}), ("t", {})]),
        *await traced.enqueue_many([pgqueue.NewJob("t", {}, unique_key=k2)]),
        *await plain.enqueue_many([("t", {})]),
    ]
    stored = [(await row(pool, job_id))["trace_context"] for job_id in ids]
    assert stored == [None, "ctx-1", "ctx-1", "ctx-1", "ctx-1", "ctx-1", None]
    seen: dict[int, str | None] = {}
    worker = pgqueue.Worker(pool, queue=queue_name)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        seen[job.id] = job.trace_context

    with anyio.fail_after(15):
        await worker.run(until_empty=True)
    assert [seen[job_id] for job_id in ids] == stored


class Broken(pgqueue.EnqueueHook, pgqueue.Observer):
    def before_enqueue(self, event: pgqueue.EnqueueEvent) -> Any:
        raise RuntimeError("before")

    def after_enqueue(
        self, event: pgqueue.EnqueueEvent, state: Any, error: BaseException | None
    ) -> None:
        raise RuntimeError("after")

    def on_written(
        self, written: Sequence[pgqueue.Outcome], fenced: Sequence[pgqueue.Outcome]
    ) -> None:
        raise RuntimeError("written")

    def on_rescued(self, queue: str, statuses: Mapping[str, int]) -> None:
        raise RuntimeError("rescued")


class Observed(pgqueue.Observer):
    def __init__(self) -> None:
        self.written: list[tuple[int, str]] = []
        self.fenced: list[tuple[int, str]] = []
        self.rescued: list[tuple[str, dict[str, int]]] = []

    def on_written(
        self, written: Sequence[pgqueue.Outcome], fenced: Sequence[pgqueue.Outcome]
    ) -> None:
        self.written += [(o.job.id, o.status) for o in written]
        self.fenced += [(o.job.id, o.status) for o in fenced]

    def on_rescued(self, queue: str, statuses: Mapping[str, int]) -> None:
        self.rescued.append((queue, dict(statuses)))


class OnlyRescues:
    """An observer with one method of the two (no base class)."""

    def __init__(self) -> None:
        self.seen: list[Mapping[str, int]] = []

    def on_rescued(self, queue: str, statuses: Mapping[str, int]) -> None:
        self.seen.append(statuses)


async def test_a_hook_or_observer_that_raises_is_logged_and_changes_nothing(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    logger = RecordingLogger()
    broken = Broken()
    recorder = Recorder("ctx")
    queue = pgqueue.Queue(
        pool, name=queue_name, hooks=[broken, recorder], logger=logger
    )
    job_id = await queue.enqueue("t", {})
    assert (await row(pool, job_id))["trace_context"] == "ctx"
    orphan = await queue.enqueue("t", {})
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'running', attempts = 1,"
        " updated_at = now() - interval '1 hour' WHERE id = $1",
        orphan,
    )
    observed, only = Observed(), OnlyRescues()
    worker = pgqueue.Worker(
        pool,
        queue=queue_name,
        rescue_after=60,
        observers=[broken, observed, only],  # type: ignore[list-item]
        logger=logger,
    )
    worker.register("t", _noop)
    async with running(worker):
        await wait_for_row(pool, job_id, status="completed")
        await wait_for_row(pool, orphan, status="completed")
    failures = [m for m in logger.messages("error") if "hook failed" in m]
    # before of two enqueues (a hook whose before failed is not called after);
    # on_rescued once; on_written at least once.
    assert len(failures) >= 4
    assert observed.rescued == [(queue_name, {"pending": 1})]
    assert only.seen == [{"pending": 1}]
    assert sorted(observed.written) == [(job_id, "completed"), (orphan, "completed")]
    assert observed.fenced == []


async def _noop(_job: pgqueue.Job) -> None:
    return None


async def test_observers_are_told_of_outcomes_fenced_off(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    started, release = anyio.Event(), anyio.Event()
    observed = Observed()
    worker = pgqueue.Worker(
        pool, queue=queue.name, backoff=no_backoff, observers=[observed]
    )

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        started.set()
        await release.wait()
        raise ValueError("late")

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        with anyio.fail_after(10):
            await started.wait()
        # What a rescue by another worker does: the row is pending again.
        await pool.execute(
            "UPDATE pgqueue_jobs SET status = 'pending', run_at = now() + interval '1 hour'"
            " WHERE id = $1",
            job_id,
        )
        release.set()

        async def told() -> bool:
            return bool(observed.fenced)

        await wait_until(told)
    assert observed.fenced == [(job_id, "pending")]
    assert observed.written == []
    stored = await row(pool, job_id)
    assert (stored["status"], stored["last_error"]) == ("pending", None)


def test_observers_need_callable_methods() -> None:
    class Bad:
        on_written = 3

    with pytest.raises(TypeError, match="observer on_written"):
        pgqueue.Worker(None, observers=[Bad()])  # type: ignore[arg-type, list-item]
