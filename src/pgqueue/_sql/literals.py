"""Python values as the text of SQL array literals, and the claims' places in line.

Arrays other than ``text[]`` cross to the server as text, cast there
(``$1::text::bigint[]``): asyncpg has no built-in codec for them, and looks
their types up on first use with ``set_config('jit', ...)`` calls of
session scope, in transactions of their own; behind a transaction pooler
those settings stay on server connections that other clients then get.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

__all__ = [
    "HEAD_OF_LINE",
    "PRIORITIES",
    "array",
    "booleans",
    "claim_places",
    "pyformat",
    "seconds",
    "timestamps",
]


def array(values: Iterable[int | float]) -> str:
    """An array literal of numbers, for a ``$n::text::int[]`` (or bigint, float8) parameter."""
    return "{" + ",".join(map(repr, values)) + "}"


def seconds(values: Iterable[float | None]) -> str:
    """An array literal of seconds or NULLs, for a ``$n::text::float8[]`` parameter."""
    return "{" + ",".join("NULL" if v is None else repr(v) for v in values) + "}"


def booleans(values: Iterable[bool]) -> str:
    """An array literal of booleans, for a ``$n::text::boolean[]`` parameter."""
    return "{" + ",".join("t" if v else "f" for v in values) + "}"


_MIN = datetime.min.replace(tzinfo=UTC)
_MAX = datetime.max.replace(tzinfo=UTC)


def timestamps(values: Iterable[datetime | None]) -> str:
    """An array literal of aware times, for a ``$n::text::timestamptz[]`` parameter.

    The smallest and largest datetimes stand for ``-infinity`` and
    ``infinity``, as asyncpg writes them.
    """
    return "{" + ",".join(map(_timestamp, values)) + "}"


def _timestamp(value: datetime | None) -> str:
    if value is None:
        return "NULL"
    year = value.year  # compared first: comparing aware datetimes is slow
    if year == 1 and value == _MIN:
        return "-infinity"
    if year == 9999 and value == _MAX:
        return "infinity"
    return value.isoformat()


HEAD_OF_LINE = (datetime.min.replace(tzinfo=UTC), 0)
"""A place before every job of a priority: ('-infinity', 0)."""

PRIORITIES = tuple(range(5, -6, -1))
"""The priorities a job may have, in the order claims take them (highest first)."""


def claim_places(places: Mapping[int, tuple[datetime, int]]) -> tuple[str, str]:
    """CLAIM's $3 and $4: where each priority's line starts (at its head if not in ``places``)."""
    if not places:
        return _HEADS
    starts = [places.get(priority, HEAD_OF_LINE) for priority in PRIORITIES]
    texts = {start[0]: _timestamp(start[0]) for start in starts}  # few distinct times
    return (
        "{" + ",".join([texts[start[0]] for start in starts]) + "}",
        array([start[1] for start in starts]),
    )


_HEADS = (
    timestamps([HEAD_OF_LINE[0]] * len(PRIORITIES)),
    array([HEAD_OF_LINE[1]] * len(PRIORITIES)),
)


@functools.cache
def pyformat(statement: str, names: tuple[str, ...]) -> str:
    """``statement`` with each ``$n`` as ``%(name)s``, ``names[n - 1]``, and ``%`` escaped.

    What psycopg and psycopg2 (Django's cursors too) take, with the
    parameters as a mapping by those names.
    """
    return _PLACEHOLDER.sub(
        lambda match: f"%({names[int(match[1]) - 1]})s", statement.replace("%", "%%")
    )


_PLACEHOLDER = re.compile(r"\$(\d+)")
