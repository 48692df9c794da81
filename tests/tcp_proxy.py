"""A TCP proxy for tests that can make its connections half-open.

Usage::

    async with tcp_proxy("127.0.0.1", 5432) as proxy:
        dsn = f"postgresql://postgres@127.0.0.1:{proxy.port}/test"
        ...
        proxy.freeze()  # existing connections go silent; new ones work

A frozen connection stays open at both ends, but the proxy forwards nothing
more in either direction: what either end sends is read and dropped, and
neither end learns that the other is gone, not even when one of them closes.
That is a half-open connection as a dead NAT entry, a pulled cable or a
frozen virtual machine leaves it: only a timeout on a request can find it.
Connections accepted after `TcpProxy.freeze` forward normally.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import anyio
from anyio.abc import SocketAttribute

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from anyio.abc import ByteStream, Listener, SocketStream, TaskStatus

__all__ = ["TcpProxy", "tcp_proxy"]

_LOST = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


class _Pair:
    """One proxied connection: the client's socket and ours to the target."""

    def __init__(self) -> None:
        self.frozen = False


class TcpProxy:
    """Forwards connections from ``127.0.0.1:port`` to a target; see `tcp_proxy`."""

    def __init__(self, target_host: str, target_port: int, port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port = port
        """The local port to connect to."""
        self.accepted = 0
        """How many connections the proxy has accepted."""
        self._pairs: set[_Pair] = set()
        self._scope = anyio.CancelScope()

    @property
    def live(self) -> int:
        """How many accepted connections are open (frozen ones included)."""
        return len(self._pairs)

    def freeze(self) -> None:
        """Stop forwarding on every open connection, in both directions, closing none."""
        for pair in self._pairs:
            pair.frozen = True

    def close(self) -> None:
        """Stop accepting and close every connection (the context's exit waits for it)."""
        self._scope.cancel()

    async def _serve(
        self,
        listener: Listener[SocketStream],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        with self._scope:
            task_status.started()
            await listener.serve(self._forward)

    async def _forward(self, client: SocketStream) -> None:
        self.accepted += 1
        async with client:
            try:
                upstream = await anyio.connect_tcp(self.target_host, self.target_port)
            except OSError:
                return
            async with upstream:
                pair = _Pair()
                self._pairs.add(pair)
                try:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(_pump, client, upstream, pair, tg.cancel_scope)
                        tg.start_soon(_pump, upstream, client, pair, tg.cancel_scope)
                finally:
                    self._pairs.discard(pair)


async def _pump(
    source: ByteStream, sink: ByteStream, pair: _Pair, both: anyio.CancelScope
) -> None:
    with contextlib.suppress(*_LOST):
        async for chunk in source:
            if not pair.frozen:
                await sink.send(chunk)
    if not pair.frozen:
        both.cancel()  # one end closed: close the other, as TCP would


@contextlib.asynccontextmanager
async def tcp_proxy(target_host: str, target_port: int) -> AsyncIterator[TcpProxy]:
    """Run a proxy to ``target_host:target_port`` on a free port of 127.0.0.1.

    On exit every connection is closed, frozen ones included.
    """
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    proxy = TcpProxy(
        target_host, target_port, listener.extra(SocketAttribute.local_port)
    )
    async with listener, anyio.create_task_group() as tg:
        await tg.start(proxy._serve, listener)
        try:
            yield proxy
        finally:
            proxy.close()
