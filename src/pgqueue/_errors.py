"""Exceptions raised by pgqueue, and how the worker reads the ones it meets.

The tree::

    PgQueueError
    ├── AlreadyStartedError   run() called twice, or register() after run()
    ├── PayloadTooLargeError  a NOTIFY payload of 8000 bytes or more (also a ValueError)
    └── SchemaError           the table is missing, or lacks what pgqueue needs

    Permanent                 raised by a handler: dead-letter the job at once

Bad input raises the built-in ``TypeError`` or ``ValueError`` before any SQL
runs. Database failures surface as asyncpg's own exceptions.
"""

from __future__ import annotations

import asyncpg

__all__ = [
    "DATABASE_ERRORS",
    "AlreadyStartedError",
    "PayloadTooLargeError",
    "Permanent",
    "PgQueueError",
    "SchemaError",
    "describe",
    "ends_session",
    "is_permanent",
    "is_transient",
    "storable",
]

MAX_ERROR_LENGTH = 4000
"""The most characters of an error message stored in ``last_error``."""


class PgQueueError(Exception):
    """Base class of the errors pgqueue raises itself."""


class AlreadyStartedError(PgQueueError):
    """A worker or subscriber was started twice, or changed after it started."""


class PayloadTooLargeError(PgQueueError, ValueError):
    """A NOTIFY payload is at or over PostgreSQL's 8000-byte limit."""


class SchemaError(PgQueueError):
    """The database lacks the ``pgqueue_jobs`` table, or parts of it pgqueue needs.

    The message names what is missing and how to add it.
    """


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


# What a lost, unreachable or busy database raises: worth retrying later, on a
# new connection. Anything else the server says is about the statement or its
# data, and the same statement would fail again.
DATABASE_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    # Raised for a statement on a connection whose FATAL message (the server
    # ended the session) arrived before the socket closed.
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.TransactionRollbackError,
    asyncpg.InsufficientResourcesError,
    asyncpg.OperatorInterventionError,
    asyncpg.LockNotAvailableError,
)

# Server errors after which the session is still usable.
_SESSION_ENDING_STATES = frozenset({"57P01", "57P02", "57P03", "57P05"})


def is_transient(exc: BaseException) -> bool:
    """Report whether ``exc`` says the database was unreachable or busy, not that it refused."""
    return isinstance(exc, DATABASE_ERRORS)


def ends_session(exc: BaseException) -> bool:
    """Report whether a connection that raised ``exc`` must be dropped."""
    if isinstance(exc, asyncpg.PostgresConnectionError):
        return True
    if isinstance(exc, asyncpg.PostgresError):
        return exc.sqlstate in _SESSION_ENDING_STATES
    return True


def describe(exc: BaseException) -> str:
    """Return ``"Type: message"`` for ``exc``, storable in ``last_error``; never raises."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not lose the attempt
        text = "(its message could not be read)"
    return storable(f"{name}: {text}" if text else name)


def storable(text: str) -> str:
    """Return ``text`` as PostgreSQL ``text`` can hold it: no NUL, valid UTF-8, capped.

    NUL characters become ``\\x00`` and lone surrogates (from a file name or
    outside JSON) ``\\udcXX``; text over `MAX_ERROR_LENGTH` characters is
    cut, with a marker.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > MAX_ERROR_LENGTH:
        kept = MAX_ERROR_LENGTH - 40  # room for the marker
        text = f"{text[:kept]}... ({len(text) - kept} more characters)"
    return text
