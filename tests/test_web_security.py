"""The dashboard under attack, against a real ``pgqueue web`` process over HTTP.

What a hostile page in the operator's browser could try: an action by any
method but a POST with its token (``HEAD`` from a no-cors ``fetch``), DNS
rebinding (a foreign ``Host``), a token of another action or an old one, an
``Origin`` of another scheme; for the bulk actions, the edit form and a
job's Send signal form too, and a bulk token posted with another filter,
count, ids or queue. And what
every response carries: the security headers, on errors and 500s too, and no
internal host names on the 503 page.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from html import unescape
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

import anyio
import asyncpg
import httpx
import pytest

import pgqueue
from pgqueue.web import create_app
from pgqueue.web._guard import ActionTokens
from tests.helpers import row, rows
from tests.tcp_proxy import tcp_proxy, via

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Mapping
    from pathlib import Path

METHODS = ("GET", "HEAD", "POST", "OPTIONS", "PUT", "DELETE", "PATCH", "TRACE", "FOO")
"""Every method a page (or curl) could send to an action's URL."""

SECRET = "a-shared-secret-of-the-test-32by"

HEADERS = {
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}


@dataclass
class Served:
    """A running ``pgqueue web``: where it listens, what it printed and logged."""

    port: int
    line: str
    errors: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def origin(self) -> dict[str, str]:
        """The headers a browser sends with a form of this dashboard's own page."""
        return {"origin": self.url, "sec-fetch-site": "same-origin"}

    def log(self) -> str:
        return self.errors.read_text()


@contextlib.asynccontextmanager
async def serving(
    dsn: str,
    tmp_path: Path,
    *options: str,
    env: Mapping[str, str] | None = None,
    program: tuple[str, ...] = ("-m", "pgqueue"),
) -> AsyncIterator[Served]:
    """``pgqueue web`` on a free port, its stderr kept in a file."""
    errors = tmp_path / f"stderr-{time.monotonic_ns()}.txt"
    command = [sys.executable, *program, "web", "--dsn", dsn, "--port", "0", *options]
    with errors.open("wb") as sink:
        process = await anyio.open_process(
            command,
            stdout=subprocess.PIPE,
            stderr=sink,
            env={**os.environ, **(env or {})},
        )
    try:
        assert process.stdout is not None
        with anyio.fail_after(20):
            line = b""
            while not line.endswith(b"\n"):
                chunk = await process.stdout.receive(1)
                line += chunk
        found = re.search(r"http://\S+:(\d+)/", line.decode())
        assert found, (line, errors.read_text())
        yield Served(port=int(found[1]), line=line.decode(), errors=errors)
    finally:
        process.send_signal(signal.SIGINT)
        with anyio.fail_after(10):
            await process.wait()


def token_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, "no token on the page"
    return found[1]


def form(**fields: str) -> dict[str, Any]:
    """A request's body as a browser posts a form."""
    return {
        "content": urlencode(fields),
        "headers": {"content-type": "application/x-www-form-urlencoded"},
    }


async def seed(pool: asyncpg.Pool, queue_name: str) -> tuple[int, int, list[int]]:
    """A dead job (to retry), a pending one (to cancel), two dead of queue ``-all``."""
    [dead] = await pgqueue.Queue(pool, name=f"{queue_name}-r").enqueue_many([("t", {})])
    pending = await pgqueue.Queue(pool, name=f"{queue_name}-c").enqueue("t", {})
    every = await pgqueue.Queue(pool, name=f"{queue_name}-all").enqueue_many(
        [("t", {})] * 2
    )
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'dead', attempts = 1, max_attempts = 1"
        " WHERE id = ANY($1::bigint[])",
        [dead, *every],
    )
    return dead, pending, every


async def snapshot(pool: asyncpg.Pool, queue_name: str) -> list[dict[str, Any]]:
    return [
        *await rows(pool, f"{queue_name}-r"),
        *await rows(pool, f"{queue_name}-c"),
        *await rows(pool, f"{queue_name}-all"),
    ]


