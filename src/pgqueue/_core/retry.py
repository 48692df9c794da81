"""The one rule for how long a loop waits after a failure, and how it says so.

Every loop that talks to the database (claims, outcome writes, upkeep,
LISTEN) waits ``retry_delay(failures, cap)`` after its ``failures``-th
failure in a row: 50 ms doubling up to ``cap``, times a jitter from 0.5 to 1
so that workers do not retry in step. The exponent stops growing long before
a float could overflow, so an outage of any length is waited out. Such a
loop keeps its count in a `Failures`.
"""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING, Any, Protocol

from pgqueue._core.errors import describe, is_outage
from pgqueue._core.log import log_failure, safe_repr

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from pgqueue._core.log import Logger

__all__ = [
    "FIRST_RETRY_DELAY",
    "MAX_RETRY_WAIT",
    "Failures",
    "Outage",
    "Part",
    "retry_delay",
]

FIRST_RETRY_DELAY = 0.05
"""Seconds before the first retry (before jitter)."""

MAX_RETRY_WAIT = 5.0
"""The longest wait between two attempts of a loop, unless its cap is lower."""

# 0.05 * 2**20 is about 14.6 hours: beyond every cap, far from overflowing.
_MAX_EXPONENT = 20


def retry_delay(failures: int, cap: float = MAX_RETRY_WAIT) -> float:
    """Seconds to wait after the ``failures``-th failure in a row (1-based)."""
    exponent = min(max(failures, 1) - 1, _MAX_EXPONENT)
    return min(cap, FIRST_RETRY_DELAY * 2.0**exponent) * random.uniform(
        0.5, 1.0
    )  # jitter, not cryptography


class Part(Protocol):
    """What `Failures.of` reads of an engine part."""

    @property
    def logger(self) -> Logger: ...

    @property
    def fields(self) -> Mapping[str, object]: ...


class Failures:
    """The failures in a row of one loop: logs each, and says how long to wait.

    ``failed`` after an attempt that failed, ``succeeded`` after one that
    did not. Each failure is logged with ``msg`` and ``fields`` by
    `log_failure` (WARNING, then ERROR once it persists); the wait after it
    is ``retry_delay(count, cap)``. With ``quiet`` (true, or a function
    saying whether), a failure that is an outage (`is_outage`) is logged at
    DEBUG: an `Outage` says it once for the whole outage.
    """

    __slots__ = ("_cap", "_fields", "_logger", "_msg", "_quiet", "count")

    @classmethod
    def of(cls, part: Part, msg: str) -> Failures:
        """An engine part's loop's failures: quiet, logged with the part's logger and fields."""
        return cls(part.logger, msg, fields=part.fields, quiet=True)

    def __init__(
        self,
        logger: Logger,
        msg: str,
        *,
        cap: float = MAX_RETRY_WAIT,
        fields: Mapping[str, Any] | None = None,
        quiet: bool | Callable[[], bool] = False,
    ) -> None:
        self._logger = logger
        self._msg = msg
        self._cap = cap
        self._fields = fields or {}
        self._quiet = quiet
        self.count = 0
        """Failures since the last success."""

    def failed(self, exc: BaseException, msg: str | None = None, **extra: Any) -> float:
        """Count and log ``exc`` (as ``msg`` if given); the seconds to wait before retrying."""
        self.count += 1
        quiet = self._quiet() if callable(self._quiet) else self._quiet
        if quiet and is_outage(exc):
            self._logger.debug(
                self._msg if msg is None else msg,
                extra={
                    "error": safe_repr(exc),
                    "failures": self.count,
                    **self._fields,
                    **extra,
                },
            )
            return retry_delay(self.count, self._cap)
        log_failure(
            self._logger,
            self._msg if msg is None else msg,
            exc,
            self.count,
            **self._fields,
            **extra,
        )
        return retry_delay(self.count, self._cap)

    def counted(self) -> float:
        """Count a failure its caller logs itself; the seconds to wait before retrying."""
        self.count += 1
        return retry_delay(self.count, self._cap)

    def succeeded(self) -> None:
        """Start counting again from zero."""
        self.count = 0

    def pause(self, interval: float) -> float:
        """Seconds until the next attempt of a loop that runs every ``interval``.

        ``interval`` after a success; after failures, the retry delay
        capped at ``interval`` (a failure never makes the loop slower).
        """
        return retry_delay(self.count, interval) if self.count else interval


class Outage:
    """Says once that the database became unavailable, and once that it is back.

    The parts that talk to the database (a worker's claim, write and upkeep
    connections, its LISTEN connection) report to it: ``down`` when a
    statement or a connect failed with an outage (`is_outage`), ``up`` when
    one succeeded. The first ``down`` while every part was up logs one
    WARNING naming the server (``user@host:port/database``, never a
    password) and the error; the outage lasts until every part that went
    down is up again, which logs one INFO line with how long it lasted.
    The parts' own retries are logged at DEBUG meanwhile (`Failures`,
    ``quiet``).
    """

    def __init__(
        self,
        logger: Logger,
        *,
        fields: Mapping[str, Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._fields = dict(fields or {})
        self._clock = clock
        self._down: set[object] = set()
        self._since = 0.0

    @property
    def ongoing(self) -> bool:
        """Whether the database is unavailable (some part is down)."""
        return bool(self._down)

    def down(self, part: object, exc: BaseException, where: str) -> None:
        """``part`` failed with an outage while talking to ``where``."""
        if not self._down:
            self._since = self._clock()
            self._logger.warning(
                "database %s unavailable (%s); retrying until it is back",
                where,
                describe(exc),
                extra={"database": where, "error": describe(exc), **self._fields},
            )
        self._down.add(part)

    def up(self, part: object, where: str) -> None:
        """``part`` talked to ``where`` again."""
        if part not in self._down:
            return
        self._down.discard(part)
        if not self._down:
            seconds = round(self._clock() - self._since, 3)
            self._logger.info(
                "database %s available again after %.1f s",
                where,
                seconds,
                extra={"database": where, "seconds": seconds, **self._fields},
            )
