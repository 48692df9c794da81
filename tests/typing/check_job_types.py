"""What type checkers see of `pgqueue.JobType`; mypy checks this file (``assert_type``).

Each ``# type: ignore[...]`` marks a mistake mypy must flag: under
``warn_unused_ignores`` (strict), an ignore that is not needed is an error,
so the file fails to check if a wrong payload or handler were accepted.
pytest does not collect it.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, assert_type

import pgqueue

if TYPE_CHECKING:
    import asyncpg
    from asyncpg.pool import PoolConnectionProxy


@dataclass(frozen=True)
class SendEmail:
    to: str


@dataclass(frozen=True)
class Other:
    n: int


send_email = pgqueue.JobType("send_email", SendEmail, queue="emails")
assert_type(send_email, pgqueue.JobType[SendEmail])
assert_type(send_email.payload_type, type[SendEmail])
assert_type(send_email.queue, str | None)


async def producers(
    pool: asyncpg.Pool[Any],
    connection: asyncpg.Connection[Any],
    proxy: PoolConnectionProxy[Any],
    queue: pgqueue.Queue,
) -> None:
    assert_type(await send_email.enqueue(pool, SendEmail("a")), int)
    await send_email.enqueue(connection, SendEmail("a"), delay=60)
    await send_email.enqueue(proxy, SendEmail("a"), delay=timedelta(minutes=5))
    await send_email.enqueue(
        queue,
        SendEmail("a"),
        run_at=datetime.now(UTC),
        max_attempts=3,
        priority=2,
        unique_key="k",
        on_conflict="raise",
        track=True,
        connection=proxy,
    )

    await send_email.enqueue(pool, {"to": "a"})  # type: ignore[arg-type]
    await send_email.enqueue(pool, Other(1))  # type: ignore[arg-type]
    await send_email.enqueue(pool, SendEmail("a"), delay="10m")  # type: ignore[arg-type]
    await send_email.enqueue("postgresql://", SendEmail("a"))  # type: ignore[arg-type]
    await send_email.enqueue(pool, SendEmail("a"), on_conflict="skip")  # type: ignore[arg-type]


def handlers(worker: pgqueue.Worker) -> None:
    @worker.handler(send_email)
    async def deliver(job: pgqueue.Job[SendEmail]) -> None:
        assert_type(job.payload, SendEmail)
        assert_type(job.payload.to, str)

    assert_type(deliver, Callable[[pgqueue.Job[SendEmail]], Coroutine[Any, Any, None]])

    @worker.handler(send_email)
    async def untyped(job: pgqueue.Job) -> int:  # a bare Job is Job[Any]: it fits
        return 1

    assert_type(untyped, Callable[[pgqueue.Job[SendEmail]], Coroutine[Any, Any, int]])

    @worker.handler(send_email)  # type: ignore[arg-type]
    async def wrong(job: pgqueue.Job[Other]) -> None: ...

    async def other(job: pgqueue.Job[Other]) -> None: ...

    worker.register(send_email, deliver)
    worker.register(send_email, other)  # type: ignore[arg-type]
    worker.register("send_email", deliver)  # by name: the annotation decides

    # The str form is unchanged: the annotation decides.
    @worker.handler("plain")
    async def plain(job: pgqueue.Job[SendEmail]) -> None: ...
