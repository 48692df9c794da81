"""A worker process: runs jobs until SIGINT or SIGTERM, then drains and exits 0.

    PGQUEUE_DSN=postgresql://postgres@127.0.0.1:5432/test \\
        python examples/worker_process.py [QUEUE]

On the first SIGINT (Ctrl-C) or SIGTERM (``docker stop``, systemd, Kubernetes)
it stops claiming jobs and lets the ones in flight finish, for up to
``DRAIN_TIMEOUT`` seconds; jobs still running then are cut short and go back to
``pending`` at once, to be run again by another worker. A second signal cuts
them short right away. Keep ``DRAIN_TIMEOUT`` under your supervisor's grace
period (Kubernetes waits 30 s before it sends SIGKILL).

It prints ``ready`` once it handles signals and the worker is starting, and one
line as each job starts and finishes.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from typing import TYPE_CHECKING

import anyio
import asyncpg

import pgqueue

if TYPE_CHECKING:
    from anyio.abc import TaskStatus

DRAIN_TIMEOUT = 25.0


async def send_report(job: pgqueue.Job) -> None:
    print(f"job {job.id} started: report for {job.payload['account']}", flush=True)
    await anyio.sleep(job.payload.get("seconds", 1.0))  # stands in for slow work
    print(f"job {job.id} finished", flush=True)


async def drain(worker: pgqueue.Worker, grace: float) -> None:
    try:
        await worker.stop(timeout=grace)
    except TimeoutError as exc:
        print(exc, flush=True)  # the jobs cut short are back in pending already


async def stop_on_signals(
    worker: pgqueue.Worker, *, task_status: TaskStatus[None]
) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async with anyio.create_task_group() as tg:
            grace = DRAIN_TIMEOUT
            async for signum in signals:
                if grace:
                    what = f"stopping; jobs in flight get {grace:g} s to finish"
                else:
                    what = "cutting the jobs in flight short"
                print(f"{signal.Signals(signum).name}: {what}", flush=True)
                tg.start_soon(drain, worker, grace)
                grace = 0.0  # a second signal cuts them short


async def main(queue: str) -> None:
    async with asyncpg.create_pool(os.environ["PGQUEUE_DSN"]) as pool:
        worker = pgqueue.Worker(pool, queue=queue, concurrency=8)
        worker.register("send_report", send_report)
        async with anyio.create_task_group() as tg:
            await tg.start(stop_on_signals, worker)
            print("ready", flush=True)
            await worker.run()  # returns once stopped and drained
            tg.cancel_scope.cancel()  # stop listening for signals
    print("stopped", flush=True)


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    anyio.run(main, sys.argv[1] if len(sys.argv) > 1 else "default")
