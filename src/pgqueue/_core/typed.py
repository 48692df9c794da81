"""Typed payloads: a handler annotated ``job: Job[X]`` gets its payload as an ``X``.

``X`` is a dataclass or a pydantic model (pydantic is never required: it is
looked for only in ``sys.modules``, where any model class has put it). The
worker wraps such a handler with `typed_handler` when it is registered; a
payload that does not fit ``X`` dead-letters its job at once, with a message
naming the type and the field. `pgqueue._core.codec.to_json_value` is the way
back: what ``enqueue`` turns an ``X`` into before encoding it.

Dataclass payloads are checked by a small validator: every field without a
default must be present, no key may name an unknown field (a key naming a
field with ``init=False`` is ignored: `dataclasses.asdict` writes it), and
these annotations are checked: ``str``, ``int`` (not ``bool``), ``float``
(an ``int`` is accepted and converted), ``bool``, ``None``, unions
(``X | None``, ``Optional[X]``), ``Any``, ``object``, ``Literal[...]``,
``list[X]``, ``dict[str, X]`` (values; keys are always strings in JSON),
``NewType``\\ s, nested dataclasses and pydantic models. These are decoded
from what `pgqueue._core.codec.to_json_value` writes for them: ``UUID`` (its
string), ``datetime``, ``date`` and ``time`` (ISO 8601 strings; a ``Z``
offset is read too), ``Decimal`` (its string, keeping every digit; a JSON
number is read too) and ``Enum`` subclasses (their value). Any other annotation
(``tuple``, ``timedelta``, a ``TypedDict``, a type variable...) is not
checked: the field gets the JSON value as it is. A union takes the first
member that accepts the value, after an exact match of its type (so
``UUID | str`` keeps a string a string). Pydantic models validate
themselves (`model_validate`), under their own configuration.
"""

from __future__ import annotations

import ast
import dataclasses
import decimal
import enum
import functools
import inspect
import json
import sys
import types
import typing
import uuid
from datetime import date, datetime, time
from typing import TYPE_CHECKING, Any, Literal, NewType, TypeAlias, TypeVar, Union

from pgqueue._core.codec import is_model_class
from pgqueue._core.errors import Permanent, describe
from pgqueue._core.job import Job

if TYPE_CHECKING:
    from collections.abc import Callable

    from pgqueue._core.handler import Handler

__all__ = [
    "converting",
    "is_async",
    "payload_converter",
    "payload_type",
    "typed_handler",
]

Convert: TypeAlias = "Callable[[Any], Any]"
"""Turns a decoded JSON value into the value an annotation asks for, or raises `_Mismatch`."""

# The marker typed_handler sets on its wrappers, so that it never wraps twice.
_MARK = "_pgqueue_payload_type"

_UNION_TYPES = (Union, types.UnionType)
_EXACT_SCALARS = frozenset({str, int, float, bool, type(None)})


def typed_handler(handler: Handler) -> Handler:
    """Return ``handler``, wrapped to get its payload as the type its annotation names.

    When the first parameter of ``handler`` is annotated ``Job[X]``, ``X`` a
    dataclass or a pydantic model, the wrapper turns ``job.payload`` into an
    ``X`` (in a new `Job`) before calling it, and raises `Permanent` when
    the payload does not fit. Any other handler (no annotation, ``Job``,
    ``Job[Any]``, ``Job[dict[str, Any]]``...) is returned unchanged.

    String annotations (``from __future__ import annotations``) are resolved
    in the handler's module, and in the variables its body closes over.

    Raises:
        TypeError: the annotation is ``Job[...]`` but cannot be resolved (a
            class defined inside a function, or imported only under
            ``if TYPE_CHECKING:``), or the type hints of a dataclass it
            names cannot be; raised at registration, not at the first job.
    """
    if _MARK in getattr(handler, "__dict__", ()):
        return handler
    payload_cls = payload_type(handler)
    if payload_cls is None:
        return handler
    return converting(handler, payload_cls, payload_converter(payload_cls))


def converting(
    handler: Callable[[Job[Any]], Any], payload_cls: type, convert: Convert
) -> Handler:
    """``handler``, called with ``job.payload`` turned into a ``payload_cls`` by ``convert``.

    The wrapper is async when ``handler`` is, and a plain function calling
    it otherwise (so that a worker running plain functions in threads runs
    this one in a thread too); `typed_handler` never wraps it again.
    """

    def call(job: Job[Any]) -> Any:
        return handler(dataclasses.replace(job, payload=convert(job.payload)))

    async def call_async(job: Job[Any]) -> Any:
        return await call(job)

    typed = functools.wraps(handler)(call_async if is_async(handler) else call)
    typed.__dict__[_MARK] = payload_cls
    return typed


