"""A typed handle for a job type: ``pgqueue.JobType``, through the real queue and worker.

The same handle enqueues (to a pool, a connection or a `Queue`) and
registers the handler, which gets ``Job[SendEmail]``. mypy flags a payload
of the wrong type: ``tests/typing/check_job_types.py`` (checked with the
rest of the tests) and a subprocess run of mypy on a wrong snippet here.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import textwrap
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, cast

import anyio
import pydantic
import pytest

import pgqueue
from tests.helpers import queue_count, row, rows

if TYPE_CHECKING:
    from pathlib import Path

    import asyncpg


@dataclass(frozen=True)
class SendEmail:
    to: str
    at: datetime | None = None


class Invite(pydantic.BaseModel):
    email: str


async def test_a_job_type_enqueues_through_a_pool_a_connection_or_a_queue_and_its_handler_gets_the_type(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    send_email = pgqueue.JobType("send_email", SendEmail, queue=queue_name)
    seen: list[pgqueue.Job[SendEmail]] = []
    worker = pgqueue.Worker(pool, queue=queue_name)

    @worker.handler(send_email)
    async def deliver(job: pgqueue.Job[SendEmail]) -> str:
        seen.append(job)
        return job.payload.to

    at = datetime(2026, 12, 4, 9, tzinfo=UTC)
    by_pool = await send_email.enqueue(pool, SendEmail("a@example.com", at))
    async with pool.acquire() as connection, connection.transaction():
        by_connection = await send_email.enqueue(connection, SendEmail("b@example.com"))
    by_queue = await send_email.enqueue(
        pgqueue.Queue(pool, name=queue_name), SendEmail("c@example.com")
    )
    await worker.run(until_empty=True)

    assert sorted(job.payload.to for job in seen) == [
        "a@example.com",
        "b@example.com",
        "c@example.com",
    ]
    assert all(type(job.payload) is SendEmail for job in seen)
    assert {job.type for job in seen} == {"send_email"}
    assert next(j for j in seen if j.id == by_pool).payload.at == at
    stored = {r["id"]: r for r in await rows(pool, queue_name)}
    assert set(stored) == {by_pool, by_connection, by_queue}
    assert {r["status"] for r in stored.values()} == {"completed"}
    assert json.loads(stored[by_pool]["payload"]) == {
        "to": "a@example.com",
        "at": "2026-12-04T09:00:00+00:00",
    }
    assert json.loads(stored[by_queue]["result"]) == "c@example.com"


async def test_enqueue_takes_the_enqueue_options(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    send_email = pgqueue.JobType("send_email", SendEmail, queue=queue_name)
    key = f"{queue_name}-welcome"  # unique per job type across queues: this test's own
    later = await send_email.enqueue(
        pool,
        SendEmail("a@example.com"),
        delay=timedelta(minutes=5),
        priority=3,
        max_attempts=9,
        unique_key=key,
        track=True,
    )
    again = await send_email.enqueue(pool, SendEmail("a@example.com"), unique_key=key)
    at = datetime(2100, 1, 1, tzinfo=UTC)
    fixed = await send_email.enqueue(pool, SendEmail("b@example.com"), run_at=at)
    stored = await row(pool, later)
    assert again == later
    assert stored["run_at"] - stored["created_at"] == timedelta(minutes=5)
    assert (stored["priority"], stored["max_attempts"], stored["unique_key"]) == (
        3,
        9,
        key,
    )
    assert stored["tracked"] is True
    assert (await row(pool, fixed))["run_at"] == at
    with pytest.raises(pgqueue.DuplicateJobError):
        await send_email.enqueue(
            pool,
            SendEmail("c@example.com"),
            unique_key=key,
            on_conflict="raise",
        )


async def test_in_a_transaction_that_rolls_back_nothing_is_enqueued(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    send_email = pgqueue.JobType("send_email", SendEmail, queue=queue_name)
    async with pool.acquire() as connection:
        transaction = connection.transaction()
        await transaction.start()
        await send_email.enqueue(connection, SendEmail("a@example.com"))
        await send_email.enqueue(
            pool, SendEmail("b@example.com"), connection=connection
        )
        await transaction.rollback()
    assert await queue_count(pool, queue_name) == 0


async def test_without_a_queue_it_follows_the_queue_it_is_given(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    invite = pgqueue.JobType("invite", Invite)
    assert invite.queue is None
    queue = pgqueue.Queue(pool, name=queue_name)
    job_id = await invite.enqueue(queue, Invite(email="a@example.com"))
    seen: list[Invite] = []
    worker = pgqueue.Worker(pool, queue=queue_name)

    @worker.handler(invite)
    async def on_invite(job: pgqueue.Job[Invite]) -> None:
        seen.append(job.payload)

    await worker.run(until_empty=True)
    assert seen == [Invite(email="a@example.com")]
    assert (await row(pool, job_id))["queue"] == queue_name


async def test_the_handler_gets_the_type_whatever_its_annotation(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    send_email = pgqueue.JobType("send_email", SendEmail, queue=queue_name)
    seen: list[object] = []
    worker = pgqueue.Worker(pool, queue=queue_name)

    async def untyped(job):
        seen.append(job.payload)

    worker.register(send_email, untyped)
    await send_email.enqueue(pool, SendEmail("a@example.com"))
    await worker.run(until_empty=True)
    assert seen == [SendEmail("a@example.com")]


async def test_a_stored_payload_that_does_not_fit_dead_letters_its_job(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    send_email = pgqueue.JobType("send_email", SendEmail, queue=queue_name)
    called: list[object] = []
    worker = pgqueue.Worker(pool, queue=queue_name)

    @worker.handler(send_email)
    async def deliver(job: pgqueue.Job[SendEmail]) -> None:
        called.append(job)

    # Written by something that does not know the type (a Go producer, the CLI).
    job_id = await pgqueue.Queue(pool, name=queue_name).enqueue(
        "send_email", {"to": 42}
    )
    await worker.run(until_empty=True)
    stored = await row(pool, job_id)
    assert (stored["status"], stored["attempts"]) == ("dead", 1)
    assert stored["last_error"] == (
        "Permanent: payload does not match SendEmail: field 'to': expected str, got int"
    )
    assert called == []


async def test_bad_use_raises_before_any_sql(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    send_email = pgqueue.JobType("send_email", SendEmail, queue=queue_name)
    with pytest.raises(
        TypeError, match="'send_email' takes a SendEmail payload, not dict"
    ):
        await send_email.enqueue(pool, {"to": "a@example.com"})  # type: ignore[arg-type]
    with pytest.raises(
        ValueError, match=f"goes to queue '{queue_name}', but was given Queue"
    ):
        await send_email.enqueue(pgqueue.Queue(pool), SendEmail("a@example.com"))
    with pytest.raises(TypeError, match=r"needs a pgqueue\.Queue, an asyncpg pool"):
        await send_email.enqueue("postgresql://", SendEmail("a"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="give run_at or delay, not both"):
        await send_email.enqueue(
            pool, SendEmail("a"), delay=1, run_at=datetime.now(UTC)
        )
    async with pool.acquire() as connection, pool.acquire() as other:
        with pytest.raises(ValueError, match="connection= must be left out"):
            await send_email.enqueue(connection, SendEmail("a"), connection=other)
    assert await queue_count(pool, queue_name) == 0


def test_bad_definitions_and_registrations_raise_at_once(
    queue_name: str,
) -> None:
    with pytest.raises(TypeError, match="dataclass or a pydantic model class, not"):
        pgqueue.JobType("t", dict)
    with pytest.raises(ValueError, match="job type must not be empty"):
        pgqueue.JobType("", SendEmail)
    with pytest.raises(ValueError, match="NUL"):
        pgqueue.JobType("t", SendEmail, queue="a\x00")
    assert repr(pgqueue.JobType("t", SendEmail, queue="q")) == (
        "JobType('t', SendEmail, queue='q')"
    )


async def test_a_worker_that_does_not_consume_its_queue_refuses_it(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    send_email = pgqueue.JobType("send_email", SendEmail, queue="emails")
    worker = pgqueue.Worker(pool, queue=queue_name)

    async def deliver(job: pgqueue.Job[SendEmail]) -> None: ...

    with pytest.raises(ValueError, match="runs on queue 'emails', which this worker"):
        worker.register(send_email, deliver)
    with pytest.raises(ValueError, match="runs on queue 'emails'"):
        worker.handler(send_email)(deliver)
    with pytest.raises(TypeError, match="handler must be callable"):
        pgqueue.Worker(pool, queue="emails").register(send_email, "deliver")  # type: ignore[arg-type]
    several = pgqueue.Worker(pool, queues={queue_name: 1, "emails": 1})
    several.register(send_email, deliver)


async def test_registering_it_twice_or_copying_the_worker_keeps_the_type(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    send_email = pgqueue.JobType("send_email", SendEmail, queue=queue_name)
    seen: list[object] = []
    first = pgqueue.Worker(pool, queue=queue_name)

    @first.handler(send_email)
    async def deliver(job: pgqueue.Job[SendEmail]) -> None:
        seen.append(job.payload)

    worker = first.with_options(concurrency=2)
    await send_email.enqueue(pool, SendEmail("a@example.com"))
    await worker.run(until_empty=True)
    assert seen == [SendEmail("a@example.com")]


# mypy flags a wrong payload. (tests/typing/check_job_types.py holds the
# right uses; mypy checks it with the rest of the tests.)

WRONG = """
from dataclasses import dataclass
from typing import Any

