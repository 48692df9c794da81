"""A worker process for the fault tests: ``python fault_worker.py DSN QUEUE CONCURRENCY``.

``QUEUE`` may also name several queues with their concurrency,
``A=10,B=10``; ``CONCURRENCY`` is then the overall cap (``max_concurrency``,
or ``none``).

Every job of type ``record`` inserts ``(job_id, attempt)`` into
``fault_invocations`` (the test creates that table) and completes; one of
type ``hang`` inserts it too, then never returns. The worker runs until the
process is killed or interrupted; the test kills it.
"""

from __future__ import annotations

import sys

import anyio
import asyncpg

import pgqueue

RECORD = "INSERT INTO fault_invocations (job_id, attempt) VALUES ($1, $2)"


async def main(dsn: str, queue: str, concurrency: str) -> None:
    async with asyncpg.create_pool(
        dsn,
        min_size=1,
        max_size=4,
        server_settings={"application_name": "pgqueue_fault_worker"},
    ) as pool:
        if "=" in queue:
            queues = {
                name: int(n) for name, n in (q.split("=") for q in queue.split(","))
            }
            cap = None if concurrency == "none" else int(concurrency)
            worker = pgqueue.Worker(
                pool, queues=queues, max_concurrency=cap, poll_interval=0.5
            )
        else:
            worker = pgqueue.Worker(
                pool, queue=queue, concurrency=int(concurrency), poll_interval=0.5
            )

        @worker.handler("record")
        async def record(job: pgqueue.Job) -> None:
            await pool.execute(RECORD, job.id, job.attempts)

        @worker.handler("hang")
        async def hang(job: pgqueue.Job) -> None:
            await pool.execute(RECORD, job.id, job.attempts)
            await anyio.sleep_forever()

        await worker.run()


if __name__ == "__main__":
    dsn, queue, concurrency = sys.argv[1:]
    anyio.run(main, dsn, queue, concurrency)
