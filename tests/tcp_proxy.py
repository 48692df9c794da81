"""A TCP proxy for tests that can make its connections half-open, refuse them, or hold them.

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

The other faults:

- ``freeze(matching=b"...")``: from now on, freeze every connection, open or
  new, the moment its client sends those bytes (say, the text of one SQL
  statement, which a client sends when it prepares it), until `thaw`.
- `refuse`: close every live connection (frozen ones stay half-open) and
  stop listening, so that new ones are refused (a server that is down),
  until `accept` listens again on the same port.
- `hold`: new connections wait, neither forwarded nor closed (a server that
  is slow to answer), until `release`.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import anyio
from anyio.abc import SocketAttribute

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from contextlib import AbstractAsyncContextManager

    from anyio.abc import ByteStream, SocketStream, TaskStatus

__all__ = ["TcpProxy", "proxy_to", "tcp_proxy", "via"]

_LOST = (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


class _Pair:
    """One proxied connection: the client's socket and ours to the target."""

    def __init__(self, scope: anyio.CancelScope) -> None:
        self.frozen = False
        self.scope = scope
        self.tail = b""  # the client's last bytes, for a pattern across reads


class TcpProxy:
    """Forwards connections from ``127.0.0.1:port`` to a target; see `tcp_proxy`."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port = 0
        """The local port to connect to (known once the proxy runs)."""
        self.accepted = 0
        """How many connections the proxy has accepted."""
        self.frozen_by_pattern = 0
        """How many connections a `freeze` pattern froze."""
        self.received = 0
        """How many bytes the target sent to clients (through the proxy)."""
        self._pairs: set[_Pair] = set()
        self._scope = anyio.CancelScope()
        self._listening = anyio.CancelScope()
        self._accepting = anyio.Event()
        self._accepting.set()
        self._pattern: bytes | None = None
        self._released = anyio.Event()
        self._released.set()

    @property
    def live(self) -> int:
        """How many accepted connections are open (frozen ones included)."""
        return len(self._pairs)

    def freeze(self, matching: bytes | None = None) -> None:
        """Stop forwarding on open connections, in both directions, closing none.

        With ``matching``, freeze instead each connection (open or new) whose
        client sends those bytes, from now until `thaw`; the bytes are not
        forwarded.
        """
        if matching is None:
            for pair in self._pairs:
                pair.frozen = True
        else:
            self._pattern = matching

    def thaw(self) -> None:
        """Stop freezing by pattern (frozen connections stay frozen)."""
        self._pattern = None

    def refuse(self) -> None:
        """Close every live connection and stop listening, until `accept`."""
        for pair in self._pairs:
            if not pair.frozen:
                pair.scope.cancel()
        self._accepting = anyio.Event()
        self._listening.cancel()

    def accept(self) -> None:
        """Listen again, on the same port."""
        self._accepting.set()

    def hold(self) -> None:
        """Make new connections wait (not forwarded, not closed) until `release`."""
        self._released = anyio.Event()

    def release(self) -> None:
        """Forward the held connections, and new ones."""
        self._released.set()

    def close(self) -> None:
        """Stop accepting and close every connection (the context's exit waits for it)."""
        self._scope.cancel()

    async def _serve(
        self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        with self._scope:
            async with anyio.create_task_group() as connections:
                while True:
                    await self._accepting.wait()
                    listener = await anyio.create_tcp_listener(
                        local_host="127.0.0.1", local_port=self.port
                    )
                    self.port = listener.extra(SocketAttribute.local_port)
                    async with listener:
                        with anyio.CancelScope() as self._listening:
                            task_status.started()
                            task_status = anyio.TASK_STATUS_IGNORED
                            await listener.serve(self._forward, connections)

    async def _forward(self, client: SocketStream) -> None:
        self.accepted += 1
        async with client:
            await self._released.wait()
            try:
                upstream = await anyio.connect_tcp(self.target_host, self.target_port)
            except OSError:
                return
            async with upstream:
                pair = _Pair(anyio.CancelScope())
                self._pairs.add(pair)
                try:
                    with pair.scope:
                        async with anyio.create_task_group() as tg:
                            tg.start_soon(self._pump, client, upstream, pair, True)
                            tg.start_soon(self._pump, upstream, client, pair, False)
                finally:
                    self._pairs.discard(pair)

    async def _pump(
        self, source: ByteStream, sink: ByteStream, pair: _Pair, from_client: bool
    ) -> None:
        with contextlib.suppress(*_LOST):
            async for chunk in source:
                if from_client and not pair.frozen and self._matches(pair, chunk):
                    pair.frozen = True
                    self.frozen_by_pattern += 1
                if not pair.frozen:
                    if not from_client:
                        self.received += len(chunk)
                    await sink.send(chunk)
        if not pair.frozen:
            pair.scope.cancel()  # one end closed: close the other, as TCP would

    def _matches(self, pair: _Pair, chunk: bytes) -> bool:
        pattern = self._pattern
        if pattern is None:
            pair.tail = b""
            return False
        seen = pair.tail + chunk
        pair.tail = seen[-len(pattern) :]
        return pattern in seen


@contextlib.asynccontextmanager
async def tcp_proxy(target_host: str, target_port: int) -> AsyncIterator[TcpProxy]:
    """Run a proxy to ``target_host:target_port`` on a free port of 127.0.0.1.

    On exit every connection is closed, frozen ones included.
    """
    proxy = TcpProxy(target_host, target_port)
    async with anyio.create_task_group() as tg:
        await tg.start(proxy._serve)
        try:
            yield proxy
        finally:
            proxy.close()


def proxy_to(dsn: str) -> AbstractAsyncContextManager[TcpProxy]:
    """A proxy to the server of ``dsn``, run in the test's own task.

    Not a fixture: pytest-asyncio sets fixtures up and tears them down in
    different tasks, and a task group cannot span that.
    """
    parts = urlsplit(dsn)
    assert parts.hostname is not None
    return tcp_proxy(parts.hostname, parts.port or 5432)


def via(dsn: str, port: int) -> str:
    """``dsn`` with its host and port replaced by the proxy's (at ``port``)."""
    parts = urlsplit(dsn)
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))
