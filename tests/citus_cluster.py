"""A Citus coordinator and two worker nodes of the machine's PostgreSQL, for the citus tier.

Made with the machine's own ``initdb`` and ``pg_ctl`` (see
`tests.replicated.binaries`), run as the ``postgres`` user when the tests
run as root, on free loopback ports, in a temporary directory that is
removed on the way out whatever happened. Every node preloads ``citus``
and has the extension in its ``postgres`` database; the coordinator knows
itself (``citus_set_coordinator_host``) and both workers (``citus_add_node``).
Two-phase commits are never recovered in the background
(``citus.recover_2pc_interval = -1``), so the records of any that ran stay
in ``pg_dist_transaction`` for a test to count.

Citus is not built here: without ``citus.so`` in the server's library
directory (`citus_missing` says why), the tier is skipped.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg

from tests.replicated import _free_port, binaries

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["CitusCluster", "CitusNode", "citus_cluster", "citus_missing"]

_START_TIMEOUT = 30


def citus_missing(bindir: Path | None) -> str | None:
    """Why the citus tier cannot run here (None when it can)."""
    if bindir is None:
        return "no initdb/pg_ctl found (set PG_BINDIR)"
    pg_config = bindir / "pg_config"
    if not pg_config.is_file():
        found = shutil.which("pg_config")
        if found is None:
            return "no pg_config found to locate the citus extension"
        pg_config = Path(found)
    result = subprocess.run(
        [str(pg_config), "--pkglibdir"],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    libdir = Path(result.stdout.strip())
    if not (libdir / "citus.so").is_file():
        return f"the citus extension is not installed ({libdir}/citus.so is missing)"
    return None


class CitusNode:
    """One server of the cluster: its data directory, port and DSN."""

    def __init__(self, cluster: CitusCluster, name: str, port: int) -> None:
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
        """Stop the server; does nothing if it is not running."""
        if (self.data / "postmaster.pid").exists():
            self.cluster.run(
                "pg_ctl", "stop", "-w", "-m", mode, "-D", str(self.data), check=False
            )

    def server_log(self) -> str:
        """The server's log so far ('' if none)."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


class CitusCluster:
    """A coordinator and two worker nodes in a temporary directory."""

    def __init__(self, bindir: Path, *, settings: dict[str, str] | None = None) -> None:
        self.bindir = bindir
        self._as_postgres = os.geteuid() == 0
        self.root = Path(tempfile.mkdtemp(prefix="pgqueue-citus-"))
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self.coordinator = CitusNode(self, "coordinator", _free_port())
        self.workers = [
            CitusNode(self, "worker1", _free_port()),
            CitusNode(self, "worker2", _free_port()),
        ]
        self.extra_settings = settings or {}

    @property
    def nodes(self) -> list[CitusNode]:
        """The coordinator, then the workers."""
        return [self.coordinator, *self.workers]

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
        """Make and start the three servers (the extension comes with `join`)."""
        for node in self.nodes:
            self.run(
                "initdb",
                "-D",
                str(node.data),
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
                "port": str(node.port),
                "unix_socket_directories": f"'{self.root}'",
                "shared_preload_libraries": "'citus'",
                "fsync": "off",
                "full_page_writes": "off",
                "max_connections": "300",
                "max_prepared_transactions": "100",
                "citus.recover_2pc_interval": "-1",
                # No reports to Citus's servers from a test run.
                "citus.enable_statistics_collection": "off",
                **self.extra_settings,
            }
            with (node.data / "postgresql.conf").open("a") as conf:
                conf.writelines(
                    f"{name} = {value}\n" for name, value in settings.items()
                )
            node.start()

    async def join(self) -> None:
        """Create the extension on every node and register the nodes with the coordinator."""
        for node in self.nodes:
            conn = await asyncpg.connect(node.dsn)
            try:
                await conn.execute("CREATE EXTENSION IF NOT EXISTS citus")
            finally:
                await conn.close()
        conn = await asyncpg.connect(self.coordinator.dsn)
        try:
            await conn.execute(
                "SELECT citus_set_coordinator_host('127.0.0.1', $1)",
                self.coordinator.port,
            )
            for node in self.workers:
                await conn.execute("SELECT citus_add_node('127.0.0.1', $1)", node.port)
        finally:
            await conn.close()

    def destroy(self) -> None:
        """Stop the servers (immediately) and remove every file."""
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


@contextlib.contextmanager
def citus_cluster(
    bindir: Path, *, settings: dict[str, str] | None = None
) -> Iterator[CitusCluster]:
    """A created `CitusCluster` (not yet joined), destroyed on the way out whatever happened."""
    cluster = CitusCluster(bindir, settings=settings)
    try:
        cluster.create()
        yield cluster
    except BaseException:
        for node in cluster.nodes:
            log = node.server_log()
            if log:
                sys.stderr.write(f"--- {node.name} server log ---\n{log[-4000:]}\n")
        raise
    finally:
        cluster.destroy()


def main() -> None:
    """Start a joined cluster and print its DSNs until interrupted (for trying things by hand)."""
    import asyncio
    import signal

    bindir = binaries()
    assert bindir is not None
    # Blocked, so that sigwait takes them (and the cluster is destroyed).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    with citus_cluster(bindir) as cluster:
        asyncio.run(cluster.join())
        for node in cluster.nodes:
            sys.stdout.write(f"{node.name} {node.dsn}\n")
            sys.stdout.flush()
        signal.sigwait({signal.SIGINT, signal.SIGTERM})


if __name__ == "__main__":
    main()
