"""``pgqueue web``: serve the browser dashboard (`pgqueue.web`) with uvicorn.

Read-only unless ``--allow-actions``; on 127.0.0.1 unless ``--host`` says
otherwise. Both need the ``web`` extra.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
from typing import TYPE_CHECKING, Any

import asyncpg

from pgqueue._checks import check_origin
from pgqueue._schema import check_schema
from pgqueue.cli._common import (
    CONNECT_ERRORS,
    EXIT_OK,
    UsageError,
    cannot_connect,
    dsn_of,
    reports_database_errors,
)

if TYPE_CHECKING:
    from pgqueue.cli._common import Commands

__all__ = ["add_to"]


def add_to(commands: Commands) -> None:
    """Add ``pgqueue web``."""
    parser = commands.add_parser(
        "web",
        help="serve the dashboard in the browser (read-only by default)",
        description=(
            "Serve the dashboard: queues (live), jobs, a job, periodic schedules. "
            "It has no authentication: it listens on 127.0.0.1 by default and is "
            "read-only unless --allow-actions. Ctrl-C stops it."
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
    parser.set_defaults(run=reports_database_errors(run))


def _origin(text: str) -> str:
    try:
        return check_origin(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    try:
        listener = socket.create_server(
            (args.host, args.port),
            family=socket.AF_INET6 if ":" in args.host else socket.AF_INET,
        )
    except OSError as exc:
        msg = f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}"
        raise UsageError(msg) from exc
    with listener:
        pool = await _open_pool(dsn_of(args))
        try:
            await check_schema(pool)
            app = create_app(
                pool,
                read_only=not args.allow_actions,
                show_payloads=not args.hide_payloads,
                trusted_origins=args.trusted_origin,
            )
            port = listener.getsockname()[1]
            shown = f"[{args.host}]" if ":" in args.host else args.host
            mode = "actions enabled" if args.allow_actions else "read-only"
            print(
                f"pgqueue web: http://{shown}:{port}/ ({mode}); Ctrl-C stops",
                flush=True,
            )
            if not _loopback(args.host):
                print(
                    "pgqueue web: listening beyond this machine with no authentication: "
                    "anyone who reaches it sees your jobs",
                    file=sys.stderr,
                    flush=True,
                )
            config = uvicorn.Config(app, log_level="warning", lifespan="off")
            await uvicorn.Server(config).serve(sockets=[listener])
        finally:
            await pool.close()
    return EXIT_OK


async def _open_pool(dsn: str | None) -> asyncpg.Pool[Any]:
    try:
        pool: asyncpg.Pool[Any] = await asyncpg.create_pool(
            dsn, min_size=1, max_size=4, timeout=10
        )
    except CONNECT_ERRORS as exc:
        raise cannot_connect(exc, dsn) from exc
    return pool
