"""Every attempt, kept: the failed attempts and snoozes a job's row records.

Through the public API on a real server: a worker's failures, a rescue of
a worker process killed with SIGKILL, snoozes kept apart, the newest 20
kept with each error capped like ``last_error``, Go-written outcomes
(``last_error`` only), and what ``pgqueue jobs show``, ``--json`` and the
dashboard's job page show.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from html import unescape
from typing import TYPE_CHECKING

import anyio
import asyncpg
import httpx
import pytest

import pgqueue
from pgqueue._core.errors import MAX_ERROR_LENGTH
from pgqueue.web import create_app
from tests.go_module import GO_CLAIM, GO_RETRY
from tests.helpers import no_backoff, running, wait_for_row, wait_until
from tests.test_cli import EXIT_OK, cli
from tests.test_faults import FAULT_WORKER, INVOCATIONS

if TYPE_CHECKING:
    from pathlib import Path


def fast_worker(pool: asyncpg.Pool, queue: str, **options: object) -> pgqueue.Worker:
    return pgqueue.Worker(
        pool,
        queue=queue,
        poll_interval=0.1,
        backoff=no_backoff,
        **options,  # type: ignore[arg-type]
    )


@pytest.mark.slow
async def test_history_after_a_rescue_and_three_failures(
    fresh_dsn: str, tmp_path: Path
) -> None:
    """A run killed with SIGKILL is rescued ("no heartbeat for N s"), then three attempts fail."""
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool:
        await pool.execute(INVOCATIONS)
        job_id = await pgqueue.Queue(pool, name="history").enqueue(
            "hang", {"n": 1}, max_attempts=10
        )
        log_path = tmp_path / "fault_worker.log"
        with log_path.open("wb") as log:
            process = await anyio.open_process(
                [sys.executable, str(FAULT_WORKER), fresh_dsn, "history", "1"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:

            async def hanging() -> bool:
                if process.returncode is not None:
                    pytest.fail(f"the worker exited early:\n{log_path.read_text()}")
                n: int = await pool.fetchval(
                    "SELECT count(*) FROM fault_invocations WHERE job_id = $1", job_id
                )
                return n == 1

            await wait_until(hanging, within=30)
            process.kill()
            with anyio.fail_after(10):
                await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                    await process.wait()
        assert process.returncode == -9
        await wait_for_row(pool, job_id, status="running", attempts=1)

        worker = fast_worker(pool, "history", rescue_after=1.0)

        @worker.handler("hang")
        async def fail_three_times(job: pgqueue.Job) -> str:
            if job.attempts <= 4:
                raise RuntimeError(f"failure in attempt {job.attempts}")
            return "done"

        async with running(worker):
            await wait_for_row(pool, job_id, within=30, status="completed")

        info = await pgqueue.Admin(pool).job(job_id)
    assert info is not None
    assert [failed.attempt for failed in info.errors] == [1, 2, 3, 4]
    rescued, *failed = info.errors
    assert rescued.error is not None
    assert re.fullmatch(r"no heartbeat for \d+ s", rescued.error), rescued.error
    assert [f.error for f in failed] == [
        f"RuntimeError: failure in attempt {n}" for n in (2, 3, 4)
    ]
    times = [f.at for f in info.errors]
    assert None not in times
    assert times == sorted(times)  # type: ignore[type-var]
    assert info.snoozed == ()
    assert info.last_error == "RuntimeError: failure in attempt 4"
    assert info.result == "done"


async def test_snoozes_are_listed_apart_from_failures(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    job_id = await pgqueue.Queue(pool, name=queue_name).enqueue("step", {})
    worker = fast_worker(pool, queue_name)

    @worker.handler("step")
    async def step(job: pgqueue.Job) -> None:
        if job.snoozes == 0:
            raise pgqueue.Snooze(0.01)
        if job.attempts == 1:
            raise ValueError("not yet")

    async with running(worker):
        await wait_for_row(pool, job_id, status="completed")
    info = await pgqueue.Admin(pool).job(job_id)
    assert info is not None
    assert [(s.attempt, s.delay) for s in info.snoozed] == [(1, 0.01)]
    assert [(f.attempt, f.error) for f in info.errors] == [(1, "ValueError: not yet")]
    assert info.snoozes == 1
    assert info.snoozed[0].at is not None
    assert info.errors[0].at is not None
    assert info.snoozed[0].at < info.errors[0].at


async def test_the_newest_twenty_are_kept_each_capped_like_last_error(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    job_id = await pgqueue.Queue(pool, name=queue_name).enqueue(
        "fails", {}, max_attempts=25
    )
    worker = fast_worker(pool, queue_name)

    @worker.handler("fails")
    async def fails(job: pgqueue.Job) -> None:
        raise ValueError(f"failure {job.attempts} " + "x" * 2 * MAX_ERROR_LENGTH)

    async with running(worker):
        await wait_for_row(pool, job_id, within=30, status="dead")
    info = await pgqueue.Admin(pool).job(job_id)
    assert info is not None
    assert [f.attempt for f in info.errors] == list(range(6, 26))
    for failed in info.errors:
        assert failed.error is not None
        assert failed.error.startswith(f"ValueError: failure {failed.attempt} x")
        assert len(failed.error) <= MAX_ERROR_LENGTH
    assert info.errors[-1].error == info.last_error


async def test_go_written_outcomes_set_last_error_only(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    """A Go worker's retry leaves the history alone; pgqueue's next failure adds to it."""
    job_id = await pgqueue.Queue(pool, name=queue_name).enqueue("mixed", {})
    [claimed] = await pool.fetch(GO_CLAIM, queue_name, 1)
    assert await pool.execute(GO_RETRY, job_id, claimed["attempts"], "go failed") == (
        "UPDATE 1"
    )
    info = await pgqueue.Admin(pool).job(job_id)
    assert info is not None
    assert info.last_error == "go failed"
    assert info.errors == ()

    worker = fast_worker(pool, queue_name)

    @worker.handler("mixed")
    async def mixed(job: pgqueue.Job) -> None:
        if job.attempts == 2:
            raise ValueError("python failed")

    async with running(worker):
        await wait_for_row(pool, job_id, status="completed")
    info = await pgqueue.Admin(pool).job(job_id)
    assert info is not None
    assert [(f.attempt, f.error) for f in info.errors] == [
        (2, "ValueError: python failed")
    ]


async def test_a_history_written_by_hand_reads_without_failing(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    job_id = await pgqueue.Queue(pool, name=queue_name).enqueue("odd", {})
    await pool.execute(
        "UPDATE pgqueue_jobs SET errors = $2::text::jsonb, snoozed = '{\"a\": 1}'"
        " WHERE id = $1",
        job_id,
        json.dumps(
            [1, {"attempt": "one", "at": "yesterday", "error": 3}, {"attempt": 7}]
        ),
    )
    admin = pgqueue.Admin(pool)
    info = await admin.job(job_id)
    preview = await admin.job_preview(job_id)
    assert info is not None
    assert preview is not None
    for read in (info, preview):
        assert [(f.attempt, f.at, f.error) for f in read.errors] == [
            (None, None, None),
            (7, None, None),
        ]
        assert read.snoozed == ()


async def test_jobs_show_and_json_list_the_failed_attempts(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    job_id = await pgqueue.Queue(pool, name=queue_name).enqueue("fails", {})
    worker = fast_worker(pool, queue_name)

    @worker.handler("fails")
    async def fails(job: pgqueue.Job) -> None:
        if job.attempts == 1:
            raise ValueError("first [/] \x1b[31mred")
        if job.snoozes == 0:
            raise pgqueue.Snooze(0.5)
        raise pgqueue.Permanent("second")

    async with running(worker):
        await wait_for_row(pool, job_id, status="dead")

    shown = await cli(dsn, "jobs", "show", str(job_id), "--json")
    assert shown.code == EXIT_OK, shown
    document = json.loads(shown.out)
    assert [(e["attempt"], e["error"]) for e in document["errors"]] == [
        (1, "ValueError: first [/] \x1b[31mred"),
        (2, "Permanent: second"),
    ]
    assert [(s["attempt"], s["delay"]) for s in document["snoozed"]] == [(2, 0.5)]
    assert all(isinstance(e["at"], str) for e in document["errors"])

    text = await cli(dsn, "jobs", "show", str(job_id))
    assert text.code == EXIT_OK, text
    assert "failed attempts, oldest first" in text.out
    assert "ValueError: first [/]" in text.out
    assert "\x1b" not in text.out  # control characters are escaped
    assert "Permanent: second" in text.out
    assert "snoozes, oldest first" in text.out


async def test_the_job_page_lists_failed_attempts_escaped_and_cut(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    job_id = await pgqueue.Queue(pool, name=queue_name).enqueue("fails", {})
    worker = fast_worker(pool, queue_name)
    hostile = "<script>alert(1)</script>"

    @worker.handler("fails")
    async def fails(job: pgqueue.Job) -> None:
        raise pgqueue.Permanent(hostile + " " + "y" * 100)

    async with running(worker):
        await wait_for_row(pool, job_id, status="dead")

    transport = httpx.ASGITransport(app=create_app(pool))
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
        page = (await c.get(f"/jobs/{job_id}")).text
    assert "<script>alert" not in page
    assert "&lt;script&gt;" in page
    section = page[page.index("<h2>Failed attempts</h2>") :]
    assert 'id="errors"' in section
    assert unescape(hostile) in unescape(re.sub(r"<[^>]+>", "", section))

    preview = await pgqueue.Admin(pool).job_preview(job_id, max_chars=12)
    assert preview is not None
    assert [f.error for f in preview.errors] == ["Permanent: <"]