def is_async(handler: Callable[..., Any]) -> bool:
    """Whether ``handler`` is an async function, a partial of one, or an object whose ``__call__`` is."""
    while isinstance(handler, functools.partial):
        handler = handler.func
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 - the method, not callable()
    )


def payload_type(handler: Callable[..., Any]) -> type | None:
    """The dataclass or pydantic model ``X`` of a handler whose first parameter is ``Job[X]``.

    Returns ``None`` for any other handler.

    Raises:
        TypeError: as `typed_handler`.
    """
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # a builtin, or something with no signature
        return None
    first = next(iter(signature.parameters.values()), None)
    if first is None or first.annotation is inspect.Parameter.empty:
        return None
    if first.kind not in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD):
        return None
    argument = _job_argument(handler, first.name, first.annotation)
    if argument is None:
        return None
    # A parameterized generic dataclass (Box[int]) is checked as Box.
    cls = typing.get_origin(argument) or argument
    if not isinstance(cls, type):
        return None
    if dataclasses.is_dataclass(cls) or is_model_class(cls):
        return cls
    return None


def payload_converter(cls: type) -> Callable[[Any], Any]:
    """A function that turns a decoded JSON payload into a ``cls``.

    The function raises `Permanent` when the payload does not fit, with a
    message such as ``payload does not match SendWelcome: field 'user_id':
    expected str, got int``.

    Raises:
        TypeError: ``cls`` is not a dataclass or a pydantic model class, or
            type hints of a dataclass it holds cannot be resolved.
    """
    if not (dataclasses.is_dataclass(cls) or is_model_class(cls)):
        msg = f"a payload type must be a dataclass or a pydantic model, not {cls!r}"
        raise TypeError(msg)
    convert = _Compiler().compile(cls)
    name = cls.__name__

    def convert_payload(payload: Any) -> Any:
        try:
            return convert(payload)
        except _Mismatch as exc:
            msg = f"payload does not match {name}: {exc.describe()}"
            raise Permanent(msg) from exc.__cause__
        except RecursionError:
            msg = f"payload does not match {name}: it is nested too deeply to check"
            raise Permanent(msg) from None

    return convert_payload


def _job_argument(handler: Callable[..., Any], name: str, annotation: Any) -> Any:
    """``X`` when ``annotation`` is ``Job[X]``, resolved; ``None`` when it is anything else.

    An annotation that cannot be resolved is taken for what it looks like:
    ``pgqueue.Job[X]`` with ``pgqueue`` imported only for type checkers is
    still ``Job[X]``, and only ``X`` must be found.
    """
    function = _defining_function(handler)
    namespace = {**getattr(function, "__globals__", {}), **_closure(function)}
    try:
        hint = _evaluate(annotation, namespace)
    except Exception as exc:
        failure = exc
    else:
        return typing.get_args(hint)[0] if typing.get_origin(hint) is Job else None
    if isinstance(annotation, str):
        argument = _job_subscript(annotation, namespace)
        if argument is None:
            return None  # untyped, as every handler was before Job was generic
        try:
            return _evaluate(argument, namespace)
        except Exception as exc:
            failure = exc
    elif typing.get_origin(annotation) is not Job:
        return None
    where = getattr(handler, "__qualname__", None) or repr(handler)
    text = annotation if isinstance(annotation, str) else repr(annotation)
    msg = (
        f"cannot resolve the annotation {text!r} of parameter {name!r} of "
        f"handler {where}: {describe(failure)}. The payload type of a typed "
        "handler must be found when it is registered: define it at module "
        "level, and import it outside `if TYPE_CHECKING:`"
    )
    raise TypeError(msg) from failure


def _evaluate(annotation: Any, namespace: dict[str, Any]) -> Any:
    """An annotation (a string, or holding strings) evaluated in ``namespace``."""
    holder = types.SimpleNamespace(__annotations__={"hint": annotation})
    return typing.get_type_hints(holder, namespace, namespace)["hint"]


