"""pgqueue.sqlalchemy: the job rides the session's transaction, async (asyncpg) and sync (psycopg)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, cast

import anyio
import pytest
import sqlalchemy as sa
from psycopg.pq import TransactionStatus
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

import pgqueue
import pgqueue.sqlalchemy
from tests.helpers import queue_count, row, rows, running

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    import asyncpg
    import psycopg
    from sqlalchemy.ext.asyncio import AsyncEngine


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "sa_orders"

    id: Mapped[str] = mapped_column(primary_key=True)
    item: Mapped[str]


def url(dsn: str, driver: str) -> sa.URL:
    return sa.make_url(dsn).set(drivername=f"postgresql+{driver}")


@pytest.fixture
async def async_engine(dsn: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(url(dsn, "asyncpg"))
    async with engine.begin() as conn:
        await conn.run_sync(Base.metadata.create_all)
    yield engine
    await engine.dispose()


@pytest.fixture
def engine(dsn: str) -> Iterator[sa.Engine]:
    engine = sa.create_engine(url(dsn, "psycopg"))
    Base.metadata.create_all(engine)
    yield engine
    engine.dispose()


async def in_transaction(session: AsyncSession) -> bool:
    """Whether the session's asyncpg connection has begun (a statement ran)."""
    raw = await (await session.connection()).get_raw_connection()
    connection = cast("asyncpg.Connection", raw.driver_connection)
    return connection.is_in_transaction()


async def orders(pool: asyncpg.Pool, order_id: str) -> int:
    count: int = await pool.fetchval(
        "SELECT count(*) FROM sa_orders WHERE id = $1", order_id
    )
    return count


async def test_an_async_session_s_commit_writes_the_order_and_the_job_and_wakes_an_idle_worker(
    pool: asyncpg.Pool, async_engine: AsyncEngine, queue_name: str
) -> None:
    started = anyio.Event()
    # poll_interval=30: within the deadline only the NOTIFY runs the job.
    worker = pgqueue.Worker(pool, queue=queue_name, poll_interval=30)

    @worker.handler("ship")
    async def ship(_job: pgqueue.Job) -> None:
        started.set()

    order_id = uuid.uuid4().hex
    async with running(worker):
        async with async_sessionmaker(async_engine)() as session, session.begin():
            session.add(Order(id=order_id, item="teapot"))
            job_id = await pgqueue.sqlalchemy.enqueue(
                session, "ship", {"order": order_id}, queue=queue_name
            )
            assert await queue_count(pool, queue_name) == 0  # not committed yet
        with anyio.fail_after(5):
            await started.wait()
    assert await orders(pool, order_id) == 1
    assert (await row(pool, job_id))["payload"] == f'{{"order": "{order_id}"}}'


async def test_an_async_session_s_rollback_writes_neither(
    pool: asyncpg.Pool, async_engine: AsyncEngine, queue_name: str
) -> None:
    order_id = uuid.uuid4().hex
    async with AsyncSession(async_engine) as session:
        # No transaction yet: the enqueue begins one, as a query would.
        await pgqueue.sqlalchemy.enqueue_many(
            session, [("ship", {"order": order_id}), ("bill", {})], queue=queue_name
        )
        session.add(Order(id=order_id, item="teapot"))
        await session.flush()
        await session.rollback()
    assert await orders(pool, order_id) == 0
    assert await queue_count(pool, queue_name) == 0


async def test_an_async_connection_s_transaction_carries_the_job(
    pool: asyncpg.Pool, async_engine: AsyncEngine, queue_name: str
) -> None:
    async with async_engine.connect() as conn:
        first = await pgqueue.sqlalchemy.enqueue(conn, "t", queue=queue_name)
        await conn.rollback()
        second = await pgqueue.sqlalchemy.enqueue(
            conn, "t", {"n": 2}, queue=queue_name, priority=3, unique_key=queue_name
        )
        assert (
            await pgqueue.sqlalchemy.enqueue(
                conn, "t", queue=queue_name, unique_key=queue_name
            )
            == second
        )
        await conn.commit()
    assert [r["id"] for r in await rows(pool, queue_name)] == [second]
    assert first != second
    async with async_engine.connect() as conn:
        with pytest.raises(pgqueue.DuplicateJobError):
            await pgqueue.sqlalchemy.enqueue(
                conn, "t", queue=queue_name, unique_key=queue_name, on_conflict="raise"
            )


async def test_an_autocommit_async_connection_commits_each_enqueue(
    pool: asyncpg.Pool, async_engine: AsyncEngine, queue_name: str
) -> None:
    autocommit = async_engine.execution_options(isolation_level="AUTOCOMMIT")
    async with autocommit.connect() as conn:
        job_id = await pgqueue.sqlalchemy.enqueue(conn, "t", queue=queue_name)
        assert [r["id"] for r in await rows(pool, queue_name)] == [job_id]


