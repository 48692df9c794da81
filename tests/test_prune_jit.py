"""Retention without JIT: the worker's sweep and `Admin.prune`, on a server that compiles everything.

PostgreSQL JIT-compiles a statement whose plan costs more than
``jit_above_cost``; a prune batch's walk of the primary key passes it on a
table of a few hundred thousand finished rows and then spends far longer
compiling than deleting. Here a private server (`pgqueue.testing._clusters`)
sets the thresholds to 0, so that every statement would be compiled, and
``pg_stat_statements`` counts the functions each statement compiled: the
batches compile none, a control query does (so JIT is there to be
avoided), and a caller's own ``jit`` setting survives a prune in its
transaction. Skipped where the server has no JIT.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import asyncpg
import pytest

import pgqueue
from pgqueue.testing._clusters import (
    LocalCluster,
    LocalServer,
    binaries,
    free_port,
    servers,
)
from tests.helpers import running, wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator, Sequence
    from pathlib import Path

pytestmark = pytest.mark.timeout(120)

_BINDIR = binaries()


class _JitServer(LocalCluster):
    """One server that JIT-compiles every statement and counts what it compiled."""

    def __init__(self, bindir: Path) -> None:
        super().__init__(bindir, "pgqueue-jit-")
        self.server = LocalServer(self, "jit", free_port())

    @property
    def nodes(self) -> Sequence[LocalServer]:
        return [self.server]

    def create(self) -> None:
        self.server.init(
            {
                "shared_preload_libraries": "'pg_stat_statements'",
                "pg_stat_statements.track": "all",
                "jit": "on",
                "jit_above_cost": "0",
                "jit_inline_above_cost": "0",
                "jit_optimize_above_cost": "0",
            }
        )


@pytest.fixture(scope="module")
def server() -> Iterator[LocalServer]:
    if _BINDIR is None:
        pytest.skip("no initdb/pg_ctl found (set PG_BINDIR)")
    with servers(_JitServer(_BINDIR)) as made:
        yield made.server


@pytest.fixture
async def pool(server: LocalServer) -> AsyncIterator[asyncpg.Pool]:
    async with asyncpg.create_pool(server.dsn, min_size=1, max_size=4) as made:
        await made.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        if not await made.fetchval("SELECT pg_jit_available()"):
            pytest.skip("the server has no JIT (llvmjit) to avoid")
        await pgqueue.install(made)
        await made.execute("TRUNCATE pgqueue_jobs")
        await made.execute("SELECT pg_stat_statements_reset()")
        yield made


async def _finished(pool: asyncpg.Pool, count: int) -> None:
    await pool.execute(
        "INSERT INTO pgqueue_jobs (queue, job_type, payload, status, updated_at)"
        " SELECT 'default', 't', '{}', 'completed', now() - interval '1 day'"
        " FROM generate_series(1, $1)",
        count,
    )


async def _compiled(pool: asyncpg.Pool, fragment: str) -> tuple[int, int]:
    """(calls, JIT functions) of the statements whose text holds ``fragment``."""
    row = await pool.fetchrow(
        "SELECT coalesce(sum(calls), 0)::int8 AS calls,"
        " coalesce(sum(jit_functions), 0)::int8 AS jit"
        " FROM pg_stat_statements WHERE query LIKE '%' || $1 || '%'"
        " AND query NOT LIKE '%pg_stat_statements%'",
        fragment,
    )
    assert row is not None
    return row["calls"], row["jit"]


async def test_a_statement_is_compiled_here(pool: asyncpg.Pool) -> None:
    await pool.fetchval("SELECT count(*) FROM pgqueue_jobs WHERE attempts >= snoozes")
    assert (await _compiled(pool, "attempts >= snoozes"))[1] > 0


async def test_admin_prune_over_a_pool_compiles_nothing(pool: asyncpg.Pool) -> None:
    await _finished(pool, 250)
    removed = await pgqueue.Admin(pool).prune(60, batch_size=100)
    assert removed == 250
    calls, jit = await _compiled(pool, "DELETE FROM pgqueue_jobs")
    assert (calls, jit) == (3, 0)


async def test_admin_prune_in_the_callers_transaction_keeps_its_jit(
    pool: asyncpg.Pool,
) -> None:
    await _finished(pool, 150)
    async with pool.acquire() as conn:
        async with conn.transaction():
            await conn.execute("SET LOCAL jit = on")
            removed = await pgqueue.Admin(conn).prune(60, batch_size=100)
            assert await conn.fetchval("SHOW jit") == "on"
        assert removed == 150
        # Outside a transaction each batch is one of its own.
        await _finished(pool, 150)
        assert await pgqueue.Admin(conn).prune(60, batch_size=100) == 150
        assert await conn.fetchval("SHOW jit") == "on"
    calls, jit = await _compiled(pool, "DELETE FROM pgqueue_jobs")
    assert (calls, jit) == (4, 0)


async def test_the_workers_retention_sweep_compiles_nothing(pool: asyncpg.Pool) -> None:
    await _finished(pool, 200)
    worker = pgqueue.Worker(pool, retain=60, rescue_after=1)

    async def swept() -> bool:
        left: int = await pool.fetchval("SELECT count(*) FROM pgqueue_jobs")
        return left == 0

    async with running(worker):
        await wait_until(swept, within=30)
    calls, jit = await _compiled(pool, "DELETE FROM pgqueue_jobs")
    assert calls >= 1
    assert jit == 0
