"""The one owner of every claim, from the claim until its outcome is durable.

A worker of several queues keeps one ledger per queue (each queue's own
capacity) and, with an overall cap, a `Budget` over all of them.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from pgqueue._core.job import Job
    from pgqueue._core.outcome import Key

__all__ = ["SHORT_JOB", "Budget", "Claims"]

SHORT_JOB = 0.02
"""Seconds: while a backlog lasts, a lane whose handlers run shorter than this
on average claims up to its ``ahead`` more jobs than it has slots."""


class Claims:
    """Every claim the worker holds, and what it is doing with each.

    A claim is *ready* (claimed, no handler started yet), *running*, or
    *writing* (its outcome is with the writer, not yet durable). It leaves
    only when its outcome is durable: written, or fenced off as stale. Free
    capacity, heartbeats, back pressure, the drain, the release of unstarted
    jobs and ``run(until_empty=True)`` all read this one place.

    Args:
        capacity: the most claims ready or running at once
            (``concurrency + prefetch``).
        write_allowance: how many outcomes may wait for the writer before
            they take capacity away: beyond it, the worker claims less, and
            nothing once ``capacity`` more wait (back pressure while
            outcomes cannot be written).
        ahead: how many more claims it may hold (and outcomes it may let
            wait for the writer) while a backlog of short jobs lasts (the
            last claim came back full, and handlers run under `SHORT_JOB`
            on average) and the writer keeps up: the next claim's round
            trip then overlaps running jobs instead of idling the slots.
    """

    def __init__(self, capacity: int, write_allowance: int, ahead: int = 0) -> None:
        self.capacity = capacity
        self.ahead = ahead
        self.backlog = False
        """The last claim came back full: more jobs are likely ready."""
        self._run_time = math.inf  # the handlers' mean run time (moving average)
        self._allowance = write_allowance
        self.ready: deque[Job] = deque()
        self.running = 0
        self._held: set[Key] = set()
        self.settled_count = 0
        """Outcomes made durable so far (a claim that began before a change sees it)."""
        self._empty = asyncio.Event()
        self._empty.set()

    @property
    def free(self) -> int:
        """How many more jobs may be claimed now."""
        active = len(self.ready) + self.running
        capacity, allowance = self.capacity, self._allowance
        if self.claiming_ahead:
            capacity += self.ahead
            allowance += self.ahead
        over = len(self._held) - active - allowance  # writing beyond the allowance
        return capacity - active - (over if over > 0 else 0)

    @property
    def claiming_ahead(self) -> bool:
        """Whether it may hold its ``ahead`` claims now.

        While a backlog of short jobs lasts, and the writer keeps up (no more
        outcomes wait for it than the allowance and ``ahead`` together: a
        full claim's outcomes may be written while the next claim runs): a
        writer that cannot write stops the claims as without ``ahead``.
        """
        return (
            self.backlog
            and self._run_time < SHORT_JOB
            and len(self._held) - len(self.ready) - self.running
            <= self._allowance + self.ahead
        )

    @property
    def claim_at(self) -> int | None:
        """The fewest free slots worth a claim now, if it may claim ahead (else None: the policy's).

        A batch of ``ahead`` while a backlog of short jobs lasts, even while
        the writer lags (the claims then hold back, and resume in batches
        rather than a slot at a time); else one free slot.
        """
        if not self.ahead:
            return None
        return self.ahead if self.backlog and self._run_time < SHORT_JOB else 1

    def ran(self, seconds: float) -> None:
        """A handler ran for ``seconds``: the mean that decides claiming `ahead`."""
        mean = self._run_time
        self._run_time = seconds if mean == math.inf else mean + (seconds - mean) / 8

    @property
    def active(self) -> int:
        """Claims ready or running (their handlers not yet ended)."""
        return len(self.ready) + self.running

    @property
    def held(self) -> int:
        """Claims whose outcome is not yet durable."""
        return len(self._held)

    @property
    def writing(self) -> int:
        """Claims whose outcome waits to be written."""
        return len(self._held) - self.active

    def keys(self) -> list[Key]:
        """Every claim not yet durable: the rows to heartbeat."""
        return list(self._held)

    def add(self, jobs: Iterable[Job], *, ready: bool = True) -> None:
        """Take over claimed ``jobs``: ready to run, or (``ready=False``) already ended."""
        for job in jobs:
            self._held.add((job.id, job.attempts))
            if ready:
                self.ready.append(job)
        if self._held:
            self._empty.clear()

    def start(self) -> Job:
        """Take the next ready job to run it."""
        job = self.ready.popleft()
        self.running += 1
        return job

    def ended(self) -> None:
        """A running job's outcome went to the writer."""
        self.running -= 1

    def give_back(self) -> list[Job]:
        """Take every ready job, to release it (its outcome goes to the writer)."""
        jobs = list(self.ready)
        self.ready.clear()
        return jobs

    def settled(self, keys: Iterable[Key]) -> None:
        """Outcomes of these claims are durable (or fenced off): forget the claims."""
        held = self._held
        before = len(held)
        for key in keys:
            held.discard(key)
        self.settled_count += before - len(held)
        if not held:
            self._empty.set()

    async def wait_empty(self) -> None:
        """Wait until no claim is held."""
        await self._empty.wait()


class Budget:
    """The overall cap of a worker of several queues, over their ledgers.

    Claims ready or running across every ledger, plus the slots of claims in
    flight (reserved before a claim is sent, given back once its jobs are in
    their ledger), never exceed ``cap``: so no more than ``cap`` handlers
    ever run at once, however the queues' claims interleave. A queue claims
    ``min(its own free slots, free)``.

    Args:
        cap: the most claims ready or running at once across the ledgers.
        ledgers: the ledger of each queue.
    """

    def __init__(self, cap: int, ledgers: Sequence[Claims]) -> None:
        self.cap = cap
        self._ledgers = tuple(ledgers)
        self.reserved = 0
        """Slots taken by claims in flight."""

    @property
    def free(self) -> int:
        """How many more jobs the worker's queues may claim between them now."""
        used = self.reserved
        for claims in self._ledgers:
            used += claims.active
        return self.cap - used
