"""A FastAPI service: an order and its job in one transaction, a worker, live events.

Run it from the repository root (any ASGI server will do)::

    PGQUEUE_DSN=postgresql://postgres@127.0.0.1:5432/test \\
        uvicorn examples.fastapi_app:app --timeout-graceful-shutdown 5

    open http://localhost:8000/pgqueue/            # the queues' dashboard
    curl -N localhost:8000/events                  # every order event, live
    curl -N 'localhost:8000/events?order_id=1'     # one order's, until it ships
    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"id": 1, "item": "teapot"}'
    curl -X POST localhost:8000/reports -H 'content-type: application/json' \\
         -d '{"item": "teapot"}'

``POST /orders`` writes the order and enqueues its ``ship_order`` job in one
transaction: both commit, or neither does (a duplicate order id answers 409 and
leaves no job behind). The worker runs in the app's lifespan; its handler marks
the order shipped and publishes an event in one transaction, so the event goes
out only if the update commits. One `pgqueue.Subscriber` per process feeds the
events to every ``GET /events`` client as Server-Sent Events.

``/pgqueue/`` is the dashboard of the queues (`pgqueue.web`, the ``web``
extra), mounted once the pool is open: read-only, and with no authentication
of its own, so a real service mounts it behind its own (a dependency or a
middleware that checks the user).

``POST /reports`` enqueues a tracked ``build_report`` job and awaits its
outcome through the process's one `pgqueue.Tracker`: 200 with the report the
handler returned, or 202 with the job id when it takes longer than ``wait``
seconds (5 by default; the job goes on, and its row keeps the report).

uvicorn waits for open connections to close before it runs the lifespan's
shutdown: ``--timeout-graceful-shutdown`` keeps an open event stream from
holding up the worker's graceful stop.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import asyncpg
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

import pgqueue
import pgqueue.web

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

QUEUE = "orders"
CHANNEL = "order_events"
ORDERS_TABLE = """
CREATE TABLE IF NOT EXISTS orders (
    id          bigint PRIMARY KEY,
    item        text NOT NULL,
    status      text NOT NULL DEFAULT 'placed',
    ship_job_id bigint NOT NULL
)
"""


class Order(BaseModel):
    id: int
    item: str


class ReportRequest(BaseModel):
    item: str


class Hub:
    """Fans the events this process receives out to its SSE clients."""

    def __init__(self) -> None:
        self._clients: set[MemoryObjectSendStream[str]] = set()

    @property
    def clients(self) -> int:
        return len(self._clients)

    @contextlib.contextmanager
    def connect(self) -> Iterator[MemoryObjectReceiveStream[str]]:
        send, receive = anyio.create_memory_object_stream[str](100)
        self._clients.add(send)
        try:
            with send, receive:
                yield receive
        finally:
            self._clients.discard(send)

    async def broadcast(self, payload: str) -> None:
        """The Subscriber's callback. It must not block: a slow client misses events."""
        for client in list(self._clients):
            with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError):
                client.send_nowait(payload)

    def close(self) -> None:
        """End every open stream (at shutdown)."""
        for client in list(self._clients):
            client.close()


@dataclass
class Services:
    pool: asyncpg.Pool[asyncpg.Record]
    queue: pgqueue.Queue
    tracker: pgqueue.Tracker
    hub: Hub = field(default_factory=Hub)


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def event(order_id: int, status: str) -> str:
    return json.dumps({"order_id": order_id, "status": status})


def sse(payload: str) -> str:
    return f"event: {json.loads(payload)['status']}\ndata: {payload}\n\n"


async def ship_order(pool: asyncpg.Pool[asyncpg.Record], job: pgqueue.Job) -> None:
    order_id = job.payload["order_id"]
    await anyio.sleep(0.05)  # stands in for the carrier's API
    # Idempotent, as handlers must be; the event is sent when this commits.
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "UPDATE orders SET status = 'shipped' WHERE id = $1", order_id
        )
        await pgqueue.publish(conn, CHANNEL, event(order_id, "shipped"))


