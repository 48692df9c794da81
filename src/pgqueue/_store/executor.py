"""What a store runs its statements on: an asyncpg pool or connection, or one of the worker's own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Sequence

    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

__all__ = ["Connection", "Dedicated", "Executor"]

T = TypeVar("T")

Connection: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"
"""An asyncpg connection, or one acquired from a pool."""

Executor: TypeAlias = "asyncpg.Pool[Any] | Connection"
"""An asyncpg pool, or a connection (inside a transaction, writes ride it)."""


class Dedicated(Protocol):
    """A worker's own connection (`pgqueue._wire.dedicated.DedicatedConnection`): a deadline on every statement."""

    async def fetch(self, query: str, *args: object) -> list[asyncpg.Record]: ...

    async def fetchrow(self, query: str, *args: object) -> asyncpg.Record | None: ...

    async def transaction(
        self,
        statements: Sequence[tuple[str, tuple[object, ...]]],
        *,
        stop_if_empty: bool = False,
    ) -> list[list[asyncpg.Record]]: ...

    async def run_in_transaction(
        self, work: Callable[[asyncpg.Connection[Any]], Awaitable[T]]
    ) -> T: ...
