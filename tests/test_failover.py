"""The failover tier: a primary and a synchronous standby of the machine's PostgreSQL.

Every test makes its own pair (`tests.replicated`), reaches it through a
multi-host DSN with ``target_session_attrs=read-write``, causes the fault
for real (an immediate stop and a promotion, a primary turned read-only)
and removes both servers afterwards. Marked ``failover``; skipped, saying
why, where the PostgreSQL binaries are missing.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgqueue
from tests.helpers import RecordingLogger
from tests.replicated import binaries, replicated_cluster

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from tests.replicated import ReplicatedCluster

pytestmark = [pytest.mark.failover, pytest.mark.timeout(90)]

BINDIR = binaries()


@pytest.fixture
def cluster() -> Iterator[ReplicatedCluster]:
    """A primary and a synchronous standby, removed afterwards even on failure."""
    if BINDIR is None:
        pytest.skip(
            "failover tier skipped: initdb, pg_ctl and pg_basebackup not found "
            "(install PostgreSQL's server binaries or set PG_BINDIR)"
        )
    with replicated_cluster(BINDIR) as made:
        yield made


@pytest.fixture
async def pool(cluster: ReplicatedCluster) -> AsyncIterator[asyncpg.Pool]:
    """A pool on the multi-host DSN, with the schema installed on the primary."""
    async with asyncpg.create_pool(cluster.multi_dsn, min_size=1, max_size=8) as made:
        await pgqueue.install(made)
        yield made


async def set_read_only(cluster: ReplicatedCluster, *, on: bool) -> None:
    """Turn the primary read-only (as a demoted primary or a cloud failover does), or back."""
    connection = await asyncpg.connect(cluster.primary.dsn)
    try:
        await connection.execute("SET default_transaction_read_only = off")
        if on:
            await connection.execute(
                "ALTER SYSTEM SET default_transaction_read_only = on"
            )
        else:
            await connection.execute("ALTER SYSTEM RESET default_transaction_read_only")
        await connection.execute("SELECT pg_reload_conf()")
    finally:
        await connection.close()


async def job_rows(dsn: str, queue: str) -> list[dict[str, Any]]:
    connection = await asyncpg.connect(dsn)
    try:
        records = await connection.fetch(
            "SELECT id, status, attempts, last_error FROM pgqueue_jobs"
            " WHERE queue = $1 ORDER BY id",
            queue,
        )
    finally:
        await connection.close()
    return [dict(r) for r in records]


async def test_a_read_only_primary_mid_drain_uses_no_attempt(
    cluster: ReplicatedCluster, pool: asyncpg.Pool
) -> None:
    """25006 on the worker's writes is an outage: held outcomes are written once it ends."""
    total = 1000
    queue = pgqueue.Queue(pool, name="ro")
    await queue.enqueue_many([("t", {"n": n}) for n in range(total)])
    logger = RecordingLogger()
    worker = pgqueue.Worker(pool, queue="ro", concurrency=20, logger=logger)
    runs: Counter[int] = Counter()
    started_enough = anyio.Event()

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        runs[job.id] += 1
        if len(runs) >= 200:
            started_enough.set()
        await anyio.sleep(0.002)

    async def turn_read_only_for_a_while() -> None:
        await started_enough.wait()
        await set_read_only(cluster, on=True)
        # Held until the writer has met the read-only server and kept its outcomes.
        await logger.wait_until_logged(
            lambda _level, msg, extra: (
                "writing job outcomes failed" in msg
                and "ReadOnlySQLTransaction" in str(extra.get("error"))
            ),
            within=20,
        )
        await set_read_only(cluster, on=False)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(turn_read_only_for_a_while)
            await worker.run(until_empty=True)

    rows = await job_rows(cluster.primary.dsn, "ro")
    assert len(rows) == total
    assert Counter(r["status"] for r in rows) == {"completed": total}
    assert {r["attempts"] for r in rows} == {1}
    assert set(runs.values()) == {1}
    assert len(runs) == total
    messages = " ".join(logger.messages())
    assert "placeholder" not in messages
    assert "refused" not in messages
    assert "stale run" not in messages
