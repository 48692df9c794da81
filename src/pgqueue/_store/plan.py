"""Checked enqueues laid out as statements: the one plan every driver runs.

`plan_one` and `plan_many` are pure: they pick the statement for what the
jobs use (keys, replaces, delays, groups, parents) and fill its parameters
by name. A driver (asyncpg's `Queue`, psycopg's `pgqueue.sync`, Django's
cursor) runs `Plan.statement` with `Plan.args` on its connection (and
then `Plan.then`'s, in the same transaction) and hands the rows to
`Plan.read`; it sends the wakeup itself after the statement when
`Plan.wake_after` says so (Citus: the coordinator notifies).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from pgqueue._core.request import Batch, Request
from pgqueue._sql.enqueue import (
    DISTRIBUTED_COLUMNS,
    DISTRIBUTED_ROWS,
    DISTRIBUTED_UNIQUE_SILENT,
    ENQUEUE,
    ENQUEUE_AFTER,
    ENQUEUE_MANY,
    ENQUEUE_MANY_DELAYED,
    ENQUEUE_MANY_DELAYED_SILENT,
    ENQUEUE_MANY_REPLACE,
    ENQUEUE_MANY_SILENT,
    ENQUEUE_MANY_UNIQUE,
    ENQUEUE_MANY_UNIQUE_DELAYED,
    ENQUEUE_MANY_UNIQUE_DELAYED_SILENT,
    ENQUEUE_MANY_UNIQUE_SILENT,
    ENQUEUE_REPLACE,
    ENQUEUE_SILENT,
    ENQUEUE_UNIQUE,
    ENQUEUE_UNIQUE_SILENT,
    NOTIFY_JOBS,
    PARAMETERS,
    distributed_many,
)
from pgqueue._sql.literals import array, booleans, pyformat, seconds, timestamps

__all__ = ["Cursor", "Enqueued", "Plan", "plan_many", "plan_one"]

Row = Mapping[str, Any]

_DUPLICATE_OUTCOMES = frozenset(("existed", "replaced", "replaced_next"))
"""pgqueue_enqueue_replace's outcomes for a job that took an existing one's place."""

_NO_REPLACE_DISTRIBUTED = (
    "on_conflict='replace' and debounce are not supported on a distributed "
    "(Citus) schema: the job queued after a running one waits for it as a "
    "child, and dependencies are not supported there"
)
_NO_PARENTS_DISTRIBUTED = (
    "jobs with dependencies (after=...) are not supported on a distributed "
    "(Citus) schema: a parent and its children may live on different nodes"
)


@dataclass(slots=True)
class Enqueued:
    """What an enqueue's statement answered, for each input job."""

    ids: list[int]
    duplicates: list[bool]
    """Whether each job took an existing job's place (its key's)."""
    existing: tuple[int, str] | None
    """The first job that was pending or running with its key (id, key), kept as it was."""
    woke: bool
    """Whether the queue has a new job to claim now (its wakeup is due)."""


@dataclass(frozen=True, slots=True)
class Plan:
    """One statement to run, and how to read its rows."""

    statement: str
    params: dict[str, Any]
    read: Callable[[Sequence[Row]], Enqueued]
    wake_after: bool = False
    """Whether the driver sends the wakeup (`NOTIFY_JOBS`) itself once the
    statement inserted a job (the statement cannot: Citus)."""
    dependent: bool = False
    """Whether the jobs have parents: an unknown parent fails the statement
    with a foreign key violation naming it (run it in a savepoint inside a
    caller's transaction)."""

    then: tuple[tuple[str, dict[str, Any]], ...] = ()
    """Statements to run after ``statement`` in its transaction, with their
    parameters (Citus's enqueue_many of more rows than one statement
    takes); `read` gets the rows of all of them, in order."""

    @property
    def args(self) -> tuple[Any, ...]:
        """The parameters in the statement's ``$n`` order."""
        return _ordered(self.statement, self.params)

    @property
    def statements(self) -> Iterator[tuple[str, tuple[Any, ...]]]:
        """Each statement to run, in order, with its parameters in ``$n`` order."""
        yield self.statement, self.args
        for statement, params in self.then:
            yield statement, _ordered(statement, params)

    def run(self, cursor: Cursor, queue: str) -> Enqueued:
        """Run the plan on a DB-API cursor (psycopg's, Django's), wakeup included.

        The statement crosses with ``%(name)s`` placeholders, which psycopg
        and psycopg2 both take. A plan with `then` must run in a
        transaction (the caller's, or one the driver begins).
        """
        rows: list[Row] = []
        for statement, params in ((self.statement, self.params), *self.then):
            cursor.execute(pyformat(statement, PARAMETERS[statement]), params)
            names = [column[0] for column in cursor.description or ()]
            rows.extend(dict(zip(names, row, strict=True)) for row in cursor.fetchall())
        done = self.read(rows)
        if self.wake_after and done.woke:
            cursor.execute(pyformat(NOTIFY_JOBS, ("queue",)), {"queue": queue})
        return done


