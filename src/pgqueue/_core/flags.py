"""The worker options' flags, for every command that runs a worker.

``pgqueue worker`` and ``manage.py pgqueue_worker`` add them with
`add_option_flags` and read them with `option_values`, so both take the
same flags, built from the fields of `WorkerOptions` (their `Flag`), and
each lands under its option's name. A flag not given is not in the parsed
namespace.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import math
import os
import re
import sys
from typing import Any

from pgqueue._core.options import Flag, RateLimit, option_flags

__all__ = [
    "DURATION_EXAMPLES",
    "FlagError",
    "add_option_flags",
    "duration",
    "option_values",
    "optional_duration",
    "optional_int",
    "resolve",
    "seconds_of",
]

logger = logging.getLogger("pgqueue.cli")


class FlagError(Exception):
    """A flag's value is no good; each command says it its own way."""


_DURATION = re.compile(r"(?:(?:\d+(?:\.\d*)?|\.\d+)[dhms])+|\d+(?:\.\d*)?|\.\d+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([dhms])")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
DURATION_EXAMPLES = "30s, 10m, 2h, 7d, 1h30m or seconds"


def seconds_of(text: str) -> float | None:
    """``30s``, ``10m``, ``2h``, ``7d``, ``1h30m`` or plain seconds, as float seconds; None if not one.

    Units go from the largest to the smallest, each at most once.
    """
    spelled = text.strip().lower()
    seconds = math.nan
    if _DURATION.fullmatch(spelled):
        parts = _DURATION_PART.findall(spelled)
        units = [unit for _, unit in parts]
        if not parts:
            seconds = float(spelled)
        elif units == sorted(set(units), key="dhms".index):
            seconds = sum(float(n) * _UNIT_SECONDS[unit] for n, unit in parts)
    return seconds if math.isfinite(seconds) else None


def duration(text: str, what: str = "duration") -> float:
    """An argparse type: a duration (`seconds_of`), as float seconds; its error calls it ``what``."""
    seconds = seconds_of(text)
    if seconds is None:
        msg = f"not a {what}: {text!r} (use e.g. {DURATION_EXAMPLES})"
        raise argparse.ArgumentTypeError(msg)
    return seconds


def optional_duration(text: str) -> float | None:
    """An argparse type: a duration (`duration`), or ``none`` for None."""
    return None if text.strip().lower() == "none" else duration(text)


def optional_int(text: str) -> int | None:
    """An argparse type: a whole number, or ``none`` for None."""
    if text.strip().lower() == "none":
        return None
    try:
        return int(text, 10)
    except ValueError:
        msg = f"not a whole number: {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


# --------------------------------------------------------------------------
# Adding the flags


_TYPES: dict[str, Any] = {
    "int": int,
    "int|none": optional_int,
    "seconds": duration,
    "seconds|none": optional_duration,
}
"""The argparse type of each kind of flag value that has one."""


def add_option_flags(group: Any) -> dict[str, list[str]]:
    """Add the flag of every option that has one to ``group`` (a parser or an argument group).

    Returns:
        Each option's flags (``--listen`` and ``--no-listen`` for
        ``listen``; ``queue`` and ``queues`` share ``--queue``).
    """
    added: dict[str, list[str]] = {}
    for name, flag in option_flags().items():
        added[name] = _add_option(group, name, flag)
    return added


def _add_option(group: Any, name: str, flag: Flag) -> list[str]:
    """Add the flags of option ``name``; its value lands under ``name`` when given."""
    keep = argparse.SUPPRESS  # an option not given is not in the namespace
    arguments: dict[str, Any] = {"dest": name, "default": keep, "help": flag.help}
    if flag.metavar is not None:
        arguments["metavar"] = flag.metavar
    kind = flag.kind
    if kind == "queues":
        return [flag.name]  # --queue NAME=N, given by the queue option's flag
    if kind in _TYPES:
        arguments["type"] = _TYPES[kind]
    elif kind == "choice":
        arguments["choices"] = flag.choices
    elif kind == "callables":
        arguments["action"] = "append"
    elif kind == "queue":
        arguments["action"] = _QueueAction
    elif kind == "limit":
        arguments["action"] = _GlobalLimitAction
    elif kind == "rate":
        arguments["action"] = _RateLimitAction
    elif kind == "listen":
        arguments.update(nargs="?", const=True)
    group.add_argument(flag.name, **arguments)
    if kind != "listen":
        return [flag.name]
    negative = f"--no-{flag.name.removeprefix('--')}"
    group.add_argument(
        negative,
        dest=name,
        action="store_const",
        const=False,
        default=keep,
        help="poll only",
    )
    return [flag.name, negative]


