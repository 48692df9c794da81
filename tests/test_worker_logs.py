"""Worker log lines name their job, and a flood of retries does not flood the log.

With the command line's text format, "job failed; will retry" and "job
dead" used to say nothing of which job: the id, type, queue and attempt were
only in ``extra``, which common formatters drop. The message now names the
job; ``pgqueue worker --log-format json`` writes one JSON object a line with
every field; a retried attempt logs its traceback once per job type per
`TRACEBACK_INTERVAL` (every time at DEBUG), a dead job always.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import pgqueue
from pgqueue._core.log import JsonFormatter
from pgqueue._engine.runner import TRACEBACK_INTERVAL
from tests.helpers import RecordingLogger, no_backoff

if TYPE_CHECKING:
    import asyncpg

ROOT = Path(__file__).resolve().parent.parent
APP = "tests.cli_apps.failing:worker"
JSON = ("--log-format", "json")


def job_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "pgqueue" and "job_id" in vars(r)]


async def test_messages_name_the_job_its_attempt_and_the_error(
    pool: asyncpg.Pool, queue: pgqueue.Queue, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pgqueue")
    worker = pgqueue.Worker(
        pool, queue=queue.name, backoff=no_backoff, unknown_types="dead"
    )

    @worker.handler("send_email")
    async def send_email(job: pgqueue.Job) -> None:
        if job.attempts < 3:
            msg = "smtp timeout"
            raise ConnectionError(msg)
        msg = "no such mailbox"
        raise pgqueue.Permanent(msg)

    sent = await queue.enqueue("send_email", {}, max_attempts=25)
    unknown = await queue.enqueue("resize_image", {})
    with anyio.fail_after(15):
        await worker.run(until_empty=True)
    messages = [r.getMessage() for r in job_records(caplog)]
    where = f"on {queue.name}"
    assert (
        f"job {sent} (send_email {where}, attempt 1/25) failed; will retry in 0s: "
        "ConnectionError: smtp timeout"
    ) in messages
    assert (
        f"job {sent} (send_email {where}, attempt 2/25) failed; will retry in 0s: "
        "ConnectionError: smtp timeout"
    ) in messages
    [dead] = [m for m in messages if m.startswith(f"job {sent} ") and " dead" in m]
    assert dead.startswith(f"job {sent} (send_email {where}, attempt 3/25) dead: ")
    assert "no such mailbox" in dead
    assert (
        f"job {unknown} (resize_image {where}, attempt 1/5) dead: "
        "no handler registered for job type 'resize_image'"
    ) in messages
    # The fields stay in extra, for structured logging.
    retry = next(r for r in job_records(caplog) if "will retry" in r.getMessage())
    fields = vars(retry)
    assert (fields["job_id"], fields["job_type"], fields["queue"]) == (
        sent,
        "send_email",
        queue.name,
    )
    assert (fields["attempt"], fields["retry_in"]) == (1, 0.0)
    assert fields["error"] == "ConnectionError: smtp timeout"


@pytest.mark.parametrize("level", [logging.INFO, logging.DEBUG])
async def test_retries_log_their_traceback_once_per_type_unless_debugging(
    pool: asyncpg.Pool,
    queue: pgqueue.Queue,
    caplog: pytest.LogCaptureFixture,
    level: int,
) -> None:
    caplog.set_level(level, logger="pgqueue")
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=4, backoff=no_backoff)

    @worker.handler("a")
    @worker.handler("b")
    async def fail(_job: pgqueue.Job) -> None:
        msg = "down"
        raise RuntimeError(msg)

    jobs, attempts = 5, 4
    await queue.enqueue_many(
        [
            pgqueue.NewJob(t, {}, max_attempts=attempts)
            for t in "ab"
            for _ in range(jobs)
        ]
    )
    with anyio.fail_after(20):
        await worker.run(until_empty=True)
    retries = [r for r in job_records(caplog) if "will retry" in r.getMessage()]
    deaths = [r for r in job_records(caplog) if r.getMessage().count(" dead: ")]
    assert len(retries) == 2 * jobs * (attempts - 1)
    assert len(deaths) == 2 * jobs
    with_traceback = [r for r in retries if r.exc_info]
    if level == logging.DEBUG:
        assert len(with_traceback) == len(retries)
    else:
        # The test runs well within the interval: one traceback per type.
        assert TRACEBACK_INTERVAL >= 60
        assert sorted(vars(r)["job_type"] for r in with_traceback) == ["a", "b"]
    assert all(r.exc_info for r in deaths)  # a dead job always says why
    assert all(r.levelno == logging.ERROR for r in deaths)


def test_the_json_formatter_writes_every_field_on_one_line() -> None:
    record = logging.LogRecord(
        "pgqueue", logging.ERROR, __file__, 1, "job %s dead: %s", (7, "x\ny"), None
    )
    record.__dict__.update({"job_id": 7, "queue": "q\x1b[31m", "when": object()})
    try:
        raise ValueError("boom")
    except ValueError:
        record.exc_info = sys.exc_info()
    line = JsonFormatter().format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "job 7 dead: x\ny"
    assert (entry["level"], entry["logger"]) == ("ERROR", "pgqueue")
    assert (entry["job_id"], entry["queue"]) == (7, "q\x1b[31m")
    assert entry["when"].startswith("<object object")
    assert "ValueError: boom" in entry["traceback"]
    assert "\x1b" not in line  # escaped in the JSON text


async def test_pgqueue_worker_log_format_json_writes_one_object_per_line(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name)
    flaky = await queue.enqueue("flaky", {})
    doomed = await queue.enqueue("doomed", {}, max_attempts=1)
    with anyio.fail_after(30):
        result = await anyio.run_process(
            [sys.executable, "-m", "pgqueue", "worker", APP, "--burst", *JSON],
            env={**os.environ, "PGQUEUE_DSN": dsn, "CLI_QUEUE": queue_name},
            cwd=ROOT,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    entries: list[dict[str, Any]] = [json.loads(line) for line in stderr.splitlines()]
    assert entries
    assert all({"time", "level", "logger", "message"} <= set(e) for e in entries)
    by_job = {
        (e["job_id"], e["level"]): e
        for e in entries
        if e.get("queue") == queue_name and "job_id" in e
    }
    retry = by_job[flaky, "WARNING"]
    assert retry["message"] == (
        f"job {flaky} (flaky on {queue_name}, attempt 1/5) failed; "
        "will retry in 0s: ConnectionError: smtp timeout"
    )
    assert (retry["job_type"], retry["attempt"], retry["retry_in"]) == ("flaky", 1, 0)
    assert "ConnectionError: smtp timeout" in retry["traceback"]
    dead = by_job[doomed, "ERROR"]
    assert dead["message"] == (
        f"job {doomed} (doomed on {queue_name}, attempt 1/1) dead: "
        "LookupError: no such mailbox"
    )
    assert dead["error"] == "LookupError: no such mailbox"
    assert "raise LookupError(msg)" in dead["traceback"]
    records = await pool.fetch(
        "SELECT id, status FROM pgqueue_jobs WHERE queue = $1", queue_name
    )
    assert {r["id"]: r["status"] for r in records} == {
        flaky: "completed",
        doomed: "dead",
    }


async def test_a_handler_that_blocks_the_event_loop_is_named_in_a_warning(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    logger = RecordingLogger()
    worker = pgqueue.Worker(pool, queue=queue.name, block_warning=0.2, logger=logger)

    @worker.handler("resize")
    async def resize(job: pgqueue.Job) -> None:
        time.sleep(0.6)  # noqa: ASYNC251 - the blocking call the watch is for

    @worker.handler("polite")
    async def polite(job: pgqueue.Job) -> None:
        await anyio.sleep(0.6)

    blocking = await queue.enqueue("resize", {})
    await queue.enqueue("polite", {})
    await drain_logged(worker)
    [(level, extra)] = [
        (lv, e) for lv, m, e in logger.records if "held the event loop" in m
    ]
    assert level == "warning"
    assert (extra["job_id"], extra["job_type"], extra["queue"]) == (
        blocking,
        "resize",
        queue.name,
    )
    assert extra["held"] >= 0.4


async def test_the_block_warning_can_be_turned_off(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    logger = RecordingLogger()
    worker = pgqueue.Worker(pool, queue=queue.name, block_warning=None, logger=logger)

    @worker.handler("resize")
    async def resize(job: pgqueue.Job) -> None:
        time.sleep(0.3)  # noqa: ASYNC251 - blocks, and nothing is said

    await queue.enqueue("resize", {})
    await drain_logged(worker)
    assert not [m for m in logger.messages() if "event loop" in m]


async def drain_logged(worker: pgqueue.Worker) -> None:
    with anyio.fail_after(15):
        await worker.run(until_empty=True)
