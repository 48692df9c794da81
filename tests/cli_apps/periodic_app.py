"""A worker with one periodic schedule, for ``tests/test_periodic.py`` (run with ``pgqueue worker``).

Its schedule (``PERIODIC_NAME``, every 60 s, jobs of type ``tick`` on the
queue ``CLI_QUEUE``, ``unique=False``) reads the time from the table
``PERIODIC_CLOCK`` (one row, column ``t``) instead of ``now()``, so that the
test moves the clock of every process at once. The database comes from
``PGQUEUE_DSN``.
"""

from __future__ import annotations

import os

import asyncpg

import pgqueue
from tests.helpers import TableClock


async def _done(_job: pgqueue.Job) -> None:
    pass


def worker() -> pgqueue.Worker:
    pool = asyncpg.create_pool(os.environ["PGQUEUE_DSN"], min_size=1, max_size=2)
    made = pgqueue.Worker(pool, queue=os.environ["CLI_QUEUE"], concurrency=4)
    made.register("tick", _done)
    made.periodic(os.environ["PERIODIC_NAME"], every=60, job_type="tick", unique=False)
    # The clock every process reads, with short sleeps (injected privately).
    made._schedules.clock = TableClock(os.environ["PERIODIC_CLOCK"])
    return made
