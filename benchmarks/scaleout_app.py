"""The worker app of `benchmarks.scaleout`: one no-op handler, run by ``pgqueue worker``.

``python -m pgqueue worker benchmarks.scaleout_app:worker --burst --processes P``
enters `worker` in every process: it opens a small pool on ``PGQUEUE_DSN``
(set by the benchmark to its own database) and yields a `pgqueue.Worker`
whose handler for ``noop`` does nothing. Concurrency and prefetch come from
the command line.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING

import asyncpg

import pgqueue

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

JOB_TYPE = "noop"


async def noop(job: pgqueue.Job) -> None:
    """Do nothing: the benchmark measures the queue, not the handler."""


@contextlib.asynccontextmanager
async def worker() -> AsyncIterator[pgqueue.Worker]:
    """A worker on ``PGQUEUE_DSN`` with the no-op handler (pool of 1..4, as small as it needs)."""
    async with asyncpg.create_pool(
        os.environ["PGQUEUE_DSN"], min_size=1, max_size=4
    ) as pool:
        w = pgqueue.Worker(pool)
        w.register(JOB_TYPE, noop)
        yield w
