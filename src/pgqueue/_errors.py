"""Exceptions raised by pgqueue.

The tree::

    PgQueueError
    ├── AlreadyStartedError   run() called twice, or register() after run()
    └── PayloadTooLargeError  a NOTIFY payload of 8000 bytes or more (also a ValueError)

    Permanent                 raised by a handler: dead-letter the job at once

Bad input raises the built-in ``TypeError`` or ``ValueError`` before any SQL
runs. Database failures surface as asyncpg's own exceptions.
"""

from __future__ import annotations

import asyncpg

__all__ = [
    "AlreadyStartedError",
    "PayloadTooLargeError",
    "Permanent",
    "PgQueueError",
    "is_permanent",
]


class PgQueueError(Exception):
    """Base class of the errors pgqueue raises itself."""


class AlreadyStartedError(PgQueueError):
    """A worker or subscriber was started twice, or changed after it started."""


class PayloadTooLargeError(PgQueueError, ValueError):
    """A NOTIFY payload is at or over PostgreSQL's 8000-byte limit."""


class Permanent(Exception):
    """Raised by a handler to dead-letter its job at once, without retries.

    Use it for failures that retrying cannot fix, such as a payload that does
    not parse. Chain the original error to keep it::

        raise pgqueue.Permanent("bad payload") from exc
    """


def is_permanent(exc: BaseException) -> bool:
    """Report whether ``exc`` is, contains or was caused by a `Permanent` error."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, Permanent):
            return True
        if isinstance(current, BaseExceptionGroup) and any(
            is_permanent(inner) for inner in current.exceptions
        ):
            return True
        current = current.__cause__
    return False


# What a lost or refusing database raises; loops log these and retry.
DATABASE_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    # Raised for a statement on a connection whose FATAL message (the server
    # ended the session) arrived before the socket closed.
    asyncpg.InternalClientError,
)