def assert_guarded(answer: httpx.Response) -> None:
    """``answer`` carries every security header."""
    for name, value in HEADERS.items():
        assert answer.headers.get(name) == value, (answer.status_code, name)
    policy = answer.headers.get("content-security-policy", "")
    assert "default-src 'none'" in policy, answer.status_code
    assert "frame-ancestors 'none'" in policy, answer.status_code


# --- methods ---------------------------------------------------------------------------


async def test_only_a_post_with_its_token_acts_whatever_else_is_sent(
    dsn: str, pool: asyncpg.Pool, queue_name: str, tmp_path: Path
) -> None:
    dead, pending, _ = await seed(pool, queue_name)
    before = await snapshot(pool, queue_name)
    actions: list[tuple[str, dict[str, str]]] = [
        (f"/jobs/{dead}/retry", {}),
        (f"/jobs/{pending}/cancel", {}),
        ("/retry-all", {"queue": f"{queue_name}-all"}),
    ]
    async with (
        serving(dsn, tmp_path, "--allow-actions") as web,
        httpx.AsyncClient(base_url=web.url) as c,
    ):
        tokens = {}
        for path, fields in actions:
            confirm = await c.get(path, params=fields)
            assert confirm.status_code == 200, path
            tokens[path] = token_of(confirm.text)
        for path, fields in actions:
            for method in METHODS:
                # Even the right token, from the page, with a browser's headers.
                body = form(csrf=tokens[path], **fields)
                body["headers"].update(web.origin)
                if method == "POST":
                    body["headers"]["origin"] = "https://evil.example"
                answer = await c.request(method, path, params=fields, **body)
                if method in ("GET", "HEAD"):
                    assert answer.status_code == 200, (method, path)  # it asks
                elif method == "POST":
                    assert answer.status_code == 403, (method, path)
                else:
                    assert answer.status_code == 405, (method, path)
                    allowed = {m.strip() for m in answer.headers["allow"].split(",")}
                    assert allowed == {"GET", "HEAD", "POST"}
                assert_guarded(answer)
                assert await snapshot(pool, queue_name) == before, (method, path)
        # A POST with the token from this page acts: the checks above could see it.
        for path, fields in actions:
            done = await c.post(path, **_with(form(csrf=tokens[path], **fields), web))
            assert done.status_code == 303, path
    assert (await row(pool, dead))["status"] == "pending"
    assert (await row(pool, pending))["status"] == "cancelled"
    assert {r["status"] for r in await rows(pool, f"{queue_name}-all")} == {"pending"}


def _with(body: dict[str, Any], web: Served) -> dict[str, Any]:
    body["headers"].update(web.origin)
    return body


# --- hosts -----------------------------------------------------------------------------


async def test_a_foreign_host_is_refused_before_routing(
    dsn: str, pool: asyncpg.Pool, queue_name: str, tmp_path: Path
) -> None:
    _, pending, _ = await seed(pool, queue_name)
    path = f"/jobs/{pending}/cancel"
    async with (
        serving(dsn, tmp_path, "--allow-actions") as web,
        httpx.AsyncClient(base_url=web.url) as c,
    ):
        port = web.port
        other = port + 1 if port < 65535 else port - 1
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"):
            assert (await c.get("/", headers={"host": host})).status_code == 200, host
        assert (
            await c.get("/", headers={"host": f"LocalHost:{port}"})
        ).status_code == 200
        token = token_of((await c.get(path)).text)
        for host in (
            "attacker.example",
            f"attacker.example:{port}",
            f"localhost.attacker.example:{port}",
            f"127.0.0.1.nip.io:{port}",
            f"127.0.0.1:{other}",
            "127.0.0.1",
            f"[::2]:{port}",
            f"127.0.0.1:{port}@attacker.example",
        ):
            for method, target in (
                ("GET", "/"),
                ("GET", "/nowhere"),
                ("GET", "/static/pgqueue.css"),
                ("POST", path),
            ):
                body = _with(form(csrf=token), web)
                body["headers"]["host"] = host
                answer = await c.request(method, target, **body)
                assert answer.status_code == 400, (host, target)
                assert "host" in answer.text.lower()
                assert host not in answer.text  # never echoed back
                assert_guarded(answer)
        # HTTP/1.0 without a Host header at all.
        stream = await anyio.connect_tcp("127.0.0.1", port)
        async with stream:
            await stream.send(b"GET / HTTP/1.0\r\n\r\n")
            answer_bytes = b""
            with anyio.fail_after(10):
                with contextlib.suppress(anyio.EndOfStream):
                    while True:
                        answer_bytes += await stream.receive()
        assert answer_bytes.startswith(b"HTTP/1.1 400"), answer_bytes[:80]
    assert (await row(pool, pending))["status"] == "pending"


