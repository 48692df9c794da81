"""Concepts written once: statuses in the lifecycle, servers behind the store, SQL by concept, connections opened by the wire."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pgqueue._core.lifecycle import LIFECYCLE, OUTCOMES, OutcomeKind, Status

SRC = Path(__file__).resolve().parent.parent / "src" / "pgqueue"
LIFECYCLE_MODULE = SRC / "_core" / "lifecycle.py"
NOT_A_STATUS = "# not a status"
"""A line that names a status's word for something else says so."""

_STATUS_VALUES = {status.value for status in Status}
_WORDS = "|".join(_STATUS_VALUES)
_SQL_LITERAL = re.compile(rf"'({_WORDS})'")
_TEMPLATE_LITERAL = re.compile(rf"[\"']({_WORDS})[\"']")


def _sources() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if p != LIFECYCLE_MODULE)


def _skipped(tree: ast.AST) -> set[int]:
    """The ids of the nodes a status word may be in: docstrings, annotations, row keys."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            skipped.add(id(body[0].value))
        annotations: list[ast.AST | None] = []
        if isinstance(node, (ast.AnnAssign, ast.arg)):
            annotations.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # A signature spells its defaults (status: Literal[...] = "dead").
            annotations += [node.returns, *node.args.defaults]
            annotations += node.args.kw_defaults
        elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            skipped.add(id(node.slice))  # row["completed"]: a column's name
        for annotation in annotations:
            if annotation is not None:
                skipped.update(id(n) for n in ast.walk(annotation))
    return skipped


def _status_literals(path: Path, root: Path = SRC) -> list[str]:
    text = path.read_text()
    lines = text.splitlines()
    tree = ast.parse(text)
    skipped = _skipped(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        if id(node) in skipped:
            continue
        named = node.value in _STATUS_VALUES or _SQL_LITERAL.search(node.value)
        line = lines[node.lineno - 1]
        if named and NOT_A_STATUS not in line:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {line.strip()}")
    return found


def test_statuses_are_named_only_in_the_lifecycle() -> None:
    found = [hit for path in _sources() for hit in _status_literals(path)]
    for template in sorted(SRC.rglob("*.html")):
        for number, line in enumerate(template.read_text().splitlines(), 1):
            if _TEMPLATE_LITERAL.search(line):
                found.append(f"{template.relative_to(SRC)}:{number}: {line.strip()}")
    assert found == [], "\n".join(found)


def test_a_status_literal_is_found_where_it_is_written(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""A module about dead jobs."""\n'
        'DEAD = "dead"\n'
        "SQL = \"SELECT 1 WHERE status = 'waiting'\"\n"
        'STATE = "running"  # not a status: the worker\'s state\n'
        'def f(row: dict[str, int]) -> int:\n    return row["completed"]\n'
    )
    assert [hit.split(": ", 1)[1] for hit in _status_literals(sample, tmp_path)] == [
        'DEAD = "dead"',
        "SQL = \"SELECT 1 WHERE status = 'waiting'\"",
    ]


def test_only_the_store_asks_which_server() -> None:
    asked = []
    for path in _sources():
        relative = path.relative_to(SRC)
        if relative.parts[0] in ("_store", "_sql"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "distributed"
                # The CLI's --distributed flag says what to install, not asks.
                and not (isinstance(node.value, ast.Name) and node.value.id == "args")
            ):
                asked.append(f"{relative}:{node.lineno}")
            if isinstance(node, ast.alias) and node.name.startswith("DISTRIBUTED_"):
                asked.append(f"{relative}:{node.name}")
    assert asked == []


# What asyncpg's pool keeps to open its connections (none of it public).
_POOL_OPENING = {"_get_new_connection", "_connection_class", "_record_class"}


def test_only_the_wire_opens_connections_like_a_pool() -> None:
    reached = [
        f"{path.relative_to(SRC)}:{node.lineno}"
        for path in _sources()
        if path != SRC / "_wire" / "opening.py"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in _POOL_OPENING
    ]
    assert reached == []


@pytest.mark.parametrize(
    "module", sorted((SRC / "_sql").glob("*.py")), ids=lambda path: path.name
)
def test_each_concepts_statements_fit_one_module(module: Path) -> None:
    assert len(module.read_text().splitlines()) <= 600


def test_each_outcome_writes_a_status_of_the_lifecycle() -> None:
    # Every kind but a durable handler's suspended run, whose row is written
    # before its run ends (no outcome write carries it).
    assert set(OUTCOMES) == set(OutcomeKind) - {OutcomeKind.SUSPENDED}
    for kind, transition in OUTCOMES.items():
        assert transition.status in LIFECYCLE
        if transition.requeued:
            assert transition.status.claimable, kind
        else:
            assert transition.status == kind.value, kind
            assert transition.status.ended, kind


# The first release is 0.1 (pyproject's 0.1.0.dev0): notes name it, so a
# release needs no rewrite of them.
_VERSION_NOTE = re.compile(r"\.\. version(?:added|changed):: (\S+)")


def test_version_notes_name_the_first_release() -> None:
    other = [
        f"{path.relative_to(SRC)}: {version}"
        for path in _sources()
        for version in _VERSION_NOTE.findall(path.read_text())
        if version.rstrip('"') != "0.1"
    ]
    assert other == []
