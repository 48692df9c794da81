"""``pgqueue web``: serve the browser dashboard (`pgqueue.web`) with uvicorn.

Read-only unless ``--allow-actions``; on 127.0.0.1 unless ``--host`` says
otherwise, answering only to the names of the address it listens on (and
``--allowed-host``). Both need the ``web`` extra.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import socket
import sys
from typing import TYPE_CHECKING, Any

import asyncpg

from pgqueue._extension import check_origin, check_schema
from pgqueue.cli._common import (
    CONNECT_ERRORS,
    EXIT_OK,
    UsageError,
    add_read_dsn,
    cannot_connect,
    dsn_of,
    dsn_source,
    read_dsn_of,
    reports_database_errors,
)

if TYPE_CHECKING:
    from pgqueue.cli._common import Commands

__all__ = ["add_to"]

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def add_to(commands: Commands) -> None:
    """Add ``pgqueue web``."""
    parser = commands.add_parser(
        "web",
        help="serve the dashboard in the browser (read-only by default)",
        description=(
            "Serve the dashboard: queues (live), jobs, a job, periodic schedules. "
            "It has no authentication: it listens on 127.0.0.1 by default and is "
            "read-only unless --allow-actions. Ctrl-C stops it. The actions' tokens "
            "are keyed by PGQUEUE_WEB_SECRET (at least 16 bytes; random by default): "
            "give every process behind one address the same one."
        ),
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)"
    )
    parser.add_argument(
        "--port",
        type=int,
        default=8080,
        help="port to listen on (default: 8080; 0 picks one)",
    )
    parser.add_argument(
        "--allow-actions",
        action="store_true",
        help="show Retry, Retry all and Cancel (each asks for confirmation)",
    )
    parser.add_argument(
        "--hide-payloads",
        action="store_true",
        help="show no payloads or results (they may hold personal data)",
    )
    parser.add_argument(
        "--trusted-origin",
        action="append",
        default=[],
        type=_origin,
        metavar="ORIGIN",
        help=(
            "also accept actions from pages of this origin (scheme://host[:port]), "
            "for a proxy that rewrites the Host header; repeatable"
        ),
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        type=_allowed_host,
        metavar="HOST",
        help=(
            "also answer requests for this host name (a proxy's public name; "
            "with :PORT for that port only); others get 400, against DNS "
            "rebinding. Default: the --host address with --port, and on "
            "loopback 127.0.0.1, localhost and [::1]; '*' answers any; repeatable"
        ),
    )
    add_read_dsn(parser)
    parser.set_defaults(run=reports_database_errors(run))


def _origin(text: str) -> str:
    try:
        return check_origin(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _allowed_host(text: str) -> str:
    try:
        from pgqueue.web._guard import check_allowed_host  # the web extra
    except ModuleNotFoundError:
        return text  # run() says the extra is missing
    try:
        return check_allowed_host(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def allowed_hosts(host: str, port: int, extra: list[str]) -> list[str]:
    """The hosts ``pgqueue web --host HOST --port PORT`` answers to.

    The address it listens on with its port (for a loopback address, each of
    this machine's names), and the ``--allowed-host`` ones.
    """
    names = ["127.0.0.1", "localhost", "[::1]"] if _loopback(host) else []
    shown = f"[{host}]" if ":" in host else host.lower()
    if shown not in names:
        names.append(shown)
    return [f"{name}:{port}" for name in names] + extra


def _unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def run(args: argparse.Namespace) -> int:
    """Serve until Ctrl-C or SIGTERM."""
    try:
        import uvicorn

        from pgqueue.web import create_app
    except ModuleNotFoundError as exc:
        msg = "pgqueue web needs the web extra: pip install 'pgqueue-asyncio[web]'"
        raise UsageError(msg) from exc
    if not 0 <= args.port < 65536:
        msg = f"--port must be from 0 to 65535, not {args.port}"
        raise UsageError(msg)
    secret = _secret()
    # The dashboard's warnings (a database it cannot reach) go to stderr.
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT, stream=sys.stderr)
    try:
        listener = socket.create_server(
            (args.host, args.port),
            family=socket.AF_INET6 if ":" in args.host else socket.AF_INET,
        )
    except OSError as exc:
        msg = f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
        raise UsageError(msg) from exc
    with listener:
        pool = await _open_pool(dsn_of(args), dsn_source(args))
        read_dsn = read_dsn_of(args)
        try:
            reads = (
                await _open_pool(read_dsn, dsn_source(args, read=True))
                if read_dsn != dsn_of(args)
                else None
            )
        except BaseException:
            await pool.close()
            raise
        try:
            await check_schema(reads or pool)
            port = listener.getsockname()[1]
            app = create_app(
                pool,
                read=reads,
                read_only=not args.allow_actions,
                show_payloads=not args.hide_payloads,
                secret=secret,
                trusted_origins=args.trusted_origin,
                allowed_hosts=allowed_hosts(args.host, port, args.allowed_host),
            )
            shown = f"[{args.host}]" if ":" in args.host else args.host
            # Warnings first: the address line says it is ready.
            if not _loopback(args.host):
                print(
                    "pgqueue web: listening beyond this machine with no authentication: "
                    "anyone who reaches it sees your jobs",
                    file=sys.stderr,
                    flush=True,
                )
            if _unspecified(args.host) and not args.allowed_host:
                print(
                    f"pgqueue web: it answers only requests for {shown}:{port}: name "
                    "the host names its users type with --allowed-host",
                    file=sys.stderr,
                    flush=True,
                )
            mode = "actions enabled" if args.allow_actions else "read-only"
            print(
                f"pgqueue web: http://{shown}:{port}/ ({mode}); Ctrl-C stops",
                flush=True,
            )
            config = uvicorn.Config(app, log_level="warning", lifespan="off")
            await uvicorn.Server(config).serve(sockets=[listener])
        finally:
            await pool.close()
            if reads is not None:
                await reads.close()
    return EXIT_OK


def _secret() -> str | None:
    """``PGQUEUE_WEB_SECRET``: the actions' key, shared by every process behind one address."""
    from pgqueue.web._guard import check_secret

    secret = os.environ.get("PGQUEUE_WEB_SECRET") or None
    try:
        check_secret(secret)
    except ValueError as exc:
        msg = f"PGQUEUE_WEB_SECRET: {exc}"
        raise UsageError(msg) from None
    return secret


async def _open_pool(dsn: str | None, source: str) -> asyncpg.Pool[Any]:
    try:
        pool: asyncpg.Pool[Any] = await asyncpg.create_pool(
            dsn, min_size=1, max_size=4, timeout=10
        )
    except CONNECT_ERRORS as exc:
        raise cannot_connect(exc, dsn, source) from exc
    return pool
