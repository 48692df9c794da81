"""Durable asyncio job queue and NOTIFY/LISTEN pub/sub on PostgreSQL.

The Python sibling of the Go module ``github.com/pascalallen/pgqueue``:
same ``pgqueue_jobs`` table, same semantics, built on asyncpg and anyio.
"""

from __future__ import annotations

from pgqueue._backoff import Backoff, default_backoff
from pgqueue._errors import (
    AlreadyStartedError,
    PayloadTooLargeError,
    Permanent,
    PgQueueError,
    SchemaError,
    is_permanent,
)
from pgqueue._job import Job, NewJob, Status
from pgqueue._log import Logger
from pgqueue._pubsub import Callback, Subscriber, publish
from pgqueue._queue import Connection, Executor, Queue, install, uninstall
from pgqueue._sql import JOBS_CHANNEL, SCHEMA, SCHEMA_DOWN
from pgqueue._worker import Handler, Middleware, Worker

__all__ = [
    "JOBS_CHANNEL",
    "SCHEMA",
    "SCHEMA_DOWN",
    "AlreadyStartedError",
    "Backoff",
    "Callback",
    "Connection",
    "Executor",
    "Handler",
    "Job",
    "Logger",
    "Middleware",
    "NewJob",
    "PayloadTooLargeError",
    "Permanent",
    "PgQueueError",
    "Queue",
    "SchemaError",
    "Status",
    "Subscriber",
    "Worker",
    "default_backoff",
    "install",
    "is_permanent",
    "publish",
    "uninstall",
]

__version__ = "0.1.0.dev0"