async def test_with_host_only_that_host_and_the_allowed_ones_are_served(
    dsn: str, tmp_path: Path
) -> None:
    options = ("--host", "0.0.0.0", "--allowed-host", "ops.example.com")
    async with (
        serving(dsn, tmp_path, *options) as web,
        httpx.AsyncClient(base_url=web.url) as c,
    ):
        port = web.port
        for host in ("ops.example.com", f"ops.example.com:{port}", f"0.0.0.0:{port}"):
            assert (await c.get("/", headers={"host": host})).status_code == 200, host
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "evil.example"):
            assert (await c.get("/", headers={"host": host})).status_code == 400, host
    async with serving(dsn, tmp_path, "--host", "0.0.0.0") as web:
        assert "--allowed-host" in web.log()  # says how clients' names get in
    async with (
        serving(dsn, tmp_path, "--allowed-host", "*") as web,
        httpx.AsyncClient(base_url=web.url) as c,
    ):
        assert (
            await c.get("/", headers={"host": "anything.example"})
        ).status_code == 200
        assert "DNS rebinding" in web.log()


def test_pgqueue_web_refuses_a_bad_allowed_host_or_secret() -> None:
    for bad in ("http://ops.example.com", "ops.example.com/x", "::1", "a b", "h:0"):
        answer = subprocess.run(
            [sys.executable, "-m", "pgqueue", "web", "--allowed-host", bad],
            capture_output=True,
            text=True,
            check=False,
        )
        assert answer.returncode == 2, bad
        assert "is not a host" in answer.stderr, bad
    short = subprocess.run(
        [sys.executable, "-m", "pgqueue", "web"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PGQUEUE_WEB_SECRET": "too-short"},
    )
    assert short.returncode == 2
    assert "PGQUEUE_WEB_SECRET" in short.stderr
    assert "16 bytes" in short.stderr
    assert "too-short" not in short.stderr


def test_create_app_checks_its_secret_and_hosts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nowhere = "postgresql://nowhere.invalid/db"
    for short in ("x" * 15, b"x" * 15, b"", ""):
        with pytest.raises(ValueError, match="16 bytes"):
            create_app(nowhere, secret=short)
    with pytest.raises(TypeError, match="secret"):
        create_app(nowhere, secret=42)  # type: ignore[arg-type]
    create_app(nowhere, secret="x" * 16)
    for bad in ("", "https://a.example", "a.example/", "[::1", "::1", "a:99999", "*.x"):
        with pytest.raises(ValueError, match="allowed_hosts"):
            create_app(nowhere, allowed_hosts=[bad])
    with pytest.raises(TypeError, match="allowed_hosts"):
        create_app(nowhere, allowed_hosts="localhost")
    with caplog.at_level(logging.WARNING, logger="pgqueue.web"):
        create_app(nowhere, allowed_hosts=["localhost"])
        assert not caplog.records
        create_app(nowhere, allowed_hosts=["*"])
    [warning] = caplog.records
    assert "DNS rebinding" in warning.getMessage()


# --- tokens and origins ----------------------------------------------------------------


async def test_a_token_is_bound_to_its_action_and_lives_an_hour(
    dsn: str, pool: asyncpg.Pool, queue_name: str, tmp_path: Path
) -> None:
    dead, pending, every = await seed(pool, queue_name)
    other_dead = every[0]
    before = await snapshot(pool, queue_name)
    retry = f"/jobs/{dead}/retry"
    env = {"PGQUEUE_WEB_SECRET": SECRET}
    async with (
        serving(dsn, tmp_path, "--allow-actions", env=env) as web,
        httpx.AsyncClient(base_url=web.url) as c,
    ):
        token = token_of((await c.get(retry)).text)
        everything = {"queue": f"{queue_name}-all"}
        all_token = token_of((await c.get("/retry-all", params=everything)).text)
        tokens = ActionTokens(SECRET)
        now = time.time()
        refused = [
            (f"/jobs/{other_dead}/retry", {"csrf": token}),  # another job
            (f"/jobs/{dead}/cancel", {"csrf": token}),  # another action
            ("/retry-all", {"csrf": token}),
            ("/retry-all", {"csrf": all_token}),  # its queue dropped: every queue
            ("/retry-all", {"csrf": all_token, "queue": f"{queue_name}-r"}),
            ("/retry-all", {"csrf": all_token, **everything, "type": "t"}),
            (retry, {"csrf": tokens.issue(retry, now=now - 3601)}),  # expired
            (retry, {"csrf": tokens.issue(retry, now=now + 600)}),  # not yet issued
            (retry, {"csrf": ActionTokens("another-secret-16b").issue(retry)}),
            (retry, {"csrf": token[:-1] + ("0" if token[-1] != "0" else "1")}),
            (retry, {"csrf": token[16:]}),
            (retry, {"csrf": "f" * 16 + token[16:]}),  # a later issue time
        ]
        for path, fields in refused:
            answer = await c.post(path, **_with(form(**fields), web))
            assert answer.status_code == 403, (path, fields)
            assert await snapshot(pool, queue_name) == before, (path, fields)
        # An hour less a minute is still fine, and so is another process's
        # token, with the same secret: the forged ones above were well made.
        old = tokens.issue(retry, now=now - 3540)
        done = await c.post(retry, **_with(form(csrf=old), web))
        assert done.status_code == 303
        cancel = f"/jobs/{pending}/cancel"
        done = await c.post(cancel, **_with(form(csrf=tokens.issue(cancel)), web))
        assert done.status_code == 303
    assert (await row(pool, dead))["status"] == "pending"
    assert (await row(pool, pending))["status"] == "cancelled"


async def test_the_origin_must_match_scheme_host_and_port(
    dsn: str, pool: asyncpg.Pool, queue_name: str, tmp_path: Path
) -> None:
    dead, _, _ = await seed(pool, queue_name)
    path = f"/jobs/{dead}/retry"
    async with (
        serving(dsn, tmp_path, "--allow-actions") as web,
        httpx.AsyncClient(base_url=web.url) as c,
    ):
        token = token_of((await c.get(path)).text)
        host = urlsplit(web.url).netloc
        for origin in (
            f"https://{host}",
            f"http://127.0.0.1:{web.port + 1}",
            f"http://localhost:{web.port}",
            "null",
        ):
            body = _with(form(csrf=token), web)
            body["headers"]["origin"] = origin
            answer = await c.post(path, **body)
            assert answer.status_code == 403, origin
        assert (await row(pool, dead))["status"] == "dead"
        body = _with(form(csrf=token), web)
        assert (await c.post(path, **body)).status_code == 303
    assert (await row(pool, dead))["status"] == "pending"


# --- what every response carries -------------------------------------------------------

FAULTY = """
import sys

import pgqueue._admin
from pgqueue.cli import main


async def broken(self):
    raise RuntimeError("a bug of the dashboard at db.internal.example")


pgqueue._admin.Admin.schedules = broken
sys.exit(main(sys.argv[1:]))
"""
"""``pgqueue web`` with a bug: the periodic page raises what no handler expects."""


async def test_every_response_carries_the_security_headers(
    dsn: str, pool: asyncpg.Pool, queue_name: str, tmp_path: Path
) -> None:
    dead, _, _ = await seed(pool, queue_name)
    async with (
        serving(dsn, tmp_path, "--allow-actions", program=("-c", FAULTY)) as web,
        httpx.AsyncClient(base_url=web.url) as c,
    ):
        expected = {
            "/": 200,
            f"/jobs/{dead}": 200,
            f"/jobs/{dead}/retry": 200,
            "/static/pgqueue.js": 200,
            "/api/frame": 200,
            "/nowhere": 404,
            "/jobs/abc": 404,
            "/jobs?status=bogus": 400,
            f"/jobs?where=queue={queue_name}-r": 200,
            "/jobs?where=nokey": 400,
            f"/bulk/retry?id={dead}": 200,
            f"/bulk/retry?all=1&where=queue={queue_name}-r": 200,
            "/bulk/nope?id=1": 404,
            f"/jobs/{dead}/edit": 200,
            f"/jobs/{dead}/signal": 200,
            "/api/count": 200,
        }
        for path, status in expected.items():
            answer = await c.get(path)
            assert answer.status_code == status, path
            assert_guarded(answer)
        for method, path, status in (
            ("PUT", "/retry-all", 405),
            ("PATCH", f"/jobs/{dead}/edit", 405),
            ("PUT", f"/jobs/{dead}/signal", 405),
            ("POST", f"/jobs/{dead}/signal", 403),
            ("POST", "/bulk/delete", 403),
            ("DELETE", "/", 405),
            ("POST", f"/jobs/{dead}/retry", 403),
        ):
            answer = await c.request(method, path)
            assert answer.status_code == status, (method, path)
            assert_guarded(answer)
        # uvicorn closes the connection after a 500: the client must not reuse it.
        crash = await c.get("/periodic", headers={"connection": "close"})
        assert crash.status_code == 500
        assert_guarded(crash)
        assert "db.internal.example" not in crash.text
    async with (
        serving(dsn, tmp_path) as web,
        httpx.AsyncClient(base_url=web.url) as c,
    ):
        for path in (f"/jobs/{dead}/retry", f"/jobs/{dead}/signal"):
            refused = await c.get(path)
            assert refused.status_code == 403, path  # read-only
            assert_guarded(refused)


FRAMED = ("/", "/fragments/queues")
"""Pages of the queues' frame, which open pages share for a second."""


async def test_the_503_page_names_no_internal_host(
    fresh_dsn: str, tmp_path: Path
) -> None:
    database = urlsplit(fresh_dsn).path.lstrip("/")
    async with tcp_proxy("127.0.0.1", urlsplit(fresh_dsn).port or 5432) as proxy:
        through = via(fresh_dsn, proxy.port)
        async with (
            serving(through, tmp_path) as web,
            httpx.AsyncClient(base_url=web.url) as c,
        ):
            assert (await c.get("/")).status_code == 200
            async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=1) as pool:
                await pgqueue.uninstall(pool)
                missing = await c.get("/jobs")
                assert missing.status_code == 503
                assert "pgqueue.SCHEMA" in missing.text  # what to do about it
                assert_guarded(missing)
                await pgqueue.install(pool)
            proxy.refuse()  # the database is gone
            for path in ("/jobs", "/jobs/1", "/periodic", "/", "/fragments/queues"):
                with anyio.fail_after(15):
                    answer = await c.get(path)
                    while answer.status_code == 200 and path in FRAMED:
                        answer = await c.get(path)  # a frame under a second old
                assert answer.status_code == 503, path
                assert_guarded(answer)
                for secret in (str(proxy.port), database, "127.0.0.1", "postgres@"):
                    assert secret not in answer.text, (path, secret)
            # The operator finds the detail in the server's log.
            assert str(proxy.port) in web.log()


