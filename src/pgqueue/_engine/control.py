"""Cancel requests over the control channel: a NOTIFY is a hint, the job's row decides.

PostgreSQL asks no privilege of a session that sends a NOTIFY, so any role
that can connect can write to ``pgqueue_control``. A payload there only
names a job to look at: the worker keeps the ids of jobs it holds, reads
their rows in one statement at most every `READ_INTERVAL` seconds, and
cancels those whose row says ``cancel_requested`` (`Queue.cancel` sets it
before it sends the NOTIFY). Payloads that name no job the worker holds
cost no SQL and no log line.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING

import anyio

from pgqueue._core.retry import Failures
from pgqueue._sql.literals import array
from pgqueue._sql.outcomes import CANCEL_REQUESTED

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Collection, Mapping

    from pgqueue._core.log import Logger
    from pgqueue._wire.dedicated import DedicatedConnection

__all__ = ["READ_INTERVAL", "CancelHints", "job_id_of", "read_cancel_requested"]

READ_INTERVAL = 0.1
"""The least seconds between two reads of cancel requests."""

# A bigint has at most 19 digits: longer payloads are no job's id.
_MAX_DIGITS = 19


def job_id_of(payload: str) -> int | None:
    """The job id a control payload names (ASCII digits only), or None."""
    if 0 < len(payload) <= _MAX_DIGITS and payload.isascii() and payload.isdigit():
        return int(payload)
    return None


def read_cancel_requested(
    connection: DedicatedConnection,
) -> Callable[[list[int]], Awaitable[Collection[int]]]:
    """A read of which of some jobs have had their cancel requested, on ``connection``."""

    async def read(ids: list[int]) -> Collection[int]:
        rows = await connection.fetch(CANCEL_REQUESTED, array(ids))
        return [row["id"] for row in rows]

    return read


@dataclass(eq=False)
class CancelHints:
    """Turn control notifications into cancels of the jobs whose rows ask for it.

    Args:
        read: given job ids, returns those whose cancel was requested (one
            statement).
        holds: whether this worker holds a job (running, or claimed and not
            started yet).
        cancel: cancels a held job.
        interval: the least seconds between two reads.
    """

    read: Callable[[list[int]], Awaitable[Collection[int]]]
    _: KW_ONLY
    holds: Callable[[int], bool]
    cancel: Callable[[int], None]
    logger: Logger
    fields: Mapping[str, object]
    interval: float = READ_INTERVAL

    def __post_init__(self) -> None:
        self._named: set[int] = set()
        self._hinted = anyio.Event()

    def hint(self, payload: str) -> None:
        """A control notification arrived: remember the job it names, if this worker holds it.

        Never raises and does no I/O; anything else is ignored.
        """
        job_id = job_id_of(payload)
        if job_id is None or job_id in self._named or not self.holds(job_id):
            return
        self._named.add(job_id)
        self._hinted.set()

    async def run(self) -> None:
        """Read the named jobs' rows when hinted, at most every ``interval``; cancel those asked to."""
        failures = Failures.of(self, "reading cancel requests failed")
        while True:
            await self._hinted.wait()
            self._hinted = anyio.Event()
            # Jobs that ended meanwhile need no look.
            named = sorted(i for i in self._named if self.holds(i))
            self._named.clear()
            if not named:
                continue
            try:
                requested = await self.read(named)
            except Exception as exc:
                pause = failures.failed(exc)
                # Look again after the pause (the heartbeat is the safety net).
                self._named.update(named)
                self._hinted.set()
            else:
                failures.succeeded()
                pause = self.interval
                for job_id in requested:
                    self.cancel(job_id)
            await anyio.sleep(pause)
