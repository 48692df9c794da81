"""Frames of the live dashboards (``pgqueue top``, `pgqueue.web`): counts, rates, jobs.

Each frame reads, in one read-only snapshot: the per-queue counts and lag
of the `QUEUES_SHOWN` queues with the most jobs to do
(`pgqueue.Admin.top_queues`, and how many more there are), the newest job
id, the jobs of those queues enqueued since the previous frame (a range of
the primary key), the jobs running longest (the rescue index) and the
latest dead jobs (the index of failed jobs). Every name comes cut in the
database (`pgqueue._sql.dashboard.READ_QUEUE_CHARS` and the like), so a frame
is bounded whatever the table holds. Rates come
from differences between frames over the last `RATE_WINDOW` seconds (at
least the last interval), so the first frame shows none:

* enqueued per second: the rows whose ids are past the newest id of the
  window's first frame (each frame counts those past the previous one's);
* finished per second: those, less the growth of the queue's live jobs
  (waiting, ready, scheduled and running). Every job that left the live states
  counts: completed, dead or cancelled; dead jobs put back by a retry count
  against it (it never goes below zero).

Neither depends on the completed count (an estimate on a large table) nor
on pruning. A queue gets rates only from frames that showed it (or showed
every queue): one that has just risen into the shown ones has none yet.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pgqueue._admin import QUEUES_SHOWN, Admin
from pgqueue._core.checks import check_int, check_queue_name
from pgqueue._sql.dashboard import (
    DASHBOARD_DEAD_SHOWN,
    DASHBOARD_ENQUEUED_SHOWN,
    DASHBOARD_NEWEST,
    DASHBOARD_RUNNING_SHOWN,
)

if TYPE_CHECKING:
    from datetime import datetime

    from pgqueue._queue import Connection

__all__ = [
    "QUEUES_SHOWN",
    "RATE_WINDOW",
    "TOP",
    "DeadJob",
    "Frame",
    "QueueLine",
    "RunningJob",
    "Sampler",
]

TOP = 5
"""How many longest-running and latest dead jobs a frame shows."""

RATE_WINDOW = 10.0
"""Seconds over which the rates are averaged (at least one interval)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueLine:
    """One queue's row of a frame."""

    queue: str
    ready: int
    scheduled: int
    running: int
    completed: int
    completed_estimated: bool
    dead: int
    cancelled: int
    lag: float | None
    """Seconds since the oldest ready job was due; None with none ready."""
    enqueued_per_second: float | None
    """None on the first frame."""
    finished_per_second: float | None
    """None on the first frame."""
    slots_in_use: int | None = None
    """Slots a run holds, for a queue with a fleet-wide limit; else None."""
    global_limit: int | None = None
    """The queue's slots, for a queue with a fleet-wide limit; else None."""
    waiting: int = 0
    """Jobs waiting for their parents to finish."""
    parked: int = 0
    """Durable handlers' jobs waiting for a signal or a child job."""
    paused: bool = False
    """Whether the queue is paused (`pgqueue.Admin.pause`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunningJob:
    """A running job: seconds since it was due, and since it was last heard from."""

    id: int
    queue: str
    job_type: str
    running_for: float | None
    """Seconds since its ``run_at`` (when this attempt was due)."""
    heard_from: float | None
    """Seconds since it was claimed or its worker's last heartbeat."""
    progress: str | None = None
    """Its durable handler's progress (`pgqueue.Job.progress`: ``40% message``), else its checkpoint's
    JSON text (`pgqueue.Job.checkpoint`); its first 200 characters. None without either, or hidden."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadJob:
    """A dead job, when it died, and the first line of its last error (300 characters at most)."""

    id: int
    queue: str
    job_type: str
    died_at: datetime
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    """What one redraw shows."""

    at: datetime
    """The database's clock when the frame was read."""
    queues: list[QueueLine]
    """The queues with the most jobs to do (`pgqueue.Admin.top_queues`), at most the sampler's limit."""
    longest_running: list[RunningJob]
    latest_dead: list[DeadJob]
    more_queues: int = 0
    """How many other queues (of those the filter lets through) the frame leaves out."""

    def to_json(self) -> dict[str, Any]:
        """The frame as JSON-ready data with stable keys."""
        return dataclasses.asdict(self)


