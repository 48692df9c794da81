"""Scheduling later: ``delay=`` on enqueue and NewJob, ``--in`` on ``pgqueue enqueue``.

A delay counts from the database's ``now()``, never the client's clock: in
a transaction, ``now()`` is the transaction's start, so the row's ``run_at``
is exactly that plus the delay, and always exactly its ``created_at`` (the
same ``now()``) plus the delay.
"""

from __future__ import annotations

import math
import os
import sys
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import pgqueue
from tests.helpers import queue_count, row, rows

if TYPE_CHECKING:
    import asyncpg


@pytest.mark.parametrize(
    ("delay", "expected"),
    [
        (60, timedelta(seconds=60)),
        (1.5, timedelta(seconds=1.5)),
        (0, timedelta(0)),
        (timedelta(hours=2, microseconds=7), timedelta(hours=2, microseconds=7)),
        (timedelta(days=400), timedelta(days=400)),
    ],
)
async def test_delay_counts_from_the_databases_now(
    pool: asyncpg.Pool, queue: pgqueue.Queue, delay: Any, expected: timedelta
) -> None:
    async with pool.acquire() as connection, connection.transaction():
        now = await connection.fetchval("SELECT now()")
        in_transaction = await queue.enqueue(
            "t", {}, delay=delay, connection=connection
        )
        ids = await queue.enqueue_many(
            [pgqueue.NewJob("t", delay=delay), ("t", {})], connection=connection
        )
    stored = await row(pool, in_transaction)
    assert stored["run_at"] == now + expected
    first, undelayed = await row(pool, ids[0]), await row(pool, ids[1])
    assert first["run_at"] == now + expected
    assert undelayed["run_at"] == now

    before = await pool.fetchval("SELECT clock_timestamp()")
    job_id = await queue.enqueue("t", {}, delay=delay)
    after = await pool.fetchval("SELECT clock_timestamp()")
    stored = await row(pool, job_id)
    assert stored["run_at"] - stored["created_at"] == expected
    assert before + expected <= stored["run_at"] <= after + expected


async def test_delay_with_unique_keys_hooks_and_a_mixed_batch(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    events: list[pgqueue.EnqueueEvent] = []

    class Recorder(pgqueue.EnqueueHook):
        def before_enqueue(self, event: pgqueue.EnqueueEvent) -> None:
            events.append(event)

    queue = pgqueue.Queue(pool, name=queue_name, hooks=[Recorder()])
    at = datetime(2100, 1, 1, tzinfo=UTC)
    # Unique keys are unique per job type across queues: keys of this test's own.
    keyed = await queue.enqueue("t", {}, delay=30, unique_key=f"{queue_name}-k")
    again = await queue.enqueue("t", {}, delay=90, unique_key=f"{queue_name}-k")
    assert again == keyed
    ids = await queue.enqueue_many(
        [
            pgqueue.NewJob("t", delay=10, unique_key=f"{queue_name}-a"),
            pgqueue.NewJob("t", run_at=at, priority=2),
            pgqueue.NewJob("t", delay=timedelta(minutes=1)),
            ("t", None),
        ]
    )
    stored = {r["id"]: r for r in await rows(pool, queue_name)}
    assert len(stored) == 5
    waits = [stored[i]["run_at"] - stored[i]["created_at"] for i in [keyed, *ids]]
    assert waits[0] == timedelta(seconds=30)
    assert waits[1] == timedelta(seconds=10)
    assert stored[ids[1]]["run_at"] == at
    assert waits[3:] == [timedelta(minutes=1), timedelta(0)]
    assert events[0].jobs[0].delay == 30


async def test_a_delayed_job_runs_once_due_and_not_before(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    ran = anyio.Event()
    seen: list[pgqueue.Job] = []
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=0.2)

    @worker.handler("later")
    async def later(job: pgqueue.Job) -> None:
        seen.append(job)
        ran.set()

    job_id = await queue.enqueue("later", {}, delay=1.0)
    await worker.run(until_empty=True)  # nothing is ready yet
    assert seen == []
    assert (await row(pool, job_id))["status"] == "pending"

    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=0.2)
    worker.register("later", later)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        with anyio.fail_after(10):
            await ran.wait()
        await worker.stop()
    [job] = seen
    claimed_at = await pool.fetchval("SELECT now()")
    assert job.id == job_id
    assert job.run_at <= claimed_at
    assert job.run_at - (await row(pool, job_id))["created_at"] == timedelta(seconds=1)