def _job_subscript(annotation: str, namespace: dict[str, Any]) -> str | None:
    """The text of ``X`` when ``annotation`` reads ``Job[X]`` (or ``pgqueue.Job[X]``)."""
    try:
        node = ast.parse(annotation, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Subscript):
        return None
    base = node.value
    if not isinstance(base, ast.Name | ast.Attribute):
        return None
    try:
        found = eval(ast.unparse(base), dict(namespace))  # a dotted name, nothing else
    except Exception:
        # Job itself is not there (imported only for type checkers): go by its name.
        tail = base.id if isinstance(base, ast.Name) else base.attr
        found = Job if tail == "Job" else None
    return ast.unparse(node.slice) if found is Job else None


def _defining_function(handler: Any) -> Any:
    """The function whose module (and closure) a handler's annotations belong to."""
    current = handler
    for _ in range(100):  # a chain of wrappers, not a cycle
        current = inspect.unwrap(current)
        if isinstance(current, functools.partial):
            current = current.func
        elif inspect.ismethod(current):
            current = current.__func__
        elif inspect.isfunction(current):
            return current
        else:  # an object with a __call__ method
            call = next(
                (
                    c.__dict__["__call__"]
                    for c in type(current).__mro__
                    if "__call__" in c.__dict__
                ),
                None,
            )
            if not inspect.isfunction(call):
                return current
            current = call
    return current


def _closure(function: object) -> dict[str, Any]:
    """The variables ``function`` closes over, by name."""
    code = getattr(function, "__code__", None)
    cells = getattr(function, "__closure__", None) or ()
    if code is None:
        return {}
    found: dict[str, Any] = {}
    for name, cell in zip(code.co_freevars, cells, strict=False):
        try:
            found[name] = cell.cell_contents
        except ValueError:  # not assigned yet
            continue
    return found


