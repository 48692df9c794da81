"""The data commands of the ``pgqueue`` command line, run as subprocesses.

Each runs ``python -m pgqueue ...`` with ``PGQUEUE_DSN`` set to the test
database, and checks its exit code, its ``--json`` output against the
database, and that bad input gets one line on stderr and exit code 2,
never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue.cli.schema import NEVER_ANALYZED
from tests.helpers import row, rows

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def _env(dsn: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    if dsn is not None:
        env["PGQUEUE_DSN"] = dsn
    env["COLUMNS"] = "200"
    return env


async def cli(dsn: str | None, *args: str) -> Result:
    """Run ``python -m pgqueue *args`` to its end."""
    with anyio.fail_after(30):
        done = await anyio.run_process(
            [sys.executable, "-m", "pgqueue", *args], env=_env(dsn), check=False
        )
    return Result(done.returncode, done.stdout.decode(), done.stderr.decode())


def _usage_error(result: Result) -> str:
    """Assert ``result`` is a one-line usage error; return the line."""
    assert result.code == EXIT_USAGE, result
    assert "Traceback" not in result.err, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("pgqueue: "), lines
    return lines[0]


# --- bad input -------------------------------------------------------------------------


BAD_INPUT = [
    (["bogus"], "invalid choice"),
    (["jobs", "show", "abc"], "not a job id"),
    (["jobs", "show", "0"], "not a job id"),
    (["cancel", "1", "x"], "not a job id"),
    (["retry"], "--all-dead"),
    (["retry", "1", "--queue", "a"], "--all-dead"),
    (["jobs", "list", "--status", "bogus"], "invalid choice"),
    (["jobs", "list", "--limit", "0"], "not a positive integer"),
    (["prune", "--older-than", "1d", "--batch-size", str(2**31)], "positive integer"),
    (["enqueue", "t", "{bad"], "not valid JSON"),
    (["enqueue", "t", "{}", "--priority", "9"], "priority"),
    (["enqueue", "t", "{}", "--run-at", "2026-01-01T00:00"], "UTC offset"),
    (["enqueue", "", "{}"], "job type"),
    (["signal", "0", "go"], "not a job id"),
    (["signal", "1", "go", "{bad"], "not valid JSON"),
    (["signal", "1", ""], "signal name"),
    (["prune", "--older-than", "7x"], "not a duration"),
    (["listen", "c" * 64], "63"),
    (["schema", "print", "--upgrade", "--down"], "not allowed"),
]


async def test_bad_input_is_one_line_and_exit_2(dsn: str) -> None:
    results: dict[int, Result] = {}

    async def run(index: int, args: list[str]) -> None:
        results[index] = await cli(dsn, *args)

    async with anyio.create_task_group() as tasks:
        for index, (args, _) in enumerate(BAD_INPUT):
            tasks.start_soon(run, index, args)
    for index, (args, expected) in enumerate(BAD_INPUT):
        line = _usage_error(results[index])
        assert expected in line, (args, line)


async def test_a_dsn_that_does_not_connect_names_the_host_and_why(
    admin_dsn: str,
) -> None:
    refused = await cli(None, "--dsn", "postgresql://postgres@127.0.0.1:1/x", "stats")
    line = _usage_error(refused)
    assert "127.0.0.1:1" in line, line
    missing = admin_dsn.rsplit("/", 1)[0] + "/no_such_database_here"
    line = _usage_error(await cli(missing, "jobs", "list"))
    assert "no_such_database_here" in line, line


CONNECTING = {
    ("schema", "print"): ["schema", "print"],  # given --dsn, what the database needs
    ("schema", "apply"): ["schema", "apply"],
    ("schema", "check"): ["schema", "check"],
    ("stats",): ["stats"],
    ("jobs", "list"): ["jobs", "list"],
    ("jobs", "show"): ["jobs", "show", "1"],
    ("retry",): ["retry", "1"],
    ("cancel",): ["cancel", "1"],
    ("redrive",): ["redrive", "--where", "queue=q"],
    ("jobs", "delete"): ["jobs", "delete", "--where", "queue=q"],
    ("jobs", "move"): ["jobs", "move", "--where", "queue=q", "--to-queue", "r"],
    ("jobs", "update"): ["jobs", "update", "1", "--priority", "1"],
    ("pause",): ["pause", "q"],
    ("resume",): ["resume", "q"],
    ("prune",): ["prune", "--older-than", "1d"],
    ("enqueue",): ["enqueue", "t", "{}"],
    ("signal",): ["signal", "1", "go"],
    ("listen",): ["listen", "c"],
    ("periodic", "list"): ["periodic", "list"],
    ("periodic", "remove"): ["periodic", "remove", "p"],
    ("top",): ["top", "--once"],
    ("web",): ["web", "--port", "0"],
}
"""A command line of every command that connects to --dsn.

