"""The log messages reference: every message pgqueue logs, read from its source.

The source is parsed (never run) for each message: calls of a logger's
``debug``/``info``/``warning``/``error``/``exception``, and the helpers
that log a failure in a row (``Failures(logger, msg)``,
``failures.failed(exc, msg)``, ``log_failure(logger, msg, ...)``: WARNING,
then ERROR once the failures persist). For each: the logger, the level,
the message with its ``%`` arguments named, and the keys of its ``extra``.
``pgqueue-log-messages`` tables one logger's messages, each with the
meaning written in its content; a message without one, a meaning of no
message, or a logger no table covers, fails the build.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from pgqueue_docs._rst import described_items, list_table, parse

if TYPE_CHECKING:
    from collections.abc import Iterator

    from docutils.nodes import Node
    from sphinx.application import Sphinx
    from sphinx.environment import BuildEnvironment

__all__ = ["LogMessage", "LogMessagesDirective", "log_messages"]

logger = logging.getLogger(__name__)

LEVELS = ("debug", "info", "warning", "error", "exception", "critical")
DEFAULT_LOGGER = "pgqueue"
"""What a part logs to unless given a logger of your own."""
FAILURE_LEVEL = "warning, then error"
"""The level of a failure logged by the retry helpers (ERROR once it persists)."""


@dataclass
class LogMessage:
    """One message: where it is logged, at which levels, with which fields."""

    logger: str
    message: str
    """The message as the code writes it (``%s`` arguments, ``{name}`` of an f-string)."""
    shown: str
    """The message with its arguments named: ``<job> dead: <error>``."""
    levels: list[str] = field(default_factory=list)
    extra: set[str] = field(default_factory=set)
    places: list[str] = field(default_factory=list)
    """``module:line`` of each call."""


def _text(node: ast.expr) -> str | None:
    """A message expression's text, or None when it is not written out."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            str(part.value)
            if isinstance(part, ast.Constant)
            else "{" + ast.unparse(part.value) + "}"  # type: ignore[attr-defined]
            for part in node.values
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return None if left is None or right is None else left + right
    return None


def _placeholder(node: ast.expr) -> str:
    """A name for a ``%`` argument: ``job_label(job)`` is ``job``, ``request.method`` ``method``."""
    if isinstance(node, ast.Call):
        function = ast.unparse(node.func).rpartition(".")[2]
        if function == "job_label":
            return "job"
        return _placeholder(node.args[0]) if node.args else function
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Subscript):
        return _placeholder(node.value)
    return "…"


def _shown(message: str, arguments: list[ast.expr]) -> str:
    names = iter(arguments)

    def named(match: re.Match[str]) -> str:
        if match[0] == "%%":
            return "%"
        argument = next(names, None)
        return "<…>" if argument is None else f"<{_placeholder(argument)}>"

    text = re.sub(r"%%|%[-#0 +]*\d*(?:\.\d+)?[sdrfgi]", named, message)
    return re.sub(r"\{([^}]*)\}", lambda m: f"<{_placeholder_of(m[1])}>", text)


def _placeholder_of(source: str) -> str:
    try:
        return _placeholder(ast.parse(source, mode="eval").body)
    except SyntaxError:
        return "…"


class _Module:
    """One module's tree, with what its names stand for."""

    def __init__(self, name: str, tree: ast.Module) -> None:
        self.name = name
        self.tree = tree
        self.parents: dict[ast.AST, ast.AST] = {
            child: parent
            for parent in ast.walk(tree)
            for child in ast.iter_child_nodes(parent)
        }
        self.loggers: dict[str, str] = {}
        for node in tree.body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and ast.unparse(node.value.func) == "logging.getLogger"
                and node.value.args
                and isinstance(node.value.args[0], ast.Constant)
            ):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        self.loggers[target.id] = str(node.value.args[0].value)

    def scope(self, node: ast.AST) -> ast.AST:
        """The function (or class, or module) ``node`` is in."""
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                return node
        return self.tree

    def logger_of(self, receiver: ast.expr) -> str:
        if isinstance(receiver, ast.Name) and receiver.id in self.loggers:
            return self.loggers[receiver.id]
        return DEFAULT_LOGGER


class _Keys:
    """The keys of an ``extra`` mapping, followed through names, helpers and attributes."""

    def __init__(self, modules: list[_Module]) -> None:
        self.modules = modules
        self.functions = {
            node.name: node
            for module in modules
            for node in ast.walk(module.tree)
            if isinstance(node, ast.FunctionDef)
        }

    def of(self, node: ast.expr | None, module: _Module, depth: int = 0) -> set[str]:
        if node is None or depth > 5:
            return set()
        found: set[str] = set()
        if isinstance(node, ast.Dict):
            for key, item in zip(node.keys, node.values, strict=True):
                if key is None:
                    found |= self.of(item, module, depth + 1)
                elif isinstance(key, ast.Constant):
                    found.add(str(key.value))
        elif isinstance(node, ast.IfExp):
            found |= self.of(node.body, module, depth + 1)
            found |= self.of(node.orelse, module, depth + 1)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            function = self.functions.get(node.func.id)
            for statement in ast.walk(function) if function else ():
                if isinstance(statement, ast.Return):
                    found |= self.of(statement.value, module, depth + 1)
        elif isinstance(node, ast.Name | ast.Attribute):
            target = ast.unparse(node)
            scope = module.scope(node) if isinstance(node, ast.Name) else module.tree
            for statement in ast.walk(scope):
                assigned: ast.expr | None
                if isinstance(statement, ast.Assign):
                    targets, assigned = statement.targets, statement.value
                elif isinstance(statement, ast.AnnAssign):
                    targets, assigned = [statement.target], statement.value
                else:
                    continue
                if any(ast.unparse(t) == target for t in targets):
                    found |= self.of(assigned, module, depth + 1)
            if not found and isinstance(node, ast.Name):
                found |= self._argument(node.id, scope, module, depth)
        return found

    def _argument(
        self, name: str, scope: ast.AST, module: _Module, depth: int
    ) -> set[str]:
        """The keys of what callers pass a constructor as parameter ``name``."""
        owner = module.parents.get(scope)
        if not (
            isinstance(scope, ast.FunctionDef)
            and scope.name == "__init__"
            and isinstance(owner, ast.ClassDef)
            and any(arg.arg == name for arg in scope.args.kwonlyargs + scope.args.args)
        ):
            return set()
        found: set[str] = set()
        for caller in self.modules:
            for call in ast.walk(caller.tree):
                if (
                    isinstance(call, ast.Call)
                    and ast.unparse(call.func).rpartition(".")[2] == owner.name
                ):
                    found |= self.of(_keyword(call, name), caller, depth + 1)
        return found


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _calls(
    module: _Module, keys: _Keys
) -> Iterator[tuple[str, str, str, set[str], str]]:
    """``(logger, level, message, extra keys, shown)`` of each message ``module`` logs."""
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        function = node.func
        name = ast.unparse(function)
        short = name.rpartition(".")[2]
        if (
            isinstance(function, ast.Attribute)
            and function.attr in LEVELS
            and "log" in ast.unparse(function.value)
        ):
            message = _text(node.args[0])
            if message is not None:
                yield (
                    module.logger_of(function.value),
                    function.attr,
                    message,
                    keys.of(_keyword(node, "extra"), module),
                    _shown(message, node.args[1:]),
                )
        elif name.endswith("Failures.of") and len(node.args) >= 2:
            # An engine part's failures: its logger, its fields.
            message = _text(node.args[1])
            if message is not None:
                part = ast.unparse(node.args[0])
                yield (
                    module.logger_of(ast.parse(f"{part}.logger", mode="eval").body),
                    FAILURE_LEVEL,
                    message,
                    {"error", "failures"}
                    | keys.of(ast.parse(f"{part}.fields", mode="eval").body, module)
                    | _failed_keywords(module, node),
                    _shown(message, []),
                )
        elif short in ("Failures", "log_failure") and len(node.args) >= 2:
            message = _text(node.args[1])
            if message is not None:
                extra = {"error", "failures"} | keys.of(
                    _keyword(node, "fields"), module
                )
                if short == "log_failure":
                    extra |= {k.arg for k in node.keywords if k.arg}
                    extra |= keys.of(
                        next((k.value for k in node.keywords if k.arg is None), None),
                        module,
                    )
                else:
                    extra |= _failed_keywords(module, node)
                yield (
                    module.logger_of(node.args[0]),
                    FAILURE_LEVEL,
                    message,
                    extra,
                    _shown(message, []),
                )
        elif (
            short == "failed"
            and "failures" in name
            and len(node.args) >= 2
            and (message := _text(node.args[1])) is not None
        ):
            extra = {"error", "failures"} | {k.arg for k in node.keywords if k.arg}
            extra |= _fields_of_failures(module, node, keys)
            yield (DEFAULT_LOGGER, FAILURE_LEVEL, message, extra, _shown(message, []))


def _failed_keywords(module: _Module, constructor: ast.Call) -> set[str]:
    """The extra keywords of the ``failures.failed(...)`` calls of a ``Failures``."""
    found: set[str] = set()
    for node in ast.walk(module.scope(constructor)):
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).endswith("failures.failed")
            and len(node.args) < 2
        ):
            found |= {k.arg for k in node.keywords if k.arg}
    return found


def _fields_of_failures(module: _Module, call: ast.Call, keys: _Keys) -> set[str]:
    """The ``fields=`` of the ``Failures`` whose ``failed`` logs a message of its own."""
    for node in ast.walk(module.scope(call)):
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func).rpartition(".")[2] == "Failures"
        ):
            return keys.of(_keyword(node, "fields"), module)
    return set()


def _modules(package: Path, prefix: str) -> list[_Module]:
    return [
        _Module(
            ".".join(
                [prefix, *path.relative_to(package).with_suffix("").parts]
            ).removesuffix(".__init__"),
            ast.parse(path.read_text(encoding="utf-8")),
        )
        for path in sorted(package.rglob("*.py"))
    ]


def log_messages() -> dict[str, dict[str, LogMessage]]:
    """Every message pgqueue logs, by logger and message."""
    import pgqueue

    modules = _modules(Path(pgqueue.__file__).parent, "pgqueue")
    keys = _Keys(modules)
    found: dict[str, dict[str, LogMessage]] = {}
    for module in modules:
        for node_logger, level, message, extra, shown in _calls(module, keys):
            entry = found.setdefault(node_logger, {}).setdefault(
                message, LogMessage(node_logger, message, shown)
            )
            if level not in entry.levels:
                entry.levels.append(level)
            entry.extra |= extra
            entry.places.append(module.name)
    return found


def _order(level: str) -> int:
    return next((i for i, name in enumerate(LEVELS) if level.startswith(name)), 0)


class LogMessagesDirective(SphinxDirective):
    """``.. pgqueue-log-messages:: pgqueue``: one logger's messages, each with its meaning.

    The content names each message as the code writes it, on a line of its
    own, its meaning indented under it.
    """

    required_arguments = 1
    has_content = True

    def run(self) -> list[Node]:
        """The table: level, message, extra fields, meaning."""
        name = self.arguments[0]
        messages = log_messages().get(name, {})
        meanings = described_items(list(self.content))
        location = self.get_location()
        for message in messages:
            if not any(line.strip() for line in meanings.get(message, [])):
                logger.warning(
                    "logger %s: %r has no meaning", name, message, location=location
                )
        for message in sorted(set(meanings) - set(messages)):
            logger.warning(
                "logger %s: a meaning of %r, which it never logs",
                name,
                message,
                location=location,
            )
        _covered(self.env).setdefault(self.env.docname, set()).add(name)
        rows = [
            (
                ", ".join(entry.levels),
                f"``{entry.shown}``",
                ", ".join(f"``{key}``" for key in sorted(entry.extra)),
                "\n".join(meanings.get(message, [])),
            )
            for message, entry in sorted(
                messages.items(),
                key=lambda item: (-max(map(_order, item[1].levels)), item[1].shown),
            )
        ]
        return parse(
            self,
            list_table(
                ("level", "message", "extra", "meaning"), rows, widths="10 30 20 40"
            ),
        )


def _covered(env: BuildEnvironment) -> dict[str, set[str]]:
    """The loggers each document's tables list (kept with the environment)."""
    if not hasattr(env, "pgqueue_loggers"):
        env.pgqueue_loggers = {}  # type: ignore[attr-defined]
    covered: dict[str, set[str]] = env.pgqueue_loggers  # type: ignore[attr-defined]
    return covered


def check_every_logger(app: Sphinx, env: BuildEnvironment) -> None:
    """Warn of a logger whose messages no ``pgqueue-log-messages`` table lists."""
    del app
    covered = set().union(*_covered(env).values())
    if not covered:
        return  # a site without the page
    for name in sorted(set(log_messages()) - covered):
        logger.warning(
            "logger %s: no pgqueue-log-messages table lists its messages", name
        )


def forget_document(app: Sphinx, env: BuildEnvironment, docname: str) -> None:
    """Forget the loggers a document listed (it is read again, or gone)."""
    del app
    _covered(env).pop(docname, None)


def merge_loggers(
    app: Sphinx, env: BuildEnvironment, docnames: Any, other: BuildEnvironment
) -> None:
    """Merge the loggers a parallel reader's documents listed."""
    del app
    for docname in docnames:
        if docname in _covered(other):
            _covered(env)[docname] = _covered(other)[docname]