class _Mismatch(Exception):
    """A value that does not fit its annotation, and where it is."""

    def __init__(self, problem: str, *path: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path = list(path)  # innermost first
        self.more = 0  # further errors not described

    def describe(self) -> str:
        where = ""
        for step in reversed(self.path):
            where += step if step.startswith("[") or not where else f".{step}"
        if self.problem in ("missing", "unexpected"):
            text = f"{self.problem} field '{where}'"
        else:
            text = f"field '{where}': {self.problem}" if where else self.problem
        if self.more:
            text += f" (and {self.more} more error{'s' if self.more > 1 else ''})"
        return text


class _Compiler:
    """Builds the converter of an annotation once, at registration.

    Dataclasses are compiled once each, so recursive ones (a tree of nodes)
    refer to their own converter.
    """

    def __init__(self) -> None:
        self._dataclasses: dict[type, Convert] = {}

    def compile(self, tp: Any) -> Convert:
        if tp is Any or tp is object or isinstance(tp, TypeVar):
            return _unchecked
        if tp is None or tp is type(None):
            return _none
        if isinstance(tp, type) and tp in _SCALARS:
            return _SCALARS[tp]
        if isinstance(tp, type) and tp in _TEXT_SCALARS:
            return _TEXT_SCALARS[tp]
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return _enum(tp)
        if isinstance(tp, NewType):
            return self.compile(tp.__supertype__)
        origin = typing.get_origin(tp)
        if origin is Literal:
            return _literal(tp)
        if origin in _UNION_TYPES:
            return self._union(tp)
        if origin is list or tp is list:
            return self._list(tp)
        if origin is dict or tp is dict:
            return self._dict(tp)
        cls = origin if origin is not None else tp
        if isinstance(cls, type) and dataclasses.is_dataclass(cls):
            return self._dataclass(cls)
        if is_model_class(cls):
            return _model(cls)
        return _unchecked

    def _dataclass(self, cls: type) -> Convert:
        known = self._dataclasses.get(cls)
        if known is not None:
            return known
        try:
            hints = typing.get_type_hints(cls)
        except Exception as exc:
            msg = (
                f"cannot resolve the type hints of dataclass {cls.__qualname__}: "
                f"{describe(exc)}. A payload type must be defined at module "
                "level, with the types it names imported outside "
                "`if TYPE_CHECKING:`"
            )
            raise TypeError(msg) from exc
        fields: list[tuple[str, Convert]] = []
        required: set[str] = set()
        names = frozenset(f.name for f in dataclasses.fields(cls))

        def convert(value: Any) -> Any:
            if not isinstance(value, dict):
                raise _Mismatch(f"expected an object, got {_kind(value)}")
            kwargs: dict[str, Any] = {}
            for name, convert_field in fields:
                if name not in value:
                    if name in required:
                        raise _Mismatch("missing", name)
                    continue
                try:
                    kwargs[name] = convert_field(value[name])
                except _Mismatch as exc:
                    exc.path.append(name)
                    raise
            if len(kwargs) != len(value) and not names.issuperset(value):
                unexpected = next(key for key in value if key not in names)
                raise _Mismatch("unexpected", unexpected)
            try:
                return cls(**kwargs)
            except (TypeError, ValueError) as exc:
                mismatch = _Mismatch(f"{cls.__name__}() raised {describe(exc)}")
                raise mismatch from exc

        self._dataclasses[cls] = convert
        for field in dataclasses.fields(cls):
            if not field.init:
                continue
            fields.append((field.name, self.compile(hints.get(field.name, Any))))
            if (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            ):
                required.add(field.name)
        return convert

    def _union(self, tp: Any) -> Convert:
        members = typing.get_args(tp)
        nullable = type(None) in members
        choices = [(m, self.compile(m)) for m in members if m is not type(None)]
        exact = frozenset(
            m for m in members if isinstance(m, type) and m in _EXACT_SCALARS
        )
        expected = _type_name(tp)

        def convert(value: Any) -> Any:
            if value is None and nullable:
                return None
            if type(value) in exact:
                return value
            if len(choices) == 1:
                try:
                    return choices[0][1](value)
                except _Mismatch as exc:
                    if exc.path or not exc.problem.startswith("expected "):
                        raise
                    raise _Mismatch(
                        f"expected {expected}, got {_kind(value)}"
                    ) from None
            for _, convert_choice in choices:
                try:
                    return convert_choice(value)
                except _Mismatch:
                    continue
            raise _Mismatch(f"expected {expected}, got {_kind(value)}")

        return convert

    def _list(self, tp: Any) -> Convert:
        (item_type,) = typing.get_args(tp) or (Any,)
        convert_item = self.compile(item_type)
        if convert_item is _unchecked:
            return _plain(list, "list")

        def convert(value: Any) -> Any:
            if not isinstance(value, list):
                raise _Mismatch(f"expected list, got {_kind(value)}")
            items = []
            for index, item in enumerate(value):
                try:
                    items.append(convert_item(item))
                except _Mismatch as exc:
                    exc.path.append(f"[{index}]")
                    raise
            return items

        return convert

    def _dict(self, tp: Any) -> Convert:
        _, value_type = typing.get_args(tp) or (str, Any)
        convert_value = self.compile(value_type)
        if convert_value is _unchecked:
            return _plain(dict, "dict")

        def convert(value: Any) -> Any:
            if not isinstance(value, dict):
                raise _Mismatch(f"expected dict, got {_kind(value)}")
            items = {}
            for key, item in value.items():
                try:
                    items[key] = convert_value(item)
                except _Mismatch as exc:
                    exc.path.append(f"[{json.dumps(key, ensure_ascii=False)}]")
                    raise
            return items

        return convert


def _unchecked(value: Any) -> Any:
    return value


def _none(value: Any) -> Any:
    if value is not None:
        raise _Mismatch(f"expected None, got {_kind(value)}")
    return value


def _str(value: Any) -> Any:
    if not isinstance(value, str):
        raise _Mismatch(f"expected str, got {_kind(value)}")
    return value


def _int(value: Any) -> Any:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Mismatch(f"expected int, got {_kind(value)}")
    return value


def _float(value: Any) -> Any:
    if isinstance(value, float):
        return value
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Mismatch(f"expected float, got {_kind(value)}")
    try:
        return float(value)
    except OverflowError:
        raise _Mismatch("expected float, got an int too large for one") from None


def _bool(value: Any) -> Any:
    if not isinstance(value, bool):
        raise _Mismatch(f"expected bool, got {_kind(value)}")
    return value


_SCALARS: dict[Any, Convert] = {str: _str, int: _int, float: _float, bool: _bool}


def _from_iso(cls: type[date | time], name: str) -> Convert:
    """The converter of ``datetime``, ``date`` or ``time``: from an ISO 8601 string."""
    parse = cls.fromisoformat

    def convert(value: Any) -> Any:
        if not isinstance(value, str):
            raise _Mismatch(f"expected {name}, got {_kind(value)}")
        try:
            return parse(value)
        except ValueError:
            msg = f"expected an ISO 8601 {name}, got {_got(value)}"
            raise _Mismatch(msg) from None

    return convert


def _uuid(value: Any) -> Any:
    if not isinstance(value, str):
        raise _Mismatch(f"expected UUID, got {_kind(value)}")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise _Mismatch(f"expected UUID, got {_got(value)}") from None


def _decimal(value: Any) -> Any:
    """A ``Decimal`` from its string, or from a JSON number (a float by its shortest repr)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise _Mismatch(f"expected Decimal, got {_kind(value)}")
    try:
        return decimal.Decimal(repr(value) if isinstance(value, float) else value)
    except decimal.InvalidOperation:
        raise _Mismatch(f"expected Decimal, got {_got(value)}") from None


_TEXT_SCALARS: dict[Any, Convert] = {
    datetime: _from_iso(datetime, "datetime"),
    date: _from_iso(date, "date"),
    time: _from_iso(time, "time"),
    uuid.UUID: _uuid,
    decimal.Decimal: _decimal,
}
"""The scalars JSON has no type for, which `_as_dict` writes as strings."""


def _enum(cls: type[enum.Enum]) -> Convert:
    """The converter of an ``Enum``: a member from its value (a JSON ``true`` is not ``1``)."""
    values = [member.value for member in cls]
    shown = ", ".join(map(_shown, values[:6])) + (", ..." if len(values) > 6 else "")
    expected = f"expected a {cls.__name__} value ({shown})"

    def convert(value: Any) -> Any:
        try:
            member = cls(value)
        except (ValueError, TypeError):
            member = None
        if member is None or (type(value) is bool) is not (type(member.value) is bool):
            raise _Mismatch(f"{expected}, got {_got(value)}")
        return member

    return convert


def _plain(cls: type, name: str) -> Convert:
    """A converter that checks the type of a container, not what it holds."""

    def convert(value: Any) -> Any:
        if not isinstance(value, cls):
            raise _Mismatch(f"expected {name}, got {_kind(value)}")
        return value

    return convert


def _literal(tp: Any) -> Convert:
    allowed = typing.get_args(tp)
    expected = _type_name(tp)

    def convert(value: Any) -> Any:
        # 1 == True, but a JSON true is not the literal 1.
        for choice in allowed:
            if type(choice) is type(value) and choice == value:
                return choice
        raise _Mismatch(f"expected {expected}, got {_shown(value)}")

    return convert


def _model(cls: type) -> Convert:
    """The converter of a pydantic model class: its own ``model_validate``."""
    errors: type[Exception] = sys.modules["pydantic"].ValidationError
    validate = cls.model_validate  # type: ignore[attr-defined]

    def convert(value: Any) -> Any:
        try:
            return validate(value)
        except errors as exc:
            raise _from_pydantic(exc) from exc

    return convert


def _from_pydantic(exc: Any) -> _Mismatch:
    """The first error of a pydantic ``ValidationError``, as a `_Mismatch`."""
    first = exc.errors(include_url=False)[0]
    path = [
        f"[{step}]" if isinstance(step, int) else str(step) for step in first["loc"]
    ]
    path.reverse()
    message: str = first["msg"]
    if first["type"] == "missing":
        mismatch = _Mismatch("missing", *path)
    elif first["type"] == "extra_forbidden":
        mismatch = _Mismatch("unexpected", *path)
    elif message.startswith("Input should be "):
        # "Input should be a valid date, input is too short"
        expected, _, detail = message.removeprefix("Input should be ").partition(", ")
        problem = f"expected {expected}, got {_kind(first.get('input'))}"
        mismatch = _Mismatch(f"{problem} ({detail})" if detail else problem, *path)
    else:
        mismatch = _Mismatch(message, *path)
    mismatch.more = exc.error_count() - 1
    return mismatch


def _kind(value: Any) -> str:
    """The type of a JSON value, as Python names it."""
    return "None" if value is None else type(value).__name__


def _got(value: Any) -> str:
    """A JSON value as an error message says what it got: ``str 'x'``, ``int 3``, ``list``."""
    kind = _kind(value)
    return (
        f"{kind} {_shown(value)}"
        if value is not None and type(value) in _EXACT_SCALARS
        else kind
    )


def _shown(value: Any) -> str:
    """A scalar as it would be written (shortened), or the type of anything else."""
    if type(value) not in _EXACT_SCALARS:
        return _kind(value)
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _type_name(tp: Any) -> str:
    """An annotation as it is written: ``str | None``, ``list[int]``, ``Literal['a']``."""
    if tp is None or tp is type(None):
        return "None"
    if tp is Any:
        return "Any"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin in _UNION_TYPES:
        return " | ".join(map(_type_name, args))
    if origin is not None:
        name = getattr(origin, "__name__", repr(origin))
        return f"{name}[{', '.join(map(_type_name, args))}]" if args else name
    if isinstance(tp, type):
        return tp.__name__
    return repr(tp).removeprefix("typing.")
