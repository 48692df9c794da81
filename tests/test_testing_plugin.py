"""Tests for pgqueue.testing.pytest_plugin: pointing a DSN at another database."""

from __future__ import annotations

import uuid
from pathlib import Path

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
