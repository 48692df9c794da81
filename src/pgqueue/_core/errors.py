"""Exceptions raised by pgqueue, and how the worker reads the ones it meets.

The tree::

    PgQueueError
    ├── AlreadyStartedError   run() called twice, or register() after run()
    ├── DuplicateJobError     enqueue(on_conflict="raise") met a live job with the key
    ├── JobNotFoundError      no job has that id (also a LookupError)
    ├── JobStateError         the job's status does not allow the change (Admin.update)
    ├── PayloadTooLargeError  a NOTIFY payload of 8000 bytes or more (also a ValueError)
    ├── SchemaError           the table is missing, or lacks what pgqueue needs
    └── TrackerClosedError    a Tracker wait on a tracker that is not open

    The extras' errors are PgQueueErrors too: pgqueue.testing's
    ServerUnavailableError (also a RuntimeError), pgqueue.django's
    TaskFailed and JobFailed.

    ├── WaitTimeout           a durable handler's wait ran out of time
    └── ChildFailed           a durable handler's child job ended dead or cancelled

    Raised by handlers, to say how their job ends:
    Permanent                 dead-letter the job at once
    RetryAfter                fail this attempt; retry after these seconds
    Snooze                    run again after these seconds; no attempt used

    Raised to a durable handler (BaseExceptions: an ``except Exception``
    does not swallow them):
    RunSuperseded             this run no longer holds its attempt

Bad input raises the built-in ``TypeError`` or ``ValueError`` before any SQL
runs. Database failures surface as asyncpg's own exceptions.
"""

from __future__ import annotations

import asyncpg

