"""Checkpoints: ``await job.checkpoint(value)``, read back as ``job.last_checkpoint``.

Through the public API on a real server: a retried handler resumes where it
stopped (through a worker's retry and through ``Admin.retry``), a
checkpoint survives a rescue and a stale run's checkpoint never lands, it
is cleared on completion, and ``Admin.job``, the dashboard's job page and
``pgqueue top``'s running list show it.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime
from html import unescape
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest

import pgqueue
from pgqueue._dashboard import Sampler
from pgqueue.web import create_app
from tests.helpers import RecordingLogger, no_backoff, row, running, wait_for_row

if TYPE_CHECKING:
    import asyncpg


@dataclasses.dataclass
class Rows:
    rows: int


async def test_a_retried_handler_resumes_from_its_checkpoint(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    done: list[tuple[int, int]] = []  # (attempt, step)
    seen: list[Any] = []
    worker = pgqueue.Worker(
        pool, queue=queue.name, poll_interval=0.1, backoff=no_backoff
    )

    @worker.handler("steps")
    async def steps(job: pgqueue.Job) -> int:
        seen.append(job.last_checkpoint)
        start = 0 if job.last_checkpoint is None else job.last_checkpoint["next"]
        for step in range(start, 10):
            if step in (4, 7) and (job.attempts, step) in ((1, 4), (2, 7)):
                raise ValueError(f"failed at step {step}")
            done.append((job.attempts, step))
            assert await job.checkpoint({"next": step + 1}) is True
        return len(done)

    job_id = await queue.enqueue("steps", {}, max_attempts=2)
    async with running(worker):
        # Attempt 1 stops at step 4 and is retried; attempt 2 at step 7, and
        # the job is dead with its checkpoint kept.
        await wait_for_row(pool, job_id, status="dead")
        info = await pgqueue.Admin(pool).job(job_id)
        assert info is not None
        assert info.checkpoint == {"next": 7}
        assert await pgqueue.Admin(pool).retry(job_id) == {job_id: "retried"}
        stored = await wait_for_row(pool, job_id, status="completed")
    assert seen == [None, {"next": 4}, {"next": 7}]
    assert done == [(1, s) for s in range(4)] + [(2, s) for s in range(4, 7)] + [
        (3, s) for s in range(7, 10)
    ]
    assert stored["checkpoint"] is None  # cleared on completion
    info = await pgqueue.Admin(pool).job(job_id)
    assert info is not None
    assert info.checkpoint is None
    assert info.result == 10


async def test_a_checkpoint_survives_rescue_and_a_stale_runs_never_lands(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # Worker A runs attempt 1, checkpoints, and is cut off long enough for
    # its row to look orphaned; worker B rescues the job, reads A's
    # checkpoint, writes its own. A's next checkpoint is fenced off.
    first_saved, release_first = anyio.Event(), anyio.Event()
    second_saved, release_second = anyio.Event(), anyio.Event()
    outcomes: dict[str, Any] = {}
    logger = RecordingLogger()
    stale = pgqueue.Worker(pool, queue=queue.name, rescue_after=3 * 3600, logger=logger)
    fresh = pgqueue.Worker(pool, queue=queue.name, rescue_after=60)

    @stale.handler("t")
    async def first_run(job: pgqueue.Job) -> None:
        outcomes["first"] = await job.checkpoint({"by": 1})
        first_saved.set()
        await release_first.wait()
        outcomes["stale"] = await job.checkpoint({"by": "the stale run"})

    @fresh.handler("t")
    async def second_run(job: pgqueue.Job) -> None:
        outcomes["read"] = job.last_checkpoint
        outcomes["second"] = await job.checkpoint({"by": 2})
        second_saved.set()
        await release_second.wait()
        raise pgqueue.Permanent("stop here, checkpoint kept")

    job_id = await queue.enqueue("t", {})
    async with running(stale):
        with anyio.fail_after(10):
            await first_saved.wait()
        assert (await row(pool, job_id))["checkpoint"] == '{"by": 1}'
        await pool.execute(
            "UPDATE pgqueue_jobs SET updated_at = now() - interval '1 hour' WHERE id = $1",
            job_id,
        )
        async with running(fresh):
            with anyio.fail_after(10):
                await second_saved.wait()
            release_first.set()
            await logger.wait_for("stale run superseded")
            # While attempt 2 runs, attempt 1's checkpoint did not land.
            stored = await row(pool, job_id)
            assert (stored["status"], stored["attempts"]) == ("running", 2)
            assert json.loads(stored["checkpoint"]) == {"by": 2}
            release_second.set()
            await wait_for_row(pool, job_id, status="dead")
    assert outcomes == {
        "first": True,
        "read": {"by": 1},
        "second": True,
        "stale": False,
    }
    info = await pgqueue.Admin(pool).job(job_id)
    assert info is not None
    assert info.checkpoint == {"by": 2}


async def test_checkpoint_refuses_what_is_not_json_and_a_job_no_worker_runs(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    raised: list[BaseException] = []
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        for bad in ({1, 2}, "nul\x00"):
            try:
                await job.checkpoint(bad)
            except (TypeError, ValueError) as exc:
                raised.append(exc)

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        await wait_for_row(pool, job_id, status="completed")
    assert [type(exc) for exc in raised] == [TypeError, ValueError]

    made: pgqueue.Job = pgqueue.Job(
        id=job_id,
        queue=queue.name,
        type="t",
        payload={},
        attempts=1,
        max_attempts=1,
        run_at=datetime.now(UTC),
        created_at=datetime.now(UTC),
    )
    assert made.last_checkpoint is None
    with pytest.raises(pgqueue.PgQueueError, match="not run by a worker"):
        await made.checkpoint({"n": 1})


async def test_progress_shows_in_admin_the_job_page_and_top(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    saved, release = anyio.Event(), anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        await job.checkpoint({"done": 42, "of": 100, "note": "<b>x</b>"})
        saved.set()
        await release.wait()

    job_id = await queue.enqueue("t", {})
    async with running(worker):
        try:
            with anyio.fail_after(10):
                await saved.wait()
            info = await pgqueue.Admin(pool).job(job_id)
            assert info is not None
            assert info.checkpoint == {"done": 42, "of": 100, "note": "<b>x</b>"}

            transport = httpx.ASGITransport(app=create_app(pool))
            async with httpx.AsyncClient(
                transport=transport, base_url="http://localhost"
            ) as c:
                page = (await c.get(f"/jobs/{job_id}")).text
            assert "<h2>Checkpoint</h2>" in page
            assert "<b>x</b>" not in page
            assert '"done": 42' in unescape(page)

            async with pool.acquire() as conn:
                frame = await Sampler(conn, queue=queue.name).frame()
            [running_job] = [r for r in frame.longest_running if r.id == job_id]
            assert running_job.progress is not None
            assert json.loads(running_job.progress) == {
                "done": 42,
                "of": 100,
                "note": "<b>x</b>",
            }
        finally:
            release.set()
        stored = await wait_for_row(pool, job_id, status="completed")
    assert stored["checkpoint"] is None


async def test_a_typed_handler_checkpoints_and_resumes_too(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # Its job is a copy with the payload converted: the copy checkpoints.
    landed: list[tuple[Any, bool]] = []
    worker = pgqueue.Worker(
        pool, queue=queue.name, poll_interval=0.1, backoff=no_backoff
    )

    @worker.handler("typed")
    async def typed(job: pgqueue.Job[Rows]) -> None:
        assert isinstance(job.payload, Rows)
        landed.append((job.last_checkpoint, await job.checkpoint(job.payload.rows)))
        if job.attempts == 1:
            raise ValueError("again")

    job_id = await queue.enqueue("typed", {"rows": 3})
    async with running(worker):
        await wait_for_row(pool, job_id, status="completed")
    assert landed == [(None, True), (3, True)]
