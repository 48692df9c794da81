"""The dashboard's pages: Jinja2 templates (``templates/``), escaped by construction.

Every template is rendered with autoescape on, so every value is escaped
where it is put into the page unless a template says ``|safe`` (none does);
no HTML is built in Python. Values from the database are also shown through
the ``v`` macro, which wraps them in ``<bdi>`` (a right-to-left override in a
job type cannot reorder the text around it) and shows their control
characters (bidi controls, C0 and C1) as ``U+XXXX`` rather than letting them
act; names (queues, job types, keys) through the ``name`` macro, which also
cuts them at `SHOWN_NAME_CHARS` characters and marks the cut. Links are
built from the mount's root path (``base``), so the dashboard works under
any prefix.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlencode

import jinja2

from pgqueue import Status
from pgqueue._extension import (
    QUEUE_COUNTS,
    SHOWN_NAME_CHARS,
    check_queue_name,
    clipped,
    seconds_text,
)

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

__all__ = ["Value", "render", "url"]

"""The counts of the queues table, in its order."""

_CONTROLS = re.compile(
    "([\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069])"
)
"""Characters shown as ``U+XXXX``: C0 but tab and line ends, DEL, C1, the bidi controls."""


class Value(NamedTuple):
    """A value from the database inside a sentence (a confirmation's question)."""

    text: str


def url(base: str, path: str, params: Mapping[str, object | None] | None = None) -> str:
    """The URL of ``path`` under the mount, with the params that are not None (not escaped).

    A list's items are each a param of that name (``where=a&where=b``).
    """
    query = {
        k: [str(item) for item in v] if isinstance(v, list) else str(v)
        for k, v in (params or {}).items()
        if v is not None
    }
    return base + path + ("?" + urlencode(query, doseq=True) if query else "")


def _parts(value: object) -> Iterator[tuple[str, bool]]:
    """``value``'s text in pieces: (text, False), or (``U+XXXX``, True) for a control."""
    for index, piece in enumerate(_CONTROLS.split(str(value))):
        if index % 2:
            yield f"U+{ord(piece):04X}", True
        elif piece:
            yield piece, False


def _visible(value: object) -> str:
    """``value`` with its control characters written ``U+XXXX`` (for an attribute)."""
    return _CONTROLS.sub(lambda found: f"U+{ord(found[1]):04X}", str(value))


def _moment(value: datetime | None) -> tuple[str | None, str]:
    """A time as (ISO 8601 for ``<time datetime>``, or None; the text shown), in UTC."""
    if value is None:
        return None, "-"
    if value.year in (1, 9999) and value.replace(tzinfo=None) in (
        datetime.min,
        datetime.max,
    ):
        return (
            None,
            "-infinity" if value.year == 1 else "infinity",
        )  # as asyncpg reads them
    utc = value.astimezone(UTC) if value.tzinfo is not None else value
    return utc.isoformat(), utc.strftime("%Y-%m-%d %H:%M:%S UTC")


def _pretty(text: str, truncated: bool = False) -> str:
    """JSON text indented for reading; a cut one (no longer JSON) as it is."""
    if truncated:
        return text
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def _linkable(name: str) -> bool:
    """Whether a listing can be filtered by queue ``name`` (one written past pgqueue's limits cannot)."""
    try:
        check_queue_name(name)
    except ValueError:
        return False
    return True


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pgqueue.web", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        auto_reload=False,
    )
    env.filters.update(
        parts=_parts,
        clipped=clipped,
        visible=_visible,
        moment=_moment,
        pretty=_pretty,
        seconds=seconds_text,
        rate=_rate,
        thousands="{:,}".format,
        short="{:g}".format,
    )
    env.tests["value"] = lambda part: isinstance(part, Value)
    env.tests["linkable"] = _linkable
    env.globals["counts"] = QUEUE_COUNTS
    env.globals["Status"] = Status
    env.globals["name_chars"] = SHOWN_NAME_CHARS
    return env


_ENV = _environment()


def render(template: str, *, base: str, **context: Any) -> str:
    """The page (or fragment) ``template`` with ``context``; links under ``base``."""

    def link(path: str, params: Mapping[str, object | None] | None = None) -> str:
        return url(base, path, params)

    return _ENV.get_template(template).render(context, url=link)
