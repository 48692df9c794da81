"""The payload codec: a job's payload as JSON text that jsonb stores and gives back unchanged.

`encode_payload` (and `encode_payloads`, for a batch) is what ``enqueue``
writes, and what a worker stores as a job's result; `to_json_value` turns a
typed payload (a dataclass, a pydantic model) into JSON values first, and
`pgqueue._core.typed` is the way back. Nothing here runs SQL.
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
import json
import re
import sys
import uuid
from datetime import date, time
from decimal import Decimal
from itertools import chain
from typing import TYPE_CHECKING, Any, NamedTuple

from pgqueue._core.checks import check_callable
from pgqueue._core.errors import describe

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = [
    "MAX_PAYLOAD_DEPTH",
    "Unencodable",
    "encode_each",
    "encode_payload",
    "encode_payloads",
    "is_model_class",
    "payload_encoder",
    "to_json_value",
    "unencodable",
]

_JSON_TYPES = frozenset({dict, list, str, int, float, bool, type(None)})

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
_DICT = frozenset({dict})


def _refuse_constant(name: str) -> Any:
    msg = f"payload is not valid JSON: {name} cannot be stored in jsonb"
    raise ValueError(msg)


def _inspect(payload: Any, depth: int = 0) -> None:
    """Refuse dict keys that are not str, and nesting deeper than the limit.

    Walks the containers without recursion (so a deep value cannot exhaust
    the stack here); scalars are left to the encoder, in C. ``depth`` is the
    payload's own: -1 for a list of payloads.
    """
    if depth == -1 and _flat_dicts(payload):
        return
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


def _flat_dicts(payloads: list[Any]) -> bool:
    """Whether each of ``payloads`` is a dict of str keys and scalar values (most
    batches: one look at all of them, in C, instead of a walk of each)."""
    return (
        _DICT.issuperset(map(type, payloads))
        and _STR.issuperset(map(type, chain.from_iterable(payloads)))
        and _SCALARS.issuperset(
            map(type, chain.from_iterable(map(dict.values, payloads)))
        )
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
        return _encode(_values(payloads), encoder, depth=-1)
    except (TypeError, ValueError):
        _refuse_first(payloads, encoder)
        raise


def encode_each(payloads: list[Any], encoder: json.JSONEncoder = _encoder) -> list[str]:
    """Return each of ``payloads`` as `encode_payload` writes it (COPY takes one value a row).

    The payloads are inspected together, as in `encode_payloads`.

    Raises:
        TypeError, ValueError: as `encode_payloads`.
    """
    try:
        values = _values(payloads)
        _inspect(values, -1)
        encode = _one_by_one(encoder)
        texts = [encode(value) for value in values]
        # _checked, with one look at all the texts for what is rare.
        joined = "".join(texts)
        joined.encode("utf-8")  # a lone surrogate raises
        if "\\u0000" in joined or "e+" in joined:
            texts = [_checked(text) for text in texts]
        return texts
    except (TypeError, ValueError, RecursionError):
        _refuse_first(payloads, encoder)
        raise


def _one_by_one(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode`` for many values: the C encoder that each call of it
    makes (a third of the time for a small payload) is made once."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return encoder.encode
    # The arguments JSONEncoder.iterencode passes (pgqueue's encoders never indent).
    iterencode = make(
        {} if encoder.check_circular else None,
        encoder.default,
        json.encoder.encode_basestring_ascii
        if encoder.ensure_ascii
        else json.encoder.encode_basestring,
        None,
        encoder.key_separator,
        encoder.item_separator,
        encoder.sort_keys,
        encoder.skipkeys,
        encoder.allow_nan,
    )
    return lambda value: "".join(iterencode(value, 0))


def _refuse_first(payloads: list[Any], encoder: json.JSONEncoder) -> None:
    """Raise `encode_payload`'s error for the first bad payload, naming its index."""
    for index, payload in enumerate(payloads):
        try:
            encode_payload(payload, encoder)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"job {index}: {exc}") from exc


