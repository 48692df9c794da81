"""A primary and a synchronous hot standby of the machine's PostgreSQL, for the failover tier.

Made with `pgqueue.testing._clusters` (the machine's own ``initdb``,
``pg_ctl`` and ``pg_basebackup``, free loopback ports, a temporary
directory removed on the way out whatever happened); only the standby's
copy and promotion are the tier's own. ``synchronous_standby_names = '*'``: a commit the primary
acknowledges is on the standby too, so nothing acknowledged is lost by
promoting it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import anyio
import asyncpg

from pgqueue.testing._clusters import (
    LocalCluster,
    LocalServer,
    binaries,
    free_port,
    servers,
)
from pgqueue.testing._server import ServerUnavailableError

if TYPE_CHECKING:
    import contextlib
    from pathlib import Path

_SYNC_TIMEOUT = 30

__all__ = [
    "Node",
    "ReplicatedCluster",
    "binaries",
    "replicated_cluster",
    "wait_for_standby_replay",
]


class Node(LocalServer):
    """A server of the pair, which can be promoted."""

    def promote(self) -> None:
        """Promote the standby; block until it takes writes."""
        self.cluster.run("pg_ctl", "promote", "-w", "-D", str(self.data))


class ReplicatedCluster(LocalCluster):
    """A primary and a synchronous hot standby in a temporary directory.

    ``multi_dsn`` names both (``target_session_attrs=read-write``): a
    client on it reaches whichever one takes writes.
    """

    def __init__(self, bindir: Path) -> None:
        super().__init__(bindir, "pgqueue-failover-")
        self.primary = Node(self, "primary", free_port())
        self.standby = Node(self, "standby", free_port())
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        self.multi_dsn = (
            f"postgresql://postgres@{hosts}/postgres?target_session_attrs=read-write"
        )

    @property
    def nodes(self) -> list[Node]:
        """The primary, then the standby."""
        return [self.primary, self.standby]

    def create(self) -> None:
        """Make, start and replicate both servers; return once the standby is synchronous."""
        primary, standby = self.primary, self.standby
        primary.init(
            {
                "wal_level": "replica",
                "max_wal_senders": "4",
                "hot_standby": "on",
                "synchronous_standby_names": "'*'",
                "max_connections": "100",
                "wal_receiver_status_interval": "1s",
            }
        )
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
        deadline = time.monotonic() + _SYNC_TIMEOUT
        while time.monotonic() < deadline:
            result = self.run(
                "pg_ctl", "status", "-D", str(self.primary.data), check=False
            )
            if result.returncode == 0 and self._sync_state() == "sync":
                return
            time.sleep(0.05)
        msg = "the standby did not become synchronous"
        raise ServerUnavailableError(msg)

    def _sync_state(self) -> str | None:
        result = self.run(
            "psql",
            "-At",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary.port),
            "-U",
            "postgres",
            "-c",
            "SELECT sync_state FROM pg_stat_replication",
            check=False,
        )
        return result.stdout.strip() or None

    def fail_over(self) -> None:
        """Stop the primary in immediate mode (a crash), then promote the standby."""
        self.primary.stop("immediate")
        self.standby.promote()


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


def replicated_cluster(
    bindir: Path,
) -> contextlib.AbstractContextManager[ReplicatedCluster]:
    """A created `ReplicatedCluster`, destroyed on the way out (whatever happened)."""
    return servers(ReplicatedCluster(bindir))
