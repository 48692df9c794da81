"""What an error may say about a connection, and DSNs pgqueue refuses.

`target` and `target_of` name ``user@host:port/database`` and never a
password, `Server` names the one a set of connections uses,
`holds_password` tells whether a DSN holds one, and `check_dsn` refuses a
DSN asyncpg would misread (a password with an unescaped ``@``, ``/``,
``?`` or ``#``), with a message that repeats nothing of it. Opening
connections is the wire's (`pgqueue._wire.opening`).
"""

from __future__ import annotations

import getpass
import inspect
import os
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import asyncpg

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = [
    "DSN_HINT",
    "Server",
    "check_dsn",
    "holds_password",
    "target",
    "target_of",
]

DSN_HINT = (
    "the DSN cannot be parsed: percent-encode the user name and password "
    "(@ as %40, : as %3A, / as %2F, ? as %3F, # as %23, % as %25)"
)
"""The message of the `ValueError` `check_dsn` raises; it never quotes the DSN."""


def check_dsn(dsn: str) -> None:
    """Raise `ValueError` (`DSN_HINT`) if asyncpg would read ``dsn`` other than it was meant.

    asyncpg splits the authority at its first ``@``, so a password holding
    an unescaped ``@``, ``/``, ``?`` or ``#`` makes part of it a host, a
    port, a database or options, and asyncpg's error then quotes it. Only
    URL DSNs are checked; asyncpg refuses any other form without quoting it.
    """
    if "://" not in dsn:
        return
    try:
        parts = urlsplit(dsn)
        if parts.query:
            parse_qs(parts.query, strict_parsing=True)
    except ValueError:
        raise ValueError(DSN_HINT) from None
    if parts.scheme not in ("postgres", "postgresql"):
        return
    auth, at, hostspec = parts.netloc.rpartition("@")
    if (
        parts.fragment
        or "@" in auth
        or (not at and "@" in f"{parts.path}#{parts.fragment}")
        or not all(_port_ok(host) for host in hostspec.split(","))
    ):
        raise ValueError(DSN_HINT)


_PASSWORD_WORD = re.compile(r"(?:^|\s)password\s*=", re.IGNORECASE)


def holds_password(dsn: str) -> bool:
    """Whether ``dsn`` holds a password (``user:secret@``, ``?password=``, ``password=``); never raises."""
    if "://" not in dsn:
        return bool(_PASSWORD_WORD.search(dsn))
    try:
        parts = urlsplit(dsn)
        query = parse_qs(parts.query)
    except ValueError:
        return "@" in dsn  # unparsable: assume the worst
    auth, at, _ = parts.netloc.rpartition("@")
    return bool(at and auth.partition(":")[2]) or bool(query.get("password"))


def _port_ok(hostspec: str) -> bool:
    """Whether ``host[:port]`` (``[v6]:port`` too) has no port or a numeric one."""
    if hostspec.startswith("["):
        hostspec = hostspec.rpartition("]")[2]
    _, colon, port = hostspec.rpartition(":")
    return not colon or not port or port.isdigit()


def target(dsn: str | None = None, **connect_kwargs: Any) -> str:
    """Name where ``asyncpg.connect(dsn, **connect_kwargs)`` goes: ``user@host:port/database``.

    libpq's ``PG*`` variables and defaults fill in what the arguments leave
    out, as asyncpg does; several hosts are joined with commas. Never holds
    a password; never raises.
    """
    try:
        return _asyncpg_target(dsn, connect_kwargs)
    except Exception:  # a private function: read the DSN ourselves
        return _own_target(dsn, connect_kwargs)


def target_of(executor: object) -> str | None:
    """``user@host:port/database`` of a connection, a pool or a DSN; None for anything else."""
    if isinstance(executor, str):
        return target(executor)
    connection = executor
    for _ in range(3):  # a pool's proxy; a wrapper of pgqueue's own, open
        if isinstance(connection, asyncpg.Connection):
            break
        connection = getattr(connection, "_con", None) or getattr(
            connection, "_connection", None
        )
    if isinstance(connection, asyncpg.Connection):
        params = getattr(connection, "_params", None)
        addr = getattr(connection, "_addr", None)
        if params is not None and addr is not None:
            return _named(getattr(params, "user", None), [addr], params.database)
    if isinstance(executor, asyncpg.Pool):
        args = getattr(executor, "_connect_args", ())
        kwargs = dict(getattr(executor, "_connect_kwargs", {}))
        return target(args[0] if args else kwargs.pop("dsn", None), **kwargs)
    return None


class Server:
    """The server a set of connections uses, as its log lines name it.

    ``name`` is the one configured (``target``: a multi-host DSN names each
    host) until one of the connections opens; from then on, the server the
    last one opened is on (``target_of`` the connection). A connection that
    has not opened yet, or failed to, is named after its siblings: the server
    it would have used, not a list of candidates. Never holds a password.
    """

    __slots__ = ("name",)

    def __init__(self, configured: str = "the database") -> None:
        self.name = configured

    def opened(self, connection: object) -> str | None:
        """Note that ``connection`` opened; the server it is on (None if unknown)."""
        name = target_of(connection)
        if name is not None:
            self.name = name
        return name


def _asyncpg_target(dsn: str | None, kwargs: Mapping[str, Any]) -> str:
    from asyncpg import connect_utils

    parse = connect_utils._parse_connect_dsn_and_args  # type: ignore[attr-defined]
    given = {
        name: kwargs.get(name)
        for name in inspect.signature(parse).parameters
        if name != "dsn"
    }
    if dsn is not None:
        check_dsn(dsn)
    addrs, params = parse(dsn=dsn, **given)
    return _named(params.user, list(addrs), params.database)


def _own_target(dsn: str | None, kwargs: Mapping[str, Any]) -> str:
    env = os.environ
    user = kwargs.get("user") or env.get("PGUSER")
    host = kwargs.get("host") or env.get("PGHOST") or "localhost"
    port = kwargs.get("port") or env.get("PGPORT") or 5432
    database = kwargs.get("database") or env.get("PGDATABASE")
    if dsn is not None:
        try:
            check_dsn(dsn)
            parts = urlsplit(dsn)
            auth, _, hostspec = parts.netloc.rpartition("@")
            user = unquote(auth.partition(":")[0]) or user
            host = hostspec or host
            database = unquote(parts.path.lstrip("/")) or database
        except ValueError:
            return "the server of the DSN"
    return _named(user, [f"{host}" if ":" in str(host) else (host, port)], database)


def _named(user: str | None, addrs: list[Any], database: str | None) -> str:
    if not user:
        try:
            user = getpass.getuser()
        except Exception:
            user = "?"
    places: list[tuple[str, str]] = []
    for addr in addrs:
        if isinstance(addr, tuple):
            host = str(addr[0])
            places.append((f"[{host}]" if ":" in host else host, str(addr[1])))
        else:  # a Unix socket's path: DIR/.s.PGSQL.PORT
            directory, _, port = str(addr).rpartition("/.s.PGSQL.")
            places.append((directory, port) if port else (str(addr), ""))
    ports = {port for _, port in places}
    if len(ports) == 1:  # libpq's defaults: several socket directories, one port
        hosts = ",".join(dict.fromkeys(host for host, _ in places))
        where = f"{hosts}:{ports.pop()}" if ports != {""} else hosts
    else:
        where = ",".join(f"{host}:{port}" if port else host for host, port in places)
    return f"{user}@{where}/{database or user}"