@dataclass(slots=True)
class _Sample:
    at: datetime
    newest: int
    """The newest id then."""
    live: dict[str, int]
    """Ready, scheduled and running jobs per queue then."""
    enqueued: dict[str, int]
    """Jobs enqueued per queue since the sample before (of the queues in ``live``)."""
    complete: bool
    """Whether ``live`` holds every queue: one it lacks had no jobs."""

    def saw(self, queue: str) -> bool:
        """Whether this sample counted ``queue`` (a queue it left out had unknown counts)."""
        return self.complete or queue in self.live


class Sampler:
    """Reads frames from one connection; remembers recent ones for the rates.

    Rates are averaged over about ``window`` seconds: from the oldest
    remembered frame that is at most that old (the previous frame, when the
    interval is longer).

    A frame shows one ``queue`` (always, jobs or not), or the ``limit``
    queues with the most jobs to do whose name holds ``contains`` (any,
    with None). ``progress=False`` reads no checkpoint (a dashboard that
    hides payloads).

    Raises:
        TypeError, ValueError: a bad queue, filter or limit (nothing is read).
    """

    def __init__(
        self,
        conn: Connection,
        *,
        queue: str | None = None,
        contains: str | None = None,
        limit: int = QUEUES_SHOWN,
        progress: bool = True,
        window: float = RATE_WINDOW,
    ) -> None:
        self._conn = conn
        self._admin = Admin(conn)
        self._names = None if queue is None else [check_queue_name(queue)]
        self._contains = None if contains is None else check_queue_name(contains)
        self._limit = check_int("limit", limit)
        self._progress = bool(progress)
        self._window = window
        self._samples: deque[_Sample] = deque()

    def use(self, conn: Connection) -> None:
        """Read the next frames on ``conn`` (the last one was lost; the caller owns both)."""
        self._conn = conn
        self._admin = Admin(conn)

    async def frame(self) -> Frame:
        """Read one frame, in one read-only snapshot."""
        conn, names, contains = self._conn, self._names, self._contains
        samples = self._samples
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            head = await conn.fetchrow(DASHBOARD_NEWEST)
            assert head is not None  # an aggregate: always one row
            newest, at = head["newest"], head["now"]
            top = await self._admin.top_queues(
                self._limit, contains=contains, queues=names
            )
            stats = top.queues
            enqueued: dict[str, int] = {}
            if samples:
                # Only the rows since the previous frame: each frame reads
                # each new row once, however long the window.
                rows = await conn.fetch(
                    DASHBOARD_ENQUEUED_SHOWN,
                    samples[-1].newest,
                    newest,
                    [s.queue for s in stats],
                )
                enqueued = {row["queue"]: row["enqueued"] for row in rows}
            running = await conn.fetch(
                DASHBOARD_RUNNING_SHOWN, names, contains, TOP, self._progress
            )
            dead = await conn.fetch(DASHBOARD_DEAD_SHOWN, names, contains, TOP)
        live = {s.queue: s.waiting + s.ready + s.scheduled + s.running for s in stats}
        samples.append(_Sample(at, newest, live, enqueued, complete=top.more == 0))
        while len(samples) > 2 and (at - samples[1].at).total_seconds() >= self._window:
            samples.popleft()
        base = samples[0]
        elapsed = (at - base.at).total_seconds()
        lines = []
        for s in stats:
            enqueued_rate = finished_rate = None
            if elapsed > 0 and all(sample.saw(s.queue) for sample in samples):
                new = sum(
                    sample.enqueued.get(s.queue, 0)
                    for sample in itertools.islice(samples, 1, None)
                )
                finished = new - (live[s.queue] - base.live.get(s.queue, 0))
                enqueued_rate = new / elapsed
                finished_rate = max(finished, 0) / elapsed
            lines.append(
                QueueLine(
                    queue=s.queue,
                    ready=s.ready,
                    scheduled=s.scheduled,
                    running=s.running,
                    completed=s.completed,
                    completed_estimated=s.completed_estimated,
                    dead=s.dead,
                    cancelled=s.cancelled,
                    lag=s.lag,
                    enqueued_per_second=enqueued_rate,
                    finished_per_second=finished_rate,
                    slots_in_use=s.slots_in_use,
                    global_limit=s.global_limit,
                    waiting=s.waiting,
                    parked=s.parked,
                    paused=s.paused,
                )
            )
        return Frame(
            at=at,
            queues=lines,
            longest_running=[RunningJob(**dict(row)) for row in running],
            latest_dead=[
                DeadJob(
                    id=row["id"],
                    queue=row["queue"],
                    job_type=row["job_type"],
                    died_at=row["updated_at"],
                    error=row["error_line"],
                )
                for row in dead
            ],
            more_queues=top.more,
        )
