"""A Citus coordinator and two worker nodes of the machine's PostgreSQL.

For pgqueue's citus tier and its Citus benchmark; made as every server of
`pgqueue.testing._clusters` is (the machine's ``initdb`` and ``pg_ctl``,
free loopback ports, a temporary directory removed on the way out). Every node preloads ``citus``
and has the extension in its ``postgres`` database; the coordinator knows
itself (``citus_set_coordinator_host``) and both workers (``citus_add_node``).
Two-phase commits are never recovered in the background
(``citus.recover_2pc_interval = -1``), so the records of any that ran stay
in ``pg_dist_transaction`` for a test to count.

Citus is not built here: without ``citus.so`` in the server's library
directory (`citus_missing` says why), the tier is skipped. Not public.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg

from pgqueue.testing._clusters import (
    LocalCluster,
    LocalServer,
    binaries,
    free_port,
    servers,
)

if TYPE_CHECKING:
    import contextlib

__all__ = ["CitusCluster", "CitusNode", "citus_cluster", "citus_missing"]

CitusNode = LocalServer
"""A server of the cluster (a coordinator or a worker node)."""


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


class CitusCluster(LocalCluster):
    """A coordinator and two worker nodes in a temporary directory."""

    def __init__(self, bindir: Path, *, settings: dict[str, str] | None = None) -> None:
        super().__init__(bindir, "pgqueue-citus-")
        self.coordinator = CitusNode(self, "coordinator", free_port())
        self.workers = [
            CitusNode(self, "worker1", free_port()),
            CitusNode(self, "worker2", free_port()),
        ]
        self.extra_settings = settings or {}

    @property
    def nodes(self) -> list[CitusNode]:
        """The coordinator, then the workers."""
        return [self.coordinator, *self.workers]

    def create(self) -> None:
        """Make and start the three servers (the extension comes with `join`)."""
        for node in self.nodes:
            node.init(
                {
                    "shared_preload_libraries": "'citus'",
                    "max_connections": "300",
                    "max_prepared_transactions": "100",
                    "citus.recover_2pc_interval": "-1",
                    # No reports to Citus's servers from a test run.
                    "citus.enable_statistics_collection": "off",
                    **self.extra_settings,
                }
            )

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


def citus_cluster(
    bindir: Path, *, settings: dict[str, str] | None = None
) -> contextlib.AbstractContextManager[CitusCluster]:
    """A created `CitusCluster` (not yet joined), destroyed on the way out whatever happened."""
    return servers(CitusCluster(bindir, settings=settings))


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
