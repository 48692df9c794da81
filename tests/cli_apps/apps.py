"""Workers in every form ``pgqueue worker MODULE:ATTR`` accepts, and some it refuses.

Their one handler, ``work``, records each run in ``cli_runs`` (queue, job
id, the process id) and then does what the payload says: wait until
``pids`` processes or ``together`` runs have recorded one, ``sleep``,
``hang`` until cut off, or ``exit`` with a code. The queue comes from
``CLI_QUEUE`` and the database from ``PGQUEUE_DSN``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg

import pgqueue

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

WAIT_LIMIT = 20.0


def dsn() -> str:
    return os.environ["PGQUEUE_DSN"]


def make_worker(pool: asyncpg.Pool[Any], concurrency: int = 2) -> pgqueue.Worker:
    worker = pgqueue.Worker(
        pool, queue=os.environ.get("CLI_QUEUE", "default"), concurrency=concurrency
    )

    @worker.handler("work")
    async def work(job: pgqueue.Job) -> None:
        await pool.execute(
            "INSERT INTO cli_runs (queue, job_id, pid) VALUES ($1, $2, $3)",
            job.queue,
            job.id,
            os.getpid(),
        )
        payload: dict[str, Any] = job.payload
        if "pids" in payload:
            await wait_for(pool, job.queue, "count(DISTINCT pid)", payload["pids"])
        if "together" in payload:
            await wait_for(pool, job.queue, "count(*)", payload["together"])
        if "exit" in payload:
            raise SystemExit(payload["exit"])
        if payload.get("hang"):
            await anyio.sleep_forever()
        await anyio.sleep(payload.get("sleep", 0))

    return worker


async def wait_for(pool: asyncpg.Pool[Any], queue: str, what: str, n: int) -> None:
    """Wait until ``what`` over the queue's runs reaches ``n``."""
    with anyio.fail_after(WAIT_LIMIT):
        while (
            await pool.fetchval(
                f"SELECT {what} FROM cli_runs WHERE queue = $1",
                queue,
            )
            < n
        ):
            await anyio.sleep(0.02)


# The forms pgqueue worker accepts. A pool made and not awaited is opened by
# the command (this module is imported inside its event loop).
worker = make_worker(asyncpg.create_pool(dsn(), min_size=1, max_size=4))
single = make_worker(asyncpg.create_pool(dsn(), min_size=1, max_size=4), 1)
# Nothing listens on port 1: the pool fails to open, as a wrong DSN would.
unreachable = make_worker(
    asyncpg.create_pool("postgresql://postgres@127.0.0.1:1/nowhere", min_size=1)
)


def sync_factory() -> pgqueue.Worker:
    return make_worker(asyncpg.create_pool(dsn(), min_size=1, max_size=4))


async def async_factory() -> pgqueue.Worker:
    pool = await asyncpg.create_pool(dsn(), min_size=1, max_size=4)
    return make_worker(pool)


@contextlib.asynccontextmanager
async def lifespan() -> AsyncIterator[pgqueue.Worker]:
    async with asyncpg.create_pool(dsn(), min_size=1, max_size=4) as pool:
        yield make_worker(pool)
    sys.stderr.write("lifespan closed\n")


def tag(handler: Any) -> Any:
    """A middleware that changes nothing."""
    return handler


def backoff(_attempt: int) -> float:
    return 0.0


# What it refuses.
not_a_worker = 42


def needs_args(pool: asyncpg.Pool[Any]) -> pgqueue.Worker:
    return make_worker(pool)


def gives_nothing() -> None:
    return None


@contextlib.asynccontextmanager
async def refused() -> AsyncIterator[pgqueue.Worker]:
    """A factory whose own pool cannot connect (nothing listens on port 1)."""
    async with asyncpg.create_pool("postgresql://postgres@127.0.0.1:1/x") as pool:
        yield make_worker(pool)


@contextlib.contextmanager
def sync_context() -> Iterator[pgqueue.Worker]:
    """A factory written with contextlib.contextmanager, not asynccontextmanager."""
    yield make_worker(asyncpg.create_pool(dsn()))
