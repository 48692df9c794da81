"""What type checkers see of typed payloads; mypy checks this file (``assert_type``).

pytest does not collect it (its name does not start with ``test_``), and
importing it only defines functions. This folder has no ``__init__.py`` on
purpose: a package named ``typing`` in ``tests/`` would shadow the standard
library's for ``python tests/fault_worker.py``, which puts ``tests/`` first
on ``sys.path``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, assert_type

import pgqueue
from pgqueue._core.typed import typed_handler

if TYPE_CHECKING:
    from collections.abc import Coroutine
    from datetime import datetime


@dataclass(frozen=True)
class SendWelcome:
    user_id: str


class TakesSendWelcome(Protocol):
    def __call__(self, job: pgqueue.Job[SendWelcome]) -> Coroutine[Any, Any, None]: ...


def decorated_handlers_keep_their_type(worker: pgqueue.Worker) -> None:
    @worker.handler("send_welcome")
    async def send_welcome(job: pgqueue.Job[SendWelcome]) -> None:
        assert_type(job, pgqueue.Job[SendWelcome])
        assert_type(job.payload, SendWelcome)
        assert_type(job.payload.user_id, str)
        assert_type(job.attempts, int)

    assert_type(send_welcome, TakesSendWelcome)

    async def wrong_payload(job: pgqueue.Job[int]) -> None:
        # Unused (and so an error) if the decorator had widened the parameter.
        await send_welcome(job)  # type: ignore[arg-type]

    worker.register("send_welcome_again", send_welcome)


def a_bare_job_is_plain_json(worker: pgqueue.Worker) -> None:
    @worker.handler("plain")
    async def plain(job: pgqueue.Job) -> None:
        assert_type(job, pgqueue.Job[Any])
        assert_type(job.payload, Any)

    @worker.handler("as_dict")
    async def as_dict(job: pgqueue.Job[dict[str, Any]]) -> None:
        assert_type(job.payload, dict[str, Any])


def a_job_is_covariant_in_its_payload(
    job: pgqueue.Job[SendWelcome],
) -> pgqueue.Job[object]:
    return job


def a_job_built_with_a_payload_has_its_type(now: datetime) -> None:
    job = pgqueue.Job(
        id=1,
        queue="default",
        type="send_welcome",
        payload=SendWelcome("01J5"),
        attempts=1,
        max_attempts=5,
        run_at=now,
        created_at=now,
    )
    assert_type(job, pgqueue.Job[SendWelcome])


def typed_handler_returns_a_handler(handler: pgqueue.Handler) -> None:
    assert_type(typed_handler(handler), pgqueue.Handler)
