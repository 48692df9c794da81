"""`JobFilter`: which jobs an operator means, as one checked value.

The same value filters `pgqueue.Admin.jobs`, drives the bulk actions
(`pgqueue.Admin.retry`, ``cancel``, ``delete``, ``move``, ``redrive``),
``pgqueue jobs list --where`` and the dashboard's ``/jobs?where=``. It is
checked when made, parsed once from ``KEY=VALUE`` terms (`JobFilter.parse`)
and rendered back to them (`JobFilter.terms`); `pgqueue._sql.filters`
renders it to SQL with bound parameters only.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pgqueue._core.checks import (
    MAX_KEY_CHARS,
    check_group,
    check_job_type,
    check_label,
    check_moment,
    check_name,
    check_queue_name,
)
from pgqueue._core.lifecycle import LIFECYCLE

if TYPE_CHECKING:
    from collections.abc import Collection, Iterable, Mapping

__all__ = ["FILTER_STATUSES", "MAX_IDS", "TIME_FIELDS", "JobFilter"]

MAX_IDS = 10_000
"""The most job ids one filter names (``ids=``)."""

_MAX_ID = 2**63 - 1

FILTER_STATUSES = tuple(
    name
    for status in LIFECYCLE
    for name in (
        (status.value, "ready", "scheduled") if status.claimable else (status.value,)
    )
)
"""What ``status=`` takes: each status, ``ready`` (pending and due) and ``scheduled`` (pending, not yet due)."""

TIME_FIELDS = (
    "created_after",
    "created_before",
    "due_after",
    "due_before",
    "finished_after",
    "finished_before",
)
"""The window's fields: ``created_*`` on ``created_at``, ``due_*`` on ``run_at``, ``finished_*`` on an ended job's ``updated_at``."""

_TEXT_FIELDS = ("queue", "job_type", "status", "group", "unique_key", "error_contains")
_JSON_FIELDS = ("payload", "result")

MAX_ERROR_TEXT = 1000
"""The longest ``error_contains``, in characters."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobFilter:
    """Which jobs: every field given must match (none given: every job).

    A value: two filters with the same fields are equal (``==``) and hash
    alike. Every field is checked when the filter is made, so a bad one
    raises `TypeError` or `ValueError` before any SQL runs.

    Attributes:
        ids: the jobs with these ids (the term ``id=3,5,8``; at most
            10,000), kept as a sorted tuple: the rows an operator
            selected, with the other fields narrowing them further.
        queue: the jobs of this queue.
        job_type: of this type.
        status: in this status, or ``ready`` (pending and due) or
            ``scheduled`` (pending, not yet due).
        group: of this group (``enqueue(group=...)``).
        unique_key: with this unique key.
        created_after: created at or after this time (timezone-aware).
        created_before: created before this time.
        due_after: due (``run_at``) at or after this time.
        due_before: due before this time.
        finished_after: finished (completed, dead or cancelled) at or
            after this time: the ``updated_at`` of an ended job.
        finished_before: finished before this time.
        error_contains: whose last error holds this text (a plain
            substring, case-sensitive: no pattern).
        payload: whose payload contains this JSON object (PostgreSQL's
            ``@>``: ``{"user": {"id": 42}}`` matches a payload holding
            that key with that value, whatever else it holds).
        result: whose result contains this JSON object.

    .. versionadded:: 0.1
    """

    ids: Collection[int] | None = None
    queue: str | None = None
    job_type: str | None = None
    status: str | None = None
    group: str | None = None
    unique_key: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    due_after: datetime | None = None
    due_before: datetime | None = None
    finished_after: datetime | None = None
    finished_before: datetime | None = None
    error_contains: str | None = None
    payload: Mapping[str, Any] | None = None
    result: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        checks = {
            "queue": check_queue_name,
            "job_type": check_job_type,
            "status": _check_status,
            "group": check_group,
            "unique_key": lambda v: check_label(
                "unique_key", v, max_chars=MAX_KEY_CHARS
            ),
            "error_contains": _check_error_text,
        }
        for name, check in checks.items():
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, check(value))
        if self.ids is not None:
            object.__setattr__(self, "ids", _check_ids(self.ids))
        for name in TIME_FIELDS:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, check_moment(name, value))
        for name in _JSON_FIELDS:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, _check_object(name, value))

    def __hash__(self) -> int:
        return hash(tuple(self.terms()))

    @classmethod
    def parse(cls, terms: Iterable[str]) -> JobFilter:
        """A filter from ``KEY=VALUE`` terms, as the CLI's ``--where`` and the dashboard's ``?where=`` give them.

        KEY is a field (``queue``, ``status``, ``created_after``...) or a
        dotted path into the payload or result (``payload.user_id``,
        ``result.invoice.total``); the terms of one of them merge into one
        object matched by containment (``payload.a=1 payload.b=2`` is
        ``payload={"a": 1, "b": 2}``). ``payload=`` and ``result=`` also
        take a whole JSON object. VALUE is read as JSON, else as text
        (``payload.id=42`` is the number, ``payload.id="42"`` the text);
        a name field's VALUE is its text (a JSON string is unquoted); the
        times are ISO 8601 (without an offset: UTC).

        Raises:
            ValueError: a term without ``=``, an unknown key, a key given
                twice (a path twice with different values), a bad status
                or any value the field refuses.
            TypeError: ``terms`` is a single string, not an iterable of them.
        """
        if isinstance(terms, str):
            msg = "terms must be an iterable of KEY=VALUE strings, not a str"
            raise TypeError(msg)
        given: dict[str, Any] = {}
        for term in terms:
            if not isinstance(term, str):
                msg = f"a filter term must be a str, not {type(term).__name__}"  # type: ignore[unreachable]
                raise TypeError(msg)
            key, sep, text = term.partition("=")
            if not sep or not key:
                msg = f"a filter term is KEY=VALUE, not {term!r:.80}"
                raise ValueError(msg)
            head, dot, path = key.partition(".")
            if head in _JSON_FIELDS:
                value = _json_or_text(text)
                if dot:
                    value = _nested(path, value, key)
                elif not isinstance(value, dict):
                    msg = f"{key}= takes a JSON object, not {text!r:.80}"
                    raise ValueError(msg)
                given[head] = _merge(given.get(head, {}), value, key)
                continue
            if key in given:
                msg = f"filter key {key!r} is given twice"
                raise ValueError(msg)
            if key == "id":
                given["ids"] = _parse_ids(text)
            elif key in TIME_FIELDS:
                given[key] = _parse_time(key, text)
            elif key in _TEXT_FIELDS:
                given[key] = _name_text(text)
            else:
                known = ", ".join(
                    ("id", *_TEXT_FIELDS, *TIME_FIELDS, "payload.PATH", "result.PATH")
                )
                msg = f"unknown filter key {key!r:.80} (the keys: {known})"
                raise ValueError(msg)
        return cls(**given)

    def terms(self) -> list[str]:
        """The filter as ``KEY=VALUE`` terms that `parse` reads back to an equal filter.

        Fields in their order; a payload or result as one term per leaf
        (``payload.user.id=42``) where its keys allow a path, else as one
        ``payload={...}`` term.
        """
        found: list[str] = []
        for field in fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            if field.name == "ids":
                found.append(f"id={','.join(map(str, value))}")
            elif field.name in _JSON_FIELDS:
                found.extend(_object_terms(field.name, value))
            elif isinstance(value, datetime):
                found.append(f"{field.name}={value.isoformat()}")
            else:
                found.append(f"{field.name}={_text_value(value)}")
        return found

    def __str__(self) -> str:
        return " ".join(self.terms()) or "every job"

    @property
    def empty(self) -> bool:
        """True when no field is given (the filter matches every job)."""
        return all(getattr(self, field.name) is None for field in fields(self))