# --- bulk actions and the edit form ----------------------------------------------------


def form_of(page: str) -> dict[str, str]:
    """Every field of the page's action form as a browser posts it (inputs, textarea)."""
    found = {
        unescape(name): unescape(value)
        for name, value in re.findall(
            r'<input[^>]*\bname="([^"]+)"[^>]*\bvalue="([^"]*)"', page
        )
    }
    for name, text in re.findall(
        r'<textarea[^>]*\bname="([^"]+)"[^>]*>(.*?)</textarea>', page, re.S
    ):
        found[unescape(name)] = unescape(text)
    return found


async def by_id(pool: asyncpg.Pool, ids: list[int]) -> list[dict[str, Any]]:
    records = await pool.fetch(
        "SELECT * FROM pgqueue_jobs WHERE id = ANY($1::bigint[]) ORDER BY id", ids
    )
    return [dict(r) for r in records]


def new_actions(
    queue_name: str, dead: int, pending: int
) -> list[tuple[str, dict[str, Any]]]:
    """The edit and signal forms and the bulk actions (by filter, by ids, with a queue), with their query."""
    return [
        (f"/jobs/{pending}/edit", {}),
        (f"/jobs/{pending}/signal", {}),
        (
            "/bulk/move",
            {"where": [f"queue={queue_name}-c"], "all": "1", "to_queue": "moved"},
        ),
        ("/bulk/cancel", {"id": [str(pending)]}),
        ("/bulk/retry", {"where": [f"queue={queue_name}-all"], "all": "1"}),
        ("/bulk/delete", {"where": [f"queue={queue_name}-r"], "all": "1"}),
    ]


