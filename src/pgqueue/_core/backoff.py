"""Retry delays of failed jobs: the default backoff, and the guard around a user's."""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from pgqueue._core.log import Logger

__all__ = ["MAX_BACKOFF", "Backoff", "SafeBackoff", "default_backoff"]

Backoff: TypeAlias = Callable[[int], float]
"""Maps the attempt that just failed (1-based) to seconds before the next one."""

MAX_BACKOFF = 365 * 86400.0
"""The longest retry delay, in seconds (a year); longer ones are cut to it."""


def default_backoff(attempt: int) -> float:
    """Return the delay in seconds before retrying after failed attempt ``attempt``.

    Doubles from 2 s (attempt 1) to 256 s (attempt 8 and later), plus up to
    25% jitter, so no delay exceeds 320 s.
    """
    base = float(2 ** min(max(attempt, 1), 8))
    return base + random.uniform(0.0, base / 4)  # jitter, not cryptography


class SafeBackoff:
    """Call a user's backoff and always get a usable delay back.

    A delay that is negative is taken as 0 and one over `MAX_BACKOFF`
    (infinity included) as `MAX_BACKOFF`. A backoff that raises, or returns
    NaN or anything but a number, is replaced by `default_backoff` for that
    attempt. The first such misbehaviour is logged at WARNING, later ones
    are not.
    """

    def __init__(self, backoff: Backoff, logger: Logger) -> None:
        self._backoff = backoff
        self._logger = logger
        self._warned = False

    def __call__(self, attempt: int) -> float:
        """Seconds before retrying after failed attempt ``attempt``; never raises."""
        try:
            value: object = self._backoff(attempt)
        except Exception as exc:
            return self._fallback(attempt, f"it raised {type(exc).__name__}")
        if inspect.iscoroutine(value):
            value.close()  # an async backoff: never awaited, so never run
        if isinstance(value, bool) or not isinstance(value, int | float):
            return self._fallback(attempt, f"it returned a {type(value).__name__}")
        try:
            delay = float(value)
        except OverflowError:  # an int too large for a float
            delay = math.inf
        if math.isnan(delay):
            return self._fallback(attempt, "it returned NaN")
        if 0.0 <= delay <= MAX_BACKOFF:
            return delay
        self._warn(
            f"it returned {delay!r}; using {0.0 if delay < 0 else MAX_BACKOFF:g} s"
        )
        return min(max(delay, 0.0), MAX_BACKOFF)

    def _fallback(self, attempt: int, why: str) -> float:
        self._warn(f"{why}; using pgqueue.default_backoff")
        return default_backoff(attempt)

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            self._logger.warning(
                "backoff gave no usable delay (logged once)", extra={"reason": why}
            )
