"""Short text for people: durations, first lines and names, shared by the terminal and the browser."""

from __future__ import annotations

__all__ = [
    "CONTROL_CHARACTERS",
    "SHOWN_NAME_CHARS",
    "clip",
    "clipped",
    "first_line",
    "printable",
    "run_time_text",
    "seconds_text",
    "shown_name",
]

SHOWN_NAME_CHARS = 200
"""The most characters of a queue name, job type or unique key an operator surface shows.

A longer name (of a queue: up to 1,024 bytes; or one written past the
limits by another client) is cut and marked as cut.
"""

CONTROL_CHARACTERS = (
    *(chr(code) for code in range(0x20) if code != 0x09),
    *(chr(code) for code in range(0x7F, 0xA0)),
    *(chr(code) for code in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))),
)
"""Characters a terminal acts on rather than shows: C0 controls but tab, DEL,
C1 controls, and the bidi controls that reorder what follows them."""

_NAMED = {"\n": "\\n", "\r": "\\r"}
_PRINTABLE = str.maketrans(
    {
        char: _NAMED.get(char)
        or (f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")
        for char in CONTROL_CHARACTERS
    }
)
_KEEP_NEWLINES = str.maketrans({**_PRINTABLE, ord("\n"): "\n"})


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


def run_time_text(seconds: float | None) -> str:
    """A handler's run time: 0.84ms, 12ms, 2.5s, 1h06m; "-" for None."""
    if seconds is None:
        return "-"
    if seconds < 0.01:
        return f"{seconds * 1000:.2g}ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f}ms"
    return seconds_text(seconds)


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


def clipped(name: str, limit: int = SHOWN_NAME_CHARS) -> tuple[str, bool]:
    """``name``'s first ``limit`` characters, and whether it had more."""
    return name[:limit], len(name) > limit


def shown_name(name: str, limit: int = SHOWN_NAME_CHARS) -> str:
    """``name`` as a line of text shows it: `printable`, cut at ``limit`` characters and then marked ``…(cut)``."""
    head, cut = clipped(name, limit)
    return printable(head) + ("…(cut)" if cut else "")


def printable(text: str, *, newlines: bool = False) -> str:
    """``text`` with the characters a terminal would act on shown escaped.

    C0 controls but tab, DEL, C1 controls and bidi controls become ``\\x1b``,
    ``\\n``, ``\\u202e`` and the like, so that a job's field can neither move
    the cursor, set the title or the clipboard, nor forge a line of output.
    ``newlines`` keeps line feeds (a traceback's lines).
    """
    return text.translate(_KEEP_NEWLINES if newlines else _PRINTABLE)
