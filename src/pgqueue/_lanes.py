"""The queues a worker consumes: their options checked, and each queue's parts."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from pgqueue._checks import check_int, check_queue_name
from pgqueue._claimer import Claimer
from pgqueue._consumers import Consumers
from pgqueue._lease import Lease
from pgqueue._ledger import Claims
from pgqueue._policy import ClaimPolicy

if TYPE_CHECKING:
    import anyio

    from pgqueue._dedicated import DedicatedConnection
    from pgqueue._ledger import Budget
    from pgqueue._log import Logger
    from pgqueue._outcome import Outcome
    from pgqueue._runner import JobRunner

__all__ = [
    "Lane",
    "LaneServices",
    "LaneSettings",
    "check_global_limit",
    "check_queues",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneSettings:
    """What the lanes take from the worker's options, read when it starts.

    Args:
        prefetch: jobs claimed beyond a lane's concurrency.
        poll_interval: seconds between claims when nothing wakes a lane.
        rescue_after: the time to live of a fleet-wide lease.
        types: claim only jobs of these types; ``None`` claims every type.
        limits: whether one of the worker's queues has a fleet-wide limit.
    """

    prefetch: int
    poll_interval: float
    rescue_after: float
    types: list[str] | None
    limits: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneServices:
    """What the lanes of a running worker share.

    Args:
        connection: the claim connection (the lanes' claims take turns on it).
        put: hands an outcome to the outcome writer.
        runner: runs the handlers.
        logger: where to log.
        worker: the worker's id, naming its leases.
        owner: the worker (what a handler's ``stop()`` call is checked against).
        cut_off: whether running handlers are being cancelled by the worker.
        on_exit: a handler raised ``SystemExit`` or ``KeyboardInterrupt``.
        budget: the overall cap over every lane, if any.
    """

    connection: DedicatedConnection
    put: Callable[[Outcome], None]
    runner: JobRunner
    logger: Logger
    worker: str
    owner: object
    cut_off: Callable[[], bool]
    on_exit: Callable[[BaseException], None]
    budget: Budget | None


class Lane:
    """One queue of a worker: its ledger, claim policy, claimer, consumers and lease.

    Its capacity is its ``concurrency`` plus the worker's ``prefetch``; the
    policy, claimer, consumers and lease are made by `build` when the
    worker starts (they need a running event loop).
    """

    def __init__(
        self,
        index: int,
        name: str,
        concurrency: int,
        prefetch: int,
        global_limit: int | None = None,
    ) -> None:
        self.index = index
        self.name = name
        self.concurrency = concurrency
        self.global_limit = global_limit
        capacity = concurrency + prefetch
        self.claims = Claims(capacity, write_allowance=capacity)
        self.policy: ClaimPolicy
        self.claimer: Claimer
        self.consumers: Consumers
        self.lease: Lease | None = None

    def build(
        self,
        settings: LaneSettings,
        services: LaneServices,
        *,
        on_spare: Callable[[], None] | None,
        on_ended: Callable[[], None] | None,
        schema_checked: anyio.Event | None,
    ) -> None:
        """Make the lane's policy, claimer, consumers and (with a global limit) lease.

        Args:
            settings: the worker's options the lane reads.
            services: what the worker's lanes share.
            on_spare: called when a claim left overall slots unused.
            on_ended: called after each of the lane's jobs ended; ``None``
                gives the room to the lane's own claimer.
            schema_checked: set once another lane's claimer checked the
                schema (``None``: this lane's claimer checks it).
        """
        budget = services.budget
        capacity = self.claims.capacity
        if budget is not None:
            capacity = min(capacity, budget.cap)
        if self.global_limit is not None:
            capacity = min(capacity, self.global_limit)
            self.lease = Lease(
                self.name,
                services.worker,
                limit=self.global_limit,
                wanted=capacity,
                ttl=settings.rescue_after,
                claims=self.claims,
            )
        self.policy = ClaimPolicy(
            # With jobs in hand, wait for a batch worth claiming.
            claim_at=max(1, min(settings.prefetch, capacity // 2)),
            poll_interval=settings.poll_interval,
        )
        self.claimer = Claimer(
            services.connection,
            self.policy,
            self.claims,
            queue=self.name,
            logger=services.logger,
            on_claimed=self.claimed,
            on_dead=services.put,
            budget=budget,
            on_spare=on_spare,
            schema_checked=schema_checked,
            lease=self.lease,
            types=settings.types,
            limits=settings.limits,
        )
        self.consumers = Consumers(
            self.claims,
            services.runner,
            owner=services.owner,
            cut_off=services.cut_off,
            put=services.put,
            on_ended=self.claimer.room if on_ended is None else on_ended,
            on_exit=services.on_exit,
            logger=services.logger,
        )

    def claimed(self) -> None:
        """The claimer put jobs in the ledger: a consumer takes them."""
        self.consumers.wake()


def check_queues(queues: Mapping[str, int]) -> dict[str, int]:
    """``queues`` checked: a non-empty mapping of queue names to concurrencies."""
    if not isinstance(cast("object", queues), Mapping):
        msg = f"queues must be a mapping of queue names to concurrencies, not {type(queues).__name__}"
        raise TypeError(msg)
    if not queues:
        msg = "queues must name at least one queue"
        raise ValueError(msg)
    return {
        check_queue_name(name): check_int(f"concurrency of queue {name!r}", n)
        for name, n in queues.items()
    }


def check_global_limit(
    limit: int | Mapping[str, int] | None, queue: str | None, specs: Mapping[str, int]
) -> dict[str, int]:
    """``global_limit`` checked, as each limited queue's limit."""
    if limit is None:
        return {}
    if isinstance(limit, Mapping):
        given: Mapping[str, int] = limit
    elif queue is None:
        msg = (
            "with queues=, give global_limit as a mapping of queue names "
            'to limits ({"emails": 3})'
        )
        raise TypeError(msg)
    else:
        given = {queue: limit}
    limits = {}
    for name, n in given.items():
        if name not in specs:
            msg = (
                f"global_limit names queue {name!r}, which this worker does not consume"
            )
            raise ValueError(msg)
        limits[name] = check_int(f"global_limit of queue {name!r}", n)
    return limits
