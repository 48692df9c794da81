"""Operating durable handlers: what `Admin.job` shows of them, `Admin.signal`, `Admin.retry`'s steps.

Through the public API and the command line on a real server: a parked
job's steps (name, time, size), signals, wait and progress; a sleeping
one's wake time; a signal sent by the operator (`Admin.signal`, ``pgqueue
signal``) wakes the job and answers as `Queue.signal` does; a dead durable
job retried keeps its steps, unless ``reset_steps=True`` (by id and by
filter; ``--reset-steps``); ``pgqueue jobs show`` prints hostile names
escaped.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
import psycopg
import pytest

import pgqueue
import pgqueue.sync
from tests.helpers import row, running, wait_for_row, wait_until
from tests.test_cli import EXIT_ERROR, EXIT_OK, cli
from tests.test_cli_hostile import CLEAR, LINK, TITLE, escaped, raw_controls

if TYPE_CHECKING:
    import asyncpg


def _order(worker: pgqueue.Worker, calls: list[str]) -> None:
    @worker.handler("order")
    async def order(job: pgqueue.Job) -> Any:
        async def charge() -> dict[str, str]:
            calls.append("charge")
            return {"charge": "ch_" + "x" * 40}

        def reserve() -> int:
            calls.append("reserve")
            return 7

        await job.step("charge", charge)
        await job.step("reserve", reserve)
        await job.progress(0.5, "waiting for approval")
        approved = await job.wait_for("approve")
        if job.payload.get("fail"):
            raise pgqueue.Permanent("carrier refused")
        return approved


async def test_admin_job_shows_a_parked_jobs_steps_signals_wait_and_progress(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    calls: list[str] = []
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60)
    _order(worker, calls)
    admin = pgqueue.Admin(pool)
    job_id = await queue.enqueue("order", {})
    async with running(worker):
        await wait_for_row(pool, job_id, status="parked")
        assert await queue.signal(job_id, "other", {"k": "v"}) is True
        job = await admin.job(job_id)
        preview = await admin.job_preview(job_id)
        assert job is not None
        assert preview is not None
        assert [(s.name, s.size) for s in job.steps] == [
            ("charge", len('{"charge": "ch_' + "x" * 40 + '"}')),
            ("reserve", 1),
        ]
        assert job.steps_total == 2
        first, second = job.steps[0].at, job.steps[1].at
        assert first is not None
        assert second is not None
        assert first <= second
        assert [(s.name, s.size) for s in job.signals] == [("other", 10)]
        assert job.signals_total == 1
        assert job.wait == pgqueue.WaitInfo(signal="approve")
        assert job.progress is not None
        assert (job.progress.fraction, job.progress.message) == (
            0.5,
            "waiting for approval",
        )
        with psycopg.connect(dsn) as connection:
            synced = pgqueue.sync.Admin(connection).job(job_id)
        for field in ("steps", "signals", "wait", "progress"):
            assert getattr(preview, field) == getattr(job, field)
            assert getattr(synced, field) == getattr(job, field)
        as_json = job.to_json()
        assert as_json["wait"] == {"signal": "approve", "child": None, "until": None}
        assert as_json["steps"][0]["name"] == "charge"
        assert isinstance(as_json["steps"][0]["at"], str)
        # The operator's signal wakes it.
        assert await admin.signal(job_id, "approve", {"by": "ops"}) is True
        await wait_for_row(pool, job_id, status="completed")
    done = await admin.job(job_id)
    assert done is not None
    assert done.result == {"by": "ops"}
    assert done.wait is None  # it waits for nothing any more
    assert [s.name for s in done.signals] == ["other", "approve"]
    assert calls == ["charge", "reserve"]  # the wake replayed them
    # A listing leaves them out; a job that is no durable handler's has none.
    listed = await admin.jobs(queue=queue.name)
    assert listed[0].steps == ()
    plain = await queue.enqueue("plain", {})
    plain_job = await admin.job(plain)
    assert plain_job is not None
    assert (plain_job.steps, plain_job.signals, plain_job.wait, plain_job.progress) == (
        (),
        (),
        None,
        None,
    )


async def test_admin_job_shows_a_sleeps_wake_time(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60)

    @worker.handler("nap")
    async def nap(job: pgqueue.Job) -> None:
        await job.sleep(3600)

    job_id = await queue.enqueue("nap", {})

    async def asleep() -> bool:
        return (await row(pool, job_id))["wait"] is not None

    async with running(worker):
        await wait_until(asleep)
    slept = await row(pool, job_id)
    job = await pgqueue.Admin(pool).job(job_id)
    assert job is not None
    assert job.wait is not None
    assert (job.wait.signal, job.wait.child) == (None, None)
    assert job.wait.until is not None
    assert abs(job.wait.until - slept["run_at"]) < timedelta(seconds=1)


async def test_hand_written_durable_columns_read_as_none_not_failures(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("odd", {})
    await pool.execute(
        """UPDATE pgqueue_jobs SET status = 'parked',
               steps = '{"a": 1, "b": {"at": "not a time"}}', signals = '[1, {"name": 2}]',
               wait = '{"child": "x", "until": 5}', progress = '"half"'
           WHERE id = $1""",
        job_id,
    )
    job = await pgqueue.Admin(pool).job(job_id)
    assert job is not None
    assert {(s.name, s.at, s.size) for s in job.steps} == {
        ("a", None, None),
        ("b", None, None),
    }
    assert job.signals == (
        pgqueue.SignalInfo(name=None, at=None, size=None),
        pgqueue.SignalInfo(name="2", at=None, size=None),
    )
    assert job.signals_total == 2
    assert job.wait == pgqueue.WaitInfo()
    assert job.progress is None


async def test_admin_signal_answers_as_queue_signal(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    admin = pgqueue.Admin(pool)
    job_id = await queue.enqueue("later", {})
    assert await admin.signal(job_id, "go") is True
    assert json.loads((await row(pool, job_id))["signals"])[0]["payload"] is None
    with pytest.raises(pgqueue.JobNotFoundError):
        await admin.signal(2**62, "go")
    with pytest.raises(ValueError, match="signal name"):
        await admin.signal(job_id, "")
    with pytest.raises(TypeError):
        await admin.signal(job_id, "go", object())
    await admin.cancel(job_id)
    assert await admin.signal(job_id, "go", [1]) is False
    assert len(json.loads((await row(pool, job_id))["signals"])) == 1
    # Inside a transaction: an unknown id leaves it usable; a rollback sends nothing.
    other = await queue.enqueue("later", {})
    async with pool.acquire() as connection, connection.transaction():
        in_transaction = pgqueue.Admin(connection)
        with pytest.raises(pgqueue.JobNotFoundError):
            await in_transaction.signal(2**62, "go")
        assert await in_transaction.signal(other, "go") is True
        assert await connection.fetchval("SELECT 1") == 1
    assert json.loads((await row(pool, other))["signals"])[0]["name"] == "go"


@pytest.mark.parametrize("by", ["id", "filter", "all"])
async def test_a_dead_durable_job_retried_keeps_its_steps_unless_reset(
    pool: asyncpg.Pool, queue: pgqueue.Queue, by: str
) -> None:
    calls: list[str] = []
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60)
    _order(worker, calls)
    admin = pgqueue.Admin(pool)

    async def retry(job_id: int, **options: Any) -> None:
        if by == "filter":
            found = pgqueue.JobFilter(queue=queue.name, status="dead")
            assert await admin.retry(filter=found, **options) == 1
        elif by == "all":
            done = await admin.retry_all(queue=queue.name, **options)
            assert done == {job_id: "retried"}
        else:
            assert await admin.retry(job_id, **options) == {job_id: "retried"}

    job_id = await queue.enqueue("order", {"fail": True})
    async with running(worker):
        await wait_for_row(pool, job_id, status="parked")
        await admin.signal(job_id, "approve", True)
        await wait_for_row(pool, job_id, status="dead")
        assert calls == ["charge", "reserve"]
        # Kept: the retry replays the steps, and the signal is still there.
        await retry(job_id)
        await wait_for_row(pool, job_id, status="dead", attempts=2)
        assert calls == ["charge", "reserve"]
        # Reset: the steps run again; the signal is kept.
        await retry(job_id, reset_steps=True)
        await wait_for_row(pool, job_id, status="dead", attempts=3)
    assert calls == ["charge", "reserve", "charge", "reserve"]
    job = await admin.job(job_id)
    assert job is not None
    assert [s.name for s in job.steps] == ["charge", "reserve"]
    with pytest.raises(TypeError, match="reset_steps"):
        await admin.retry(job_id, reset_steps=1)  # type: ignore[call-overload]


async def test_the_cli_shows_steps_signals_wait_and_progress_escaped_and_signals(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    calls: list[str] = []
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60)
    _order(worker, calls)
    job_id = await queue.enqueue("order", {})
    async with running(worker):
        await wait_for_row(pool, job_id, status="parked")
        # Another client's hand: control characters and markup in names.
        await pool.execute(
            """UPDATE pgqueue_jobs
               SET steps = steps || jsonb_build_object($2::text, jsonb_build_object(
                       'result', 1, 'at', now())),
                   signals = jsonb_build_array(jsonb_build_object(
                       'name', $3::text, 'payload', null, 'at', now())),
                   progress = progress || jsonb_build_object('message', $3::text)
               WHERE id = $1""",
            job_id,
            f"s{CLEAR}{LINK}",
            f"n{TITLE}",
        )
        shown = await cli(dsn, "jobs", "show", str(job_id))
        assert shown.code == EXIT_OK, shown
        assert raw_controls(shown.out) == set()
        assert LINK in shown.out  # shown, not read as markup
        for text in (
            "waits for",
            "signal 'approve'",
            "50% " + escaped(f"n{TITLE}"),
            "steps, first recorded first",
            "charge",
            "reserve",
            escaped(f"s{CLEAR}"),
            "signals received",
            escaped(f"n{TITLE}"),
        ):
            assert text in shown.out, (text, shown.out)
        as_json = (await cli(dsn, "jobs", "show", str(job_id), "--json")).json()
        assert as_json["wait"]["signal"] == "approve"
        assert as_json["steps_total"] == 3
        assert as_json["progress"]["message"] == f"n{TITLE}"
        # pgqueue signal wakes it.
        sent = await cli(dsn, "signal", str(job_id), "approve", '{"by": "cli"}')
        assert (sent.code, sent.out) == (EXIT_OK, f"{job_id}\tsignalled\n")
        done = await wait_for_row(pool, job_id, status="completed")
    assert json.loads(done["result"]) == {"by": "cli"}
    ended = await cli(dsn, "signal", str(job_id), "approve", "--json")
    assert (ended.code, ended.json()) == (EXIT_ERROR, {"id": job_id, "stored": False})
    unknown = await cli(dsn, "signal", str(2**62), "approve")
    assert (unknown.code, unknown.err) == (
        EXIT_ERROR,
        f"pgqueue: no job has id {2**62}\n",
    )


async def test_the_cli_retry_and_redrive_reset_steps(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    calls: list[str] = []
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60)
    _order(worker, calls)
    job_id = await queue.enqueue("order", {"fail": True})
    await pgqueue.Admin(pool).signal(job_id, "approve", True)
    async with running(worker):
        await wait_for_row(pool, job_id, status="dead")
        kept = await cli(dsn, "retry", str(job_id))
        assert kept.code == EXIT_OK, kept
        await wait_for_row(pool, job_id, status="dead", attempts=2)
        assert calls == ["charge", "reserve"]
        reset = await cli(dsn, "retry", str(job_id), "--reset-steps")
        assert reset.code == EXIT_OK, reset
        await wait_for_row(pool, job_id, status="dead", attempts=3)
        assert calls == ["charge", "reserve"] * 2
        where = f"queue={queue.name}"
        redriven = await cli(dsn, "redrive", "--where", where, "--reset-steps")
        assert redriven.code == EXIT_OK, redriven
        await wait_for_row(pool, job_id, status="dead", attempts=4)
    assert calls == ["charge", "reserve"] * 3


async def test_pgqueue_top_shows_a_running_jobs_progress_and_the_parked_count(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    release = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=2, poll_interval=60)

    @worker.handler("copy")
    async def copy(job: pgqueue.Job) -> None:
        await job.progress(0.4, "copying")
        await release.wait()

    @worker.handler("approval")
    async def approval(job: pgqueue.Job) -> None:
        await job.wait_for("approve")

    copying = await queue.enqueue("copy", {})
    parked = await queue.enqueue("approval", {})
    async with running(worker):
        await wait_for_row(pool, parked, status="parked")

        async def reported() -> bool:
            return (await row(pool, copying))["progress"] is not None

        await wait_until(reported)
        shown = await cli(dsn, "top", "--once", "--json", "--queue", queue.name)
        text = await cli(dsn, "top", "--once", "--queue", queue.name)
        hidden = await cli(
            dsn, "top", "--once", "--json", "--queue", queue.name, "--hide-payloads"
        )
        release.set()
    frame = shown.json()
    assert frame["queues"][0]["parked"] == 1
    assert [(r["id"], r["progress"]) for r in frame["longest_running"]] == [
        (copying, "40% copying")
    ]
    assert "parked" in text.out
    assert "40% copying" in text.out
    assert [r["progress"] for r in hidden.json()["longest_running"]] == [None]
