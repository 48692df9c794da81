"""The logging port: the standard library's logger or any look-alike."""

from __future__ import annotations

import logging
from typing import Any, Protocol

__all__ = ["Logger", "default_logger"]


class Logger(Protocol):
    """What pgqueue needs of a logger; ``logging.Logger`` and structlog's loggers fit.

    pgqueue calls each method with a constant message and keyword ``extra``
    holding stable fields such as ``job_id``, ``job_type``, ``queue`` and
    ``attempt``.
    """

    def debug(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...
    def info(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...
    def warning(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...
    def error(self, msg: str, /, *args: Any, **kwargs: Any) -> Any: ...


def default_logger(logger: Logger | None) -> Logger:
    """Return ``logger``, or the ``pgqueue`` logger, silent until the app configures logging."""
    return logger if logger is not None else logging.getLogger("pgqueue")


# Silent until the application configures logging (no "last resort" output).
logging.getLogger("pgqueue").addHandler(logging.NullHandler())
