"""The logging port: the standard library's logger or any look-alike, and how pgqueue logs to it.

`log_failure` says a loop's failures in a row (WARNING, then ERROR once
they persist), `hook_failed` a metrics or tracing hook that raised,
`safe_repr` an error whose ``__repr__`` may raise, and `JsonFormatter`
writes records as JSON lines.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any, Protocol

__all__ = [
    "QUIET_FAILURES",
    "JsonFormatter",
    "Logger",
    "default_logger",
    "hook_failed",
    "log_failure",
    "safe_repr",
]

QUIET_FAILURES = 5
"""Consecutive failures logged at WARNING before they are logged at ERROR."""


class Logger(Protocol):
    """What pgqueue needs of a logger; ``logging.Logger`` and structlog's loggers fit.

    pgqueue calls each method with a constant message, ``%``-style
    arguments for it (a message about a job names the job: ``job 12
    (send_email on emails, attempt 2/25) failed; will retry in 4s: ...``),
    and keyword ``extra`` holding stable fields such as ``job_id``,
    ``job_type``, ``queue`` and ``attempt``.
    """

    def debug(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...
    def info(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...
    def warning(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...
    def error(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...


def default_logger(logger: Logger | None) -> Logger:
    """Return ``logger``, or the ``pgqueue`` logger, silent until the app configures logging."""
    return logger if logger is not None else logging.getLogger("pgqueue")


def log_failure(
    logger: Logger, msg: str, exc: BaseException, failures: int, **extra: Any
) -> None:
    """Log the ``failures``-th failure in a row: WARNING at first, ERROR once it persists."""
    log = logger.warning if failures <= QUIET_FAILURES else logger.error
    log(msg, extra={"error": safe_repr(exc), "failures": failures, **extra})


def hook_failed(logger: Logger, hook: object, exc: Exception) -> None:
    """Log that a metrics or tracing hook raised (and was ignored), with its traceback."""
    logger.error(
        "a metrics or tracing hook failed; ignored",
        exc_info=exc,
        extra={"hook": repr(hook)},
    )


def safe_repr(exc: BaseException) -> str:
    """``repr(exc)``, or its type's name when its ``__repr__`` raises."""
    try:
        return repr(exc)
    except Exception:
        return type(exc).__name__


class JsonFormatter(logging.Formatter):
    """Format each record as one line of JSON with every field.

    The object holds ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message`` (with its arguments), ``pid``, every field given in
    ``extra``, and ``traceback`` when the record has one. Values JSON cannot
    hold are written as their ``repr``; control characters are escaped, so a
    record is always one line.
    """

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
        }
        for key, value in vars(record).items():
            if key not in _RECORD_ATTRIBUTES:
                entry.setdefault(key, value)
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=repr)


# What every record has; the rest came in ``extra``.
_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {
    "message",
    "asctime",
    "taskName",
}

# Silent until the application configures logging (no "last resort" output).
logging.getLogger("pgqueue").addHandler(logging.NullHandler())