async def test_bulk_actions_edit_and_signal_act_only_on_a_post_with_their_token(
    dsn: str, pool: asyncpg.Pool, queue_name: str, tmp_path: Path
) -> None:
    dead, pending, every = await seed(pool, queue_name)
    ids = [dead, pending, *every]
    before = await by_id(pool, ids)
    actions = new_actions(queue_name, dead, pending)
    async with (
        serving(dsn, tmp_path, "--allow-actions") as web,
        httpx.AsyncClient(base_url=web.url) as c,
    ):
        forms = {}
        for path, query in actions:
            confirm = await c.get(path, params=query)
            assert confirm.status_code == 200, path
            forms[path] = form_of(confirm.text)
            assert forms[path]["csrf"], path
        forms[f"/jobs/{pending}/edit"]["priority"] = "4"
        forms[f"/jobs/{pending}/signal"].update(name="go", payload='{"n": 1}')
        for path, query in actions:
            for method in METHODS:
                body = _with(form(**forms[path]), web)
                if method == "POST":
                    body["headers"]["origin"] = "https://evil.example"
                answer = await c.request(method, path, params=query, **body)
                if method in ("GET", "HEAD"):
                    assert answer.status_code == 200, (method, path)  # it asks
                elif method == "POST":
                    assert answer.status_code == 403, (method, path)
                else:
                    assert answer.status_code == 405, (method, path)
                    allowed = {m.strip() for m in answer.headers["allow"].split(",")}
                    assert allowed == {"GET", "HEAD", "POST"}
                assert_guarded(answer)
                assert await by_id(pool, ids) == before, (method, path)
        # With the token, from this page: each acts (the checks above could see it).
        for path, _ in actions:
            done = await c.post(path, **_with(form(**forms[path]), web))
            assert done.status_code == 303, (path, done.text)
    assert {r["status"] for r in await rows(pool, f"{queue_name}-all")} == {"pending"}
    assert (
        await pool.fetchval("SELECT count(*) FROM pgqueue_jobs WHERE id = $1", dead)
        == 0
    )
    moved = await row(pool, pending)
    assert (moved["queue"], moved["priority"], moved["status"]) == (
        "moved",
        4,
        "cancelled",
    )
    [signal] = json.loads(moved["signals"])
    assert (signal["name"], signal["payload"]) == ("go", {"n": 1})


