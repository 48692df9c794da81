"""The filtered commands of the ``pgqueue`` command line, run as subprocesses.

``--where`` on ``jobs list``, ``retry``, ``cancel``, ``redrive``, ``jobs
delete`` and ``jobs move`` (with ``--dry-run``, ``--limit`` and
``--rate``), and ``jobs update``: their output against the database.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import anyio

import pgqueue
from pgqueue import Status
from tests.helpers import row, rows
from tests.test_cli import EXIT_ERROR, EXIT_OK, _usage_error, cli

if TYPE_CHECKING:
    import asyncpg


BAD_INPUT = [
    (["jobs", "list", "--where", "bogus=1"], "unknown filter key"),
    (["jobs", "list", "--where", "queue"], "KEY=VALUE"),
    (["retry", "1", "--where", "queue=q"], "one of them"),
    (["retry", "1", "--dry-run"], "go with --where"),
    (["cancel"], "one of them"),
    (["cancel", "--where", "status=completed"], "only"),
    (["redrive"], "--where"),
    (["redrive", "--where", "queue=q", "--rate", "0"], "jobs a second"),
    (["redrive", "--where", "status=running"], "only"),
    (["jobs", "move", "--where", "queue=q"], "--to-queue"),
    (["jobs", "delete", "--where", "status=running"], "only"),
    (["jobs", "update", "1"], "a field to change"),
    (["jobs", "update", "1", "--payload", "{bad"], "not valid JSON"),
    (["jobs", "update", "1", "--run-at", "2026-01-01T00:00"], "timezone-aware"),
]


async def test_bad_input_is_one_line_and_exit_2(dsn: str) -> None:
    results: dict[int, str] = {}
    limiter = anyio.CapacityLimiter(4)

    async def run(index: int, args: list[str]) -> None:
        async with limiter:
            results[index] = _usage_error(await cli(dsn, *args))

    async with anyio.create_task_group() as tasks:
        for index, (args, _) in enumerate(BAD_INPUT):
            tasks.start_soon(run, index, args)
    for index, (args, expected) in enumerate(BAD_INPUT):
        assert expected in results[index], (args, results[index])


async def _jobs(pool: asyncpg.Pool, queue: str) -> list[int]:
    """Six jobs of ``queue``, users 0 and 1 by turns; the first four dead."""
    ids = await pgqueue.Queue(pool, name=queue).enqueue_many(
        [("ship", {"user_id": n % 2, "n": n}) for n in range(6)]
    )
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = $2, attempts = max_attempts, last_error = 'boom'"
        " WHERE id = ANY($1::bigint[])",
        ids[:4],
        Status.DEAD,
    )
    return ids


async def test_jobs_list_where(dsn: str, pool: asyncpg.Pool, queue_name: str) -> None:
    ids = await _jobs(pool, queue_name)
    listed = await cli(
        dsn,
        "jobs",
        "list",
        "--where",
        f"queue={queue_name}",
        "--where",
        "payload.user_id=1",
        "--json",
    )
    assert listed.code == EXIT_OK, listed
    assert [job["id"] for job in listed.json()] == [ids[5], ids[3], ids[1]]
    dead = await cli(
        dsn,
        "jobs",
        "list",
        "--queue",
        queue_name,
        "--status",
        "dead",
        "--where",
        "payload.user_id=1",
    )
    assert dead.code == EXIT_OK
    assert [line.split()[0] for line in dead.out.splitlines()[1:]] == [
        str(ids[3]),
        str(ids[1]),
    ]


async def test_retry_where_dry_run_then_paced(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await _jobs(pool, queue_name)
    where = ["--where", f"queue={queue_name}", "--where", "payload.user_id=0"]
    dry = await cli(dsn, "retry", *where, "--dry-run")
    assert (dry.code, dry.out.strip()) == (
        EXIT_OK,
        f"would retry: 2 jobs matching queue={queue_name} payload.user_id=0",
    )
    assert {
        r["status"] for r in await rows(pool, queue_name) if r["id"] in ids[:4]
    } == {Status.DEAD}
    done = await cli(dsn, "retry", *where, "--rate", "100", "--json")
    assert done.code == EXIT_OK, done
    assert done.json() == {
        "action": "retry",
        "filter": [f"queue={queue_name}", "payload.user_id=0"],
        "dry_run": False,
        "count": 2,
    }
    statuses = {r["id"]: r["status"] for r in await rows(pool, queue_name)}
    assert [statuses[i] for i in ids[:4]] == [
        Status.PENDING,
        Status.DEAD,
        Status.PENDING,
        Status.DEAD,
    ]


async def test_redrive_cancel_move_and_delete_where(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await _jobs(pool, queue_name)
    other = queue_name + "-b"
    redriven = await cli(
        dsn,
        "redrive",
        "--where",
        f"queue={queue_name}",
        "--to-queue",
        other,
        "--limit",
        "3",
        "--json",
    )
    assert redriven.json()["count"] == 3
    assert [r["id"] for r in await rows(pool, other)] == ids[:3]
    cancelled = await cli(dsn, "cancel", "--where", f"queue={other}")
    assert cancelled.out.strip() == f"cancel: 3 jobs matching queue={other}"
    moved = await cli(
        dsn, "jobs", "move", "--where", f"queue={other}", "--to-queue", queue_name
    )
    assert moved.out.strip() == f"move: 3 jobs matching queue={other}"
    deleted = await cli(
        dsn,
        "jobs",
        "delete",
        "--where",
        f"queue={queue_name}",
        "--where",
        "status=dead",
    )
    assert (
        deleted.out.strip() == f"delete: 1 jobs matching queue={queue_name} status=dead"
    )
    assert [r["id"] for r in await rows(pool, queue_name)] == [*ids[:3], *ids[4:]]


async def test_jobs_update(dsn: str, pool: asyncpg.Pool, queue_name: str) -> None:
    ids = await _jobs(pool, queue_name)
    pending = ids[4]
    updated = await cli(
        dsn,
        "jobs",
        "update",
        str(pending),
        "--payload",
        '{"user_id": 7}',
        "--priority",
        "2",
        "--run-at",
        "2030-01-01T00:00:00+00:00",
        "--group",
        "g",
        "--max-attempts",
        "3",
        "--json",
    )
    assert updated.code == EXIT_OK, updated
    shown = updated.json()
    assert (shown["payload"], shown["priority"], shown["max_attempts"]) == (
        {"user_id": 7},
        2,
        3,
    )
    stored = await row(pool, pending)
    assert (json.loads(stored["payload"]), stored["group_key"]) == ({"user_id": 7}, "g")
    refused = await cli(dsn, "jobs", "update", str(ids[0]), "--priority", "1")
    assert refused.code == EXIT_ERROR
    assert refused.err.strip() == (
        f"pgqueue: job {ids[0]} is dead: only pending and waiting jobs are updated"
    )
    missing = await cli(dsn, "jobs", "update", str(2**62), "--priority", "1")
    assert (missing.code, missing.err.strip()) == (
        EXIT_ERROR,
        f"pgqueue: no job has id {2**62}",
    )
