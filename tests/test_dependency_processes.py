"""Dependencies across worker processes: a fan-in completed by two at once,
and a parent whose worker is killed with SIGKILL mid-run.

Real worker processes (``tests/fault_worker.py``) on a fresh database;
nothing is mocked; the tests synchronise on database state under deadlines.
"""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import anyio
import asyncpg
import pytest

import pgqueue
from tests.helpers import row, running, wait_for_row, wait_until

if TYPE_CHECKING:
    from pathlib import Path

    from anyio.abc import Process

from tests.test_faults import FAULT_WORKER, INVOCATIONS, RECORD


async def _start(dsn: str, queue: str, log_path: Path) -> Process:
    with log_path.open("ab") as log:
        return await anyio.open_process(
            [sys.executable, str(FAULT_WORKER), dsn, queue, "20"],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


async def _kill(process: Process) -> None:
    if process.returncode is None:
        process.kill()
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            await process.wait()


@pytest.mark.slow
async def test_a_fan_in_of_1000_parents_completed_by_two_processes_starts_its_child_once_promptly(
    fresh_dsn: str, tmp_path: Path
) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool:
        await pool.execute(INVOCATIONS)
        queue = pgqueue.Queue(pool, name="fanin")
        ids = await queue.enqueue_many(
            [
                *(("record", {"n": n}) for n in range(1000)),
                pgqueue.NewJob("record", {"callback": True}, after=range(-1000, 0)),
            ]
        )
        parents, child = ids[:-1], ids[-1]
        assert (await row(pool, child))["parents_left"] == 1000
        processes = [
            await _start(fresh_dsn, "fanin", tmp_path / f"worker{n}.log")
            for n in (1, 2)
        ]
        try:
            await wait_for_row(pool, child, within=60, status="completed")
        finally:
            for process in processes:
                await _kill(process)
        # Both processes completed parents, and the child ran exactly once,
        # after the last parent, within a second of it (its poll is 0.5 s;
        # the wakeup of the last parent's outcome is what starts it).
        ran = await pool.fetch(
            "SELECT job_id, attempt, at FROM fault_invocations WHERE job_id = $1", child
        )
        assert [(r["job_id"], r["attempt"]) for r in ran] == [(child, 1)]
        last_parent = await pool.fetchval(
            "SELECT max(completed_at) FROM pgqueue_jobs WHERE id = ANY($1::bigint[])",
            parents,
        )
        assert (
            await pool.fetchval(
                "SELECT count(*) FROM pgqueue_jobs WHERE id = ANY($1::bigint[])"
                " AND status = 'completed'",
                parents,
            )
            == 1000
        )
        lag = (ran[0]["at"] - last_parent).total_seconds()
        assert 0 < lag < 1.0, lag
        assert (await row(pool, child))["parents_left"] == 0

        # Both gone: their backends end once the server sees the sockets close.
        async def workers_gone() -> bool:
            left = await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE application_name = 'pgqueue_fault_worker'"
            )
            return bool(left == 0)

        await wait_until(workers_gone)


@pytest.mark.slow
async def test_a_parent_killed_mid_run_is_rescued_and_its_child_waits_for_the_rerun(
    fresh_dsn: str, tmp_path: Path
) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool:
        await pool.execute(INVOCATIONS)
        queue = pgqueue.Queue(pool, name="killed")
        parent = await queue.enqueue("hang", {})
        child = await queue.enqueue("record", {}, after=[parent])
        process = await _start(fresh_dsn, "killed", tmp_path / "worker.log")
        try:

            async def invoked() -> bool:
                n: int = await pool.fetchval(
                    "SELECT count(*) FROM fault_invocations WHERE job_id = $1", parent
                )
                return n == 1

            await wait_until(invoked, within=30)
        finally:
            process.kill()
            await _kill(process)
        assert process.returncode == -9
        assert (await row(pool, parent))["status"] == "running"
        worker = pgqueue.Worker(
            pool, queue="killed", rescue_after=1.0, poll_interval=0.1
        )
        order: list[str] = []

        @worker.handler("hang")
        async def rerun(job: pgqueue.Job) -> str:
            # The rescue put the parent back; its child still waits.
            assert (await row(pool, child))["status"] == "waiting"
            order.append(f"parent attempt {job.attempts}")
            return "rerun"

        @worker.handler("record")
        async def record(job: pgqueue.Job) -> None:
            order.append(f"child {dict(job.parent_results)}")
            await pool.execute(RECORD, job.id, job.attempts)

        async with running(worker):
            await wait_for_row(pool, child, within=30, status="completed")
        assert order == ["parent attempt 2", f"child { {parent: 'rerun'} }"]