class _QueueAction(argparse.Action):
    """``--queue NAME`` (the one queue), or ``--queue NAME=N`` repeated (``queues``); not both.

    ``NAME=N`` is read as a queue and its concurrency only when N is a whole
    number; any other text is one queue's name.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        text = str(values)
        name, sep, number = text.rpartition("=")
        if sep and name and number.isdigit():
            if hasattr(namespace, "queue"):
                raise argparse.ArgumentError(self, _MIXED)
            queues: dict[str, int] = getattr(namespace, "queues", {})
            if name in queues:
                msg = f"queue {name!r} given twice"
                raise argparse.ArgumentError(self, msg)
            queues[name] = int(number)
            namespace.queues = queues
        else:
            if hasattr(namespace, "queues"):
                raise argparse.ArgumentError(self, _MIXED)
            namespace.queue = text


_MIXED = "give either one --queue NAME or several --queue NAME=N, not both"


class _PerQueueAction(argparse.Action):
    """``--OPTION VALUE`` (the one queue's), ``none``, or ``--OPTION NAME=VALUE`` repeated."""

    form = "N"
    """How a value is written, for the error when both ways are mixed."""

    def value(self, text: str) -> Any:
        """The option's value read from ``text`` (raises `argparse.ArgumentError`)."""
        return _whole(self, text)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        text = str(values)
        dest = self.dest
        mixed = (
            f"give either one {option_string} {self.form} or several "
            f"{option_string} NAME={self.form}, not both"
        )
        given = getattr(namespace, dest, {})
        name, sep, value = text.rpartition("=")
        if sep and name:
            if not isinstance(given, dict):
                raise argparse.ArgumentError(self, mixed)
            if name in given:
                msg = f"queue {name!r} given twice"
                raise argparse.ArgumentError(self, msg)
            given[name] = self.value(value)
            setattr(namespace, dest, given)
        else:
            if hasattr(namespace, dest):
                raise argparse.ArgumentError(self, mixed)
            setattr(
                namespace, dest, None if text.lower() == "none" else self.value(text)
            )


class _GlobalLimitAction(_PerQueueAction):
    """``--global-limit N`` / ``--group-limit N`` (the one queue's), ``none``, or ``NAME=N`` repeated."""


class _RateLimitAction(_PerQueueAction):
    """``--rate-limit N/DURATION[:per-group]``, ``none``, or ``NAME=N/DURATION`` repeated."""

    form = "N/DURATION"

    def value(self, text: str) -> RateLimit:
        """The `RateLimit` written as ``N/DURATION[:per-group]``."""
        return _rate(self, text)


def _rate(action: argparse.Action, text: str) -> RateLimit:
    """``N/DURATION`` (``100/60s``, ``5/1s:per-group``) as a `RateLimit`."""
    body, colon, flag = text.partition(":")
    if colon and flag != "per-group":
        msg = f"expected N/DURATION or N/DURATION:per-group, got {text!r}"
        raise argparse.ArgumentError(action, msg)
    count, slash, window = body.partition("/")
    if not slash:
        msg = f"expected N/DURATION (100/60s), got {text!r}"
        raise argparse.ArgumentError(action, msg)
    try:
        return RateLimit(
            _whole(action, count), per=duration(window), per_group=bool(colon)
        )
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        raise argparse.ArgumentError(action, str(exc)) from None


def _whole(action: argparse.Action, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        msg = f"not a whole number: {text!r}"
        raise argparse.ArgumentError(action, msg) from None


# --------------------------------------------------------------------------
# Reading them


def resolve(reference: str, what: str = "MODULE:ATTR") -> Any:
    """Import ``MODULE`` and return its attribute ``ATTR`` (dotted names allowed).

    The current directory is importable.

    Raises:
        FlagError: not of the form ``MODULE:ATTR``, the module does not
            import, or it has no such attribute.
    """
    module_name, sep, attr = reference.partition(":")
    if not (sep and module_name and attr):
        msg = f"{what} {reference!r} is not of the form MODULE:ATTR"
        raise FlagError(msg)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # whatever the module raises, it does not import
        logger.debug("importing %s failed", module_name, exc_info=exc)
        msg = f"cannot import {module_name!r} (of {what} {reference}): {_describe(exc)}"
        raise FlagError(msg) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            msg = f"{module_name!r} has no attribute {attr!r} (of {what} {reference})"
            raise FlagError(msg) from None
    return obj


def _describe(exc: BaseException) -> str:
    """``exc`` on one line: its type and its message's first line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def _callable(reference: str, what: str) -> Any:
    obj = resolve(reference, what)
    if not callable(obj):
        msg = f"{what} {reference} is of type {type(obj).__name__}, not callable"
        raise FlagError(msg)
    return obj


def _logger(reference: str) -> Any:
    if ":" not in reference:
        return logging.getLogger(reference)
    obj = resolve(reference, "--logger")
    if not all(
        callable(getattr(obj, level, None))
        for level in ("debug", "info", "warning", "error")
    ):
        msg = f"--logger {reference} is of type {type(obj).__name__}, not a logger"
        raise FlagError(msg)
    return obj


def option_values(args: argparse.Namespace) -> dict[str, Any]:
    """The `Worker` options the flags in ``args`` give, resolved (imports done).

    ``middleware`` and ``observers`` hold only the flags' entries (the
    command adds them to the worker's own).

    Raises:
        FlagError: a ``MODULE:ATTR`` that does not import or is of the
            wrong kind.
    """
    values: dict[str, Any] = {}
    for name, flag in option_flags().items():
        if not hasattr(args, name):
            continue
        value = getattr(args, name)
        if flag.kind == "callable":
            value = _callable(value, flag.name)
        elif flag.kind == "callables":
            value = [_callable(ref, flag.name) for ref in value]
        elif flag.kind == "logger":
            value = _logger(value)
        values[name] = value
    return values
