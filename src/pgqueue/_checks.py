"""Checks and encodings applied to user input before any SQL runs."""

from __future__ import annotations

import json
import math
import re
from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import asyncpg

from pgqueue._connect import check_dsn
from pgqueue._errors import PayloadTooLargeError, describe
from pgqueue._typed import to_json_value

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = [
    "MAX_PAYLOAD_DEPTH",
    "MAX_QUEUE_NAME_BYTES",
    "NOTIFY_LIMIT",
    "check_bool",
    "check_callable",
    "check_channel",
    "check_delay",
    "check_duration",
    "check_int",
    "check_job_id",
    "check_max_attempts",
    "check_name",
    "check_on_conflict",
    "check_origin",
    "check_priority",
    "check_queue_name",
    "check_run_at",
    "check_unique_key",
    "check_when",
    "encode_notify_payload",
    "encode_payload",
    "encode_payloads",
    "payload_encoder",
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

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class _HookedEncoder(json.JSONEncoder):
    """`_encoder` with a user's ``json_encoder``, whose results obey the same rules."""

    def __init__(self, hook: Callable[[Any], Any]) -> None:
        super().__init__(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        self.hook = hook

    def default(self, o: Any) -> Any:
        value = self.hook(o)
        _inspect(value)
        return value


def payload_encoder(json_encoder: Callable[[Any], Any] | None) -> json.JSONEncoder:
    """The encoder of `encode_payload` that calls ``json_encoder`` for what JSON cannot hold.

    ``json_encoder`` works as ``json.dumps``'s ``default``: it gets each
    value JSON has no type for and returns one it has (which may hold more
    such values), or raises ``TypeError``.
    """
    if json_encoder is None:
        return _encoder
    check_callable("json_encoder", json_encoder)
    return _HookedEncoder(json_encoder)


_HINT = (
    "pass Queue(json_encoder=...) to encode it, or enqueue a dataclass or a "
    "pydantic model (a dataclass encodes UUID, datetime, date, time, Decimal "
    "and Enum fields)"
)

MAX_PAYLOAD_DEPTH = 500
"""The deepest nesting of lists and dicts a payload may have.

Python's json module encodes and decodes nested values by recursion bounded
by the interpreter's recursion limit (1000 frames by default, less what the
caller already uses): a much deeper payload could be stored but never
decoded by a worker.
"""

# repr() writes floats of magnitude 1e16 or more with an exponent ("1e+16").
# jsonb stores numbers as numeric and prints them back without the exponent
# and without a fraction ("10000000000000000"), which decodes as an int; such
# floats are respelled in positional notation with ".0" to stay floats.
_BIG_FLOAT = re.compile(r"-?\d+(?:\.\d+)?e\+\d+")
_NUMBER_CHARS = frozenset("0123456789.-")
# The escapes that make a quote or a backslash string content, not syntax.
_QUOTE_OR_BACKSLASH_ESCAPE = re.compile(r'\\["\\]')

_SCALARS = frozenset({str, int, float, bool, type(None)})
_STR = frozenset({str})


def _refuse_constant(name: str) -> Any:
    msg = f"payload is not valid JSON: {name} cannot be stored in jsonb"
    raise ValueError(msg)


def _inspect(payload: Any, depth: int = 0) -> None:
    """Refuse dict keys that are not str, and nesting deeper than the limit.

    Walks the containers without recursion (so a deep value cannot exhaust
    the stack here); scalars are left to the encoder, in C. ``depth`` is the
    payload's own: -1 for a list of payloads.
    """
    stack: list[tuple[Any, int]] = [(payload, depth)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            if not _STR.issuperset(map(type, value)):
                for key in value:
                    if not isinstance(key, str):
                        text = repr(key)
                        text = text if len(text) <= 40 else text[:37] + "..."
                        msg = (
                            "payload is not JSON-serializable: dict keys must be str, "
                            f"found {text} ({type(key).__name__}); JSON would turn it "
                            "into a string, or merge it with an equal string key"
                        )
                        raise TypeError(msg)
            children: Any = value.values()
        elif isinstance(value, list | tuple):
            children = value
        else:
            continue  # a scalar, or something the encoder will refuse
        if depth >= MAX_PAYLOAD_DEPTH:
            msg = (
                f"payload cannot be stored as JSON: it is nested more than "
                f"{MAX_PAYLOAD_DEPTH} levels deep, or holds a reference cycle"
            )
            raise ValueError(msg)
        if not _SCALARS.issuperset(map(type, children)):
            stack.extend(
                (child, depth + 1) for child in children if type(child) not in _SCALARS
            )


def _big_floats(text: str) -> Iterator[re.Match[str]]:
    """Each float with an exponent that starts a JSON value in ``text``, maybe in a string."""
    found = text.find("e+")
    while found != -1:
        start = found
        while start > 0 and text[start - 1] in _NUMBER_CHARS:
            start -= 1
        if start == 0 or text[start - 1] in "[,:":
            match = _BIG_FLOAT.match(text, start)
            if match is not None and match.end() > found:
                yield match
        found = text.find("e+", found + 2)


def _respell_big_floats(text: str) -> str:
    """Write the floats of JSON ``text`` that have an exponent in positional notation."""
    pieces: list[str] = []
    copied = 0  # text[:copied] is in pieces
    counted = 0  # string delimiters are counted up to here
    in_string = False
    for match in _big_floats(text):
        start = match.start()
        quotes = text.count('"', counted, start) - sum(
            escape == '\\"'
            for escape in _QUOTE_OR_BACKSLASH_ESCAPE.findall(text, counted, start)
        )
        in_string ^= quotes % 2 == 1
        counted = start
        if not in_string:
            pieces += (text[copied:start], format(Decimal(match.group()), "f"), ".0")
            copied = match.end()
    return "".join(pieces) + text[copied:] if pieces else text


def _has_escaped_nul(text: str) -> bool:
    """Whether JSON ``text`` escapes a NUL (``\\u0000`` not itself escaped)."""
    start = text.find("\\u0000")
    while start != -1:
        run = start  # the backslashes before this one escape each other
        while run > 0 and text[run - 1] == "\\":
            run -= 1
        if (start - run) % 2 == 0:
            return True
        start = text.find("\\u0000", start + 1)
    return False


def encode_payload(payload: Any, encoder: json.JSONEncoder = _encoder) -> str:
    """Return ``payload`` as JSON text that PostgreSQL's jsonb accepts.

    The rule: what is accepted comes back from ``json.loads`` of the stored
    row (which is what a worker hands its handler) equal to what went in,
    with the same types all the way down; what cannot is refused here,
    before any SQL runs. The exceptions, all predictable:

    - tuples (named tuples included) come back as lists;
    - subclasses come back as their base type (``IntEnum`` as ``int``,
      ``StrEnum`` as ``str``, ``OrderedDict`` as ``dict``);
    - ``-0.0`` comes back as ``0.0`` (jsonb numbers have no negative zero,
      PostgreSQL turns it into ``0.0``);
    - dict key order is not kept (jsonb orders keys by length, then bytes).

    Floats keep their type and exact value: those of magnitude 1e16 or more
    are written in positional notation with a ``.0`` fraction, because jsonb
    would give ``1e+16`` back as ``10000000000000000``, an int.

    ``None`` becomes ``{}``. ``bytes``, ``bytearray`` and ``memoryview`` are
    taken as JSON text: they must parse (``NaN`` and ``Infinity`` refused),
    and the parsed value is then treated as above.

    A dataclass or a pydantic model is encoded as `to_json_value` makes it.
    ``encoder`` is `payload_encoder`'s, to call a user's ``json_encoder``.

    Raises:
        TypeError: a value that JSON cannot hold (a ``set``, a ``datetime``,
            a ``Decimal``, any other object) and ``encoder`` does not encode,
            its field named; or a dict key that is not a ``str`` (JSON would
            turn ``1`` into ``"1"`` and could merge it with a key ``"1"``).
        ValueError: bytes that are not JSON; NaN or an infinity; a NUL
            character or a lone surrogate in a string or key; an int too
            long for Python to convert to text (4300 digits by default,
            ``sys.set_int_max_str_digits``); nesting deeper than
            `MAX_PAYLOAD_DEPTH` levels, or a reference cycle.
    """
    if payload is None:
        return "{}"
    return _encode(_loaded(payload), encoder)


def encode_payloads(payloads: list[Any], encoder: json.JSONEncoder = _encoder) -> str:
    """Return ``payloads`` as one JSON array, each element as `encode_payload` writes it.

    One encoder call for the whole list costs a fraction of one per payload.

    Raises:
        TypeError, ValueError: as `encode_payload` for the first bad
            payload, its message starting ``job <index>: ``.
    """
    try:
        return _encode(
            [{} if p is None else _loaded(p) for p in payloads], encoder, depth=-1
        )
    except (TypeError, ValueError):
        for index, payload in enumerate(payloads):
            try:
                encode_payload(payload, encoder)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"job {index}: {exc}") from exc
        raise


def _loaded(payload: Any) -> Any:
    """``payload``, the value that bytes of JSON text hold, or a typed payload as JSON values."""
    payload = to_json_value(payload)
    if isinstance(payload, bytes | bytearray | memoryview):
        try:
            return json.loads(bytes(payload), parse_constant=_refuse_constant)
        except (ValueError, RecursionError) as exc:
            msg = f"payload bytes are not valid JSON: {exc}"
            raise ValueError(msg) from exc
    return payload


def _encode(value: Any, encoder: json.JSONEncoder, depth: int = 0) -> str:
    """JSON text of ``value`` that jsonb stores and gives back unchanged, or raise."""
    _inspect(value, depth)
    try:
        text = encoder.encode(value)
    except TypeError as exc:
        hook = encoder.hook if isinstance(encoder, _HookedEncoder) else None
        raise TypeError(_unserializable(value, hook, exc)) from exc
    except ValueError as exc:
        # Python's own messages: NaN and infinities, ints too long for text.
        reason = "JSON has no NaN or infinity" if "float" in str(exc) else exc
        msg = f"payload cannot be stored as JSON: {reason}"
        raise ValueError(msg) from exc
    except RecursionError as exc:
        msg = "payload cannot be stored as JSON: it is nested too deeply to encode"
        raise ValueError(msg) from exc
    if _has_escaped_nul(text):
        msg = "payload contains a NUL character, which PostgreSQL cannot store"
        raise ValueError(msg)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        msg = "payload contains a lone surrogate, which is not valid UTF-8"
        raise ValueError(msg) from exc
    if "e+" in text:
        text = _respell_big_floats(text)
    return text


def _unserializable(
    value: Any, hook: Callable[[Any], Any] | None, error: TypeError
) -> str:
    """Why ``value`` could not be encoded: the first value JSON cannot hold, and where."""
    stack: list[tuple[str, Any, int]] = [("", value, 0)]
    while stack:
        path, item, hooked = stack.pop()
        if isinstance(item, dict):
            stack.extend(
                (f"{path}.{key}" if path else str(key), child, 0)
                for key, child in reversed(item.items())
            )
            continue
        if isinstance(item, list | tuple):
            stack.extend(
                (f"{path}[{index}]", child, 0)
                for index, child in reversed(list(enumerate(item)))
            )
            continue
        if item is None or isinstance(item, str | int | float):
            continue
        where = f"payload field '{path}'" if path else "payload"
        where += f" ({type(item).__name__}) is not JSON-serializable"
        if hook is None:
            return f"{where}; {_HINT}"
        if hooked == 10:  # what it returns needs it again, and again...
            return f"{where}: json_encoder did not turn it into JSON values"
        try:
            stack.append((path, hook(item), hooked + 1))
        except Exception as exc:
            return f"{where}: json_encoder raised {describe(exc)}"
    text = str(error)
    return (
        text
        if text.startswith("payload")
        else f"payload is not JSON-serializable: {text}"
    )


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


def check_unique_key(value: object) -> str | None:
    """Return ``value`` if it is ``None`` or a non-empty string PostgreSQL text can hold."""
    return None if value is None else check_name("unique_key", value)


def check_bool(what: str, value: object) -> bool:
    """Return ``value`` if it is a bool."""
    if not isinstance(value, bool):
        msg = f"{what} must be a bool, not {type(value).__name__}"
        raise TypeError(msg)
    return value


def check_on_conflict(value: object) -> str:
    """Return ``value`` if it says what to do with a duplicate unique key."""
    if value not in ("return", "raise"):
        msg = f'on_conflict must be "return" or "raise", not {value!r}'
        raise ValueError(msg)
    return str(value)


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

    A DSN asyncpg would misread raises ValueError (`pgqueue._connect.check_dsn`).
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


MAX_DELAY = 10_000 * 365.25 * 86400
"""The longest ``delay``, in seconds: 10,000 years, far inside PostgreSQL's timestamps."""


def check_delay(value: object) -> float | None:
    """Return ``value`` as seconds if it is ``None`` or a usable delay: seconds or a ``timedelta``."""
    if value is None:
        return None
    shown = f"{value!r:.40}"
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
        shown = f"a timedelta of {seconds:g} seconds"
    elif isinstance(value, bool) or not isinstance(value, int | float):
        msg = (
            "delay must be a number of seconds or a timedelta, "
            f"not {type(value).__name__}"
        )
        raise TypeError(msg)
    else:
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond any float
            seconds = math.inf
    if not math.isfinite(seconds) or seconds < 0:
        msg = f"delay must be a finite, non-negative number of seconds or timedelta, got {shown}"
        raise ValueError(msg)
    if seconds > MAX_DELAY:
        msg = (
            f"delay must be at most 10,000 years ({MAX_DELAY:.0f} seconds), got {shown}"
        )
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
    queue = check_name("queue name", name)
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
