"""An aiohttp service: an order and its job in one transaction, a worker, live events.

Run it::

    PGQUEUE_DSN=postgresql://postgres@127.0.0.1:5432/test python examples/aiohttp_app.py

    curl -N localhost:8080/events                   # every order event, as it happens
    curl -N 'localhost:8080/events?order_id=1'      # one order's events, until it ships
    curl -X POST localhost:8080/orders -H 'content-type: application/json' \\
         -d '{"id": 1, "item": "teapot"}'

The same service as ``fastapi_app.py``: ``POST /orders`` writes the order and
enqueues its ``ship_order`` job in one transaction (a duplicate order id
answers 409 and leaves no job behind); the worker and one `pgqueue.Subscriber`
run as tasks started and stopped by a ``cleanup_ctx``; the handler marks the
order shipped and publishes the event in one transaction; ``GET /events``
streams events to the client as Server-Sent Events.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio
import asyncpg
from aiohttp import web

import pgqueue

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


class Hub:
    """Fans the events this process receives out to its SSE clients."""

    def __init__(self) -> None:
        self._clients: set[MemoryObjectSendStream[str]] = set()

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
        """The Subscriber's callback: it must not block, so slow clients miss events."""
        for client in list(self._clients):
            with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError):
                client.send_nowait(payload)

    async def close(self, _app: web.Application | None = None) -> None:
        """End every open stream (on_shutdown: before aiohttp waits for handlers)."""
        for client in list(self._clients):
            client.close()


@dataclass
class Services:
    pool: asyncpg.Pool[asyncpg.Record]
    queue: pgqueue.Queue
    hub: Hub


DSN = web.AppKey("dsn", str)
HUB = web.AppKey("hub", Hub)
SERVICES = web.AppKey("services", Services)


def event(order_id: int, status: str) -> str:
    return json.dumps({"order_id": order_id, "status": status})


def sse(payload: str) -> bytes:
    return f"event: {json.loads(payload)['status']}\ndata: {payload}\n\n".encode()


async def ship_order(pool: asyncpg.Pool[asyncpg.Record], job: pgqueue.Job) -> None:
    order_id = job.payload["order_id"]
    await anyio.sleep(0.05)  # stands in for the carrier's API
    # Idempotent, as handlers must be; the event is sent when this commits.
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(
            "UPDATE orders SET status = 'shipped' WHERE id = $1", order_id
        )
        await pgqueue.publish(conn, CHANNEL, event(order_id, "shipped"))


async def pgqueue_ctx(app: web.Application) -> AsyncIterator[None]:
    """Open the pool, start the worker and the subscriber; at cleanup, stop them."""
    async with asyncpg.create_pool(app[DSN]) as pool:
        if await pool.fetchval("SELECT to_regclass('pgqueue_jobs')") is None:
            await pgqueue.install(pool)  # a real service does this in a migration
        await pool.execute(ORDERS_TABLE)
        services = app[SERVICES] = Services(
            pool, pgqueue.Queue(pool, name=QUEUE), app[HUB]
        )
        worker = pgqueue.Worker(pool, queue=QUEUE, concurrency=10)
        worker.register("ship_order", functools.partial(ship_order, pool))

        subscriber = pgqueue.Subscriber(pool)
        subscriber.handle(CHANNEL, services.hub.broadcast)
        # Startup and cleanup may run in different tasks, so no task group here.
        tasks = [
            asyncio.create_task(worker.run()),
            asyncio.create_task(subscriber.run()),
        ]
        try:
            async with asyncio.timeout(10):
                await subscriber.wait_listening()
            yield
        finally:
            try:
                # Jobs in flight get 10 s to finish; the others wait in the table.
                await worker.stop(timeout=10)
            finally:
                subscriber.stop()
                await asyncio.gather(*tasks)


async def place_order(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    try:
        body = await request.json()
        order_id, item = int(body["id"]), str(body["item"])
    except (ValueError, TypeError, KeyError):
        raise web.HTTPBadRequest(text='expected {"id": <int>, "item": <str>}') from None
    try:
        async with svc.pool.acquire() as conn, conn.transaction():
            # The job first, so the order can record it; if the order's insert
            # fails, the rollback takes the job (and the event) with it.
            job_id = await svc.queue.enqueue(
                "ship_order", {"order_id": order_id}, connection=conn
            )
            await conn.execute(
                "INSERT INTO orders (id, item, ship_job_id) VALUES ($1, $2, $3)",
                order_id,
                item,
                job_id,
            )
            await pgqueue.publish(conn, CHANNEL, event(order_id, "placed"))
    except asyncpg.UniqueViolationError:
        raise web.HTTPConflict(text=f"order {order_id} already exists") from None
    return web.json_response(
        {"order_id": order_id, "status": "placed", "job_id": job_id}, status=201
    )


async def events(request: web.Request) -> web.StreamResponse:
    svc = request.app[SERVICES]
    try:
        order_id = (
            int(request.query["order_id"]) if "order_id" in request.query else None
        )
    except ValueError:
        raise web.HTTPBadRequest(text="order_id must be an integer") from None
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    # Subscribe, then send the headers and read the current state: no event slips in
    # between, and a client that has the headers is subscribed.
    with svc.hub.connect() as received:
        await response.prepare(request)
        if order_id is not None:
            status = await svc.pool.fetchval(
                "SELECT status FROM orders WHERE id = $1", order_id
            )
            if status is not None:
                await response.write(sse(event(order_id, status)))
            if status == "shipped":
                return response
        async for payload in received:
            data = json.loads(payload)
            if order_id is None or data["order_id"] == order_id:
                await response.write(sse(payload))
                if order_id is not None and data["status"] == "shipped":
                    break
    return response


def create_app(dsn: str | None = None) -> web.Application:
    app = web.Application()
    app[DSN] = dsn or os.environ["PGQUEUE_DSN"]
    app[HUB] = Hub()
    app.on_shutdown.append(app[HUB].close)
    app.cleanup_ctx.append(pgqueue_ctx)
    app.add_routes([web.post("/orders", place_order), web.get("/events", events)])
    return app


if __name__ == "__main__":
    web.run_app(create_app())
