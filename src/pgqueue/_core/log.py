"""The logging port: the standard library's logger or any look-alike."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any, Protocol

__all__ = ["JsonFormatter", "Logger", "default_logger"]


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
