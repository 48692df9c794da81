"""A worker of a queue with a fleet-wide limit, for ``tests/test_global_limit.py``.

Run as ``pgqueue worker tests.cli_apps.limited:worker --global-limit N``.
Its one handler, ``sample``, records its run in ``limit_samples`` (start
and end, on the database clock), sleeps ``sleep`` seconds, or, with
``hang`` on its first attempt, hangs until cut off. The queue comes from
``CLI_QUEUE`` and the database from ``PGQUEUE_DSN``.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg

import pgqueue

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

SAMPLES = """
CREATE TABLE IF NOT EXISTS limit_samples (
    id      BIGSERIAL PRIMARY KEY,
    queue   TEXT        NOT NULL,
    job_id  BIGINT      NOT NULL,
    pid     INT         NOT NULL,
    started TIMESTAMPTZ NOT NULL,
    ended   TIMESTAMPTZ
)
"""
"""Where ``sample`` records each run: its start and its end."""


def make_worker(pool: asyncpg.Pool[Any], queue: str, **options: Any) -> pgqueue.Worker:
    worker = pgqueue.Worker(pool, queue=queue, **options)

    @worker.handler("sample")
    async def sample(job: pgqueue.Job) -> None:
        sample_id = await pool.fetchval(
            "INSERT INTO limit_samples (queue, job_id, pid, started)"
            " VALUES ($1, $2, $3, clock_timestamp()) RETURNING id",
            job.queue,
            job.id,
            os.getpid(),
        )
        payload: dict[str, Any] = job.payload
        if payload.get("hang") and job.attempts == 1:
            await anyio.sleep_forever()
        await anyio.sleep(payload.get("sleep", 0))
        await pool.execute(
            "UPDATE limit_samples SET ended = clock_timestamp() WHERE id = $1",
            sample_id,
        )

    return worker


@contextlib.asynccontextmanager
async def worker() -> AsyncIterator[pgqueue.Worker]:
    """The worker, with a pool big enough for its handlers."""
    async with asyncpg.create_pool(
        os.environ["PGQUEUE_DSN"], min_size=1, max_size=12
    ) as pool:
        yield make_worker(pool, os.environ["CLI_QUEUE"], concurrency=10)
