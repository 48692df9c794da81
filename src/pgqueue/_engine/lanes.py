"""The queues a worker consumes: each queue's parts, and the routes between them."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import anyio

from pgqueue._core.lifecycle import OutcomeKind
from pgqueue._core.outcome import Outcome
from pgqueue._engine.claimer import Claimer
from pgqueue._engine.consumers import Consumers
from pgqueue._engine.lease import Lease
from pgqueue._engine.ledger import Claims
from pgqueue._engine.policy import ClaimPolicy

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from pgqueue._core.options import LaneSettings, WorkerOptions
    from pgqueue._core.outcome import Key
    from pgqueue._engine.runner import JobRunner
    from pgqueue._engine.services import LaneServices

__all__ = ["Lane", "Routes"]


class Lane:
    """One queue of a worker: its ledger, claim policy, claimer, consumers and lease.

    Its capacity is its ``concurrency`` plus the worker's ``prefetch``
    (with the default ``prefetch=None``, up to ``concurrency`` more while a
    backlog of short jobs lasts, on a queue no limit but its slots counts,
    in a worker without ``max_concurrency``); the policy, claimer, consumers and lease are made by `build` when the
    worker starts (they need a running event loop).

    Args:
        settings: the queue's own settings.
        options: the worker's options.
    """

    def __init__(self, settings: LaneSettings, options: WorkerOptions) -> None:
        self.settings = settings
        self.options = options
        capacity = settings.concurrency + (options.prefetch or 0)
        ahead = (
            settings.concurrency
            if options.prefetch is None
            and options.max_concurrency is None
            and _plain(settings)
            else 0
        )
        self.claims = Claims(capacity, write_allowance=capacity + ahead, ahead=ahead)
        self.policy: ClaimPolicy
        self.claimer: Claimer
        self.consumers: Consumers
        self.lease: Lease | None = None

    def build(
        self,
        services: LaneServices,
        *,
        on_spare: Callable[[], None] | None,
        on_ended: Callable[[], None] | None,
        schema_checked: anyio.Event | None,
    ) -> None:
        """Make the lane's policy, claimer, consumers and (with a global limit) lease.

        Args:
            services: what the worker's lanes share.
            on_spare: called when a claim left overall slots unused.
            on_ended: called after each of the lane's jobs ended; ``None``
                gives the room to the lane's own claimer.
            schema_checked: set once another lane's claimer checked the
                schema (``None``: this lane's claimer checks it).
        """
        settings, options, budget = self.settings, self.options, services.budget
        capacity = self.claims.capacity
        if budget is not None:
            capacity = min(capacity, budget.cap)
        if settings.global_limit is not None:
            capacity = min(capacity, settings.global_limit)
            self.lease = Lease(
                settings,
                options,
                worker=services.worker,
                wanted=capacity,
                claims=self.claims,
            )
        self.policy = ClaimPolicy(
            # With jobs in hand, wait for a batch worth claiming.
            claim_at=max(1, min(options.prefetch or 0, capacity // 2)),
            poll_interval=options.poll_interval,
        )
        self.claimer = Claimer(
            services,
            self.policy,
            self.claims,
            settings,
            options,
            on_claimed=self.claimed,
            on_spare=on_spare,
            schema_checked=schema_checked,
            lease=self.lease,
        )
        self.consumers = Consumers(
            services,
            self.claims,
            on_ended=self.claimer.room if on_ended is None else on_ended,
        )

    def claimed(self) -> None:
        """The claimer put jobs in the ledger: a consumer takes them."""
        self.consumers.wake()


def _plain(settings: LaneSettings) -> bool:
    """Whether the queue's claims are counted by nothing but its own slots."""
    return (
        settings.global_limit is None
        and settings.group_limit is None
        and settings.rate_limit is None
    )


class Routes:
    """The switchboard between a worker's lanes, once they are built.

    It sends each wake-up to the lane of the queue it names (or to every
    lane), the room a job leaves to the lanes that may use it, each durable
    outcome to the ledger that held its claim, and a cancel request to the
    lane holding the job. A worker of one queue is lanes of one.

    Args:
        lanes: the worker's lanes, in the order of its queues.
        runner: the runner of every lane's handlers.
    """

    def __init__(self, lanes: Sequence[Lane], runner: JobRunner) -> None:
        self.lanes = tuple(lanes)
        self._by_name = {lane.settings.name: lane for lane in self.lanes}
        self._runner = runner

    def build(self, services: LaneServices) -> list[Lease]:
        """Build every lane; return the leases of those with a global limit.

        The first lane's claimer checks the schema; the others wait for it.
        Under an overall cap, the room a lane leaves goes to the others.
        """
        budget = services.budget
        checked: anyio.Event | None = None
        for lane in self.lanes:
            lane.build(
                services,
                on_spare=None if budget is None else partial(self.room_others, lane),
                on_ended=None if budget is None else partial(self.room_after, lane),
                schema_checked=checked,
            )
            checked = checked or lane.claimer.checked
        return [lane.lease for lane in self.lanes if lane.lease is not None]

    @property
    def checked(self) -> anyio.Event:
        """Set once the schema has been checked (by the first lane's claimer)."""
        return self.lanes[0].claimer.checked

    async def claim(self, *, until_empty: bool) -> None:
        """Run every lane's claimer; raise the first failure (the others are then cancelled)."""
        failure: Exception | None = None
        async with anyio.create_task_group() as claiming:

            async def claim(lane: Lane) -> None:
                nonlocal failure
                try:
                    await lane.claimer.run(until_empty=until_empty)
                except Exception as exc:
                    if failure is None:
                        failure = exc
                    claiming.cancel_scope.cancel()
                else:
                    lane.consumers.close()  # until_empty: this queue is done

            for lane in self.lanes:
                claiming.start_soon(claim, lane)
        if failure is not None:
            raise failure

    def close(self, *, stopping: bool) -> None:
        """Claims are over: consumers return once no job is ready, or (``stopping``) at once."""
        for lane in self.lanes:
            if stopping:
                lane.consumers.stop_taking()
            else:
                lane.consumers.close()

    def give_back(self, put: Callable[[Outcome], None]) -> None:
        """Release every claimed job no handler started (their outcomes go to ``put``)."""
        for lane in self.lanes:
            for job in lane.claims.give_back():
                put(Outcome(job, OutcomeKind.RELEASED))

    async def wait_empty(self) -> None:
        """Wait until no lane holds a claim."""
        for lane in self.lanes:
            await lane.claims.wait_empty()

    @property
    def held(self) -> int:
        """Claims whose outcome is not yet durable, in every lane."""
        return sum(lane.claims.held for lane in self.lanes)

    def held_keys_by_queue(self) -> dict[str, list[Key]]:
        """Every claim not yet durable, of every lane, by queue: the rows to heartbeat."""
        return {lane.settings.name: lane.claims.keys() for lane in self.lanes}

    def wake(self, queue: str) -> None:
        """Jobs of ``queue`` may be ready: its lane claims (no other does)."""
        lane = self._by_name.get(queue)
        if lane is not None:
            lane.claimer.wake()

    def wake_queues(self, queues: Iterable[str]) -> None:
        """Jobs of these queues may be ready."""
        for name in queues:
            self.wake(name)

    def wake_all(self) -> None:
        """Jobs of any queue may be ready (enqueues may have been missed)."""
        for lane in self.lanes:
            lane.claimer.wake()

    def room_after(self, lane: Lane) -> None:
        """A job of ``lane`` ended under the overall cap: the other lanes look first, then it."""
        lanes = self.lanes
        count = len(lanes)
        for step in range(1, count + 1):
            lanes[(lane.settings.index + step) % count].claimer.room()

    def room_others(self, lane: Lane) -> None:
        """``lane`` left overall slots unused: the other lanes may claim them."""
        for other in self.lanes:
            if other is not lane:
                other.claimer.room()

    def settled(self, _outcomes: Sequence[Outcome], keys: list[Key]) -> None:
        """These outcomes are durable (or fenced off): their lanes forget the claims.

        Each ledger forgets the keys it holds (a job's key is in one ledger
        only), so no batch is split by queue.
        """
        for lane in self.lanes:
            lane.claims.settled(keys)

    def written(self, outcomes: Sequence[Outcome]) -> None:
        """Outcomes were written: retries due soon wake their lane; every lane has room."""
        now = anyio.current_time()
        lanes, by_name = self.lanes, self._by_name
        for outcome in outcomes:
            if outcome.status in _DELAYED:
                lane = by_name.get(outcome.job.queue, lanes[0])
                if lane.policy.retry_written(outcome.delay, now):
                    lane.claimer.nudge()
        for lane in lanes:
            lane.claimer.room()

    def holds(self, job_id: int) -> bool:
        """Whether ``job_id`` runs here, or is claimed and not started."""
        return self._runner.running(job_id) or any(
            job.id == job_id for lane in self.lanes for job in lane.claims.ready
        )

    def cancel(self, job_id: int) -> None:
        """Cancel the run of ``job_id`` if a lane holds the job."""
        if not self._runner.cancel(job_id) and any(
            job.id == job_id for lane in self.lanes for job in lane.claims.ready
        ):
            self._runner.cancel(job_id, ready=True)


# Outcomes that put the job back to run after their delay (a durable
# sleep's or timed wait's; a parked job's delay is infinite).
_DELAYED = frozenset({OutcomeKind.PENDING, OutcomeKind.SNOOZED, OutcomeKind.SUSPENDED})