def _ordered(statement: str, params: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(params[name] for name in PARAMETERS[statement])


class Cursor(Protocol):
    """What `Plan.run` uses of a DB-API cursor."""

    @property
    def description(self) -> Sequence[Sequence[Any]] | None: ...

    def execute(self, query: str, params: Mapping[str, Any], /) -> object: ...

    def fetchall(self) -> Sequence[Sequence[Any]]: ...


def plan_one(
    queue: str,
    request: Request,
    payload: str,
    trace_context: str | None,
    *,
    notify: bool,
    distributed: bool = False,
) -> Plan:
    """The statement of a single enqueue of ``request`` onto ``queue``.

    ``payload``: the job's JSON text. With ``notify`` the wakeup rides the
    statement (in its transaction); without, the caller sends it after the
    commit when `Enqueued.woke`. ``distributed``: on Citus.

    Raises:
        ValueError: what the server cannot do (Citus: replace, parents).
    """
    if request.after:
        return plan_many(
            queue,
            Batch.of(request),
            "[" + payload + "]",
            trace_context,
            notify=notify,
            distributed=distributed,
        )
    params: dict[str, Any] = {
        "queue": queue,
        "job_type": request.job_type,
        "payload": payload,
        "max_attempts": request.max_attempts,
        "run_at": request.run_at,
        "priority": request.priority,
        "tracked": request.track,
        "trace_context": trace_context,
        "delay": request.delay,
        "group": request.group,
    }
    key = request.unique_key
    if key is None:
        if distributed:
            return Plan(ENQUEUE_SILENT, params, _inserted, wake_after=notify)
        return Plan(ENQUEUE if notify else ENQUEUE_SILENT, params, _inserted)
    params["unique_key"] = key
    if request.replaces:
        if distributed:
            raise ValueError(_NO_REPLACE_DISTRIBUTED)
        params["notify"] = notify
        return Plan(ENQUEUE_REPLACE, params, _replaced(key))
    if distributed:
        return Plan(DISTRIBUTED_UNIQUE_SILENT, params, _kept(key), wake_after=notify)
    statement = ENQUEUE_UNIQUE if notify else ENQUEUE_UNIQUE_SILENT
    return Plan(statement, params, _kept(key))


def plan_many(
    queue: str,
    batch: Batch,
    payloads: str | Sequence[str],
    trace_context: str | None,
    *,
    notify: bool,
    distributed: bool = False,
) -> Plan:
    """The statement of an enqueue_many of ``batch`` onto ``queue``.

    ``payloads``: the jobs' payloads as one JSON array (or, on Citus, each
    job's JSON text). ``notify`` and ``distributed`` as in `plan_one`; on
    Citus unique keys are unique per queue, and the jobs are inserted by
    `distributed_many` statements (no two-phase commit), more than one for
    a large batch (`Plan.then`).

    Raises:
        ValueError: what the server cannot do (Citus: replace, parents).
    """
    if distributed and batch.parents is not None:
        raise ValueError(_NO_PARENTS_DISTRIBUTED)
    if distributed and batch.replacing:
        raise ValueError(_NO_REPLACE_DISTRIBUTED)
    if distributed:
        return _plan_distributed(queue, batch, payloads, trace_context, notify=notify)
    assert isinstance(payloads, str)
    if batch.parents is not None:
        return _plan_after(queue, batch, payloads, trace_context, notify=notify)
    special = batch.special
    params: dict[str, Any] = {
        "queue": queue,
        "job_types": batch.types,
        "payloads": payloads,
        "max_attempts": array(batch.attempts),
        "run_ats": timestamps(batch.run_ats),
        "priorities": array(batch.priorities) if special else "{}",
        "tracked": booleans(batch.tracked) if special else "{}",
        "unique_keys": batch.keys if batch.keyed else [],
        "trace_context": trace_context,
        "groups": batch.groups if batch.grouped else [],
    }
    if batch.replacing:  # (a replacing batch has no groups)
        params["delays"] = seconds(batch.delays)
        params["replaces"] = booleans(batch.replaces)
        params["notify"] = notify
        return Plan(
            ENQUEUE_MANY_REPLACE, params, lambda rows: _replaced_all(batch, rows)
        )
    delayed = batch.delayed
    if delayed:
        params["delays"] = seconds(batch.delays)
    if not batch.keyed:
        return Plan(_MANY[False, delayed, notify], params, _joined)
    read: Callable[[Sequence[Row]], Enqueued] = lambda rows: _kept_all(batch, rows)  # noqa: E731
    return Plan(_MANY[True, delayed, notify], params, read)


# plan_many's statement by (unique keys, delays, NOTIFY in the statement).
_MANY = {
    (False, False, True): ENQUEUE_MANY,
    (False, True, True): ENQUEUE_MANY_DELAYED,
    (True, False, True): ENQUEUE_MANY_UNIQUE,
    (True, True, True): ENQUEUE_MANY_UNIQUE_DELAYED,
    (False, False, False): ENQUEUE_MANY_SILENT,
    (False, True, False): ENQUEUE_MANY_DELAYED_SILENT,
    (True, False, False): ENQUEUE_MANY_UNIQUE_SILENT,
    (True, True, False): ENQUEUE_MANY_UNIQUE_DELAYED_SILENT,
}


def _plan_distributed(
    queue: str,
    batch: Batch,
    payloads: str | Sequence[str],
    trace_context: str | None,
    *,
    notify: bool,
) -> Plan:
    """Citus's enqueue_many of ``batch``: `distributed_many` statements of
    `DISTRIBUTED_ROWS` rows, then one of each power of two that the rest
    has (at most 11 texts of each kind)."""
    texts = _each(payloads) if isinstance(payloads, str) else payloads
    timed = batch.delayed or any(run_at is not None for run_at in batch.run_ats)
    used = {
        "job_type": batch.types,
        "payload": texts,
        "max_attempts": batch.attempts,
        "run_at": batch.run_ats if timed else None,
        "delay": batch.delays if batch.delayed else None,
        "priority": batch.priorities if batch.special else None,
        "tracked": batch.tracked if batch.special else None,
        "unique_key": batch.keys if batch.keyed else None,
        "group": batch.groups if batch.grouped else None,
    }
    columns = [
        (name, values)
        for name in DISTRIBUTED_COLUMNS
        if (values := used[name]) is not None
    ]
    names = tuple(name for name, _ in columns)
    traced = trace_context is not None
    statements: list[tuple[str, dict[str, Any]]] = []
    start, count = 0, len(batch.types)
    for size in _sizes(count):
        params: dict[str, Any] = {"queue": queue}
        if traced:
            params["trace_context"] = trace_context
        for name, values in columns:
            for place, value in enumerate(values[start : start + size]):
                params[f"{name}{place}"] = value
        statements.append((distributed_many(size, names, traced=traced), params))
        start += size
    read: Callable[[Sequence[Row]], Enqueued] = (
        (lambda rows: _kept_all(batch, rows)) if batch.keyed else _ascending
    )
    (statement, params), *rest = statements
    return Plan(statement, params, read, wake_after=notify, then=tuple(rest))


def _sizes(count: int) -> list[int]:
    """The rows of each statement of a batch of ``count`` on Citus, largest first."""
    sizes = [DISTRIBUTED_ROWS] * (count // DISTRIBUTED_ROWS)
    rest = count % DISTRIBUTED_ROWS
    size = DISTRIBUTED_ROWS
    while rest:
        size //= 2
        if rest >= size:
            sizes.append(size)
            rest -= size
    return sizes


def _each(payloads: str) -> list[str]:
    """Each element's text of a JSON array (as given: its numbers are not re-read)."""
    decoder = _DECODER
    end = len(payloads) - 1  # the closing bracket
    at = _skip(payloads, 1)
    texts: list[str] = []
    while at < end:
        _, after = decoder.raw_decode(payloads, at)
        texts.append(payloads[at:after])
        at = _skip(payloads, after)
        if payloads[at] == ",":
            at = _skip(payloads, at + 1)
    return texts


_DECODER = json.JSONDecoder()


def _skip(text: str, at: int) -> int:
    """The place of the first character at or after ``at`` that is not JSON whitespace."""
    while text[at] in " \t\n\r":
        at += 1
    return at


def _plan_after(
    queue: str,
    batch: Batch,
    payloads: str,
    trace_context: str | None,
    *,
    notify: bool,
) -> Plan:
    """`ENQUEUE_AFTER` of ``batch`` (a call with dependencies).

    Each edge is a child's row (from 1) and its parent: a job id, or minus
    the row (from 1) of an earlier job of the call.
    """
    assert batch.parents is not None
    children: list[int] = []
    parents: list[int] = []
    failure: list[str | None] = [None] * len(batch.types)
    for row, (after, on_parent_failure) in batch.parents.items():
        failure[row] = on_parent_failure
        for parent in after:
            children.append(row + 1)
            parents.append(parent if parent > 0 else -(row + parent + 1))
    params = {
        "queue": queue,
        "job_types": batch.types,
        "payloads": payloads,
        "max_attempts": array(batch.attempts),
        "run_ats": timestamps(batch.run_ats),
        "delays": seconds(batch.delays),
        "priorities": array(batch.priorities),
        "tracked": booleans(batch.tracked),
        "trace_context": trace_context,
        "children": array(children),
        "parents": array(parents),
        "on_parent_failure": failure,
        "notify": notify,
    }
    return Plan(ENQUEUE_AFTER, params, _after, dependent=True)


def _inserted(rows: Sequence[Row]) -> Enqueued:
    return Enqueued([rows[0]["id"]], [False], None, woke=True)


def _kept(key: str) -> Callable[[Sequence[Row]], Enqueued]:
    """The reader of a keyed enqueue that keeps an existing job."""

    def read(rows: Sequence[Row]) -> Enqueued:
        job_id, existed = rows[0]["id"], rows[0]["existed"]
        return Enqueued(
            [job_id], [existed], (job_id, key) if existed else None, woke=not existed
        )

    return read


def _replaced(key: str) -> Callable[[Sequence[Row]], Enqueued]:
    """The reader of an enqueue that replaces its key's pending job."""

    def read(rows: Sequence[Row]) -> Enqueued:
        row = rows[0]
        job_id, outcome = row["id"], row["outcome"]
        existing = (job_id, key) if outcome == "existed" else None
        return Enqueued(
            [job_id], [outcome in _DUPLICATE_OUTCOMES], existing, woke=row["wake"]
        )

    return read


def _joined(rows: Sequence[Row]) -> Enqueued:
    """An unkeyed batch's ids, joined by commas in one value."""
    ids = [int(job_id) for job_id in rows[0]["array_to_string"].split(",")]
    return Enqueued(ids, [False] * len(ids), None, woke=True)


def _ascending(rows: Sequence[Row]) -> Enqueued:
    """An unkeyed batch's rows on Citus: inserted in input order, so ascending ids are it."""
    ids = sorted(row["id"] for row in rows)
    return Enqueued(ids, [False] * len(ids), None, woke=True)


def _after(rows: Sequence[Row]) -> Enqueued:
    ids: list[int] = list(rows[0]["pgqueue_enqueue_after"])
    return Enqueued(ids, [False] * len(ids), None, woke=True)


def _replaced_all(batch: Batch, rows: Sequence[Row]) -> Enqueued:
    """ENQUEUE_MANY_REPLACE's rows (one a row, in order) for each input job."""
    seen: set[int] = set()
    ids: list[int] = []
    duplicates: list[bool] = []
    for index in batch.index_of:
        ids.append(rows[index]["id"])
        duplicates.append(
            index in seen or rows[index]["outcome"] in _DUPLICATE_OUTCOMES
        )
        seen.add(index)
    return Enqueued(ids, duplicates, None, woke=any(row["wake"] for row in rows))


def _kept_all(batch: Batch, rows: Sequence[Row]) -> Enqueued:
    """ENQUEUE_MANY_UNIQUE's rows for each input job: a duplicate of a job
    that existed, or of an earlier one of the call, gets its id."""
    by_key = {
        (row["job_type"], row["unique_key"]): row
        for row in rows
        if row["unique_key"] is not None
    }
    unkeyed = iter(sorted(row["id"] for row in rows if row["unique_key"] is None))
    row_ids: list[int] = []
    existed: list[bool] = []
    existing = None
    for job_type, key in zip(batch.types, batch.keys, strict=True):
        if key is None:
            row_ids.append(next(unkeyed))
            existed.append(False)
            continue
        row = by_key[job_type, key]
        row_ids.append(row["id"])
        existed.append(row["existed"])
        if row["existed"] and existing is None:
            existing = (row["id"], key)
    seen: set[int] = set()
    duplicates = []
    for index in batch.index_of:
        duplicates.append(existed[index] or index in seen)
        seen.add(index)
    return Enqueued(
        [row_ids[row] for row in batch.index_of],
        duplicates,
        existing,
        woke=not all(duplicates),
    )