def _check_ids(value: object) -> tuple[int, ...]:
    """Distinct job ids, sorted: 1 to `MAX_IDS` of them, each a positive bigint."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        msg = f"ids must be an iterable of job ids (ints), not {type(value).__name__}"
        raise TypeError(msg)
    found: set[int] = set()
    for job_id in value:
        if not isinstance(job_id, int) or isinstance(job_id, bool):
            msg = f"ids must hold ints, not {type(job_id).__name__}"
            raise TypeError(msg)
        if not 1 <= job_id <= _MAX_ID:
            msg = f"a job id is a positive bigint, not {job_id}"
            raise ValueError(msg)
        found.add(job_id)
        if len(found) > MAX_IDS:
            msg = f"ids names more than {MAX_IDS} jobs"
            raise ValueError(msg)
    if not found:
        msg = "ids names no job (leave it None for every job)"
        raise ValueError(msg)
    return tuple(sorted(found))


def _parse_ids(text: str) -> tuple[int, ...]:
    """``id=3,5,8``'s ids (ValueError unless each is a decimal number)."""
    parts = text.split(",")
    if not all(part.strip().isascii() and part.strip().isdigit() for part in parts):
        msg = f"id= takes job ids separated by commas (id=3,5,8), not {text!r:.80}"
        raise ValueError(msg)
    return _check_ids(int(part) for part in parts)


