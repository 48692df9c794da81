"""The public names that autodoc cannot document alone: re-exported data and type aliases.

``pgqueue`` re-exports its constants (``SCHEMA``, ``JOBS_CHANNEL``...) and
type aliases (``Connection``, ``Handler``...) from private modules, where
their docstrings are: autodoc looks for a constant's docstring in the
module it documents (``pgqueue/__init__.py``) and finds none, and shows a
type alias as the string or object it is at run time.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from typing import TYPE_CHECKING, Any

from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective

from pgqueue_docs._rst import indented, parse

if TYPE_CHECKING:
    from docutils.nodes import Node
    from sphinx.application import Sphinx

__all__ = [
    "TypeAliasDirective",
    "alias_value",
    "defining_module",
    "public_name",
    "reexported_docstring",
]


def _tree(module_name: str) -> ast.Module:
    return ast.parse(inspect.getsource(importlib.import_module(module_name)))


def defining_module(package: str, name: str) -> str:
    """The module ``package`` imports ``name`` from (``pgqueue`` → ``pgqueue._sql.schema``).

    ``package`` itself when it defines ``name``.
    """
    for node in ast.walk(_tree(package)):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return node.module
    return package


def _attribute_docstring(module_name: str, name: str) -> list[str]:
    analyzer = ModuleAnalyzer.for_module(module_name)
    return list(analyzer.find_attr_docs().get(("", name), []))


def reexported_docstring(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """Give a re-exported constant the docstring written where it is defined."""
    del app, obj, options
    if what != "data" or any(line.strip() for line in lines):
        return
    package, _, attribute = name.rpartition(".")
    origin = defining_module(package, attribute)
    if origin != package:
        lines[:] = _attribute_docstring(origin, attribute)


def _imported_names(tree: ast.Module, module_name: str) -> dict[str, str]:
    """What each name bound at the top of a module (imports included) stands for."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.partition(".")[0]] = (
                    alias.name if alias.asname else alias.name.partition(".")[0]
                )
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.ClassDef | ast.FunctionDef):
            target = node.target if isinstance(node, ast.AnnAssign) else node
            if isinstance(target, ast.Name):
                names[target.id] = f"{module_name}.{target.id}"
            elif isinstance(target, ast.ClassDef | ast.FunctionDef):
                names[target.name] = f"{module_name}.{target.name}"
    return names


def _resolve(dotted: str) -> Any:
    """The object ``dotted`` names, or None when it cannot be imported."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        try:
            for part in parts[split:]:
                found = getattr(found, part)
        except AttributeError:
            return None
        return found
    return None


def public_name(dotted: str, package: str) -> str:
    """``dotted``, or the name ``package`` exports the same object under."""
    found = _resolve(dotted)
    exported = importlib.import_module(package)
    for name in getattr(exported, "__all__", ()):
        if found is not None and getattr(exported, name) is found:
            return f"{package}.{name}"
    return dotted


def alias_value(package: str, name: str) -> tuple[str, list[str]]:
    """The value of the type alias ``package.name``, its names qualified, and its docstring."""
    origin = defining_module(package, name)
    tree = _tree(origin)
    for node in tree.body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == name
            and node.value is not None
        ):
            value = node.value
            break
    else:
        msg = f"{origin} defines no type alias {name}"
        raise ValueError(msg)
    text = (
        value.value
        if isinstance(value, ast.Constant) and isinstance(value.value, str)
        else ast.unparse(value)
    )
    names = _imported_names(tree, origin)

    def qualified(match: re.Match[str]) -> str:
        head, dot, rest = match[0].partition(".")
        if head in names:
            return public_name(names[head] + dot + rest, package)
        return match[0]  # a builtin (int, str...)

    return re.sub(r"[A-Za-z_][\w.]*", qualified, text), _attribute_docstring(
        origin, name
    )


class TypeAliasDirective(SphinxDirective):
    """``.. pgqueue-type-alias:: pgqueue.Connection``: a ``py:type`` from the code.

    The alias's value with its names qualified (so that each one links),
    and the docstring written under it in the module that defines it.
    """

    required_arguments = 1

    def run(self) -> list[Node]:
        """Document the alias."""
        package, _, name = self.arguments[0].rpartition(".")
        value, docstring = alias_value(package, name)
        return parse(
            self,
            [
                f".. py:type:: {name}",
                f"   :module: {package}",
                f"   :canonical: {value}",
                "",
                *indented(docstring, "   "),
            ],
        )
