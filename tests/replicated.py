"""A primary and a synchronous hot standby of the machine's PostgreSQL, for the failover tier.

Made with the machine's own ``initdb``, ``pg_ctl`` and ``pg_basebackup``
(``PG_BINDIR``, else the newest ``/usr/lib/postgresql/*/bin``, else ``PATH``),
run as the ``postgres`` user when the tests run as root, on free loopback
ports, in a temporary directory that is removed on the way out whatever
happened. ``synchronous_standby_names = '*'``: a commit the primary
acknowledges is on the standby too, so nothing acknowledged is lost by
promoting it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import asyncpg

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = [
    "Node",
    "ReplicatedCluster",
    "binaries",
    "replicated_cluster",
    "wait_for_standby_replay",
]

_TOOLS = ("initdb", "pg_ctl", "pg_basebackup")
_START_TIMEOUT = 30


def binaries() -> Path | None:
    """The directory holding initdb, pg_ctl and pg_basebackup; None when there is none."""
    candidates: list[Path] = []
    if os.environ.get("PG_BINDIR"):
        candidates.append(Path(os.environ["PG_BINDIR"]))
    candidates += sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    found = shutil.which("initdb")
    if found:
        candidates.append(Path(found).parent)
    for directory in candidates:
        if all((directory / tool).is_file() for tool in _TOOLS):
            return directory
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Node:
    """One server of the cluster: its data directory, port and DSN."""

    def __init__(self, cluster: ReplicatedCluster, name: str, port: int) -> None:
        self.cluster = cluster
        self.name = name
        self.port = port
        self.data = cluster.root / name
        self.log = cluster.root / f"{name}.log"
        self.dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def start(self) -> None:
        """Start the server; block until it accepts connections."""
        self.cluster.run(
            "pg_ctl",
            "start",
            "-w",
            "-t",
            str(_START_TIMEOUT),
            "-D",
            str(self.data),
            "-l",
            str(self.log),
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``immediate`` is a crash); does nothing if it is not running."""
        if (self.data / "postmaster.pid").exists():
            self.cluster.run(
                "pg_ctl", "stop", "-w", "-m", mode, "-D", str(self.data), check=False
            )

    def promote(self) -> None:
        """Promote the standby; block until it takes writes."""
        self.cluster.run("pg_ctl", "promote", "-w", "-D", str(self.data))

    def server_log(self) -> str:
        """The server's log so far ('' if none)."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


class ReplicatedCluster:
    """A primary and a synchronous hot standby in a temporary directory.

    ``multi_dsn`` names both (``target_session_attrs=read-write``): a
    client on it reaches whichever one takes writes.
    """

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self._as_postgres = os.geteuid() == 0
        self.root = Path(tempfile.mkdtemp(prefix="pgqueue-failover-"))
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self.primary = Node(self, "primary", _free_port())
        self.standby = Node(self, "standby", _free_port())
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        self.multi_dsn = (
            f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"
        )

    def run(
        self, tool: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run one of the PostgreSQL tools (as ``postgres`` when we are root)."""
        command = [str(self.bindir / tool), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=self.root,
        )
        if check and result.returncode != 0:
            msg = f"{tool} {' '.join(args)} failed: {result.stdout}{result.stderr}"
            raise RuntimeError(msg)
        return result

    def create(self) -> None:
        """Make, start and replicate both servers; return once the standby is synchronous."""
        primary, standby = self.primary, self.standby
        self.run(
            "initdb",
            "-D",
            str(primary.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(primary.port),
            "unix_socket_directories": f"'{self.root}'",
            "wal_level": "replica",
            "max_wal_senders": "4",
            "hot_standby": "on",
            "synchronous_standby_names": "'*'",
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "100",
            "wal_receiver_status_interval": "1s",
        }
        with (primary.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())
        primary.start()
        self.run(
            "pg_basebackup",
            "-h",
            "127.0.0.1",
            "-p",
            str(primary.port),
            "-U",
            "postgres",
            "-D",
            str(standby.data),
            "-X",
            "stream",
            "-R",
            "--no-sync",
        )
        with (standby.data / "postgresql.conf").open("a") as conf:
            conf.write(f"port = {standby.port}\n")
            # Promoted, it has no standby of its own: commits must not wait
            # for one (what Patroni or an operator sets on promotion).
            conf.write("synchronous_standby_names = ''\n")
        standby.start()
        self._wait_synchronous()

    def _wait_synchronous(self) -> None:
        deadline = time.monotonic() + _START_TIMEOUT
        while time.monotonic() < deadline:
            result = self.run(
                "pg_ctl", "status", "-D", str(self.primary.data), check=False
            )
            if result.returncode == 0 and self._sync_state() == "sync":
                return
            time.sleep(0.05)
        msg = "the standby did not become synchronous"
        raise RuntimeError(msg)

    def _sync_state(self) -> str | None:
        psql = self.bindir / "psql"
        command = [
            str(psql),
            "-At",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary.port),
            "-U",
            "postgres",
            "-c",
            "SELECT sync_state FROM pg_stat_replication",
        ]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=30, check=False
        )
        return result.stdout.strip() or None

    def fail_over(self) -> None:
        """Stop the primary in immediate mode (a crash), then promote the standby."""
        self.primary.stop("immediate")
        self.standby.promote()

    def destroy(self) -> None:
        """Stop both servers (immediately) and remove every file."""
        for node in (self.standby, self.primary):
            with contextlib.suppress(Exception):
                node.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


async def wait_for_standby_replay(cluster: ReplicatedCluster) -> None:
    """Return once the standby has replayed everything the primary has written."""
    primary = await asyncpg.connect(cluster.primary.dsn)
    try:
        lsn = await primary.fetchval("SELECT pg_current_wal_lsn()")
    finally:
        await primary.close()
    standby = await asyncpg.connect(cluster.standby.dsn)
    try:
        while not await standby.fetchval(
            "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", lsn
        ):
            await anyio.sleep(0.02)
    finally:
        await standby.close()


@contextlib.contextmanager
def replicated_cluster(bindir: Path) -> Iterator[ReplicatedCluster]:
    """A created `ReplicatedCluster`, destroyed on the way out (whatever happened)."""
    cluster = ReplicatedCluster(bindir)
    try:
        cluster.create()
        yield cluster
    except BaseException:
        # What the servers said is the first thing to read when a test fails.
        for node in (cluster.primary, cluster.standby):
            log = node.server_log()
            if log:
                sys.stderr.write(f"--- {node.name} server log ---\n{log[-4000:]}\n")
        raise
    finally:
        cluster.destroy()
