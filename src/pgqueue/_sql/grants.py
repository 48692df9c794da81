"""`grants`: the privileges each kind of role needs, as GRANT statements.

Four grant sets, each exactly one role's job on the schema's tables:

- ``producer``: enqueue through every path (``Queue.enqueue`` and
  ``enqueue_many`` with unique keys, replace, ``after=``, delays,
  priorities and groups; ``pgqueue.sync``, SQLAlchemy, Django and
  ``pgqueue_enqueue()``). It may insert the columns of a plain job and read
  back their ids, nothing else: a job with a key or parents goes through
  the schema's SECURITY DEFINER functions, which check what they are given.
  It may signal a durable handler's job (``pgqueue_signal``), by id.
  It cannot choose ids, statuses, results, attempts or edges, update or
  delete a row, or copy (a large ``enqueue_many`` takes the INSERT path).
- ``worker``: everything a ``Worker`` does (claims, outcomes, heartbeats,
  the sweeps, leases, rate limits, periodic schedules) and what its
  handlers enqueue.
- ``operator``: ``Admin``'s reads and actions (retry, cancel, pause,
  resume, prune, signals to durable handlers), the dashboards' included.
- ``reader``: ``Admin``'s and the dashboards' reads only.
"""

from __future__ import annotations

from typing import Literal, TypeAlias

from pgqueue._core.checks import check_name
from pgqueue._sql import durable
from pgqueue._sql.enqueue import COPY_COLUMNS
from pgqueue._sql.functions import FUNCTIONS

__all__ = ["KINDS", "Kind", "grants"]

Kind: TypeAlias = Literal["producer", "worker", "operator", "reader"]

KINDS: tuple[Kind, ...] = ("producer", "worker", "operator", "reader")
"""The kinds of role `grants` knows."""

TABLES = (
    "pgqueue_jobs",
    "pgqueue_dependencies",
    "pgqueue_periodic",
    "pgqueue_limits",
    "pgqueue_leases",
    "pgqueue_paused",
    "pgqueue_starts",
    "pgqueue_turns",
    "pgqueue_groups",
    "pgqueue_trend",
)
"""The schema's tables."""

PRODUCER_COLUMNS = (*(c for c in COPY_COLUMNS if c != "id"), "group_key")
"""The columns a producer inserts itself (a plain job's, as enqueue_many copies
them, and its group: no id, status or key)."""

# Per kind: each table's privileges (beyond a producer's, for the others).
_TABLE_PRIVILEGES: dict[Kind, dict[str, str]] = {
    "producer": {},
    "worker": {
        **dict.fromkeys(TABLES, "SELECT, INSERT, UPDATE, DELETE"),
        "pgqueue_paused": "SELECT",
    },
    "operator": {
        **dict.fromkeys(TABLES, "SELECT"),
        "pgqueue_jobs": "SELECT, UPDATE, DELETE",
        "pgqueue_dependencies": "SELECT, UPDATE, DELETE",
        "pgqueue_periodic": "SELECT, DELETE",
        "pgqueue_paused": "SELECT, INSERT, DELETE",
    },
    "reader": dict.fromkeys(TABLES, "SELECT"),
}


def grants(kind: Kind, role: str) -> str:
    """The GRANT statements that give an existing ``role`` the privileges of ``kind``.

    Idempotent: run them again after a schema upgrade. They name the
    tables and functions as the search path finds them, and the schema
    the session's ``current_schema()``: run them where pgqueue's schema
    was applied. The roles and what each may do: :doc:`/explanation/security`.

    Args:
        kind: ``"producer"``, ``"worker"``, ``"operator"`` or ``"reader"``.
        role: the role's name, as it is (quoted in the statements).

    Raises:
        ValueError: an unknown ``kind``, or a role name that is empty or
            longer than PostgreSQL's 63 bytes.
        TypeError: a ``role`` that is not a str.
    """
    if kind not in KINDS:
        msg = f"kind must be one of {', '.join(KINDS)}, not {kind!r:.80}"
        raise ValueError(msg)
    name = check_name("role", role)
    if len(name.encode("utf-8")) > 63:
        msg = f"role is {len(name.encode('utf-8'))} bytes; PostgreSQL's names have at most 63"
        raise ValueError(msg)
    quoted = '"' + name.replace('"', '""') + '"'
    literal = "'" + name.replace("'", "''") + "'"
    lines = [
        f"-- pgqueue's {kind} grants for role {quoted}",
        "DO $$",
        "BEGIN",
        "    EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA %I TO %I',",
        f"                              pg_catalog.current_schema(), {literal});",
        "    EXECUTE pg_catalog.format('GRANT USAGE ON SEQUENCE %s TO %I',",
        "                              pg_catalog.pg_get_serial_sequence('pgqueue_jobs', 'id'),",
        f"                              {literal});",
        "END $$;",
    ]
    if kind in ("producer", "worker"):
        columns = ", ".join(PRODUCER_COLUMNS)
        lines += [
            f"GRANT INSERT ({columns}) ON pgqueue_jobs TO {quoted};",
            f"GRANT SELECT (id) ON pgqueue_jobs TO {quoted};",
        ]
    lines += [
        f"GRANT {privileges} ON {table} TO {quoted};"
        for table, privileges in _TABLE_PRIVILEGES[kind].items()
    ]
    if kind in ("producer", "worker"):
        lines += [
            f"GRANT EXECUTE ON FUNCTION {signature} TO {quoted};"
            for signature, function in FUNCTIONS.items()
            if function != "trigger"
        ]
    if kind == "operator":
        lines += [
            f"GRANT EXECUTE ON FUNCTION {signature} TO {quoted};"
            for signature in durable.FUNCTIONS
        ]
    return "\n".join(lines) + "\n"