def _check_status(value: object) -> str:
    if value not in FILTER_STATUSES:
        msg = f"status must be one of {', '.join(FILTER_STATUSES)}, not {value!r:.80}"
        raise ValueError(msg)
    return str(value)


def _check_error_text(value: object) -> str:
    text = check_name("error_contains", value)
    if len(text) > MAX_ERROR_TEXT:
        msg = f"error_contains is {len(text)} characters; at most {MAX_ERROR_TEXT} are allowed"
        raise ValueError(msg)
    return text


def _check_object(name: str, value: object) -> dict[str, Any]:
    """``value`` as a JSON object of its own (a copy), if it is a mapping JSON can hold."""
    if not isinstance(value, dict):
        msg = f"{name} must be a dict (a JSON object), not {type(value).__name__}"
        raise TypeError(msg)
    try:
        text = json.dumps(value, allow_nan=False, sort_keys=True)
    except (TypeError, ValueError) as exc:
        msg = f"{name} must hold JSON values only: {exc}"
        raise ValueError(msg) from exc
    if "\\u0000" in text:
        msg = f"{name} must not hold a NUL character (PostgreSQL's jsonb cannot)"
        raise ValueError(msg)
    copy: dict[str, Any] = json.loads(text)
    return copy


def _json_or_text(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, float) and not math.isfinite(value):
        return text
    return value


def _name_text(text: str) -> str:
    """A name field's VALUE: a JSON string unquoted, anything else as typed."""
    value = _json_or_text(text)
    return value if isinstance(value, str) else text


def _text_value(text: str) -> str:
    """A name or leaf's text as VALUE: quoted only where it would read as JSON."""
    try:
        json.loads(text)
    except ValueError:
        return text
    return json.dumps(text, ensure_ascii=False)


def _parse_time(key: str, text: str) -> datetime:
    try:
        moment = datetime.fromisoformat(_name_text(text))
    except ValueError:
        msg = f"{key} must be an ISO 8601 time (e.g. 2026-12-05T10:00:00Z), not {text!r:.80}"
        raise ValueError(msg) from None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _nested(path: str, value: Any, key: str) -> dict[str, Any]:
    parts = path.split(".")
    if not all(parts):
        msg = f"filter key {key!r:.80} has an empty step in its path"
        raise ValueError(msg)
    for part in reversed(parts):
        value = {part: value}
    nested: dict[str, Any] = value
    return nested


def _merge(into: dict[str, Any], value: dict[str, Any], key: str) -> dict[str, Any]:
    """``into`` with ``value``'s keys added (objects merged); a clash raises ValueError."""
    merged = dict(into)
    for name, item in value.items():
        if name not in merged:
            merged[name] = item
        elif isinstance(merged[name], dict) and isinstance(item, dict):
            merged[name] = _merge(merged[name], item, key)
        elif merged[name] != item:
            msg = f"filter key {key!r:.80} gives {name!r:.40} two values"
            raise ValueError(msg)
    return merged


def _object_terms(name: str, value: dict[str, Any]) -> list[str]:
    leaves = list(_leaves((name,), value))
    if not leaves or any(
        not step or "." in step or "=" in step for path, _ in leaves for step in path
    ):
        return [f"{name}={json.dumps(value, ensure_ascii=False, sort_keys=True)}"]
    found = []
    for path, leaf in leaves:
        shown = (
            _text_value(leaf)
            if isinstance(leaf, str)
            else json.dumps(leaf, ensure_ascii=False, sort_keys=True)
        )
        found.append(f"{'.'.join(path)}={shown}")
    return found


def _leaves(
    path: tuple[str, ...], value: dict[str, Any]
) -> Iterable[tuple[tuple[str, ...], Any]]:
    """Each leaf of ``value`` with its path; an empty object is a leaf of its own."""
    for key, item in value.items():
        if isinstance(item, dict) and item:
            yield from _leaves((*path, key), item)
        else:
            yield (*path, key), item