class Later:
    """Not a number of seconds."""


BAD_DELAYS: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    (
        "both",
        {"delay": 5, "run_at": datetime(2100, 1, 1, tzinfo=UTC)},
        ValueError,
        "give run_at or delay, not both",
    ),
    ("negative", {"delay": -1}, ValueError, "non-negative"),
    (
        "negative timedelta",
        {"delay": timedelta(seconds=-1)},
        ValueError,
        "non-negative",
    ),
    ("nan", {"delay": math.nan}, ValueError, "finite"),
    ("infinite", {"delay": math.inf}, ValueError, "finite"),
    ("huge int", {"delay": 10**400}, ValueError, "finite"),
    ("too far", {"delay": timedelta(days=4_000_000)}, ValueError, "10,000 years"),
    ("text", {"delay": "10m"}, TypeError, "delay must be a number of seconds"),
    ("bool", {"delay": True}, TypeError, "delay must be a number of seconds"),
    ("object", {"delay": Later()}, TypeError, "timedelta, not Later"),
]


@pytest.mark.parametrize(
    ("case", "kwargs", "error", "message"),
    BAD_DELAYS,
    ids=[c[0] for c in BAD_DELAYS],
)
async def test_a_bad_delay_raises_before_any_sql(
    pool: asyncpg.Pool,
    queue: pgqueue.Queue,
    case: str,
    kwargs: dict[str, Any],
    error: type[Exception],
    message: str,
) -> None:
    with pytest.raises(error, match=message):
        await queue.enqueue("t", {}, **kwargs)
    with pytest.raises(error, match=f"job 1: .*{message}"):
        await queue.enqueue_many([("t", {}), pgqueue.NewJob("t", **kwargs)])
    assert await queue_count(pool, queue.name) == 0


# The command line: pgqueue enqueue --in.


async def _cli(dsn: str, *args: str) -> tuple[int, str, str]:
    with anyio.fail_after(30):
        done = await anyio.run_process(
            [sys.executable, "-m", "pgqueue", *args],
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("PG")},
                "PGQUEUE_DSN": dsn,
            },
            check=False,
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10m", timedelta(minutes=10)),
        ("30s", timedelta(seconds=30)),
        ("2h", timedelta(hours=2)),
        ("1d", timedelta(days=1)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1d2h3m4s", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        ("90", timedelta(seconds=90)),
        ("0.5s", timedelta(seconds=0.5)),
        (" 2H ", timedelta(hours=2)),
    ],
)
async def test_cli_enqueue_in(
    dsn: str, pool: asyncpg.Pool, queue_name: str, text: str, expected: timedelta
) -> None:
    code, out, err = await _cli(
        dsn, "enqueue", "t", "{}", "--queue", queue_name, "--in", text
    )
    assert code == 0, err
    stored = await row(pool, int(out))
    assert stored["run_at"] - stored["created_at"] == expected


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--in", "10x"], "not a delay: '10x'"),
        (["--in", "m"], "not a delay"),
        (["--in=-5m"], "not a delay"),
        (["--in", "1m1h"], "not a delay"),
        (["--in", "5m", "--run-at", "2100-01-01T00:00:00Z"], "not allowed with"),
    ],
)
async def test_cli_enqueue_refuses_a_bad_in(
    dsn: str, pool: asyncpg.Pool, queue_name: str, args: list[str], message: str
) -> None:
    code, out, err = await _cli(dsn, "enqueue", "t", "{}", "--queue", queue_name, *args)
    assert code == 2, (out, err)
    assert message in err
    assert "Traceback" not in err
    assert await queue_count(pool, queue_name) == 0