def _values(payloads: list[Any]) -> list[Any]:
    """The values `encode_payload` would encode of each of ``payloads``."""
    return [p if type(p) is dict else {} if p is None else _loaded(p) for p in payloads]


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
        raise TypeError(_unserializable(value, hook, exc).message) from exc
    except ValueError as exc:
        # Python's own messages: NaN and infinities, ints too long for text.
        reason = "JSON has no NaN or infinity" if "float" in str(exc) else exc
        msg = f"payload cannot be stored as JSON: {reason}"
        raise ValueError(msg) from exc
    except RecursionError as exc:
        msg = "payload cannot be stored as JSON: it is nested too deeply to encode"
        raise ValueError(msg) from exc
    return _checked(text)


def _checked(text: str) -> str:
    """The encoder's ``text`` as jsonb gives it back unchanged, or raise (a NUL, a lone surrogate)."""
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


class Unencodable(NamedTuple):
    """Why a payload could not be encoded, and where."""

    message: str
    path: str | None = None
    """Where in the payload (``args[0]``, ``kwargs.when``; ``""`` for the
    payload itself); None when it cannot be told."""
    value_type: type | None = None
    """The type of the value JSON cannot hold; None when it cannot be told."""


def unencodable(value: Any) -> Unencodable | None:
    """The first value in ``value`` JSON cannot hold, and where; None if there is none."""
    try:
        _encoder.encode(value)
    except TypeError as exc:
        return _unserializable(value, None, exc)
    except ValueError:
        return None
    return None


def _unserializable(
    value: Any, hook: Callable[[Any], Any] | None, error: TypeError
) -> Unencodable:
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
        found = path, type(item)
        if hook is None:
            return Unencodable(f"{where}; {_HINT}", *found)
        if hooked == 10:  # what it returns needs it again, and again...
            return Unencodable(
                f"{where}: json_encoder did not turn it into JSON values", *found
            )
        try:
            stack.append((path, hook(item), hooked + 1))
        except Exception as exc:
            return Unencodable(f"{where}: json_encoder raised {describe(exc)}", *found)
    text = str(error)
    return Unencodable(
        text
        if text.startswith("payload")
        else f"payload is not JSON-serializable: {text}"
    )


def to_json_value(value: Any) -> Any:
    """Return ``value`` as a value JSON can hold, when it is a typed payload.

    A dataclass instance becomes the dict `dataclasses.asdict` makes of it,
    with the pydantic models it holds dumped, ``UUID``, ``datetime``,
    ``date``, ``time`` and ``Decimal`` values as strings (ISO 8601 for
    times), ``Enum`` members as their values, and its other values shared,
    not deep-copied; a pydantic model becomes ``model_dump(mode="json",
    by_alias=True)`` (aliases are the names ``model_validate`` reads back).
    Anything else, including a dataclass or a model in a dict or a list, is
    returned unchanged.
    """
    cls = type(value)
    if cls in _JSON_TYPES:
        return value
    if hasattr(cls, "__dataclass_fields__"):
        return _as_dict(value)
    if is_model_class(cls):
        return value.model_dump(mode="json", by_alias=True)
    return value


def _as_dict(value: Any) -> Any:
    """`dataclasses.asdict` of ``value``, but sharing its leaves, with models dumped
    and the scalars JSON has no type for written as `pgqueue._core.typed` reads them back."""
    cls = type(value)
    if cls in _JSON_TYPES and cls is not dict and cls is not list:
        return value
    if hasattr(cls, "__dataclass_fields__"):  # an instance: for a class, cls is type
        return {
            f.name: _as_dict(getattr(value, f.name)) for f in dataclasses.fields(value)
        }
    if isinstance(value, enum.Enum):
        return _as_dict(value.value)
    if isinstance(value, list | tuple):
        return [_as_dict(item) for item in value]
    if isinstance(value, dict):
        return {_as_dict(key): _as_dict(item) for key, item in value.items()}
    if isinstance(value, date | time):  # datetime is a date
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if is_model_class(cls):
        return value.model_dump(mode="json", by_alias=True)
    return value


def is_model_class(cls: object) -> bool:
    """Whether ``cls`` is a pydantic model class; never imports pydantic."""
    pydantic = sys.modules.get("pydantic")
    return (
        pydantic is not None
        and isinstance(cls, type)
        and issubclass(cls, pydantic.BaseModel)
    )
