"""The schema reference: the SQL itself, and each table's columns and indexes.

``pgqueue-sql`` shows one of pgqueue's SQL constants (``SCHEMA``...) as it
is. ``pgqueue-table`` reads the table's columns and indexes from
``pgqueue.SCHEMA`` and pairs each with the description written in the
directive's content; which ones ``pgqueue.SCHEMA_UPGRADE`` adds to a table
the Go module created is read from the SQL too. A column or index without
a description, or a description of one the SQL lacks, fails the build.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, NamedTuple

from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from pgqueue_docs._rst import described_items, indented, list_table, parse

if TYPE_CHECKING:
    from docutils.nodes import Node

__all__ = ["Column", "Index", "SQLDirective", "TableDirective", "columns", "indexes"]

logger = logging.getLogger(__name__)


class Column(NamedTuple):
    """A column of a ``CREATE TABLE``: its name and the rest of its definition."""

    name: str
    definition: str


class Index(NamedTuple):
    """A ``CREATE INDEX``: its name, table, whether unique, columns and predicate."""

    name: str
    table: str
    unique: bool
    columns: str
    where: str


def _without_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


def _split_top_level(body: str) -> list[str]:
    """``body`` split on the commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in body:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def columns(sql: str, table: str) -> tuple[list[Column], list[str]]:
    """The columns of ``table``'s ``CREATE TABLE`` in ``sql``, and its table constraints."""
    match = re.search(
        rf"CREATE TABLE IF NOT EXISTS {table}\s*\((.*?)\n\);",
        _without_comments(sql),
        re.DOTALL,
    )
    if match is None:
        msg = f"no CREATE TABLE {table} in the SQL"
        raise ValueError(msg)
    found, constraints = [], []
    for item in _split_top_level(match[1]):
        text = " ".join(item.split())
        if not text:
            continue
        name, _, definition = text.partition(" ")
        if name.upper() in ("PRIMARY", "CONSTRAINT", "UNIQUE", "CHECK"):
            constraints.append(text)
        else:
            found.append(Column(name, definition))
    return found, constraints


def indexes(sql: str) -> list[Index]:
    """The ``CREATE INDEX`` statements of ``sql``."""
    pattern = (
        r"CREATE (UNIQUE )?INDEX IF NOT EXISTS (\w+)\s+ON (\w+) \(([^)]*)\)"
        r"\s*(?:WHERE ([^;]*))?;"
    )
    return [
        Index(name, table, bool(unique), cols, " ".join((where or "").split()))
        for unique, name, table, cols, where in re.findall(
            pattern, _without_comments(sql)
        )
    ]


def _added_columns(upgrade: str) -> set[str]:
    return set(re.findall(r"ADD COLUMN IF NOT EXISTS (\w+)", upgrade))


def _created_tables(sql: str) -> set[str]:
    return set(re.findall(r"CREATE TABLE IF NOT EXISTS (\w+)", sql))


class TableDirective(SphinxDirective):
    """``.. pgqueue-table:: pgqueue_jobs``: its columns and indexes, each described.

    The content names each column and index on a line of its own, its
    description indented under it (reStructuredText).
    """

    required_arguments = 1
    has_content = True

    def run(self) -> list[Node]:
        """A table of the columns, then one of the indexes."""
        import pgqueue

        table = self.arguments[0]
        found, constraints = columns(pgqueue.SCHEMA, table)
        table_indexes = [i for i in indexes(pgqueue.SCHEMA) if i.table == table]
        described = described_items(list(self.content))
        self._check(
            table, [c.name for c in found] + [i.name for i in table_indexes], described
        )
        upgrade = pgqueue.SCHEMA_UPGRADE
        added = _added_columns(upgrade)
        new_table = table in _created_tables(upgrade)
        upgrade_indexes = {i.name for i in indexes(upgrade)}

        def since(pgqueue_adds: bool) -> str:
            return "pgqueue" if pgqueue_adds else "the Go module"

        lines = []
        if constraints:
            lines += [
                "Table constraints: "
                + "; ".join(f"``{constraint}``" for constraint in constraints),
                "",
            ]
        lines += list_table(
            ("column", "type and default", "from", "why"),
            [
                (
                    f"``{column.name}``",
                    f"``{column.definition}``",
                    since(new_table or column.name in added),
                    "\n".join(described.get(column.name, [])),
                )
                for column in found
            ],
            widths="15 30 10 45",
        )
        if table_indexes:
            lines += [
                "",
                *list_table(
                    ("index", "on", "from", "why"),
                    [
                        (
                            f"``{index.name}``",
                            f"{'unique ' if index.unique else ''}``({index.columns})``"
                            + (f" where ``{index.where}``" if index.where else ""),
                            since(index.name in upgrade_indexes),
                            "\n".join(described.get(index.name, [])),
                        )
                        for index in table_indexes
                    ],
                    widths="20 30 10 40",
                ),
            ]
        return parse(self, lines)

    def _check(
        self, table: str, names: list[str], described: dict[str, list[str]]
    ) -> None:
        for name in names:
            if not any(line.strip() for line in described.get(name, [])):
                logger.warning(
                    "%s: %s has no description",
                    table,
                    name,
                    location=self.get_location(),
                )
        for name in sorted(set(described) - set(names)):
            logger.warning(
                "%s: a description of %s, which the SQL does not have",
                table,
                name,
                location=self.get_location(),
            )


class SQLDirective(SphinxDirective):
    """``.. pgqueue-sql:: SCHEMA``: a SQL constant of ``pgqueue``, as it is."""

    required_arguments = 1

    def run(self) -> list[Node]:
        """A SQL code block of the constant's text."""
        import pgqueue

        sql = getattr(pgqueue, self.arguments[0])
        return parse(
            self, [".. code-block:: postgresql", "", *indented(sql.strip("\n"), "   ")]
        )
