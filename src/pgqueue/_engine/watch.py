"""A watch on the event loop: warns when a handler holds it too long, naming the job.

An ``async def`` handler that calls blocking code (``time.sleep``, a
synchronous HTTP client, a CPU-bound loop) holds the event loop: every
other job of the worker, its heartbeats and its claims wait. A ticker task
notes the time every half threshold; a thread looks at that note, and
while the loop has not ticked for longer than the threshold it reads the
loop thread's stack for the handler's run (`JobRunner.run`'s frame) and
remembers its job. Once the loop moves again the ticker logs the warning,
in the loop (loggers are not all thread-safe). The watch costs the jobs
nothing: no handler step is timed.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import anyio

from pgqueue._engine.runner import JobRunner, job_fields, job_label

if TYPE_CHECKING:
    from types import FrameType

    from pgqueue._core.job import Job
    from pgqueue._core.log import Logger

__all__ = ["LoopWatch"]

_RUN = JobRunner.run.__code__


class LoopWatch:
    """Warn when a handler holds the event loop for more than ``threshold`` seconds.

    Args:
        threshold: seconds a handler may run without yielding to the loop.
        logger: where the warning goes (WARNING, with the job's fields).
        fields: fields every record of the worker carries.
    """

    def __init__(
        self, threshold: float, logger: Logger, fields: dict[str, Any]
    ) -> None:
        self._threshold = threshold
        self._interval = threshold / 2
        self._logger = logger
        self._fields = fields
        self._tick = time.monotonic()
        self._culprit: Job | None = None
        self._loop_thread = threading.get_ident()

    async def run(self) -> None:
        """Tick until cancelled, with the watching thread beside it."""
        self._loop_thread = threading.get_ident()
        stop = threading.Event()
        watcher = threading.Thread(
            target=self._watch, args=(stop,), name="pgqueue-loop-watch", daemon=True
        )
        watcher.start()
        try:
            while True:
                self._tick = time.monotonic()
                await anyio.sleep(self._interval)
                held = time.monotonic() - self._tick - self._interval
                culprit, self._culprit = self._culprit, None
                if culprit is not None and held > self._threshold:
                    self._logger.warning(
                        "%s held the event loop for %.1f s: blocking code in an "
                        "async handler stops every other job of the worker "
                        "(run it with anyio.to_thread.run_sync, or register a "
                        "plain def handler)",
                        job_label(culprit),
                        held,
                        extra={**self._fields, **job_fields(culprit), "held": held},
                    )
        finally:
            stop.set()

    def _watch(self, stop: threading.Event) -> None:
        """In a thread: while the loop is held past the threshold, find the handler's job."""
        while not stop.wait(self._interval / 2):
            if time.monotonic() - self._tick - self._interval <= self._threshold:
                continue
            frame = sys._current_frames().get(self._loop_thread)
            job = _running_job(frame)
            if job is not None:
                self._culprit = job


def _running_job(frame: FrameType | None) -> Job | None:
    """The job whose handler runs in ``frame`` or a frame that called it."""
    while frame is not None:
        if frame.f_code is _RUN:
            job: Job | None = frame.f_locals.get("job")
            return job
        frame = frame.f_back
    return None