async def test_a_sync_session_s_commit_writes_the_order_and_the_job_and_wakes_an_idle_worker(
    pool: asyncpg.Pool, engine: sa.Engine, queue_name: str
) -> None:
    started = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue_name, poll_interval=30)

    @worker.handler("ship")
    async def ship(_job: pgqueue.Job) -> None:
        started.set()

    order_id = uuid.uuid4().hex
    async with running(worker):
        with Session(engine) as session, session.begin():
            session.add(Order(id=order_id, item="teapot"))
            [job_id] = pgqueue.sqlalchemy.enqueue_many_sync(
                session, [("ship", {"order": order_id})], queue=queue_name
            )
        with anyio.fail_after(5):
            await started.wait()
    assert await orders(pool, order_id) == 1
    assert (await row(pool, job_id))["job_type"] == "ship"


async def test_a_sync_session_s_rollback_and_a_connection_s_commit(
    pool: asyncpg.Pool, engine: sa.Engine, queue_name: str
) -> None:
    order_id = uuid.uuid4().hex
    with Session(engine) as session:
        session.add(Order(id=order_id, item="teapot"))
        session.flush()
        pgqueue.sqlalchemy.enqueue_sync(session, "ship", queue=queue_name)
        session.rollback()
    assert await orders(pool, order_id) == 0
    assert await queue_count(pool, queue_name) == 0
    with engine.connect() as conn:
        job_id = pgqueue.sqlalchemy.enqueue_sync(
            conn, "ship", {"n": 1}, queue=queue_name, max_attempts=2
        )
        assert await queue_count(pool, queue_name) == 0
        conn.commit()
    assert (await row(pool, job_id))["max_attempts"] == 2


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"job_type": ""}, ValueError, "job type"),
        ({"payload": {"at": object()}}, TypeError, "at"),
        ({"priority": 7}, ValueError, "priority"),
        ({"queue": ""}, ValueError, "queue"),
    ],
)
async def test_bad_input_raises_before_any_statement_runs(
    pool: asyncpg.Pool,
    async_engine: AsyncEngine,
    engine: sa.Engine,
    queue_name: str,
    options: dict[str, Any],
    error: type[Exception],
    message: str,
) -> None:
    args: dict[str, Any] = {"job_type": "t", "queue": queue_name} | options
    async with AsyncSession(async_engine) as session:
        with pytest.raises(error, match=message):
            await pgqueue.sqlalchemy.enqueue(session, **args)
        assert not await in_transaction(session)
    with Session(engine) as sync_session:
        with pytest.raises(error, match=message):
            pgqueue.sqlalchemy.enqueue_sync(sync_session, **args)
        psycopg_conn = cast(
            "psycopg.Connection[Any]",
            sync_session.connection().connection.driver_connection,
        )
        assert psycopg_conn.info.transaction_status == TransactionStatus.IDLE
    assert await queue_count(pool, queue_name) == 0


async def test_a_bad_job_of_many_raises_before_any_statement_runs(
    pool: asyncpg.Pool, async_engine: AsyncEngine, engine: sa.Engine, queue_name: str
) -> None:
    jobs: list[Any] = [("t", {}), pgqueue.NewJob("t", {"at": {1}})]
    async with AsyncSession(async_engine) as session:
        with pytest.raises(TypeError, match=r"job 1: .*at"):
            await pgqueue.sqlalchemy.enqueue_many(session, jobs, queue=queue_name)
        assert not await in_transaction(session)
    with (
        Session(engine) as sync_session,
        pytest.raises(TypeError, match=r"job 1: .*at"),
    ):
        pgqueue.sqlalchemy.enqueue_many_sync(sync_session, jobs, queue=queue_name)
    assert await queue_count(pool, queue_name) == 0


async def test_other_dialects_and_session_kinds_are_refused_before_any_sql(
    dsn: str, async_engine: AsyncEngine, engine: sa.Engine
) -> None:
    sqlite = sa.create_engine("sqlite://")
    with (
        Session(sqlite) as session,
        pytest.raises(TypeError, match=r"postgresql\+psycopg .*not sqlite\+pysqlite"),
    ):
        pgqueue.sqlalchemy.enqueue_sync(session, "t")
    psycopg_async = create_async_engine(url(dsn, "psycopg"))
    async with AsyncSession(psycopg_async) as async_session:
        with pytest.raises(TypeError, match=r"postgresql\+asyncpg .*psycopg"):
            await pgqueue.sqlalchemy.enqueue(async_session, "t")
    await psycopg_async.dispose()
    with (
        Session(engine) as sync_session,
        pytest.raises(TypeError, match="enqueue_sync"),
    ):
        await pgqueue.sqlalchemy.enqueue(sync_session, "t")  # type: ignore[arg-type]
    async with AsyncSession(async_engine) as async_session:
        with pytest.raises(TypeError, match=r"enqueue\b"):
            pgqueue.sqlalchemy.enqueue_sync(async_session, "t")  # type: ignore[arg-type]
