"""pgqueue's Sphinx extension: the reference pages that are generated from the code.

Each directive reads the code as the build runs, so its page cannot drift
from it; where a page pairs the code with prose (a log message and its
meaning, a column and why it exists), the directive warns when one has no
counterpart in the other, which fails the build (``-W``).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from typing import TYPE_CHECKING, Any

from sphinx.ext import intersphinx
from sphinx.util.inspect import TypeAliasForwardRef

from pgqueue_docs import api, cli, configuration, logs, schema, telemetry
from pgqueue_docs._docstrings import section_entries

if TYPE_CHECKING:
    from docutils.nodes import Element, TextElement
    from sphinx.addnodes import pending_xref
    from sphinx.application import Sphinx
    from sphinx.environment import BuildEnvironment

__all__ = ["setup"]


def _dataclass(full_name: str) -> Any:
    """The dataclass named ``full_name`` (``pgqueue.SchemaState``), or None."""
    module_name, _, name = full_name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return found if dataclasses.is_dataclass(found) else None


def fields_where_they_are_documented(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """Describe each dataclass field once: as an attribute of its own, with its type.

    napoleon would make an attribute entry of each name in a class's
    ``Attributes:`` section, and autodoc documents the dataclass's fields
    too (their types from the annotations; Sphinx 9 documents every slot):
    two entries for one name. So the section leaves the class's docstring
    and each description becomes its field's docstring. Runs before
    napoleon reads the docstrings.
    """
    del app, obj, options
    if what in ("class", "exception") and (owner := _dataclass(name)):
        fields = {field.name for field in dataclasses.fields(owner)}
        described, section = section_entries(lines, "Attributes")
        if described and set(described) <= fields:
            del lines[section]
    elif what == "attribute" and not any(line.strip() for line in lines):
        owner_name, _, field = name.rpartition(".")
        if owner := _dataclass(owner_name):
            described = section_entries(owner.__doc__ or "", "Attributes")[0]
            lines[:] = described.get(field, lines)


def _alias_names_in_unions() -> None:
    """Show an ``autodoc_type_aliases`` name inside a union as the name it stands for.

    Sphinx 9.0 evaluates ``Alias | None`` with a placeholder for ``Alias``
    but writes the placeholder's ``repr`` into the signature
    (``TypeAliasForwardRef('pgqueue.Connection') | None``): its repr becomes
    the name (as sphinx-doc/sphinx#14004 did for evaluating such unions).
    """
    TypeAliasForwardRef.__repr__ = lambda self: str(self.name)  # type: ignore[method-assign]


def aliased_reference(
    app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: TextElement
) -> Element | None:
    """Resolve a name of ``autodoc_type_aliases`` that autodoc left as it was written.

    autodoc applies the aliases only where it can evaluate a whole
    signature; an annotation it cannot (a dataclass field's ``datetime``,
    imported for type checking only) keeps the name, which is resolved here
    as the alias says (``datetime.datetime``), here or through intersphinx.
    """
    target = app.config.autodoc_type_aliases.get(node.get("reftarget", ""))
    if node.get("refdomain") != "py" or target is None:
        return None
    aliased = node.deepcopy()
    aliased["reftarget"] = target
    found = env.domains["py"].resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], target, aliased, contnode
    )
    return found or intersphinx.missing_reference(app, env, aliased, contnode)


def function_defaults_by_name(
    app: Sphinx,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str | None, str | None] | None:
    """Write a default that is a function by its name (``backoff=default_backoff``).

    Its repr, ``<function default_backoff>``, is no Python expression: the
    signature could not be parsed, and would show unlinked and unwrapped.
    """
    del app, what, name, obj, options
    if signature is None or "<function " not in signature:
        return None
    return re.sub(r"<function ([\w.]+)[^>]*>", r"\1", signature), return_annotation


def setup(app: Sphinx) -> dict[str, Any]:
    """Register the directives and the autodoc hooks."""
    _alias_names_in_unions()
    app.connect("missing-reference", aliased_reference)
    app.connect("autodoc-process-signature", function_defaults_by_name)
    app.connect(
        "autodoc-process-docstring", fields_where_they_are_documented, priority=400
    )
    app.connect("autodoc-process-docstring", api.reexported_docstring, priority=400)
    app.add_directive("pgqueue-type-alias", api.TypeAliasDirective)
    app.add_directive("pgqueue-cli", cli.CommandLineDirective)
    app.add_directive("pgqueue-exit-codes", cli.ExitCodesDirective)
    app.add_directive("pgqueue-parameters", configuration.ParametersDirective)
    app.add_directive("pgqueue-worker-options", configuration.WorkerOptionsDirective)
    app.add_directive("pgqueue-table", schema.TableDirective)
    app.add_directive("pgqueue-sql", schema.SQLDirective)
    app.add_directive("pgqueue-log-messages", logs.LogMessagesDirective)
    app.add_directive("pgqueue-metrics", telemetry.MetricsDirective)
    app.add_directive("pgqueue-spans", telemetry.SpansDirective)
    app.connect("env-check-consistency", logs.check_every_logger)
    app.connect("env-purge-doc", logs.forget_document)
    app.connect("env-merge-info", logs.merge_loggers)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
