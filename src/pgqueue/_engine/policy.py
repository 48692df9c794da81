"""When the worker claims, how many jobs, and from where in line.

Pure: no I/O and no clock of its own (the caller passes the time), so every
rule has a unit test.
"""

from __future__ import annotations

import heapq
import math
from datetime import datetime
from typing import TypeAlias

from pgqueue._sql.literals import HEAD_OF_LINE, PRIORITIES

__all__ = ["HEAD", "LAST_ID", "RETRY_WAKE_MARGIN", "Bounds", "ClaimPolicy", "Place"]

Place: TypeAlias = tuple[datetime, int]
"""A place in one priority's line ``(run_at, id)``; a claim takes the jobs after it."""

HEAD: Place = HEAD_OF_LINE
"""The place before every job of a priority."""

LAST_ID = 2**63 - 1
"""The largest job id: a place after every job of its time."""

Bounds: TypeAlias = dict[int, Place]
"""Where a claim starts in each priority's line; a priority not in it starts at its head."""

RETRY_WAKE_MARGIN = 0.002
"""Seconds after a job falls due (by the local clock) before claiming it.

Small: the local due time is already late by the answer's trip back, and a
claim that still comes early finds nothing and asks again when the job falls due.
"""


class ClaimPolicy:
    """Decide each claim: whether to claim now, how many jobs, from which place.

    The worker claims while jobs *may be ready*: after a wakeup (a NOTIFY, a
    reconnect, a rescue, one of its own retries falling due, the queue's
    next job falling due, a poll falling due) and after every claim that
    could have left jobs behind (a full claim, or one that started past the
    head of the line). It stops once a claim from the head comes back
    short: that claim saw every job then ready, and the worker then asks
    when the queue's next job falls due (`due_in`). A wakeup is never lost: it is remembered until a claim can be
    made, which needs at least ``claim_at`` free slots, and one that comes
    while a claim runs calls for another claim after it.

    Claims take the highest priority first, each priority's line in
    ``(run_at, id)`` order. While a backlog lasts, each claim starts in each
    priority's line just past the last job it took there: every claimed job
    leaves a dead entry at the head of the index until vacuum, and a claim
    from the head would walk them all. A claim from the head of every line
    runs at least every ``poll_interval``, and whenever a claim past a head
    comes back short, so a job put back behind (rescued, released, or
    enqueued with an earlier ``run_at``) waits at most a poll. A job of a
    higher priority than the backlog's is found by the next claim.

    Args:
        claim_at: the fewest free slots worth a claim.
        poll_interval: seconds between claims when nothing wakes the worker.
    """

    def __init__(self, *, claim_at: int, poll_interval: float) -> None:
        self.claim_at = claim_at
        self.poll_interval = poll_interval
        self.more = True
        """Jobs may be ready: claim as soon as there is room."""
        self._after: Bounds = {}
        self._passed: frozenset[int] = (
            frozenset()
        )  # priorities bounded by a claim's time
        self._woken = False  # since the last claim began
        self._head_due = 0.0
        self._poll_due = 0.0
        self._retries: list[float] = []  # a heap of local times
        self._next_due = math.inf  # the queue's next job not yet due (local time)

    def wake(self) -> None:
        """Something may have become ready.

        Priorities a claim moved past start at their heads again: a job that
        committed after that claim began may sit before its time (and so
        does a wakeup while a claim runs: the claim does not pass them).
        """
        self.more = True
        self._woken = True
        if self._passed:
            for priority in self._passed:
                del self._after[priority]
            self._passed = frozenset()

    def retry_written(self, delay: float, now: float) -> bool:
        """One of our jobs was put back to run in ``delay`` s; return whether to wake at once.

        A retry due before the next poll gets a timer of its own; the run_at
        was set from the database clock during the write that just finished,
        so a claim after ``now + delay`` (plus a margin) finds it due.
        """
        if delay >= self.poll_interval:
            return False
        due = now + delay + RETRY_WAKE_MARGIN
        earliest = not self._retries or due < self._retries[0]
        heapq.heappush(self._retries, due)
        return earliest

    def due_in(self, delay: float | None, now: float) -> None:
        """The queue's first job not yet due falls due in ``delay`` s (None: it has none).

        Learnt from the database after a claim came back short (the time
        until that job's run_at, on the database clock, as the answer
        left it): a claim after ``now + delay`` (plus a margin) finds it
        due. The latest answer replaces the one before (which may be
        claimed by now); a wakeup or a poll before then claims as ever.
        """
        self._next_due = (
            math.inf if delay is None else now + max(delay, 0.0) + RETRY_WAKE_MARGIN
        )

    def next_claim(self, free: int, now: float) -> tuple[int, Bounds] | None:
        """How many jobs to claim from which places now, or None to wait."""
        self._fire_timers(now)
        if not self.more or free < self.claim_at:
            return None
        self._woken = False
        if not self._after or now >= self._head_due:
            self._head_due = now + self.poll_interval
            return free, {}
        return free, self._after

    def claimed(
        self,
        limit: int,
        bounds: Bounds,
        got: int,
        last: Bounds,
        now: float,
        claimed_at: datetime | None = None,
    ) -> None:
        """Take note of a claim of ``limit`` from ``bounds`` that returned ``got`` jobs.

        ``last`` holds, for each priority the claim took jobs of, the place
        of the last one; ``claimed_at`` is the claim's time on the database
        clock. A full claim moved past every priority above the lowest one
        it took: they had no due job it could see, so the next claim starts
        their lines at ``claimed_at`` (priority 0 lives in the Go module's
        index, among the jobs of every priority: draining a backlog of
        negative priority, each claim would walk the whole backlog to find
        no job of priority 0), until a wakeup says a job may have committed
        since; after a wakeup during the claim, they start at their heads.
        """
        self._poll_due = now + self.poll_interval
        full = got == limit
        if not full or not last:
            # A short claim from past a head has yet to look behind its place
            # (and a full one of rows without a place claims from the heads);
            # a wakeup while it ran may be for a job it did not see.
            self.more = full or bool(bounds) or self._woken
            self._after = {}
            self._passed = frozenset()
            return
        self.more = True
        lowest = min(last)
        after = dict(bounds)
        passed = []
        if claimed_at is not None and not self._woken:
            for priority in PRIORITIES:
                if priority > lowest:
                    after[priority] = (claimed_at, LAST_ID)
                    passed.append(priority)
        after[lowest] = last[lowest]
        self._after = after
        self._passed = frozenset(passed)

    def failed(self) -> None:
        """A claim failed: claim again (after the retry delay), from the heads."""
        self.more = True
        self._after = {}
        self._passed = frozenset()

    def wait(self, now: float) -> float:
        """Seconds until a timer makes jobs possibly ready.

        Infinite while they already may be: then only room (a freed slot)
        or a stop is worth waking for.
        """
        if self.more:
            return math.inf
        due = self._poll_due
        if self._retries and self._retries[0] < due:
            due = self._retries[0]
        due = min(due, self._next_due)
        return max(due - now, 0.0)

    def _fire_timers(self, now: float) -> None:
        retries = self._retries
        while retries and retries[0] <= now:
            heapq.heappop(retries)
            self.more = True
        if now >= self._next_due:
            self._next_due = math.inf
            self.more = True
        if now >= self._poll_due:
            self.more = True
