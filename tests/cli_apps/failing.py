"""A worker whose handlers fail, for the log tests (``tests/test_worker_logs.py``).

``flaky`` fails its first attempt and completes its second; ``doomed``
always fails. Retries are due at once (``no_backoff``).
"""

from __future__ import annotations

import os

import asyncpg

import pgqueue
from tests.helpers import no_backoff

worker = pgqueue.Worker(
    asyncpg.create_pool(os.environ["PGQUEUE_DSN"], min_size=1, max_size=2),
    queue=os.environ.get("CLI_QUEUE", "default"),
    backoff=no_backoff,
)


@worker.handler("flaky")
async def flaky(job: pgqueue.Job) -> None:
    if job.attempts == 1:
        msg = "smtp timeout"
        raise ConnectionError(msg)


@worker.handler("doomed")
def doomed(_job: pgqueue.Job) -> None:
    msg = "no such mailbox"
    raise LookupError(msg)
