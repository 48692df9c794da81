"""Opening connections of pgqueue's own, outside the application's pool.

A pool's own connect arguments and ``init`` hook are reached here, and only
here: asyncpg has no public way to open a connection like its pool's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeAlias

import asyncpg

from pgqueue._core.dsn import check_dsn

__all__ = ["Connect", "connect_like"]


Connect: TypeAlias = Callable[[], Awaitable["asyncpg.Connection[Any]"]]


def connect_like(
    pool_or_dsn: asyncpg.Pool[Any] | str,
    settings: Mapping[str, str] | None = None,
    *,
    shared: bool = False,
) -> Connect:
    """Return a function that opens a new, unpooled connection.

    For a pool, the connection uses the pool's own connect arguments (and
    its ``init`` hook) but is never handed back to the pool. A DSN asyncpg
    would misread raises `ValueError` (`check_dsn`) here. ``settings``
    are sent as startup parameters (the application's own ``server_settings``
    win); a server or pooler that refuses one of them (PgBouncer refuses
    parameters it does not know) gets a connection without them, from then on.
    With ``shared``, ``settings`` (a dict) is read at each connect, not
    copied: its owner may change it (`pgqueue._wire.dedicated.Mode`).
    """
    if isinstance(pool_or_dsn, str):
        check_dsn(pool_or_dsn)
    extra: dict[str, str] = (
        settings if shared and isinstance(settings, dict) else dict(settings or {})
    )

    async def connect() -> asyncpg.Connection[Any]:
        if extra:
            try:
                return await _open(pool_or_dsn, extra)
            except asyncpg.PostgresError as exc:
                if not any(name in str(exc) for name in extra):
                    raise
                extra.clear()
        return await _open(pool_or_dsn, {})

    return connect


async def _open(
    pool_or_dsn: asyncpg.Pool[Any] | str, settings: dict[str, str]
) -> asyncpg.Connection[Any]:
    if isinstance(pool_or_dsn, str):
        return await asyncpg.connect(pool_or_dsn, server_settings=settings or None)
    pool = pool_or_dsn
    if not settings:
        # asyncpg has no public way to open a connection with a pool's
        # settings; this private method does exactly that without adopting it.
        connection: asyncpg.Connection[Any] = await pool._get_new_connection()  # type: ignore[attr-defined]
        return connection
    # The same as the pool's _get_new_connection, with startup parameters added.
    kwargs: dict[str, Any] = dict(pool._connect_kwargs)  # type: ignore[attr-defined]
    kwargs["server_settings"] = {**settings, **(kwargs.get("server_settings") or {})}
    connect = getattr(pool, "_connect", asyncpg.connect)  # asyncpg < 0.30 has none
    connection = await connect(
        *pool._connect_args,  # type: ignore[attr-defined]
        loop=pool._loop,  # type: ignore[attr-defined]
        connection_class=pool._connection_class,  # type: ignore[attr-defined]
        record_class=pool._record_class,  # type: ignore[attr-defined]
        **kwargs,
    )
    init = pool._init  # type: ignore[attr-defined]
    if init is not None:
        try:
            await init(connection)
        except BaseException:
            connection.terminate()
            raise
    return connection
