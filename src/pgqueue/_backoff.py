"""Retry delays."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TypeAlias

__all__ = ["Backoff", "default_backoff"]

Backoff: TypeAlias = Callable[[int], float]
"""Maps the attempt that just failed (1-based) to seconds before the next one."""


def default_backoff(attempt: int) -> float:
    """Return the delay in seconds before retrying after failed attempt ``attempt``.

    Doubles from 2 s (attempt 1) to 256 s (attempt 8 and later), plus up to
    25% jitter, so no delay exceeds 320 s.
    """
    base = float(2 ** min(max(attempt, 1), 8))
    return base + random.uniform(0.0, base / 4)  # jitter, not cryptography
