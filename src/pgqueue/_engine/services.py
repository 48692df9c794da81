"""What the lanes of a running worker share: handed whole to each lane's claimer and consumers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from pgqueue._core.log import Logger
    from pgqueue._core.outcome import Outcome
    from pgqueue._engine.ledger import Budget
    from pgqueue._engine.runner import JobRunner
    from pgqueue._wire.dedicated import DedicatedConnection

__all__ = ["LaneServices"]


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
        types: claim only jobs of these types; ``None`` claims every type.
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
    types: list[str] | None
