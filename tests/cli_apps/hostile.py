"""A worker whose one handler, ``echo``, logs its payload's ``text`` and raises its ``error``.

``tests/test_cli_hostile.py`` runs it with ``pgqueue worker`` to see what
reaches the log. The queue comes from ``CLI_QUEUE`` and the database from
``PGQUEUE_DSN``.
"""

from __future__ import annotations

import logging
import os

import asyncpg

import pgqueue

worker = pgqueue.Worker(
    asyncpg.create_pool(os.environ["PGQUEUE_DSN"], min_size=1, max_size=2),
    queue=os.environ.get("CLI_QUEUE", "default"),
)


@worker.handler("echo")
async def echo(job: pgqueue.Job) -> None:
    logging.getLogger("app").warning("payload text: %s", job.payload["text"])
    raise pgqueue.Permanent(job.payload["error"])
