"""Checks and encodings applied to user input before any SQL runs."""

from __future__ import annotations

import json
import math
import re
from datetime import datetime
from typing import Any

from pgqueue._errors import PayloadTooLargeError

__all__ = [
    "NOTIFY_LIMIT",
    "check_callable",
    "check_channel",
    "check_duration",
    "check_int",
    "check_max_attempts",
    "check_name",
    "check_queue_name",
    "check_run_at",
    "encode_notify_payload",
    "encode_payload",
]

# PostgreSQL refuses NOTIFY payloads of 8000 bytes or more.
NOTIFY_LIMIT = 8000
# PostgreSQL truncates identifiers (channel names) longer than this.
MAX_IDENTIFIER_BYTES = 63

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
# A JSON-escaped NUL that is not itself an escaped backslash: jsonb rejects it.
_ESCAPED_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _refuse_constant(name: str) -> Any:
    msg = f"payload is not valid JSON: {name} cannot be stored in jsonb"
    raise ValueError(msg)


def encode_payload(payload: Any) -> str:
    """Return ``payload`` as JSON text that PostgreSQL's jsonb accepts.

    ``None`` becomes ``{}``. ``bytes`` and ``bytearray`` are taken as JSON
    text and must parse.

    Raises:
        TypeError: the value is not JSON-serializable.
        ValueError: the bytes are not JSON, or the value holds NaN, an
            infinity, a NUL character or a lone surrogate.
    """
    if payload is None:
        return "{}"
    if isinstance(payload, bytes | bytearray | memoryview):
        try:
            payload = json.loads(bytes(payload), parse_constant=_refuse_constant)
        except ValueError as exc:
            msg = f"payload bytes are not valid JSON: {exc}"
            raise ValueError(msg) from exc
    try:
        text = _encoder.encode(payload)
    except TypeError as exc:
        msg = f"payload is not JSON-serializable: {exc}"
        raise TypeError(msg) from exc
    except ValueError as exc:
        msg = f"payload cannot be stored as JSON: {exc}"
        raise ValueError(msg) from exc
    if "\\u0000" in text and _ESCAPED_NUL.search(text):
        msg = "payload contains a NUL character, which PostgreSQL cannot store"
        raise ValueError(msg)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        msg = "payload contains a lone surrogate, which is not valid UTF-8"
        raise ValueError(msg) from exc
    return text


def check_name(what: str, value: object) -> str:
    """Return ``value`` if it is a non-empty string PostgreSQL text can hold."""
    if not isinstance(value, str):
        msg = f"{what} must be a str, not {type(value).__name__}"
        raise TypeError(msg)
    if not value:
        msg = f"{what} must not be empty"
        raise ValueError(msg)
    if "\x00" in value:
        msg = f"{what} must not contain a NUL character"
        raise ValueError(msg)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        msg = f"{what} is not valid UTF-8 (a lone surrogate?)"
        raise ValueError(msg) from exc
    return value


def check_channel(channel: object) -> str:
    """Return ``channel`` if PostgreSQL can LISTEN and NOTIFY on it unchanged."""
    name = check_name("channel", channel)
    size = len(name.encode("utf-8"))
    if size > MAX_IDENTIFIER_BYTES:
        msg = f"channel name is {size} bytes; PostgreSQL allows at most {MAX_IDENTIFIER_BYTES}"
        raise ValueError(msg)
    return name


def encode_notify_payload(payload: object) -> str:
    """Return a NOTIFY payload as text, refusing what PostgreSQL would refuse."""
    if isinstance(payload, bytes | bytearray | memoryview):
        try:
            text = bytes(payload).decode("utf-8")
        except UnicodeDecodeError as exc:
            msg = "payload bytes are not valid UTF-8"
            raise ValueError(msg) from exc
    elif isinstance(payload, str):
        text = payload
    else:
        msg = f"payload must be str or bytes, not {type(payload).__name__}"
        raise TypeError(msg)
    if "\x00" in text:
        msg = "payload must not contain a NUL character"
        raise ValueError(msg)
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        msg = "payload is not valid UTF-8 (a lone surrogate?)"
        raise ValueError(msg) from exc
    if size >= NOTIFY_LIMIT:
        msg = f"payload is {size} bytes; PostgreSQL NOTIFY payloads must be under {NOTIFY_LIMIT}"
        raise PayloadTooLargeError(msg)
    return text


def check_int(what: str, value: object) -> int:
    """Return ``value`` if it is an int from 1 to 2**31 - 1 (a PostgreSQL int)."""
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"{what} must be an int, not {type(value).__name__}"
        raise TypeError(msg)
    if value < 1:
        msg = f"{what} must be at least 1, got {value}"
        raise ValueError(msg)
    if value > 2**31 - 1:
        msg = f"{what} must fit in a 32-bit integer, got {value}"
        raise ValueError(msg)
    return value


def check_max_attempts(value: object) -> int:
    """Return ``value`` if it is a usable ``max_attempts``."""
    return check_int("max_attempts", value)


def check_callable(what: str, value: object) -> None:
    """Raise TypeError unless ``value`` is callable."""
    if not callable(value):
        msg = f"{what} must be callable, not {type(value).__name__}"
        raise TypeError(msg)


def check_run_at(value: object) -> datetime | None:
    """Return ``value`` if it is ``None`` or a timezone-aware datetime."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        msg = f"run_at must be a datetime, not {type(value).__name__}"
        raise TypeError(msg)
    if value.tzinfo is None or value.utcoffset() is None:
        msg = "run_at must be timezone-aware (for example datetime.now(UTC))"
        raise ValueError(msg)
    return value


def check_queue_name(name: object) -> str:
    """Return ``name`` if it can name a queue (it is also the wakeup payload)."""
    queue = check_name("queue name", name)
    if len(queue.encode("utf-8")) >= NOTIFY_LIMIT:
        msg = f"queue name must be under {NOTIFY_LIMIT} bytes (it is sent as a NOTIFY payload)"
        raise ValueError(msg)
    return queue


def check_duration(what: str, value: object, *, positive: bool = False) -> float:
    """Return ``value`` as seconds if it is a finite, non-negative (or positive) number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        msg = f"{what} must be a number of seconds, not {type(value).__name__}"
        raise TypeError(msg)
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        bound = "positive" if positive else "non-negative"
        msg = f"{what} must be a finite, {bound} number of seconds, got {value!r}"
        raise ValueError(msg)
    return seconds
