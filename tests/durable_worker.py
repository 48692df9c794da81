"""A worker process for the durable handler tests: ``python durable_worker.py DSN QUEUE CALLS [hang]``.

Its handler ``three_steps`` runs three steps; each step's function appends
its name to the file ``CALLS`` (counted outside the database). With
``hang``, the handler hangs after step 2, until the test kills the process.
The worker rescues a job after 1 s without a heartbeat and runs until killed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import asyncpg

import pgqueue


async def main(dsn: str, queue: str, calls: str, hang: bool) -> None:
    log = Path(calls)

    def called(name: str) -> str:
        with log.open("a") as out:
            out.write(f"{name}\n")
        return name

    async with asyncpg.create_pool(
        dsn,
        min_size=1,
        max_size=4,
        server_settings={"application_name": "pgqueue_durable_worker"},
    ) as pool:
        worker = pgqueue.Worker(
            pool, queue=queue, concurrency=2, poll_interval=0.5, rescue_after=1.0
        )

        @worker.handler("three_steps")
        async def three_steps(job: pgqueue.Job) -> list[str]:
            one = await job.step("one", called, "one")
            two = await job.step("two", called, "two")
            if hang:
                await anyio.sleep_forever()
            three = await job.step("three", called, "three")
            return [one, two, three]

        await worker.run()


if __name__ == "__main__":
    dsn, queue, calls, *rest = sys.argv[1:]
    anyio.run(main, dsn, queue, calls, rest == ["hang"])
