"""A restartable embedded PostgreSQL for the fault tests, built on `pgqueue.testing`'s cluster."""

from __future__ import annotations

import time

from pgqueue.testing._server import (
    EmbeddedCluster,
    ServerUnavailableError,
    _stop_postmaster,
)

__all__ = ["EmbeddedServer"]

_START_ATTEMPTS = 5


class EmbeddedServer(EmbeddedCluster):
    """An embedded cluster that can be stopped and started again on the same port and data directory.

    Clients reconnect to the same DSN after a restart and find their data.
    Entering starts it, leaving stops it and removes its files, as
    `EmbeddedCluster`.

    Usage::

        with EmbeddedServer() as server:
            ...  # connect to server.dsn
            server.restart(immediate=True)  # a crash, then crash recovery
    """

    @property
    def is_running(self) -> bool:
        """Whether the postmaster is up."""
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
            msg = "enter the server before starting it again"
            raise RuntimeError(msg)
        for attempt in range(1, _START_ATTEMPTS + 1):
            if self.launch(self.port):
                return
            time.sleep(0.2 * attempt)
        msg = f"PostgreSQL could not listen on port {self.port} again in {_START_ATTEMPTS} attempts"
        raise ServerUnavailableError(msg)

    def stop(self, *, immediate: bool = False) -> None:
        """Stop the server; keep its data.

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
