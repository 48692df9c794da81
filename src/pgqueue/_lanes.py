"""The queues a worker consumes: each queue's parts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgqueue._ledger import Claims

if TYPE_CHECKING:
    from pgqueue._claimer import Claimer
    from pgqueue._consumers import Consumers
    from pgqueue._policy import ClaimPolicy

__all__ = ["Lane"]


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
