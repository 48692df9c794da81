"""A private PgBouncer in transaction pooling mode, in front of a test server.

Usage::

    with pgbouncer(dsn) as bouncer:
        pool = await asyncpg.create_pool(bouncer.dsn, statement_cache_size=0)

It listens on ``127.0.0.1`` on a free port, without a unix socket, and
forwards the DSN's database to the DSN's server as the DSN's user, over at
most ``pool_size`` server connections (one pool: every client shares them).
Clients need no password (``auth_type = any``). It runs as ``nobody`` when
we are root, as PgBouncer refuses to run as root. The test is skipped when
the ``pgbouncer`` binary is missing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

import pytest

from pgqueue.testing._server import free_port, unprivileged_ids

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["PgBouncer", "pgbouncer"]

INSTALL = "apt-get install -y pgbouncer"
_START_TIMEOUT = 10.0
_STOP_TIMEOUT = 5.0
_PORT_ATTEMPTS = 5
_SAFE_NAME = re.compile(r"[A-Za-z0-9_]+")


class PgBouncerError(RuntimeError):
    """PgBouncer did not start, or does not let clients through."""


@dataclass(frozen=True)
class PgBouncer:
    """A running PgBouncer; see `pgbouncer`."""

    dsn: str
    """A DSN of the same database and user, through PgBouncer."""
    pool_size: int
    """The most server connections it opens (all clients share them)."""
    log_path: Path

    def log(self) -> str:
        """Return what PgBouncer has logged so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")


def binary() -> str:
    """Return the path of the ``pgbouncer`` binary; skip the test when there is none."""
    found = shutil.which("pgbouncer") or shutil.which(
        "pgbouncer", path="/usr/sbin:/usr/local/sbin"
    )
    if found is None:
        pytest.skip(f"pgbouncer is not installed: {INSTALL}")
    return found


@contextlib.contextmanager
def pgbouncer(server_dsn: str, *, pool_size: int = 2) -> Iterator[PgBouncer]:
    """Run PgBouncer (``pool_mode = transaction``) in front of ``server_dsn``'s database.

    Returns once a client has logged in through it, which also proves that
    it reached the server. It is stopped and its directory removed on exit,
    also when the body raises.

    Args:
        server_dsn: a ``postgresql://`` DSN of the real server and database.
        pool_size: the most server connections PgBouncer opens.

    Yields:
        The running PgBouncer, whose ``dsn`` goes through it.

    Raises:
        PgBouncerError: it did not start or let a client in within 10 s.
    """
    program = binary()
    target = urlsplit(server_dsn)
    user = unquote(target.username or "postgres")
    database = unquote(target.path.lstrip("/")) or user
    for name in (user, database):
        if not _SAFE_NAME.fullmatch(name):
            msg = f"{name!r}: only letters, digits and underscores are supported"
            raise ValueError(msg)
    server = f"host={target.hostname or '127.0.0.1'} port={target.port or 5432} dbname={database} user={user}"
    if target.password:
        server += f" password={unquote(target.password)}"
    run_as = unprivileged_ids()
    with tempfile.TemporaryDirectory(prefix="pgqueue-pgbouncer-") as tmp:
        directory = Path(tmp)
        if run_as is not None:
            os.chown(directory, *run_as)
        log_path = directory / "pgbouncer.log"
        for _ in range(_PORT_ATTEMPTS):
            port = free_port()
            config = directory / "pgbouncer.ini"
            config.write_text(
                _CONFIG.format(
                    database=database,
                    server=server,
                    port=port,
                    pool_size=pool_size,
                ),
                encoding="utf-8",
            )
            config.chmod(0o600)
            if run_as is not None:
                os.chown(config, *run_as)
            with log_path.open("ab") as log:
                process = subprocess.Popen(
                    [program, str(config)],
                    cwd=directory,
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    user=None if run_as is None else run_as[0],
                    group=None if run_as is None else run_as[1],
                    extra_groups=None if run_as is None else [],
                )
            try:
                if _wait_ready(process, port, user, database, log_path):
                    bouncer = PgBouncer(
                        dsn=f"postgresql://{user}@127.0.0.1:{port}/{database}",
                        pool_size=pool_size,
                        log_path=log_path,
                    )
                    yield bouncer
                    return
            finally:
                _stop(process)
            if "Address already in use" not in _tail(log_path):
                msg = f"PgBouncer exited with code {process.returncode} on start; its log ends with:\n{_tail(log_path)}"
                raise PgBouncerError(msg)
        msg = f"PgBouncer found no free port in {_PORT_ATTEMPTS} attempts; its log ends with:\n{_tail(log_path)}"
        raise PgBouncerError(msg)


_CONFIG = """\
[databases]
{database} = {server} pool_size={pool_size}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
pool_mode = transaction
default_pool_size = {pool_size}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 100
logfile =
pidfile =
"""


def _wait_ready(
    process: subprocess.Popen[bytes],
    port: int,
    user: str,
    database: str,
    log_path: Path,
) -> bool:
    """Log in through PgBouncer until it works; return False if PgBouncer exits first."""
    deadline = time.monotonic() + _START_TIMEOUT
    reason = "no attempt"
    while process.poll() is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            msg = f"PgBouncer let no client in within {_START_TIMEOUT:.0f} s ({reason}); its log ends with:\n{_tail(log_path)}"
            raise PgBouncerError(msg)
        try:
            _log_in(port, user, database, timeout=remaining)
        except (OSError, PgBouncerError) as exc:
            reason = str(exc)
            time.sleep(0.02)
        else:
            return True
    return False


def _log_in(port: int, user: str, database: str, *, timeout: float) -> None:
    """Complete a protocol 3.0 login through PgBouncer, then say goodbye.

    Raises:
        PgBouncerError: it answered with an error or asked for a password.
        OSError: it does not accept connections yet, or hung up.
    """
    params = f"user\0{user}\0database\0{database}\0\0".encode()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)
        while True:
            kind, body = _receive(sock)
            if kind == b"E":
                fields = body.split(b"\0")
                message = next((f[1:] for f in fields if f[:1] == b"M"), body)
                raise PgBouncerError(message.decode(errors="replace"))
            if kind == b"R" and struct.unpack("!i", body[:4])[0] != 0:
                msg = "PgBouncer asked for a password"
                raise PgBouncerError(msg)
            if kind == b"Z":
                sock.sendall(b"X\0\0\0\4")
                return


def _receive(sock: socket.socket) -> tuple[bytes, bytes]:
    """Read one backend message: its type byte and its body."""
    header = _read_exactly(sock, 5)
    (length,) = struct.unpack("!i", header[1:])
    return header[:1], _read_exactly(sock, length - 4)


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            msg = "PgBouncer closed the connection during login"
            raise ConnectionError(msg)
        data += chunk
    return data


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop PgBouncer (SIGTERM, then SIGKILL) and reap it."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _tail(path: Path, size: int = 4000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-size:]
    except OSError:
        return ""
