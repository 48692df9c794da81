"""Checks applied to user input before any SQL runs (payloads: `pgqueue._core.codec`)."""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from urllib.parse import urlsplit

import asyncpg

from pgqueue._core.dsn import check_dsn
from pgqueue._core.errors import PayloadTooLargeError
from pgqueue._core.job import PERIODIC_KEY_PREFIX

__all__ = [
    "MAX_KEY_CHARS",
    "MAX_NAME_CHARS",
    "MAX_QUEUE_NAME_BYTES",
    "NOTIFY_LIMIT",
    "check_bool",
    "check_callable",
    "check_channel",
    "check_delay",
    "check_duration",
    "check_group",
    "check_int",
    "check_job_id",
    "check_job_type",
    "check_label",
    "check_max_attempts",
    "check_moment",
    "check_name",
    "check_on_conflict",
    "check_origin",
    "check_priority",
    "check_queue_name",
    "check_replace",
    "check_run_at",
    "check_unique_key",
    "check_when",
    "encode_notify_payload",
]

# PostgreSQL refuses NOTIFY payloads of 8000 bytes or more.
NOTIFY_LIMIT = 8000
# PostgreSQL truncates identifiers (channel names) longer than this.
MAX_IDENTIFIER_BYTES = 63
MAX_QUEUE_NAME_BYTES = 1024
"""The longest queue name, in bytes of UTF-8.

The name is a key of the claim index, whose entries PostgreSQL caps at 2704
bytes (a third of a page): a name of about 2680 bytes or more that does not
compress fails at INSERT. 1024 leaves room and is far beyond real names (and
under the 8000-byte NOTIFY limit, since the name is also the wakeup payload).
"""


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


def check_int(what: str, value: object, *, minimum: int = 1) -> int:
    """Return ``value`` if it is an int from ``minimum`` to 2**31 - 1 (a PostgreSQL int)."""
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"{what} must be an int, not {type(value).__name__}"
        raise TypeError(msg)
    if value < minimum:
        msg = f"{what} must be at least {minimum}, got {value}"
        raise ValueError(msg)
    if value > 2**31 - 1:
        msg = f"{what} must fit in a 32-bit integer, got {value}"
        raise ValueError(msg)
    return value


def check_max_attempts(value: object) -> int:
    """Return ``value`` if it is a usable ``max_attempts``."""
    return check_int("max_attempts", value)


MIN_PRIORITY, MAX_PRIORITY = -5, 5


def check_priority(value: object) -> int:
    """Return ``value`` if it is a job priority: an int from -5 to 5."""
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"priority must be an int, not {type(value).__name__}"
        raise TypeError(msg)
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        msg = f"priority must be from {MIN_PRIORITY} to {MAX_PRIORITY}, got {value}"
        raise ValueError(msg)
    return value


MAX_NAME_CHARS = 255
"""The longest job type and group, in characters."""

MAX_KEY_CHARS = 1024
"""The longest unique key, in characters."""

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
"""C0 and C1 control characters (and DEL): no name may hold one."""


def check_label(what: str, value: object, *, max_chars: int) -> str:
    """Return ``value`` if it is a name of at most ``max_chars`` characters, none of them a control character.

    Job types, groups, keys and queue names reach logs, terminals, pages
    and metrics' labels: a name that is long or holds control characters
    is refused before anything is written.
    """
    text = check_name(what, value)
    if len(text) > max_chars:
        msg = f"{what} is {len(text)} characters; at most {max_chars} are allowed"
        raise ValueError(msg)
    if found := _CONTROL.search(text):
        msg = (
            f"{what} must not contain a control character"
            f" (U+{ord(found.group()):04X} at {found.start()})"
        )
        raise ValueError(msg)
    return text


def check_job_type(value: object) -> str:
    """Return ``value`` if it can name a job type (at most `MAX_NAME_CHARS` characters)."""
    return check_label("job type", value, max_chars=MAX_NAME_CHARS)


def check_group(value: object) -> str:
    """Return ``value`` if it can name a group (at most `MAX_NAME_CHARS` characters)."""
    return check_label("group", value, max_chars=MAX_NAME_CHARS)