async def test_bulk_actions_edit_and_signal_refuse_a_foreign_host_or_origin(
    dsn: str, pool: asyncpg.Pool, queue_name: str, tmp_path: Path
) -> None:
    dead, pending, every = await seed(pool, queue_name)
    ids = [dead, pending, *every]
    before = await by_id(pool, ids)
    async with (
        serving(dsn, tmp_path, "--allow-actions") as web,
        httpx.AsyncClient(base_url=web.url) as c,
    ):
        host = urlsplit(web.url).netloc
        for path, query in new_actions(queue_name, dead, pending):
            fields = form_of((await c.get(path, params=query)).text)
            for foreign in ("attacker.example", f"127.0.0.1.nip.io:{web.port}"):
                for method in ("GET", "POST"):
                    body = _with(form(**fields), web)
                    body["headers"]["host"] = foreign
                    answer = await c.request(method, path, params=query, **body)
                    assert answer.status_code == 400, (foreign, method, path)
                    assert_guarded(answer)
            for origin in (
                f"https://{host}",
                f"http://127.0.0.1:{web.port + 1}",
                f"http://localhost:{web.port}",
                "null",
            ):
                body = _with(form(**fields), web)
                body["headers"]["origin"] = origin
                assert (await c.post(path, **body)).status_code == 403, (origin, path)
            for site in ("cross-site", "same-site", "none"):
                body = _with(form(**fields), web)
                body["headers"]["sec-fetch-site"] = site
                assert (await c.post(path, **body)).status_code == 403, (site, path)
            assert await by_id(pool, ids) == before, path


