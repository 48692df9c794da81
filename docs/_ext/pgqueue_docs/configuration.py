"""The configuration pages: each constructor's parameters, and the worker's options.

``pgqueue-parameters`` tables a class's constructor: each parameter, its
default from the signature, and its description from the class
docstring's ``Args:``. ``pgqueue-worker-options`` tables the fields of
`pgqueue.WorkerOptions` with their defaults, the flag of ``pgqueue worker``
their metadata declares, and `pgqueue.Worker`'s description of each. A
parameter without a description, or a description without a parameter,
fails the build.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
from typing import TYPE_CHECKING, Any

from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from pgqueue_docs._docstrings import section_entries
from pgqueue_docs._rst import list_table, parse
from pgqueue_docs.api import public_name

if TYPE_CHECKING:
    from collections.abc import Iterator

    from docutils.nodes import Node

__all__ = ["ParametersDirective", "WorkerOptionsDirective", "default_text"]

logger = logging.getLogger(__name__)


def _imported(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def default_text(value: object) -> str:
    """A default as reStructuredText: a literal, or a link to the function it is."""
    if value is inspect.Parameter.empty:
        return "(required)"
    if inspect.isfunction(value):
        name = public_name(f"{value.__module__}.{value.__qualname__}", "pgqueue")
        return f":py:func:`{name}`"
    if isinstance(value, str):
        return f"``{str.__repr__(value)}``"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"``{int.__repr__(value)}``"
    return f"``{value!r}``"


class _Described(SphinxDirective):
    """What both tables share: descriptions parsed where the class's docstring is."""

    required_arguments = 1

    @contextlib.contextmanager
    def _inside(self, cls: type) -> Iterator[None]:
        """Resolve the descriptions' references as in the class's docstring."""
        context = self.env.ref_context
        saved = {key: context.get(key) for key in ("py:module", "py:class")}
        context["py:module"] = "pgqueue"
        context["py:class"] = cls.__name__
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    context.pop(key, None)
                else:
                    context[key] = value

    def _descriptions(self, cls: type, names: list[str]) -> dict[str, str]:
        """Each of ``names``' description in ``cls``'s ``Args:``; warn of any missing."""
        described = {
            name: "\n".join(lines)
            for name, lines in section_entries(cls.__doc__ or "", "Args")[0].items()
        }
        where = f"{cls.__module__}.{cls.__qualname__}"
        for name in names:
            if name not in described:
                logger.warning(
                    "%s: %s has no description in its Args:",
                    where,
                    name,
                    location=self.get_location(),
                )
        for name in sorted(set(described) - set(names)):
            logger.warning(
                "%s: Args: describes %s, which it does not take",
                where,
                name,
                location=self.get_location(),
            )
        return described


class ParametersDirective(_Described):
    """``.. pgqueue-parameters:: pgqueue.Queue``: a constructor's parameters."""

    def run(self) -> list[Node]:
        """The table: parameter, default, meaning."""
        cls = _imported(self.arguments[0])
        parameters = inspect.signature(cls).parameters
        described = self._descriptions(cls, list(parameters))
        rows = [
            (f"``{name}``", default_text(p.default), described.get(name, ""))
            for name, p in parameters.items()
        ]
        with self._inside(cls):
            return parse(
                self,
                list_table(
                    ("parameter", "default", "meaning"), rows, widths="20 20 60"
                ),
            )


def _flag(field: dataclasses.Field[Any]) -> str:
    """The ``pgqueue worker`` flag of an option, or why it has none."""
    from pgqueue._core.options import FLAG, NO_FLAG

    if NO_FLAG in field.metadata:
        return f"none: {field.metadata[NO_FLAG]}"
    flag = field.metadata[FLAG]
    link = f":option:`{flag.name} <pgqueue worker {flag.name}>`"
    if flag.kind == "listen":
        return f"{link}, :option:`--no-listen <pgqueue worker --no-listen>`"
    if flag.kind == "queues":
        return f"{link} ``NAME=N``, repeated"
    return link


class WorkerOptionsDirective(_Described):
    """``.. pgqueue-worker-options:: pgqueue.Worker``: every option of a worker."""

    def run(self) -> list[Node]:
        """The table: option, default, flag, meaning."""
        from pgqueue import WorkerOptions

        cls = _imported(self.arguments[0])
        fields = dataclasses.fields(WorkerOptions)
        parameters = [
            name for name in inspect.signature(cls).parameters if name != "pool"
        ]
        if parameters != [field.name for field in fields]:
            logger.warning(
                "%s's keyword arguments are not WorkerOptions' fields",
                self.arguments[0],
                location=self.get_location(),
            )
        described = self._descriptions(cls, ["pool", *parameters])
        rows = [
            (
                f"``{field.name}``",
                default_text(field.default),
                _flag(field),
                described.get(field.name, ""),
            )
            for field in fields
        ]
        with self._inside(cls):
            return parse(
                self,
                list_table(
                    ("option", "default", "``pgqueue worker``", "meaning"),
                    rows,
                    widths="15 15 20 50",
                ),
            )