def check_unique_key(value: object) -> str | None:
    """Return ``value`` if it is ``None`` or a key a producer may give.

    At most `MAX_KEY_CHARS` characters; keys that start with
    ``periodic:`` are the periodic schedules' own.
    """
    if value is None:
        return None
    key = check_label("unique_key", value, max_chars=MAX_KEY_CHARS)
    if key.startswith(PERIODIC_KEY_PREFIX):
        msg = f"unique keys that start with {PERIODIC_KEY_PREFIX!r} are reserved for periodic schedules"
        raise ValueError(msg)
    return key


def check_bool(what: str, value: object) -> bool:
    """Return ``value`` if it is a bool."""
    if not isinstance(value, bool):
        msg = f"{what} must be a bool, not {type(value).__name__}"
        raise TypeError(msg)
    return value


def check_on_conflict(value: object) -> str:
    """Return ``value`` if it says what to do with a duplicate unique key."""
    if value not in ("return", "raise", "replace"):
        msg = f'on_conflict must be "return", "raise" or "replace", not {value!r:.80}'
        raise ValueError(msg)
    return str(value)


def check_replace(
    key: str | None,
    on_conflict: str,
    debounce: object,
    run_at: object,
    delay: object,
) -> tuple[bool, float | None]:
    """Whether a job with the checked ``key`` and ``on_conflict`` replaces its key's pending job, and its ``debounce`` as seconds.

    ``debounce`` is ``on_conflict="replace"`` with that delay: it needs a
    key, and takes neither ``run_at``, ``delay`` nor ``on_conflict="raise"``.
    """
    seconds = check_delay(debounce, "debounce")
    if seconds is None:
        if on_conflict == "replace" and key is None:
            msg = 'on_conflict="replace" needs a unique_key: it replaces the pending job of that key'
            raise ValueError(msg)
        return on_conflict == "replace", None
    if seconds == 0:
        msg = "debounce must be more than 0 seconds (the wait after the last enqueue)"
        raise ValueError(msg)
    if key is None:
        msg = "debounce needs a unique_key: enqueues of one key are debounced together"
        raise ValueError(msg)
    if run_at is not None or delay is not None:
        msg = "give debounce or run_at/delay, not both: debounce is the delay after each enqueue"
        raise ValueError(msg)
    if on_conflict == "raise":
        msg = 'debounce replaces the pending job of its key: it cannot be given with on_conflict="raise"'
        raise ValueError(msg)
    return True, seconds


def check_origin(value: object) -> str:
    """Return ``value`` as a browser's ``Origin`` header would say it, if it is an origin.

    An origin is ``http`` or ``https``, ``://``, a host and an optional port:
    no user, path (not even ``/``), query or fragment. The scheme and host
    are lowercased and a default port (80, 443) is dropped.
    """
    text = check_name("an origin", value)
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        port = 0
    if (
        scheme not in _DEFAULT_PORTS
        or not parts.hostname
        or port == 0
        or "@" in parts.netloc
        or parts.netloc.endswith(":")
        or text.partition("://")[2] != parts.netloc
        or not text.isascii()
        or any(c.isspace() for c in text)
    ):
        msg = (
            f"{text!r} is not an origin: scheme://host[:port], "
            "as https://ops.example.com or http://10.0.0.5:8080"
        )
        raise ValueError(msg)
    host = parts.netloc.lower()
    if port is not None:
        host = host.rpartition(":")[0]
    if port is None or port == _DEFAULT_PORTS[scheme]:
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


_DEFAULT_PORTS = {"http": 80, "https": 443}


def check_job_id(value: object) -> int:
    """Return ``value`` if it can be a job id: a positive int (a bigint)."""
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"a job id must be an int, not {type(value).__name__}"
        raise TypeError(msg)
    if not 0 < value < 2**63:
        msg = f"a job id must be a positive 64-bit integer, got {value}"
        raise ValueError(msg)
    return value