async def build_report(
    pool: asyncpg.Pool[asyncpg.Record], job: pgqueue.Job
) -> dict[str, Any]:
    """What it returns is stored as the job's result, for the tracker's waits."""
    item = job.payload["item"]
    [counts] = await pool.fetch(
        "SELECT count(*) AS orders, count(*) FILTER (WHERE status = 'shipped') AS shipped"
        " FROM orders WHERE item = $1",
        item,
    )
    return {"item": item, "orders": counts["orders"], "shipped": counts["shipped"]}


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    async with asyncpg.create_pool(app.state.dsn or os.environ["PGQUEUE_DSN"]) as pool:
        if await pool.fetchval("SELECT to_regclass('pgqueue_jobs')") is None:
            await pgqueue.install(pool)  # a real service does this in a migration
        await pool.execute(ORDERS_TABLE)
        queue = pgqueue.Queue(pool, name=QUEUE)
        tracker = pgqueue.Tracker(pool)
        services = app.state.services = Services(pool, queue, tracker)
        # The dashboard borrows the pool; read-only, it shows and changes nothing
        # more than pgqueue.Admin's reads. Put your authentication in front of it.
        app.mount("/pgqueue", pgqueue.web.create_app(pool, read_only=True))
        worker = pgqueue.Worker(pool, queue=QUEUE, concurrency=10)
        worker.register("ship_order", functools.partial(ship_order, pool))
        worker.register("build_report", functools.partial(build_report, pool))
        subscriber = pgqueue.Subscriber(pool)
        subscriber.handle(CHANNEL, services.hub.broadcast)
        # The tracker's one LISTEN connection serves every request's wait.
        async with tracker, anyio.create_task_group() as tg:
            tg.start_soon(worker.run)
            tg.start_soon(subscriber.run)
            with anyio.fail_after(10):
                await subscriber.wait_listening()
            yield
            services.hub.close()
            # Jobs in flight get 10 s to finish; the others wait in the table.
            await worker.stop(timeout=10)
            subscriber.stop()


def create_app(dsn: str | None = None) -> FastAPI:
    """Make the app; ``dsn`` defaults to ``$PGQUEUE_DSN``, read at startup."""
    app = FastAPI(title="pgqueue orders", lifespan=lifespan)
    app.state.dsn = dsn

    @app.post("/orders", status_code=201)
    async def place_order(order: Order, svc: ServicesDep) -> dict[str, Any]:
        try:
            async with svc.pool.acquire() as conn, conn.transaction():
                # The job first, so that the order can record its id. If the
                # insert fails, the rollback takes the job and the event along.
                job_id = await svc.queue.enqueue(
                    "ship_order", {"order_id": order.id}, connection=conn
                )
                await conn.execute(
                    "INSERT INTO orders (id, item, ship_job_id) VALUES ($1, $2, $3)",
                    order.id,
                    order.item,
                    job_id,
                )
                await pgqueue.publish(conn, CHANNEL, event(order.id, "placed"))
        except asyncpg.UniqueViolationError:
            raise HTTPException(409, f"order {order.id} already exists") from None
        return {"order_id": order.id, "status": "placed", "job_id": job_id}

    @app.post("/reports", response_model=None)
    async def report(
        body: ReportRequest,
        svc: ServicesDep,
        wait: Annotated[float, Query(ge=0, le=30)] = 5.0,
    ) -> Any:
        # track=True: the worker announces the job's end to the tracker.
        job_id = await svc.queue.enqueue(
            "build_report", {"item": body.item}, track=True
        )
        try:
            outcome = await svc.tracker.wait(job_id, timeout=wait)
        except TimeoutError:
            # Not done yet: the job goes on, and its row keeps the report.
            return JSONResponse(
                {"job_id": job_id, "status": "pending"}, status_code=202
            )
        if outcome.status != "completed":
            raise HTTPException(500, f"report job {job_id} is {outcome.status}")
        return outcome.result  # what build_report returned

    @app.get("/events")
    async def events(
        svc: ServicesDep, order_id: int | None = None
    ) -> StreamingResponse:
        async def stream() -> AsyncIterator[str]:
            # Subscribe, then read the current state: no event slips in between.
            with svc.hub.connect() as received:
                if order_id is not None:
                    status = await svc.pool.fetchval(
                        "SELECT status FROM orders WHERE id = $1", order_id
                    )
                    if status is not None:
                        yield sse(event(order_id, status))
                    if status == "shipped":
                        return
                async for payload in received:
                    data = json.loads(payload)
                    if order_id is None or data["order_id"] == order_id:
                        yield sse(payload)
                        if order_id is not None and data["status"] == "shipped":
                            return

        headers = {"Cache-Control": "no-cache"}
        return StreamingResponse(
            stream(), media_type="text/event-stream", headers=headers
        )

    return app


app = create_app()
