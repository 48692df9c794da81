"""Smoke test of an installed wheel: import, SCHEMA, the CLI's --help, the web app, a short drain.

Run by .ci/run with the Python of a fresh virtualenv that holds only the
built wheel (and its ``cli`` and ``web`` extras), from outside the checkout, so a file
missing from the wheel fails CI. Needs PGQUEUE_TEST_DSN.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg

import pgqueue
from pgqueue.testing import with_database

JOBS = 200


async def drain(dsn: str) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    try:
        await pgqueue.install(pool)
        queue = pgqueue.Queue(pool, "smoke")
        await queue.enqueue_many([pgqueue.NewJob("add", {"n": n}) for n in range(JOBS)])
        seen: list[int] = []
        worker = pgqueue.Worker(pool, queue="smoke", concurrency=8)

        @worker.handler("add")
        async def add(job: pgqueue.Job) -> int:
            seen.append(job.payload["n"])
            return int(job.payload["n"]) * 2

        await asyncio.wait_for(worker.run(until_empty=True), 60)
        assert sorted(seen) == list(range(JOBS)), len(seen)
        done = await pool.fetchval(
            "SELECT count(*) FROM pgqueue_jobs WHERE status = 'completed'"
        )
        assert done == JOBS, done
    finally:
        await pool.close()


async def in_a_database_of_its_own(admin_dsn: str) -> None:
    name = f"pgqueue_smoke_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            await drain(with_database(admin_dsn, name))
        finally:
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await admin.close()


def main() -> None:
    assert "pgqueue_jobs" in pgqueue.SCHEMA
    installed = Path(pgqueue.__file__).resolve()
    assert "site-packages" in installed.parts, f"not the wheel: {installed}"
    cli = Path(sys.executable).with_name("pgqueue")
    for command in ([str(cli), "--help"], [sys.executable, "-m", "pgqueue", "--help"]):
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    from pgqueue.web import create_app  # the web extra's files are in the wheel

    create_app(os.environ["PGQUEUE_TEST_DSN"])
    asyncio.run(in_a_database_of_its_own(os.environ["PGQUEUE_TEST_DSN"]))
    print(f"wheel smoke test passed: {installed.parent}")


main()