async def test_a_bulk_token_is_bound_to_its_filter_count_ids_and_queue_and_a_forms_to_its_job(
    dsn: str, pool: asyncpg.Pool, queue_name: str, tmp_path: Path
) -> None:
    dead, pending, every = await seed(pool, queue_name)
    ids = [dead, pending, *every]
    before = await by_id(pool, ids)
    env = {"PGQUEUE_WEB_SECRET": SECRET}
    filtered = {"where": [f"queue={queue_name}-all"], "all": "1"}
    async with (
        serving(dsn, tmp_path, "--allow-actions", env=env) as web,
        httpx.AsyncClient(base_url=web.url) as c,
    ):
        retry = form_of((await c.get("/bulk/retry", params=filtered)).text)
        cancel = form_of(
            (await c.get("/bulk/cancel", params={"id": str(pending)})).text
        )
        move = form_of(
            (await c.get("/bulk/move", params={**filtered, "to_queue": "a"})).text
        )
        edit_path = f"/jobs/{pending}/edit"
        edit = form_of((await c.get(edit_path)).text)
        signal_path = f"/jobs/{pending}/signal"
        signal = {**form_of((await c.get(signal_path)).text), "name": "go"}
        tokens = ActionTokens(SECRET)
        bound = {k: retry.get(k, "") for k in ("filter", "ids", "limit", "to_queue")}
        old = tokens.issue("/bulk/retry", bound, now=time.time() - 3601)
        refused = [
            ("/bulk/retry", {k: v for k, v in retry.items() if k != "csrf"}),
            ("/bulk/retry", {**retry, "csrf": ""}),
            ("/bulk/retry", {**retry, "csrf": old}),  # over an hour old
            ("/bulk/retry", {**retry, "filter": f'["queue={queue_name}-r"]'}),
            ("/bulk/retry", {**retry, "filter": "[]"}),  # every job
            ("/bulk/retry", {**retry, "limit": "100"}),
            ("/bulk/retry", {**retry, "to_queue": "a"}),
            ("/bulk/retry", {**retry, "ids": str(dead)}),
            ("/bulk/delete", {**retry}),  # a retry's token
            ("/bulk/cancel", {**cancel, "ids": str(every[0])}),
            ("/bulk/cancel", {**cancel, "ids": f"{pending},{every[0]}"}),
            ("/bulk/cancel", {**cancel, "ids": ""}),
            ("/bulk/move", {**move, "to_queue": "b"}),
            ("/bulk/move", {**move, "filter": ""}),
            (f"/jobs/{every[0]}/edit", {**edit}),  # another job's edit
            (edit_path, {**edit, "csrf": retry["csrf"]}),
            (f"/jobs/{every[0]}/signal", {**signal}),  # another job's signal
            (signal_path, {**signal, "csrf": edit["csrf"]}),  # its edit's token
            (edit_path, {**edit, "csrf": signal["csrf"]}),  # its signal's token
        ]
        for path, fields in refused:
            answer = await c.post(path, **_with(form(**fields), web))
            assert 400 <= answer.status_code < 500, (path, fields)
            assert await by_id(pool, ids) == before, (path, fields)
        # Another process's token, with the same secret, is good.
        fresh = tokens.issue("/bulk/retry", bound)
        done = await c.post(
            "/bulk/retry", **_with(form(**{**retry, "csrf": fresh}), web)
        )
        assert done.status_code == 303
    assert {r["status"] for r in await rows(pool, f"{queue_name}-all")} == {"pending"}
