"""Every field of a job reaches its row from every entry point.

The fields are `pgqueue.NewJob`'s; a field added there and missing here
fails `test_every_field_is_proven`. Django's entry point is proven in
``tests/django_suite`` (it needs Python 3.12).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import pgqueue
import pgqueue.sqlalchemy
import pgqueue.sync

if TYPE_CHECKING:
    from collections.abc import Callable

    import asyncpg

RUN_AT = datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)


@dataclasses.dataclass
class Payload:
    field: str


def _due_in(seconds: float) -> Callable[[dict[str, Any]], bool]:
    return lambda row: abs(row["due_in"] - seconds) < 1


# Each field: the options that set it (a parent's id stands in for PARENT),
# and what its row then shows.
PARENT = -1
FIELDS: dict[str, tuple[dict[str, Any], Callable[[dict[str, Any]], bool]]] = {
    "job_type": ({"job_type": "fields-type"}, lambda r: r["job_type"] == "fields-type"),
    "payload": (
        {"payload": {"field": "payload"}},
        lambda r: r["payload"] == {"field": "payload"},
    ),
    "run_at": ({"run_at": RUN_AT}, lambda r: r["run_at"] == RUN_AT),
    "delay": ({"delay": 3600}, _due_in(3600)),
    "max_attempts": ({"max_attempts": 7}, lambda r: r["max_attempts"] == 7),
    "priority": ({"priority": 3}, lambda r: r["priority"] == 3),
    "unique_key": ({"unique_key": "the-key"}, lambda r: r["unique_key"] == "the-key"),
    "track": ({"track": True}, lambda r: r["tracked"] is True),
    "after": (
        {"after": [PARENT]},
        lambda r: r["parents"] == [r["parent"]] and r["status"] == "waiting",
    ),
    "on_parent_failure": (
        {"after": [PARENT], "on_parent_failure": "run"},
        lambda r: r["on_parent_failure"] == "run",
    ),
    "debounce": (
        {"unique_key": "debounced", "debounce": 120},
        lambda r: r["unique_key"] == "debounced" and abs(r["due_in"] - 120) < 1,
    ),
    "group": ({"group": "customer:42"}, lambda r: r["group_key"] == "customer:42"),
}


def test_every_field_is_proven() -> None:
    assert set(FIELDS) == {field.name for field in dataclasses.fields(pgqueue.NewJob)}


def _split(options: dict[str, Any]) -> tuple[str, Any, dict[str, Any]]:
    rest = dict(options)
    return rest.pop("job_type", "t"), rest.pop("payload", None), rest


async def via_queue(env: Env, options: dict[str, Any]) -> int:
    job_type, payload, rest = _split(options)
    return await pgqueue.Queue(env.pool, env.queue).enqueue(job_type, payload, **rest)


async def via_queue_many(env: Env, options: dict[str, Any]) -> int:
    job_type, payload, rest = _split(options)
    queue = pgqueue.Queue(env.pool, env.queue)
    [job_id] = await queue.enqueue_many([pgqueue.NewJob(job_type, payload, **rest)])
    return job_id


async def via_job_type(env: Env, options: dict[str, Any]) -> int:
    job_type, payload, rest = _split(options)
    typed = pgqueue.JobType(job_type, Payload, queue=env.queue)
    given = Payload(**payload) if payload is not None else Payload("x")
    return await typed.enqueue(env.pool, given, **rest)


async def via_sync(env: Env, options: dict[str, Any]) -> int:
    job_type, payload, rest = _split(options)
    return pgqueue.sync.Queue(env.conn, env.queue).enqueue(job_type, payload, **rest)


async def via_sync_many(env: Env, options: dict[str, Any]) -> int:
    job_type, payload, rest = _split(options)
    queue = pgqueue.sync.Queue(env.conn, env.queue)
    [job_id] = queue.enqueue_many([pgqueue.NewJob(job_type, payload, **rest)])
    return job_id


async def via_sqlalchemy(env: Env, options: dict[str, Any]) -> int:
    job_type, payload, rest = _split(options)
    async with AsyncSession(env.async_engine) as session, session.begin():
        return await pgqueue.sqlalchemy.enqueue(
            session, job_type, payload, queue=env.queue, **rest
        )


async def via_sqlalchemy_many(env: Env, options: dict[str, Any]) -> int:
    job_type, payload, rest = _split(options)
    async with AsyncSession(env.async_engine) as session, session.begin():
        [job_id] = await pgqueue.sqlalchemy.enqueue_many(
            session, [pgqueue.NewJob(job_type, payload, **rest)], queue=env.queue
        )
    return job_id


async def via_sqlalchemy_sync(env: Env, options: dict[str, Any]) -> int:
    job_type, payload, rest = _split(options)
    with Session(env.engine) as session, session.begin():
        return pgqueue.sqlalchemy.enqueue_sync(
            session, job_type, payload, queue=env.queue, **rest
        )


async def via_sqlalchemy_many_sync(env: Env, options: dict[str, Any]) -> int:
    job_type, payload, rest = _split(options)
    with Session(env.engine) as session, session.begin():
        [job_id] = pgqueue.sqlalchemy.enqueue_many_sync(
            session, [pgqueue.NewJob(job_type, payload, **rest)], queue=env.queue
        )
    return job_id


# pgqueue_enqueue's parameter for each field, and its SQL type.
_SQL_PARAMETERS = {
    "run_at": ("run_at", "timestamptz"),
    "delay": ("delay", "interval"),
    "max_attempts": ("max_attempts", "int"),
    "priority": ("priority", "int"),
    "unique_key": ("unique_key", "text"),
    "track": ("track", "boolean"),
    "after": ("after", "bigint[]"),
    "on_parent_failure": ("on_parent_failure", "text"),
    "debounce": ("debounce", "interval"),
    "group": ("group_key", "text"),
}


async def via_sql(env: Env, options: dict[str, Any]) -> int:
    job_type, payload, rest = _split(options)
    names = ["queue => %(queue)s"]
    params: dict[str, Any] = {
        "job_type": job_type,
        "payload": json.dumps(payload or {}),
        "queue": env.queue,
    }
    for field, value in rest.items():
        name, sql_type = _SQL_PARAMETERS[field]
        if sql_type == "interval":
            names.append(f"{name} => make_interval(secs => %({field})s)")
        else:
            names.append(f"{name} => CAST(%({field})s AS {sql_type})")
        params[field] = value
    statement = (
        "SELECT pgqueue_enqueue(%(job_type)s, CAST(%(payload)s AS jsonb), "
        + ", ".join(names)
        + ")"
    )
    [job_id] = env.conn.execute(statement, params).fetchone() or [None]
    assert isinstance(job_id, int)
    return job_id


ENTRY_POINTS = {
    "Queue.enqueue": via_queue,
    "Queue.enqueue_many": via_queue_many,
    "JobType.enqueue": via_job_type,
    "sync.Queue.enqueue": via_sync,
    "sync.Queue.enqueue_many": via_sync_many,
    "sqlalchemy.enqueue": via_sqlalchemy,
    "sqlalchemy.enqueue_many": via_sqlalchemy_many,
    "sqlalchemy.enqueue_sync": via_sqlalchemy_sync,
    "sqlalchemy.enqueue_many_sync": via_sqlalchemy_many_sync,
    "pgqueue_enqueue (SQL)": via_sql,
}


@dataclasses.dataclass
class Env:
    pool: asyncpg.Pool
    conn: psycopg.Connection[Any]
    engine: sa.Engine
    async_engine: Any
    queue: str


def _url(dsn: str, driver: str) -> sa.URL:
    return sa.make_url(dsn).set(drivername=f"postgresql+{driver}")


@pytest.mark.parametrize("field", sorted(FIELDS))
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
async def test_each_field_reaches_the_row_from_each_entry_point(
    pool: asyncpg.Pool, dsn: str, queue_name: str, entry: str, field: str
) -> None:
    options, shows = FIELDS[field]
    async_engine = create_async_engine(_url(dsn, "asyncpg"))
    engine = sa.create_engine(_url(dsn, "psycopg"))
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            env = Env(pool, conn, engine, async_engine, queue_name)
            parent = await pgqueue.Queue(pool, queue_name).enqueue("parent")
            given = {
                name: [parent if p == PARENT else p for p in value]
                if name == "after"
                else value
                for name, value in options.items()
            }
            job_id = await ENTRY_POINTS[entry](env, given)
    finally:
        engine.dispose()
        await async_engine.dispose()
    row = await pool.fetchrow(
        """
        SELECT j.job_type, j.payload::text AS payload, j.run_at, j.max_attempts,
               j.priority, j.unique_key, j.tracked, j.status, j.group_key,
               j.on_parent_failure,
               extract(epoch FROM j.run_at - j.created_at)::float8 AS due_in,
               ARRAY(SELECT d.parent_id FROM pgqueue_dependencies d
                     WHERE d.child_id = j.id ORDER BY d.parent_id) AS parents
        FROM pgqueue_jobs j WHERE j.id = $1
        """,
        job_id,
    )
    assert row is not None
    found = dict(row)
    found["payload"] = json.loads(found["payload"])
    found["parents"] = list(found["parents"])
    found["parent"] = parent
    assert shows(found), found


def test_the_options_are_new_job_s_fields_and_the_call_s_conflict_rule() -> None:
    declared = {
        field.name: field.type
        for field in dataclasses.fields(pgqueue.NewJob)
        if field.name not in ("job_type", "payload")
    }
    declared["on_conflict"] = "Literal['return', 'raise', 'replace']"
    options = {
        name: getattr(hint, "__forward_arg__", hint)
        for name, hint in pgqueue.EnqueueOptions.__annotations__.items()
    }
    assert options == declared


@pytest.mark.parametrize(
    "function",
    [
        pgqueue.Queue.enqueue,
        pgqueue.JobType.enqueue,
        pgqueue.sync.Queue.enqueue,
        pgqueue.sqlalchemy.enqueue,
        pgqueue.sqlalchemy.enqueue_sync,
    ],
    ids=lambda f: f.__qualname__,
)
def test_each_single_enqueue_takes_the_options_as_one_declaration(
    function: Callable[..., Any],
) -> None:
    parameters = inspect.signature(function).parameters
    last = list(parameters.values())[-1]
    assert (last.kind, last.annotation) == (
        inspect.Parameter.VAR_KEYWORD,
        "Unpack[EnqueueOptions]",
    )
    assert not set(parameters) & set(pgqueue.EnqueueOptions.__annotations__)


async def test_an_option_that_does_not_exist_is_refused_before_any_sql(
    queue: pgqueue.Queue,
) -> None:
    with pytest.raises(TypeError, match="unexpected enqueue option 'prio'"):
        await queue.enqueue("t", prio=3)  # type: ignore[call-arg]
