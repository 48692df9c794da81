"""The queues a worker consumes: their options checked, and each queue's parts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from pgqueue._checks import check_int, check_queue_name
from pgqueue._ledger import Claims

if TYPE_CHECKING:
    from pgqueue._claimer import Claimer
    from pgqueue._consumers import Consumers
    from pgqueue._policy import ClaimPolicy

__all__ = ["Lane", "check_global_limit", "check_queues"]


class Lane:
    """One queue of a worker: its ledger, claim policy, claimer and consumers.

    Its capacity is its ``concurrency`` plus the worker's ``prefetch``; the
    policy, claimer and consumers are made in `Worker.run` (they need a
    running event loop).
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