def check_dsn_or_pool(value: object) -> None:
    """Raise TypeError unless ``value`` is a DSN string or an asyncpg pool.

    A DSN asyncpg would misread raises ValueError (`pgqueue._core.dsn.check_dsn`).
    """
    if not isinstance(value, str | asyncpg.Pool):
        msg = f"dsn_or_pool must be a DSN string or an asyncpg Pool, not {type(value).__name__}"
        raise TypeError(msg)
    if isinstance(value, str):
        check_dsn(value)


def check_callable(what: str, value: object) -> None:
    """Raise TypeError unless ``value`` is callable."""
    if not callable(value):
        msg = f"{what} must be callable, not {type(value).__name__}"
        raise TypeError(msg)


def check_moment(name: str, value: object) -> datetime:
    """Return ``value`` (argument ``name``) if it is a timezone-aware datetime."""
    if not isinstance(value, datetime):
        msg = f"{name} must be a datetime, not {type(value).__name__}"
        raise TypeError(msg)
    if value.tzinfo is None or value.utcoffset() is None:
        msg = f"{name} must be timezone-aware (for example datetime.now(UTC))"
        raise ValueError(msg)
    return value


def check_run_at(value: object) -> datetime | None:
    """Return ``value`` if it is ``None`` or a timezone-aware datetime."""
    return None if value is None else check_moment("run_at", value)


MAX_DELAY = 10_000 * 365.25 * 86400
"""The longest ``delay``, in seconds: 10,000 years, far inside PostgreSQL's timestamps."""


def check_delay(value: object, what: str = "delay") -> float | None:
    """Return ``value`` as seconds if it is ``None`` or a usable delay: seconds or a ``timedelta``."""
    if value is None:
        return None
    shown = f"{value!r:.40}"
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        shown = f"a timedelta of {seconds:g} seconds"
    elif isinstance(value, bool) or not isinstance(value, int | float):
        msg = (
            f"{what} must be a number of seconds or a timedelta, "
            f"not {type(value).__name__}"
        )
        raise TypeError(msg)
    else:
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond any float
            seconds = math.inf
    if not math.isfinite(seconds) or seconds < 0:
        msg = f"{what} must be a finite, non-negative number of seconds or timedelta, got {shown}"
        raise ValueError(msg)
    if seconds > MAX_DELAY:
        msg = f"{what} must be at most 10,000 years ({MAX_DELAY:.0f} seconds), got {shown}"
        raise ValueError(msg)
    return seconds


def check_when(run_at: object, delay: object) -> tuple[datetime | None, float | None]:
    """Return ``run_at`` and ``delay`` (as seconds) if they are usable, and not both given."""
    if run_at is not None and delay is not None:
        msg = (
            "give run_at or delay, not both: run_at is a point in time, delay "
            "counts seconds from the database's now()"
        )
        raise ValueError(msg)
    return check_run_at(run_at), check_delay(delay)


def check_queue_name(name: object) -> str:
    """Return ``name`` if it can name a queue.

    A queue name is a key of the claim index and the wakeup NOTIFY payload;
    it may be at most `MAX_QUEUE_NAME_BYTES` bytes of UTF-8.
    """
    queue = check_label("queue name", name, max_chars=MAX_QUEUE_NAME_BYTES)
    size = len(queue.encode("utf-8"))
    if size > MAX_QUEUE_NAME_BYTES:
        msg = (
            f"queue name is {size} bytes; at most {MAX_QUEUE_NAME_BYTES} are allowed "
            "(it is a key of the claim index)"
        )
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


MAX_SIGNAL_NAME = 255
"""The most characters of a signal's name (as a job type's)."""
MAX_SIGNAL_BYTES = 65536
"""The most bytes of a signal's payload, as JSON text."""


def check_signal(job_id: object, name: object, payload_text: str) -> tuple[int, str]:
    """Return the job id and name of a signal if they, and its payload (JSON text), may be sent."""
    checked = check_job_id(job_id)
    text = check_label("signal name", name, max_chars=MAX_SIGNAL_NAME)
    size = len(payload_text.encode("utf-8"))
    if size > MAX_SIGNAL_BYTES:
        msg = f"signal payload is {size} bytes of JSON; at most {MAX_SIGNAL_BYTES} are allowed"
        raise ValueError(msg)
    return checked, text
