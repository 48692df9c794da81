"""What type checkers see of synchronous handlers; mypy checks this file.

A plain ``def`` is accepted by `Worker.handler` and `Worker.register` and
keeps its own type; pytest does not collect this file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, assert_type

if TYPE_CHECKING:
    from collections.abc import Callable

    import pgqueue


@dataclass(frozen=True)
class Charge:
    cents: int


def decorated_sync_handlers_keep_their_type(
    worker: pgqueue.Worker, job: pgqueue.Job[Charge]
) -> None:
    @worker.handler("charge")
    def charge(job: pgqueue.Job[Charge]) -> dict[str, int]:
        assert_type(job.payload, Charge)
        return {"charged": job.payload.cents}

    # Returned unwrapped: still a plain function, callable directly.
    assert_type(charge(job), dict[str, int])
    kept: Callable[[pgqueue.Job[Charge]], dict[str, int]] = charge
    assert kept is charge


def registered_sync_handlers(worker: pgqueue.Worker) -> None:
    def untyped(job: pgqueue.Job) -> None:
        assert_type(job.payload, Any)

    worker.register("untyped", untyped)
    worker.register("lambda", lambda job: job.id)
