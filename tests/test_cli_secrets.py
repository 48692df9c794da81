"""Passwords stay out of errors, logs and command lines; errors name the database.

The command line runs as a subprocess against the real server (trust
authentication: a password in the DSN is accepted and ignored, which lets a
test carry one all the way). The public API's `SchemaError` is checked
against a real database without the table.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import anyio
import asyncpg
import pytest

import pgqueue
from tests.test_cli_worker import APPS, READY, started

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

ROOT = Path(__file__).resolve().parent.parent
SECRET = "Zq9sEcReT"


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    return {**env, "COLUMNS": "200", **extra}


async def pgqueue_cli(*args: str, **env: str) -> tuple[int, str]:
    """Run ``python -m pgqueue ARGS``; its exit code and stdout + stderr."""
    with anyio.fail_after(30):
        done = await anyio.run_process(
            [sys.executable, "-m", "pgqueue", *args],
            env=environment(**env),
            cwd=ROOT,
            check=False,
        )
    return done.returncode, done.stdout.decode() + done.stderr.decode()


def listening_addresses(port: int) -> set[str]:
    """The local addresses with a TCP socket listening on ``port`` (Linux's /proc)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def server(dsn: str) -> tuple[str, int, str]:
    parts = urlsplit(dsn)
    assert parts.hostname is not None
    return parts.hostname, parts.port or 5432, parts.path.lstrip("/")


# A password with a character that ends asyncpg's reading of it early.
UNPARSEABLE = [
    f"postgresql://u:{SECRET[:4]}@{SECRET[4:]}@127.0.0.1:5432/db",
    f"postgresql://u:{SECRET[:4]}/{SECRET[4:]}@127.0.0.1:5432/db",
    f"postgresql://u:{SECRET[:4]}?{SECRET[4:]}@127.0.0.1:5432/db",
    f"postgresql://u:{SECRET[:4]}#{SECRET[4:]}@127.0.0.1:5432/db",
    f"postgresql://u:1234/{SECRET}@127.0.0.1:5432/db",
]


@pytest.mark.parametrize("dsn", UNPARSEABLE)
async def test_a_dsn_that_cannot_be_parsed_gets_a_fixed_message(dsn: str) -> None:
    for args in (["stats"], ["top", "--once"], ["listen", "c", "--count", "1"]):
        code, out = await pgqueue_cli("--dsn", dsn, *args)
        assert code == 2, out
        assert "percent-encode" in out, out
        assert SECRET[:4] not in out, out
        assert SECRET[4:] not in out, out
        assert "Traceback" not in out


def test_the_public_api_refuses_it_before_connecting() -> None:
    for dsn in UNPARSEABLE:
        for make in (pgqueue.Subscriber, pgqueue.Tracker):
            with pytest.raises(ValueError, match="percent-encode") as caught:
                make(dsn)
            assert SECRET[:4] not in str(caught.value)
            assert SECRET[4:] not in str(caught.value)


async def test_a_refused_connection_names_the_target_without_the_password() -> None:
    code, out = await pgqueue_cli(
        "--dsn", f"postgresql://someone:{SECRET}@127.0.0.1:1/somedb", "jobs", "list"
    )
    assert code == 2, out
    assert "someone@127.0.0.1:1/somedb" in out, out
    assert SECRET not in out


async def test_without_a_dsn_the_error_names_the_database_libpq_chose(
    admin_dsn: str,
) -> None:
    """No PGQUEUE_DSN: the missing table is reported with the database it looked in."""
    host, port, _ = server(admin_dsn)
    name = f"no_schema_{os.getpid()}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await admin.execute(f'CREATE DATABASE "{name}"')
        code, out = await pgqueue_cli(
            "stats", PGHOST=host, PGPORT=str(port), PGUSER="postgres", PGDATABASE=name
        )
        assert code == 1, out
        assert f"postgres@{host}:{port}/{name}" in out, out
        assert "no table pgqueue_jobs" in out
        code, out = await pgqueue_cli(
            "--dsn", f"postgresql://postgres:{SECRET}@{host}:{port}/{name}", "top"
        )
        assert code == 1, out
        assert f"postgres@{host}:{port}/{name}" in out, out
        assert SECRET not in out
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
async def empty_database(admin_dsn: str) -> AsyncIterator[str]:
    """A database without pgqueue's tables; its DSN with a password in it."""
    host, port, _ = server(admin_dsn)
    name = f"empty_{os.getpid()}_{id(admin_dsn) % 10000}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await admin.execute(f'CREATE DATABASE "{name}"')
        yield f"postgresql://postgres:{SECRET}@{host}:{port}/{name}"
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def test_schema_errors_of_the_public_api_name_the_database(
    empty_database: str,
) -> None:
    host, port, name = server(empty_database)
    where = f"postgres@{host}:{port}/{name}"
    async with asyncpg.create_pool(empty_database, min_size=1, max_size=2) as pool:
        with pytest.raises(pgqueue.SchemaError) as enqueued:
            await pgqueue.Queue(pool).enqueue("t", {})
        with pytest.raises(pgqueue.SchemaError) as listed:
            await pgqueue.Admin(pool).stats()
        worker = pgqueue.Worker(pool, poll_interval=0.1)
        with pytest.raises(pgqueue.SchemaError) as ran, anyio.fail_after(20):
            await worker.run()
    for caught in (enqueued, listed, ran):
        error = caught.value
        assert error.where == where
        assert str(error).startswith(f"{where}: ")
        assert "no table pgqueue_jobs" in error.summary
        assert host not in error.summary
        assert SECRET not in str(error)


WARNING = "holds a password, which any user of this machine can read"


async def test_a_password_on_the_command_line_is_warned_of_once(dsn: str) -> None:
    host, port, name = server(dsn)
    with_password = f"postgresql://postgres:{SECRET}@{host}:{port}/{name}"
    code, out = await pgqueue_cli("--dsn", with_password, "stats")
    assert (code, SECRET in out) == (0, False), out
    [line] = [line for line in out.splitlines() if "password" in line]
    assert line == (
        f"pgqueue: warning: --dsn {WARNING} on the command line (ps) while pgqueue "
        "runs: give it in PGQUEUE_DSN, or keep the password in a password file "
        "(~/.pgpass) or a service file (PGSERVICEFILE)"
    )
    code, out = await pgqueue_cli(
        "top", "--once", "--json", f"--read-dsn={with_password}", PGQUEUE_DSN=dsn
    )
    assert (code, SECRET in out) == (0, False), out
    assert out.count("warning: --read-dsn holds a password") == 1, out
    assert "give it in PGQUEUE_READ_DSN" in out
    # In the environment, or without a password: nothing to warn of.
    for args, env in (
        (["stats"], {"PGQUEUE_DSN": with_password}),
        (["--dsn", dsn, "stats"], {}),
    ):
        code, out = await pgqueue_cli(*args, **env)
        assert (code, "pgqueue: warning" in out, SECRET in out) == (0, False, False), (
            out
        )


async def test_children_get_no_password_on_their_command_line(
    dsn: str, queue_name: str
) -> None:
    host, port, name = server(dsn)
    with_password = f"postgresql://postgres:{SECRET}@{host}:{port}/{name}"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    args = (
        f"{APPS}:worker",
        "--processes",
        "2",
        "--dsn",
        with_password,
        f"--listen={with_password}",
        "--metrics-port",
        str(metrics_port),
    )
    async with started(with_password, queue_name, *args) as child:
        await child.wait_for(READY, count=2)
        (line,) = await child.wait_for("started 2 worker processes")
        pids = [int(pid) for pid in re.findall(r"\d+", line.rpartition(":")[2])]
        assert len(pids) == 2
        for pid in pids:
            cmdline = (await anyio.Path(f"/proc/{pid}/cmdline").read_bytes()).decode()
            assert "pgqueue" in cmdline
            assert SECRET not in cmdline, cmdline
            assert "--listen-from-env" in cmdline
        # Each child's metrics listen on 127.0.0.1 only.
        assert listening_addresses(metrics_port) == {"0100007F"}
        assert listening_addresses(metrics_port + 1) == {"0100007F"}
        child.process.terminate()
        assert await child.exit_code() == 0, child.text
    assert SECRET not in child.text
    # Said once, by the parent: the children's DSNs are not on a command line.
    assert child.text.count("--dsn and --listen hold a password") == 1, child.text
