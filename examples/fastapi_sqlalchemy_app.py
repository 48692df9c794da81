"""A FastAPI service on SQLAlchemy: an order row and its job in one session's transaction.

Run it from the repository root (any ASGI server will do)::

    PGQUEUE_DSN=postgresql://postgres@127.0.0.1:5432/test \\
        uvicorn examples.fastapi_sqlalchemy_app:app

    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"id": 1, "item": "teapot"}'
    curl localhost:8000/orders/1

``POST /orders`` adds an ``Order`` through an ``AsyncSession`` and enqueues
its ``ship_order`` job with `pgqueue.sqlalchemy.enqueue` in the same
transaction: the commit writes both and wakes the worker; a failure (a
duplicate order id answers 409) rolls both back. The worker runs in the app's
lifespan on an asyncpg pool of its own; its handler marks the order shipped
through a session too. Needs the ``sqlalchemy`` and ``examples`` extras.
"""

from __future__ import annotations

import contextlib
import os
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import asyncpg
import sqlalchemy as sa
from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import pgqueue
import pgqueue.sqlalchemy

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

QUEUE = "shop"


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "shop_orders"

    id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
    item: Mapped[str]
    status: Mapped[str] = mapped_column(default="placed")
    ship_job_id: Mapped[int] = mapped_column(sa.BigInteger)


class NewOrder(BaseModel):
    id: int
    item: str


async def session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessions() as db:
        yield db


SessionDep = Annotated[AsyncSession, Depends(session)]


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    dsn = app.state.dsn or os.environ["PGQUEUE_DSN"]
    engine = create_async_engine(sa.make_url(dsn).set(drivername="postgresql+asyncpg"))
    sessions = app.state.sessions = async_sessionmaker(engine, expire_on_commit=False)
    async with engine.begin() as conn:  # a real service does this in a migration
        await conn.run_sync(Base.metadata.create_all)
    async with asyncpg.create_pool(dsn) as pool:
        if await pool.fetchval("SELECT to_regclass('pgqueue_jobs')") is None:
            await pgqueue.install(pool)  # and this too
        worker = pgqueue.Worker(pool, queue=QUEUE, poll_interval=app.state.poll)

        @worker.handler("ship_order")
        async def ship_order(job: pgqueue.Job) -> None:
            # Idempotent, as handlers must be.
            async with sessions.begin() as db:
                order = await db.get(Order, job.payload["order_id"])
                if order is not None:
                    order.status = "shipped"

        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)  # ready: listening for wakeups
            yield
            await worker.stop(timeout=10)
    await engine.dispose()


def create_app(dsn: str | None = None, *, poll_interval: float = 5.0) -> FastAPI:
    """Make the app; ``dsn`` defaults to ``$PGQUEUE_DSN``, read at startup.

    The worker wakes at each job's commit; ``poll_interval`` only bounds how
    long it takes to notice a job whose wakeup it missed.
    """
    app = FastAPI(title="pgqueue shop (SQLAlchemy)", lifespan=lifespan)
    app.state.dsn = dsn
    app.state.poll = poll_interval

    @app.post("/orders", status_code=201)
    async def place_order(new: NewOrder, db: SessionDep) -> dict[str, Any]:
        try:
            async with db.begin():
                # The job first, so that the order can record its id.
                job_id = await pgqueue.sqlalchemy.enqueue(
                    db, "ship_order", {"order_id": new.id}, queue=QUEUE
                )
                db.add(Order(id=new.id, item=new.item, ship_job_id=job_id))
        except sa.exc.IntegrityError:
            raise HTTPException(409, f"order {new.id} already exists") from None
        return {"order_id": new.id, "status": "placed", "job_id": job_id}

    @app.get("/orders/{order_id}")
    async def get_order(order_id: int, db: SessionDep) -> dict[str, Any]:
        order = await db.get(Order, order_id)
        if order is None:
            raise HTTPException(404, f"no order {order_id}")
        return {"order_id": order.id, "item": order.item, "status": order.status}

    return app


app = create_app()
