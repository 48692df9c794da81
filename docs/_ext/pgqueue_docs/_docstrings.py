"""Google-style docstring sections (``Args:``, ``Attributes:``), read as napoleon reads them."""

from __future__ import annotations

import inspect
import re

__all__ = ["section_entries"]


def section_entries(
    lines: list[str] | str, title: str
) -> tuple[dict[str, list[str]], slice]:
    """The entries of section ``title`` (``"Args"``) of a docstring.

    Returns each name's description (its lines, dedented) and where the
    section lies in ``lines`` (an empty slice when there is none). A
    docstring given as a string is cleaned first (``inspect.cleandoc``).
    """
    if isinstance(lines, str):
        lines = inspect.cleandoc(lines).splitlines()
    entries: dict[str, list[str]] = {}
    start = next(
        (i for i, line in enumerate(lines) if line.strip() == f"{title}:"), None
    )
    if start is None:
        return entries, slice(0, 0)
    indent = len(lines[start]) - len(lines[start].lstrip())
    end, current, body = len(lines), "", 0
    for index in range(start + 1, len(lines)):
        line = lines[index]
        depth = len(line) - len(line.lstrip())
        if line.strip() and depth <= indent:
            end = index
            break
        match = re.match(r"\*{0,2}(\w+)(?: \(.*\))?: ?(.*)", line.strip())
        if match and line.strip() and (not current or depth <= body):
            current, body = match[1], depth
            entries[current] = [match[2]]
        elif current:
            entries[current].append(line[body + 4 :] if line.strip() else "")
    while end > start and not lines[end - 1].strip():
        end -= 1
    return {name: _trimmed(text) for name, text in entries.items()}, slice(start, end)


def _trimmed(lines: list[str]) -> list[str]:
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines
