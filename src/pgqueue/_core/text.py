"""Short text for people: durations and first lines, shared by the terminal and the browser."""

from __future__ import annotations

__all__ = ["clip", "first_line", "seconds_text"]


def seconds_text(seconds: float | None) -> str:
    """A short duration: 0.4s, 12s, 3m05s, 2h03m, 3d04h; "-" for None."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{whole // 86400}d{whole % 86400 // 3600:02d}h"


def first_line(text: str | None) -> str | None:
    """The first line of ``text``, stripped (None for None)."""
    if text is None:
        return None
    lines = text.strip().splitlines()
    return lines[0] if lines else ""


def clip(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters, saying how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"
