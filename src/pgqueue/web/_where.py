"""The job listing's filter in a URL: ``?where=TERM`` (the CLI's terms) and its canonical text.

A listing's filter comes from its ``where`` terms (``payload.user_id=42``,
as ``pgqueue jobs list --where`` reads them, through `pgqueue.JobFilter.parse`)
and from the older ``queue``, ``status`` and ``type`` parameters. Either way
it is one `pgqueue.JobFilter`, written back as its terms
(`pgqueue.JobFilter.terms`): the same filter always has the same terms, so a
token bound to them is bound to the filter (`pgqueue.web._bulk`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.exceptions import HTTPException

from pgqueue import JobFilter

if TYPE_CHECKING:
    from collections.abc import Mapping

    from starlette.datastructures import QueryParams

__all__ = ["MAX_TERMS", "Where", "parse_text", "where_of"]

MAX_TERMS = 20
"""The most terms a listing's filter may have."""

_FIELDS = (("queue", "queue"), ("status", "status"), ("type", "job_type"))
"""The listing's older parameters and the terms they stand for."""


@dataclass(frozen=True, slots=True)
class Where:
    """A listing's filter: the `pgqueue.JobFilter` and its canonical terms."""

    filter: JobFilter
    terms: tuple[str, ...]

    @property
    def text(self) -> str:
        """The terms as one JSON list: what a form carries, and its token binds."""
        return json.dumps(list(self.terms), ensure_ascii=False, separators=(",", ":"))

    @property
    def params(self) -> dict[str, list[str]]:
        """The query of a listing of this filter."""
        return {"where": list(self.terms)}


def _parsed(terms: list[str]) -> JobFilter:
    if len(terms) > MAX_TERMS:
        raise HTTPException(400, f"a filter has at most {MAX_TERMS} terms")
    try:
        return JobFilter.parse(terms)
    except (TypeError, ValueError) as exc:
        raise HTTPException(400, f"bad filter: {exc}") from None


def where_of(params: QueryParams | Mapping[str, str]) -> Where:
    """The filter of a listing's query: its ``where`` terms after its queue, status and type.

    Raises:
        HTTPException: 400 for a term `pgqueue.JobFilter.parse` refuses.
    """
    terms = [
        f"{term}={json.dumps(params[name], ensure_ascii=False)}"
        for name, term in _FIELDS
        if params.get(name)
    ]
    given = params.getlist("where") if hasattr(params, "getlist") else []
    terms += [term for term in given if term.strip()]
    found = _parsed(terms)
    return Where(found, tuple(found.terms()))


def parse_text(text: str) -> Where:
    """The filter of a form's ``filter`` field (`Where.text`); 400 unless it is canonical."""
    try:
        terms = json.loads(text)
    except ValueError:
        terms = None
    if not (isinstance(terms, list) and all(isinstance(t, str) for t in terms)):
        raise HTTPException(400, "the form's filter cannot be read")
    found = _parsed(terms)
    where = Where(found, tuple(found.terms()))
    if where.text != text:
        raise HTTPException(400, "the form's filter is not as this dashboard wrote it")
    return where