``worker``'s pool is its app's; ``schema grants`` prints without connecting.
"""


def test_every_command_that_connects_is_tried_unreachable() -> None:
    from pgqueue.cli import build_parser
    from tests.test_docs import commands

    leaves = {
        name
        for name, parser in commands(build_parser())
        if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
    }
    assert leaves == {*CONNECTING, ("worker",), ("schema", "grants")}


@pytest.mark.timeout(120)
async def test_every_command_says_where_it_cannot_connect_and_whence_exit_2() -> None:
    unreachable = "postgresql://postgres@127.0.0.1:1/nowhere"
    results: dict[tuple[str, ...], tuple[Result, Result]] = {}
    # A few at a time: each process's 30 s must hold on a busy machine.
    limiter = anyio.CapacityLimiter(16)

    async def run(name: tuple[str, ...], args: list[str]) -> None:
        async with limiter:
            given = await cli(None, *args, "--dsn", unreachable)
            from_env = await cli(unreachable, *args)
        results[name] = (given, from_env)

    async with anyio.create_task_group() as tasks:
        for name, args in CONNECTING.items():
            tasks.start_soon(run, name, args)
    for name in CONNECTING:
        given, from_env = results[name]
        line = _usage_error(given)
        assert line.startswith(
            "pgqueue: cannot connect to postgres@127.0.0.1:1/nowhere (from --dsn): "
        ), (name, line)
        if name == ("schema", "print"):
            continue  # without --dsn it prints the SQL, connecting nowhere
        line = _usage_error(from_env)
        assert "postgres@127.0.0.1:1/nowhere (from PGQUEUE_DSN): " in line, (name, line)


async def test_a_missing_table_is_exit_1_naming_the_fix(fresh_dsn: str) -> None:
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await pgqueue.uninstall(connection)
    finally:
        await connection.close()
    result = await cli(fresh_dsn, "stats")
    assert result.code == EXIT_ERROR, result
    # The command line's fix, not a Python one.
    assert "there is no table pgqueue_jobs" in result.err
    assert "run pgqueue schema apply" in result.err
    assert "pgqueue.install(pool)" not in result.err
    assert "Traceback" not in result.err


# --- schema ----------------------------------------------------------------------------


async def test_schema_check_says_when_the_table_was_never_analyzed(
    fresh_dsn: str,
) -> None:
    check = await cli(fresh_dsn, "schema", "check")
    assert check.code == EXIT_OK
    assert check.out.splitlines()[1:] == [NEVER_ANALYZED]
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await connection.execute("ANALYZE pgqueue_jobs")
    finally:
        await connection.close()
    check = await cli(fresh_dsn, "schema", "check", "--json")
    assert (check.code, check.json()["analyzed"]) == (EXIT_OK, True)
    check = await cli(fresh_dsn, "schema", "check")
    assert NEVER_ANALYZED not in check.out
    assert len(check.out.splitlines()) == 1


async def test_schema_print_apply_and_check(fresh_dsn: str) -> None:
    printed = await cli(None, "schema", "print")
    assert printed.code == EXIT_OK
    assert printed.out.strip() == pgqueue.SCHEMA.strip()
    assert (await cli(None, "schema", "print", "--upgrade")).out.strip() == (
        pgqueue.SCHEMA_UPGRADE.strip()
    )

    where = fresh_dsn.removeprefix("postgresql://")
    check = await cli(fresh_dsn, "schema", "check", "--json")
    assert (check.code, check.json()) == (
        EXIT_OK,
        {
            "kind": "current",
            "missing": [],
            "analyzed": False,
            "fix": None,
            "database": where,
        },
    )

    connection = await asyncpg.connect(fresh_dsn)
    try:
        await connection.execute("DROP INDEX idx_pgqueue_jobs_priority")
        check = await cli(fresh_dsn, "schema", "check")
        assert check.code == EXIT_ERROR
        assert "partly up to date" in check.out
        assert "index idx_pgqueue_jobs_priority" in check.out
        refused = await cli(fresh_dsn, "schema", "apply")
        assert refused.code == EXIT_ERROR
        assert "--upgrade" in refused.err
        upgraded = await cli(fresh_dsn, "schema", "apply", "--upgrade", "--json")
        assert (upgraded.code, upgraded.json()["kind"]) == (EXIT_OK, "current")

        await pgqueue.uninstall(connection)
        check = await cli(fresh_dsn, "schema", "check", "--json")
        assert (check.code, check.json()["kind"]) == (EXIT_ERROR, "missing")
        assert (await cli(fresh_dsn, "schema", "apply", "--upgrade")).code == (
            EXIT_ERROR
        )
        applied = await cli(fresh_dsn, "schema", "apply")
        assert (applied.code, applied.out.splitlines()) == (
            EXIT_OK,
            [f"{where}: pgqueue_jobs is current", NEVER_ANALYZED],
        )

        await pgqueue.uninstall(connection)
        from tests.go_module import GO_SCHEMA

        await connection.execute(GO_SCHEMA)
        check = await cli(fresh_dsn, "schema", "check")
        assert check.code == EXIT_ERROR
        assert "the Go module's v1.1.0 table" in check.out
        assert "column priority" in check.out
        assert "SCHEMA_UPGRADE" in check.out
    finally:
        await connection.close()


# --- stats, jobs -----------------------------------------------------------------------


async def test_stats_json_matches_the_table(fresh_dsn: str) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=2) as pool:
        queue = pgqueue.Queue(pool, name="q")
        ids = [await queue.enqueue("t", {"n": n}) for n in range(4)]
        later = await pool.fetchval("SELECT now() + interval '1 hour'")
        await queue.enqueue("t", {}, run_at=later)
        await pool.execute(
            "UPDATE pgqueue_jobs SET status = 'dead' WHERE id = ANY($1)", ids[:2]
        )
        await queue.enqueue("t", {}, after=[ids[2]])
        await pgqueue.Queue(pool, name="r").enqueue("t", {})
        result = await cli(fresh_dsn, "stats", "--json")
        assert result.code == EXIT_OK, result
        found = result.json()
        assert [s["queue"] for s in found] == ["q", "r"]
        assert list(found[0]) == [
            "queue",
            "ready",
            "scheduled",
            "running",
            "completed",
            "dead",
            "cancelled",
            "lag",
            "longest_running",
            "oldest_heartbeat",
            "completed_estimated",
            "slots_in_use",
            "global_limit",
            "waiting",
            "parked",
            "paused",
        ]
        q = found[0]
        assert (q["ready"], q["scheduled"], q["dead"], q["completed"]) == (2, 1, 2, 0)
        assert (q["waiting"], found[1]["waiting"]) == (1, 0)
        assert q["lag"] >= 0
        only = await cli(fresh_dsn, "stats", "--queue", "r", "--json")
        assert [s["queue"] for s in only.json()] == ["r"]
        text = await cli(fresh_dsn, "stats")
        assert text.code == EXIT_OK
        header, *lines = text.out.splitlines()
        assert header.split()[:3] == ["queue", "waiting", "ready"]
        rows = {line.split()[0]: line.split()[1:3] for line in lines if line.strip()}
        assert rows["q"] == ["1", "2"]
        assert rows["r"] == ["0", "1"]


async def test_jobs_list_and_show(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name)
    ids = [await queue.enqueue("t", {"n": n}) for n in range(3)]
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'dead', last_error = $2 WHERE id = $1",
        ids[0],
        "boom\nat line 2",
    )
    listed = await cli(dsn, "jobs", "list", "--queue", queue_name, "--json")
    assert listed.code == EXIT_OK, listed
    assert [j["id"] for j in listed.json()] == ids[::-1]
    page = await cli(
        dsn,
        "jobs",
        "list",
        "--queue",
        queue_name,
        "--limit",
        "1",
        "--before-id",
        str(ids[2]),
        "--json",
    )
    assert [j["id"] for j in page.json()] == [ids[1]]
    dead = await cli(
        dsn, "jobs", "list", "--queue", queue_name, "--status", "dead", "--json"
    )
    [job] = dead.json()
    assert (job["id"], job["status"], job["last_error"]) == (
        ids[0],
        "dead",
        "boom\nat line 2",
    )
    assert job["payload"] == {"n": 0}
    text = await cli(dsn, "jobs", "list", "--queue", queue_name, "--status", "dead")
    assert text.code == EXIT_OK
    assert str(ids[0]) in text.out
    assert "boom" in text.out
    assert "at line 2" not in text.out

    shown = await cli(dsn, "jobs", "show", str(ids[1]), "--json")
    assert shown.code == EXIT_OK
    stored = await row(pool, ids[1])
    assert shown.json()["created_at"] == stored["created_at"].isoformat()
    assert shown.json()["payload"] == {"n": 1}
    assert (await cli(dsn, "jobs", "show", str(ids[1]))).code == EXIT_OK
    missing = await cli(dsn, "jobs", "show", str(2**62))
    assert missing.code == EXIT_ERROR
    assert "no job" in missing.err


async def test_piped_output_keeps_whole_lines_past_80_columns(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    long_queue = f"{queue_name}-{'q' * 90}"
    long_type = "t" * 150
    await pgqueue.Queue(pool, name=long_queue).enqueue(long_type, {})
    env = {k: v for k, v in _env(dsn).items() if k != "COLUMNS"}
    for args in (["jobs", "list", "--queue", long_queue], ["stats"]):
        with anyio.fail_after(30):
            done = await anyio.run_process(
                [sys.executable, "-m", "pgqueue", *args], env=env, check=False
            )
        out = done.stdout.decode()
        assert done.returncode == EXIT_OK, done.stderr
        wanted = long_type if args[0] == "jobs" else long_queue
        assert any(wanted in line for line in out.splitlines()), out


# --- retry, cancel, prune, enqueue -----------------------------------------------------


async def test_retry_cancel_and_their_results(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name, max_attempts=2)
    dead, pending, other_dead = [await queue.enqueue("t", {}) for _ in range(3)]
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'dead', attempts = 2 WHERE id = ANY($1)",
        [dead, other_dead],
    )
    retried = await cli(dsn, "retry", str(dead), str(pending), str(2**62), "--json")
    assert retried.code == EXIT_ERROR  # an id has no job
    assert retried.json() == [
        {"id": dead, "result": "retried", "reason": None},
        {
            "id": pending,
            "result": "not_retryable",
            "reason": "it is pending: only dead and cancelled jobs are retried",
        },
        {
            "id": 2**62,
            "result": "not_found",
            "reason": "no job has this id (never enqueued, or pruned)",
        },
    ]
    stored = await row(pool, dead)
    assert (stored["status"], stored["attempts"], stored["max_attempts"]) == (
        "pending",
        2,
        4,
    )
    everything = await cli(
        dsn, "retry", "--all-dead", "--queue", queue_name, "--attempts", "1", "--json"
    )
    assert everything.code == EXIT_OK
    assert everything.json() == [
        {"id": other_dead, "result": "retried", "reason": None}
    ]
    assert (await row(pool, other_dead))["max_attempts"] == 3

    cancelled = await cli(dsn, "cancel", str(pending), str(dead))
    assert cancelled.code == EXIT_OK
    assert cancelled.out.splitlines() == [f"{pending}\tcancelled", f"{dead}\tcancelled"]
    assert {r["status"] for r in await rows(pool, queue_name)} == {
        "cancelled",
        "pending",
    }

    # Nothing done: each id says why, and the exit code is 1.
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed' WHERE id = $1", dead
    )
    again = await cli(dsn, "retry", str(dead))
    assert again.code == EXIT_ERROR
    assert again.out.splitlines() == [
        f"{dead}\tnot_retryable: it is completed: only dead and cancelled jobs are retried"
    ]
    finished = await cli(dsn, "cancel", str(dead), str(pending))
    assert finished.code == EXIT_ERROR
    why = "only pending, waiting and running jobs are cancelled"
    assert finished.out.splitlines() == [
        f"{dead}\tfinished: it is completed: {why}",
        f"{pending}\tfinished: it is cancelled: {why}",
    ]
    nothing_dead = await cli(dsn, "retry", "--all-dead", "--queue", queue_name)
    assert (nothing_dead.code, nothing_dead.out.strip()) == (EXIT_OK, "no jobs")


async def test_prune_takes_a_duration(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name)
    old, new, live = [await queue.enqueue("t", {}) for _ in range(3)]
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed',"
        " updated_at = now() - interval '3 hours' WHERE id = $1",
        old,
    )
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'dead',"
        " updated_at = now() - interval '1 hour' WHERE id = $1",
        new,
    )
    pruned = await cli(
        dsn, "prune", "--older-than", "2h", "--queue", queue_name, "--json"
    )
    assert (pruned.code, pruned.json()) == (EXIT_OK, {"deleted": 1})
    pruned = await cli(dsn, "prune", "--older-than", "1800", "--queue", queue_name)
    assert (pruned.code, pruned.out.strip()) == (EXIT_OK, "deleted 1 jobs")
    assert [r["id"] for r in await rows(pool, queue_name)] == [live]


async def test_enqueue_prints_the_id(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    later = "2100-01-01T00:00:00Z"
    made = await cli(
        dsn,
        "enqueue",
        "send",
        '{"to": "a@example.com", "n": 1.50}',
        "--queue",
        queue_name,
        "--run-at",
        later,
        "--priority",
        "3",
        "--unique-key",
        "k",
        "--max-attempts",
        "7",
        "--json",
    )
    assert made.code == EXIT_OK, made
    job_id = made.json()["id"]
    stored = await row(pool, job_id)
    assert (
        stored["queue"],
        stored["job_type"],
        stored["priority"],
        stored["unique_key"],
        stored["max_attempts"],
        stored["run_at"].year,
    ) == (queue_name, "send", 3, "k", 7, 2100)
    assert json.loads(stored["payload"]) == {"to": "a@example.com", "n": 1.5}
    again = await cli(
        dsn, "enqueue", "send", "{}", "--queue", queue_name, "--unique-key", "k"
    )
    assert (again.code, again.out.strip()) == (EXIT_OK, str(job_id))


# --- listen ----------------------------------------------------------------------------


async def _listening(dsn: str, *args: str) -> Any:
    process = await anyio.open_process(
        [sys.executable, "-m", "pgqueue", "listen", *args],
        env=_env(dsn),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stderr is not None
    with anyio.fail_after(15):
        ready = b""
        while b"listening on" not in ready:
            ready += await process.stderr.receive()
    return process


async def _read_all(stream: Any) -> bytes:
    data = b""
    try:
        while True:
            data += await stream.receive()
    except anyio.EndOfStream:
        return data


async def test_listen_prints_notifications_until_count(
    dsn: str, pool: asyncpg.Pool
) -> None:
    process = await _listening(dsn, "cli_a", "cli b", "--json", "--count", "2")
    async with process:
        await pgqueue.publish(pool, "cli_a", '{"x": 1}')
        await pgqueue.publish(pool, "cli b", "plain")
        with anyio.fail_after(15):
            out = await _read_all(process.stdout)
            code = await process.wait()
    assert code == EXIT_OK
    lines = [json.loads(line) for line in out.decode().splitlines()]
    assert [(line["channel"], line["payload"]) for line in lines] == [
        ("cli_a", '{"x": 1}'),
        ("cli b", "plain"),
    ]
    assert all(isinstance(line["pid"], int) for line in lines)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
async def test_listen_exits_0_on_a_signal(
    dsn: str, pool: asyncpg.Pool, signum: int
) -> None:
    process = await _listening(dsn, "cli_c")
    async with process:
        await pgqueue.publish(pool, "cli_c", "one")
        with anyio.fail_after(15):
            assert process.stdout is not None
            line = b""
            while not line.endswith(b"\n"):
                line += await process.stdout.receive()
            assert line.decode() == "cli_c\tone\n"
            process.send_signal(signum)
            code = await process.wait()
            err = await _read_all(process.stderr)
    assert code == EXIT_OK
    assert b"Traceback" not in err


async def test_import_pgqueue_imports_neither_rich_nor_the_command_line() -> None:
    code = (
        "import sys, pgqueue; "
        "assert 'rich' not in sys.modules and 'pgqueue.cli' not in sys.modules"
    )
    done = await anyio.run_process([sys.executable, "-c", code], check=False)
    assert done.returncode == 0, done.stderr.decode()


async def test_schema_print_with_a_dsn_prints_what_that_database_needs(
    fresh_dsn: str,
) -> None:
    where = fresh_dsn.removeprefix("postgresql://")
    current = await cli(None, "schema", "print", "--dsn", fresh_dsn)
    assert current.code == EXIT_OK, current
    assert current.out == (
        f"-- {where}: pgqueue_jobs is current\n-- nothing to apply\n"
    )
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await pgqueue.uninstall(connection)
    finally:
        await connection.close()
    missing = await cli(None, "--dsn", fresh_dsn, "schema", "print")
    assert missing.code == EXIT_OK, missing
    header, _, sql = missing.out.partition("\n")
    assert header == f"-- {where}: there is no table pgqueue_jobs"
    assert sql == pgqueue.SCHEMA.strip() + "\n"
    # PGQUEUE_DSN alone (here a server that is not there) does not connect.
    unreachable = await cli("postgresql://postgres@127.0.0.1:1/x", "schema", "print")
    assert (unreachable.code, unreachable.out) == (
        EXIT_OK,
        pgqueue.SCHEMA.strip() + "\n",
    )


async def test_jobs_show_lists_parents_and_children(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name)
    first, second = [await queue.enqueue("t", {}) for _ in range(2)]
    child = await queue.enqueue("t", {}, after=[first, second])
    grandchild = await queue.enqueue("t", {}, after=[child])
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed' WHERE id = $1", first
    )
    shown = await cli(dsn, "jobs", "show", str(child), "--json")
    assert shown.code == EXIT_OK, shown
    assert shown.json()["dependencies"] == {
        "parents": [
            {"id": first, "status": "completed"},
            {"id": second, "status": "pending"},
        ],
        "parents_total": 2,
        "children": [{"id": grandchild, "status": "waiting"}],
        "children_total": 1,
    }
    text = await cli(dsn, "jobs", "show", str(child))
    assert text.code == EXIT_OK, text
    lines = {
        line.split()[0]: line.split(maxsplit=1)[1].strip()
        for line in text.out.splitlines()
        if line.strip()
    }
    assert lines["parents"] == f"{first} (completed), {second} (pending)"
    assert lines["children"] == f"{grandchild} (waiting)"
    alone = await cli(dsn, "jobs", "show", str(second), "--json")
    assert alone.json()["dependencies"]["parents"] == []
    assert alone.json()["dependencies"]["children_total"] == 1