import asyncpg

import pgqueue


@dataclass
class SendEmail:
    to: str


@dataclass
class Other:
    n: int


send_email = pgqueue.JobType("send_email", SendEmail, queue="emails")


async def produce(pool: asyncpg.Pool[Any]) -> None:
    await send_email.enqueue(pool, SendEmail(to="a@example.com"))
    await send_email.enqueue(pool, {"to": "a@example.com"})
    await send_email.enqueue(pool, Other(n=1))


def consume(worker: pgqueue.Worker) -> None:
    @worker.handler(send_email)
    async def wrong(job: pgqueue.Job[Other]) -> None: ...
"""


@pytest.mark.timeout(300)
async def test_mypy_flags_a_payload_of_the_wrong_type(tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    source = tmp_path / "wrong.py"
    source.write_text(textwrap.dedent(WRONG), encoding="utf-8")
    with anyio.fail_after(280):
        done = await anyio.run_process(
            [
                sys.executable,
                "-m",
                "mypy",
                "--strict",
                "--no-error-summary",
                "--hide-error-context",
                "--cache-dir",
                str(tmp_path / "cache"),
                str(source),
            ],
            env=dict(os.environ),  # with PYTHONPATH: the pgqueue this test imports
            cwd=tmp_path,
            check=False,
        )
    out = done.stdout.decode()
    errors = [line for line in out.splitlines() if line.startswith("wrong.py:")]
    assert done.returncode == 1, out + done.stderr.decode()
    lines = WRONG.splitlines()
    expected = [
        lines.index('    await send_email.enqueue(pool, {"to": "a@example.com"})'),
        lines.index("    await send_email.enqueue(pool, Other(n=1))"),
        lines.index("    @worker.handler(send_email)"),
    ]
    found = [int(line.split(":")[1]) - 1 for line in errors]
    assert found[:2] == expected[:2], out
    assert found[2] in (expected[2], expected[2] + 1), out  # the decorator, or the def
    assert len(errors) == 3, out
    assert 'incompatible type "dict[str, str]"; expected "SendEmail"' in errors[0]
    assert 'incompatible type "Other"; expected "SendEmail"' in errors[1]
    assert "Job[Other]" in errors[2]
    assert "Job[SendEmail]" in errors[2]


def test_the_wrapper_of_a_plain_function_is_a_plain_function() -> None:
    # So that a worker that runs plain functions in threads runs it in one,
    # converting the payload there too; an async handler's wrapper is async.
    send_email = pgqueue.JobType("send_email", SendEmail)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    job = pgqueue.Job(
        id=1,
        queue="default",
        type="send_email",
        payload={"to": "a@example.com"},
        attempts=1,
        max_attempts=5,
        run_at=now,
        created_at=now,
    )

    def deliver(job: pgqueue.Job[SendEmail]) -> str:
        return f"to {job.payload.to}"

    async def deliver_async(job: pgqueue.Job[SendEmail]) -> str:
        return f"to {job.payload.to}"

    wrapped = send_email._handler(deliver, ["default"])
    assert not inspect.iscoroutinefunction(wrapped)
    assert cast("object", wrapped(job)) == "to a@example.com"
    assert inspect.iscoroutinefunction(send_email._handler(deliver_async, ["default"]))