__all__ = [
    "DATABASE_ERRORS",
    "AlreadyStartedError",
    "ChildFailed",
    "DuplicateJobError",
    "JobNotFoundError",
    "JobStateError",
    "PayloadTooLargeError",
    "Permanent",
    "PgQueueError",
    "RetryAfter",
    "RunSuperseded",
    "SchemaError",
    "Snooze",
    "Suspended",
    "TrackerClosedError",
    "WaitTimeout",
    "describe",
    "ends_session",
    "is_outage",
    "is_permanent",
    "is_transient",
    "schema_fix",
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


class DuplicateJobError(PgQueueError):
    """A job of the same type and unique key is already pending or running.

    Attributes:
        job_id: the existing job's id.
        unique_key: the key.
    """

    def __init__(self, job_id: int, unique_key: str) -> None:
        super().__init__(
            f"job {job_id} with unique key {unique_key!r} is pending or running"
        )
        self.job_id = job_id
        self.unique_key = unique_key


class JobNotFoundError(PgQueueError, LookupError):
    """No job has this id (it never existed, or was pruned).

    Attributes:
        job_id: the id.
    """

    def __init__(self, job_id: int) -> None:
        super().__init__(f"no job has id {job_id}")
        self.job_id = job_id


class JobStateError(PgQueueError):
    """A job's status does not allow the change asked of it: `Admin.update` of a job no longer pending or waiting.

    Attributes:
        job_id: the job's id.
        status: its status when the change was refused (``"running"`` for
            a job a worker claimed meanwhile).
    """

    def __init__(self, job_id: int, status: str, allowed: str) -> None:
        super().__init__(f"job {job_id} is {status}: {allowed}")
        self.job_id = job_id
        self.status = status


class SchemaError(PgQueueError):
    """The database lacks the ``pgqueue_jobs`` table, or parts of it pgqueue needs.

    The message names the database (``user@host:port/database``, never a
    password) followed by what is missing and how to add it.

    Attributes:
        summary: what is missing and how to add it, on one line, without
            the database (for a page a viewer sees).
        where: the database, ``user@host:port/database``; None when it
            cannot be told (an executor pgqueue does not know).
        missing: what is missing, without how to add it.
        apply: the statement that adds it, ``"SCHEMA"`` or
            ``"SCHEMA_UPGRADE"``; None when the message says something else.
    """

    def __init__(
        self, summary: str, *, where: str | None = None, apply: str | None = None
    ) -> None:
        self.missing = summary
        self.apply = apply
        if apply is not None:
            summary = f"{summary}: {schema_fix(apply)}"
        super().__init__(summary if where is None else f"{where}: {summary}")
        self.summary = summary
        self.where = where

    def fixed_by(self, fix: str) -> str:
        """The message with ``fix`` as how to add what is missing (a command line's, a framework's)."""
        if self.apply is None:
            return str(self)
        summary = f"{self.missing}: {fix}"
        return summary if self.where is None else f"{self.where}: {summary}"


def schema_fix(apply: str) -> str:
    """How Python code adds what ``pgqueue.<apply>`` creates."""
    return f"apply pgqueue.{apply} in a migration (or await pgqueue.install(pool))"


class TrackerClosedError(PgQueueError):
    """`Tracker.wait` called on a tracker that is not open, or pending when it closed."""


class WaitTimeout(PgQueueError):
    """A durable handler's `Job.wait_for` or `Job.wait_child` ran out of time.

    Raised in the run after the deadline (the job is woken at it), and again
    in every later run at the same wait: the handler may catch it.

    Attributes:
        what: what was waited for: ``"signal <name>"`` or ``"child <id>"``.
    """

    def __init__(self, what: str) -> None:
        super().__init__(f"the wait for {what} timed out")
        self.what = what


class ChildFailed(PgQueueError):
    """The child job a durable handler waited for (`Job.wait_child`) ended dead or cancelled.

    Attributes:
        child_id: the child's id.
        status: how it ended, ``"dead"`` or ``"cancelled"``.
        error: its last error (None if it has none).
    """

    def __init__(self, child_id: int, status: str, error: str | None) -> None:
        super().__init__(
            f"child job {child_id} is {status}: {error or 'no error recorded'}"
        )
        self.child_id = child_id
        self.status = status
        self.error = error


class RunSuperseded(BaseException):
    """This run of a durable handler no longer holds its attempt: nothing it writes lands.

    Raised by `Job.step`, `Job.sleep`, `Job.wait_for`, `Job.spawn`,
    `Job.wait_child` and `Job.progress` when their fenced write matched
    nothing: the run was rescued while it looked orphaned (its job may run
    again elsewhere), or has ended. A ``BaseException``, so that an
    ``except Exception`` around a step does not swallow it by accident; let
    it propagate (the worker ends the run quietly, writing nothing).

    Attributes:
        job_id: the job's id.
        attempt: the attempt this run held.
    """

    def __init__(self, job_id: int, attempt: int) -> None:
        super().__init__(
            f"job {job_id}: the run of attempt {attempt} was superseded; its writes do not land"
        )
        self.job_id = job_id
        self.attempt = attempt


class Suspended(BaseException):
    """A durable handler's run ends here, its job already written to wake later (internal).

    Raised by `Job.sleep`, `Job.wait_for` and `Job.wait_child` after their
    fenced write; the worker ends the run without an outcome write.
    ``seconds``: until the job is due (None: parked until what it waits for
    comes); ``what``: for the log.
    """

    def __init__(self, what: str, seconds: float | None) -> None:
        super().__init__(what)
        self.what = what
        self.seconds = seconds


class Permanent(Exception):
    """Raised by a handler to dead-letter its job at once, without retries.

    Use it for failures that retrying cannot fix, such as a payload that does
    not parse. Chain the original error to keep it::

        raise pgqueue.Permanent("bad payload") from exc
    """


class Snooze(Exception):
    """Raised by a handler to run its job again after ``seconds``, using up no attempt.

    The job goes back to pending at ``now() + seconds`` with its attempt
    given back, and ``job.snoozes`` counts the snoozes: a job can snooze
    any number of times without being dead-lettered.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = _delay("Snooze", seconds)
        super().__init__(f"snoozed for {self.seconds:g} s")


class RetryAfter(Exception):
    """Raised by a handler to fail the attempt and retry after exactly ``seconds``.

    Like any exception it uses up an attempt (dead when they are used up),
    but its delay replaces the worker's backoff: an HTTP 429 with a
    Retry-After header, say.
    """

    def __init__(self, seconds: float, message: str = "") -> None:
        self.seconds = _delay("RetryAfter", seconds)
        super().__init__(message or f"retry after {self.seconds:g} s")


def _delay(what: str, seconds: object) -> float:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        msg = f"{what} takes a number of seconds, not {type(seconds).__name__}"
        raise TypeError(msg)
    delay = float(seconds)
    if not 0 <= delay < float("inf"):
        msg = f"{what} takes a finite, non-negative number of seconds, got {seconds!r}"
        raise ValueError(msg)
    return delay


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


# What a lost, unreachable, busy or read-only database raises: worth retrying
# later, on a new connection. Anything else the server says is about the
# statement or its data, and the same statement would fail again.
DATABASE_ERRORS: tuple[type[Exception], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    # Raised for a statement on a connection whose FATAL message (the server
    # ended the session) arrived before the socket closed, and when no host
    # of a multi-host DSN matches its target_session_attrs.
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.TransactionRollbackError,
    asyncpg.InsufficientResourcesError,
    asyncpg.OperatorInterventionError,
    asyncpg.LockNotAvailableError,
    # 25006: a standby, a demoted primary, default_transaction_read_only.
    asyncpg.ReadOnlySQLTransactionError,
)

# The server cannot serve this session (shutting down, starting up, crashed,
# or unable to write): the database is unavailable, not the statement wrong.
_OUTAGE_STATES = frozenset({"25006", "57P01", "57P02", "57P03"})

# Server errors after which the session is not usable (or, read-only, not
# worth keeping: a new connection through a multi-host DSN finds the primary).
_SESSION_ENDING_STATES = _OUTAGE_STATES | {"57P05"}

_UNREACHABLE: tuple[type[Exception], ...] = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,  # the 08xxx class
)


def is_transient(exc: BaseException) -> bool:
    """Report whether ``exc`` says the database was unreachable, busy or read-only, not that it refused."""
    return isinstance(exc, DATABASE_ERRORS)


def is_outage(exc: BaseException) -> bool:
    """Report whether ``exc`` says the database is unavailable (an outage), not just busy.

    A lost or refused connection, a statement deadline, the 08xxx class, a
    server shutting down or starting up (57P01, 57P02, 57P03) or unable to
    write (25006). A deadlock or a lock timeout is transient, not an outage.
    """
    if isinstance(exc, _UNREACHABLE):
        return True
    return isinstance(exc, asyncpg.PostgresError) and exc.sqlstate in _OUTAGE_STATES


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
