"""The command line's reference, from its argparse parser and its exit codes.

``pgqueue-cli`` walks the parser ``pgqueue.cli.build_parser()`` returns:
a section per command and subcommand, with its usage, description, every
flag and argument (as ``option`` entries, which ``:option:`` links to) and
its epilog. ``pgqueue-exit-codes`` lists the exit codes the commands share,
from their constants in ``pgqueue.cli._common`` and their docstrings.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
from typing import TYPE_CHECKING

from docutils import nodes
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective

from pgqueue_docs._rst import indented, list_table, parse

if TYPE_CHECKING:
    from collections.abc import Iterator

    from docutils.nodes import Node

__all__ = ["CommandLineDirective", "ExitCodesDirective", "commands"]


def escaped(text: str) -> str:
    """``text`` as reStructuredText that shows it as it is (no markup)."""
    return re.sub(r"([\\`*_|\[\]<>])", r"\\\1", " ".join(text.split()))


def commands(
    parser: argparse.ArgumentParser, prefix: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser, str | None]]:
    """Each command under ``parser``: its full name, its parser and its one-line help."""
    for action in parser._actions:  # argparse has no public walk of its parsers
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                full = f"{prefix} {name}".strip()
                yield full, sub, helps.get(name)
                yield from commands(sub, full)


def _raw(parser: argparse.ArgumentParser) -> bool:
    """Whether the parser prints its description and epilog as written."""
    formatter = parser.formatter_class
    return isinstance(formatter, type) and issubclass(
        formatter, argparse.RawDescriptionHelpFormatter
    )


def _text(parser: argparse.ArgumentParser, text: str | None) -> list[str]:
    """A description or epilog: as written when the parser keeps its layout."""
    if not text:
        return []
    if _raw(parser):
        return ["::", "", *indented(text, "   "), ""]
    paragraphs = re.split(r"\n\s*\n", text.strip())
    return [line for p in paragraphs for line in (escaped(p), "")]


def _invocation(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    return formatter._format_action_invocation(action)


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    if not action.help:
        return ""
    formatter = parser._get_formatter()
    text = formatter._expand_help(action)
    default = action.default
    if (
        "default" not in text
        and default not in (None, False, argparse.SUPPRESS)
        and not isinstance(action, argparse._HelpAction)
        and action.option_strings
    ):
        text += f" (default: {default})"
    return text


def _options(parser: argparse.ArgumentParser, program: str) -> list[str]:
    """Each argument group of ``parser``: its title, then its arguments as options."""
    lines = [f".. program:: {program}", ""]
    for group in parser._action_groups:
        actions = [
            action
            for action in group._group_actions
            if action.help is not argparse.SUPPRESS
            and not isinstance(action, argparse._SubParsersAction)
        ]
        if not actions:
            continue
        lines += [f".. rubric:: {escaped(group.title or '')}", ""]
        if group.description:
            lines += [escaped(group.description), ""]
        for action in actions:
            lines += [
                f".. option:: {_invocation(parser, action)}",
                "",
                *indented(escaped(_help(parser, action)), "   "),
                "",
            ]
    return lines


def _subcommand_list(parser: argparse.ArgumentParser, name: str) -> list[str]:
    depth = len(name.split())
    rows = [
        (f":ref:`{full} <cli-{_slug(full)}>`", escaped(help_ or ""))
        for full, _sub, help_ in commands(parser, name)
        if len(full.split()) == depth + 1
    ]
    if not rows:
        return []
    return [
        ".. rubric:: commands",
        "",
        *list_table(("command", "what it does"), rows),
        "",
    ]


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


class CommandLineDirective(SphinxDirective):
    """``.. pgqueue-cli::``: every command of ``pgqueue``, from its parser."""

    def run(self) -> list[Node]:
        """A section per command, after the top-level parser's own."""
        from pgqueue.cli import build_parser

        parser = build_parser()
        program = parser.prog
        result = self._body(parser, program, "")
        for full, sub, _ in commands(parser):
            name = f"{program} {full}"
            section = nodes.section(ids=[f"cli-{_slug(full)}"], names=[name])
            section += nodes.title(name, "", nodes.literal(name, name))
            section += self._body(sub, name, full)
            self.env.domains.standard_domain.note_hyperlink_target(
                f"cli-{_slug(full)}", self.env.docname, section["ids"][0], name
            )
            result.append(section)
        return result

    def _body(
        self, parser: argparse.ArgumentParser, program: str, name: str
    ) -> list[Node]:
        usage = re.sub(r"\n {7}", "\n", parser.format_usage().removeprefix("usage: "))
        lines = [
            ".. code-block:: text",
            "",
            *indented(usage, "   "),
            "",
            *_text(parser, parser.description),
            *_options(parser, program),
            *_subcommand_list(parser, name),
            *_text(parser, parser.epilog),
        ]
        return parse(self, lines)


def _exit_constants() -> list[tuple[int, str, str]]:
    """``(code, name, docstring)`` of each ``EXIT_*`` constant the commands share."""
    from pgqueue.cli import _common

    docs = ModuleAnalyzer.for_module(_common.__name__).find_attr_docs()
    return sorted(
        (value, name, " ".join(docs.get(("", name), [])).strip())
        for name, value in vars(_common).items()
        if name.startswith("EXIT_") and isinstance(value, int)
    )


def _literal_returns() -> list[tuple[int, str]]:
    """``(code, exception)`` of each ``except X: return N`` in ``pgqueue.cli.main``."""
    import pgqueue.cli

    tree = ast.parse(inspect.getsource(pgqueue.cli.main))
    return [
        (statement.value.value, ast.unparse(handler.type))
        for handler in ast.walk(tree)
        if isinstance(handler, ast.ExceptHandler) and handler.type is not None
        for statement in handler.body
        if isinstance(statement, ast.Return)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, int)
    ]


class ExitCodesDirective(SphinxDirective):
    """``.. pgqueue-exit-codes::``: the exit codes of every command."""

    def run(self) -> list[Node]:
        """A table: each code, its constant, what it means."""
        rows: list[tuple[str, ...]] = [
            (str(code), f"``{name}``", doc) for code, name, doc in _exit_constants()
        ]
        rows += [
            (
                str(code),
                "",
                "interrupted (Ctrl-C)"
                if exception == "KeyboardInterrupt"
                else f"``{exception}`` was raised",
            )
            for code, exception in _literal_returns()
        ]
        return parse(self, list_table(("code", "constant", "meaning"), rows))
