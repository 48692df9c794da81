"""The database is the trust boundary (issue 40): roles, pinned functions, producers that stay in their lane.

Each test makes roles of its own on the server (dropped at the end) and
connects as them: a producer with only `pgqueue.grants`'s producer set,
a worker, an operator and a reader; an attacker who may create functions in
``public``. Each finding of the review is caused first where it can be (an
unqualified built-in does call a planted overload; a key-based check is
fooled by a forged key), then shown refused by what pgqueue runs.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue._sql.claims import CLAIM_GROUPS
from pgqueue._sql.functions import FUNCTIONS
from pgqueue._sql.grants import KINDS
from pgqueue._sql.outcomes import RESCUE
from pgqueue._sql.settings import WORKER_SETTINGS
from tests.go_module import GO_CLAIM, GO_COMPLETE, GO_INSERT
from tests.helpers import plan_buffers, running, wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator


def _as(dsn: str, role: str) -> str:
    """``dsn`` with ``role`` as its user (the test servers trust local connections)."""
    parts = urlsplit(dsn)
    host = parts.hostname or "127.0.0.1"
    netloc = f"{role}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass
class Roles:
    """The test's roles on its database: ``dsn[kind]`` connects as that kind."""

    owner: str
    dsn: dict[str, str]
    name: dict[str, str]


@pytest.fixture
async def roles(fresh_dsn: str, admin_dsn: str) -> AsyncIterator[Roles]:
    suffix = uuid.uuid4().hex[:8]
    names = {kind: f"pgq_{kind}_{suffix}" for kind in (*KINDS, "attacker")}
    server = await asyncpg.connect(admin_dsn)
    owner = await asyncpg.connect(fresh_dsn)
    try:
        for kind, name in names.items():
            await server.execute(f'CREATE ROLE "{name}" LOGIN')
            if kind != "attacker":
                await owner.execute(pgqueue.grants(kind, name))  # type: ignore[arg-type]
        yield Roles(
            owner=fresh_dsn,
            dsn={kind: _as(fresh_dsn, name) for kind, name in names.items()},
            name=names,
        )
    finally:
        for name in names.values():
            await owner.execute(f'DROP OWNED BY "{name}" CASCADE')
        await owner.close()
        for name in names.values():
            await server.execute(f'DROP ROLE IF EXISTS "{name}"')
        await server.close()


@contextlib.asynccontextmanager
async def _pool(dsn: str) -> AsyncIterator[asyncpg.Pool]:
    async with asyncpg.create_pool(dsn, min_size=1, max_size=4) as pool:
        yield pool


# --- pinned code ---------------------------------------------------------------------


async def test_every_function_runs_with_a_pinned_search_path_and_definers_are_not_public(
    fresh_dsn: str,
) -> None:
    connection = await asyncpg.connect(fresh_dsn)
    try:
        for signature, kind in FUNCTIONS.items():
            found = await connection.fetchrow(
                "SELECT p.proconfig, p.prosecdef,"
                " EXISTS (SELECT FROM pg_catalog.aclexplode(p.proacl) AS a"
                "         WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE') AS public,"
                " p.proacl IS NULL AS default_acl"
                " FROM pg_catalog.pg_proc AS p WHERE p.oid = $1::regprocedure",
                signature,
            )
            assert found is not None, signature
            assert "search_path=pg_catalog, public, pg_temp" in found["proconfig"]
            assert found["prosecdef"] == (signature in DEFINERS), signature
            if kind == "definer":
                assert not found["public"], signature
                assert not found["default_acl"], signature
    finally:
        await connection.close()


DEFINERS = {
    *(signature for signature, kind in FUNCTIONS.items() if kind == "definer"),
    "pgqueue_group_pending()",  # a trigger: a producer cannot write heads itself
}

# Overloads an attacker who may create functions in public plants: each one a
# better match for the arguments pgqueue passes than pg_catalog's variadic or
# polymorphic built-in, were the call not qualified; each records its call.
PLANTED = """
CREATE TABLE public.trap (name text);
GRANT INSERT, SELECT ON public.trap TO PUBLIC;
CREATE FUNCTION public.format(text, bigint, text) RETURNS text LANGUAGE sql
    AS $$ INSERT INTO public.trap VALUES ('format'); SELECT pg_catalog.format($1, $2, $3) $$;
CREATE FUNCTION public.format(text, bigint, bigint) RETURNS text LANGUAGE sql
    AS $$ INSERT INTO public.trap VALUES ('format'); SELECT pg_catalog.format($1, $2, $3) $$;
CREATE FUNCTION public.jsonb_build_object(text, integer, text, timestamptz, text, text)
    RETURNS jsonb LANGUAGE sql
    AS $$ INSERT INTO public.trap VALUES ('jsonb_build_object');
          SELECT pg_catalog.jsonb_build_object($1, $2, $3, $4, $5, $6) $$;
CREATE FUNCTION public.jsonb_build_array(jsonb) RETURNS jsonb LANGUAGE sql
    AS $$ INSERT INTO public.trap VALUES ('jsonb_build_array'); SELECT pg_catalog.jsonb_build_array($1) $$;
CREATE FUNCTION public.unnest(bigint[]) RETURNS SETOF bigint LANGUAGE sql
    AS $$ INSERT INTO public.trap VALUES ('unnest'); SELECT pg_catalog.unnest($1) $$;
CREATE FUNCTION public.unnest(text[]) RETURNS SETOF text LANGUAGE sql
    AS $$ INSERT INTO public.trap VALUES ('unnest'); SELECT pg_catalog.unnest($1) $$;
CREATE FUNCTION public.hashtextextended(text, integer) RETURNS bigint LANGUAGE sql
    AS $$ INSERT INTO public.trap VALUES ('hashtextextended'); SELECT pg_catalog.hashtextextended($1, $2) $$;
"""


async def test_overloads_planted_in_public_are_never_called(
    roles: Roles, admin_dsn: str, queue_name: str
) -> None:
    server = await asyncpg.connect(admin_dsn)
    owner = await asyncpg.connect(roles.owner)
    try:
        await owner.execute(
            f'GRANT CREATE ON SCHEMA public TO "{roles.name["attacker"]}"'
        )
        attacker = await asyncpg.connect(roles.dsn["attacker"])
        try:
            await attacker.execute(PLANTED)
        finally:
            await attacker.close()
        # Caused: an unqualified call, on the victim's search path, runs the
        # attacker's function with the victim's rights.
        await owner.fetchval(
            "SELECT format('parent job %s is %s', 1::bigint, 'dead'::text)"
        )
        assert await owner.fetchval("SELECT count(*) FROM public.trap") == 1
        await owner.execute("DELETE FROM public.trap")
    finally:
        await server.close()

    async with _pool(roles.owner) as pool:
        queue = pgqueue.Queue(pool, name=queue_name)
        worker = pgqueue.Worker(pool, queue=queue_name, backoff=lambda _a: 0.0)
        failed_once: set[int] = set()

        @worker.handler("t")
        async def handle(job: pgqueue.Job) -> None:
            if job.id not in failed_once:
                failed_once.add(job.id)
                raise RuntimeError("a failed attempt")

        parent = await queue.enqueue("held", {}, delay=3600)
        child = await queue.enqueue("t", {}, after=[parent])
        await queue.enqueue("t", {}, unique_key="k")
        await queue.enqueue("t", {}, unique_key="r", debounce=0.001)
        await queue.enqueue_many(
            [("t", {}), pgqueue.NewJob("t", {}, unique_key="m", priority=2)]
        )
        await owner.fetchval(
            "SELECT pgqueue_enqueue('t', '{}', queue => $1, unique_key => 's')",
            queue_name,
        )
        # A cancel with a waiting child: the trigger cancels the child.
        assert await pgqueue.Admin(pool).cancel(parent) == {parent: "cancelled"}
        waited = await pgqueue.Admin(pool).job(child)
        assert waited is not None
        assert waited.status == "cancelled"
        async with running(worker):
            await wait_until(lambda: _all_done(pool, queue_name))
    assert len(failed_once) == 5
    assert await owner.fetch("SELECT name FROM public.trap") == []
    await owner.close()


async def _all_done(pool: asyncpg.Pool, queue_name: str) -> bool:
    left: int = await pool.fetchval(
        "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1 AND job_type = 't'"
        " AND status NOT IN ('completed', 'cancelled')",
        queue_name,
    )
    return left == 0


# --- roles -------------------------------------------------------------------------


async def test_a_producer_enqueues_through_every_path(
    roles: Roles, queue_name: str
) -> None:
    import psycopg
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    import pgqueue.sqlalchemy
    import pgqueue.sync

    ids: list[int] = []
    async with _pool(roles.dsn["producer"]) as pool:
        queue = pgqueue.Queue(pool, name=queue_name)
        parent = await queue.enqueue("t", {"n": 1})
        ids += [
            parent,
            await queue.enqueue("t", {}, delay=60, priority=3, group="g"),
            await queue.enqueue("t", {}, unique_key="k"),
            await queue.enqueue("t", {}, unique_key="k"),  # the same job
            await queue.enqueue("t", {"v": 2}, unique_key="d", debounce=60),
            await queue.enqueue("t", {}, after=[parent]),
        ]
        with pytest.raises(pgqueue.DuplicateJobError):
            await queue.enqueue("t", {}, unique_key="k", on_conflict="raise")
        ids += await queue.enqueue_many(
            [
                ("t", {}),
                pgqueue.NewJob("t", {}, unique_key="m", group="g"),
                pgqueue.NewJob("t", {}, unique_key="d", debounce=30),
            ]
        )
        ids += await queue.enqueue_many(
            [pgqueue.NewJob("t", {}), pgqueue.NewJob("t", {}, after=[-1, parent])]
        )
        # A large batch takes COPY, which a producer may not: the INSERT path.
        many = await queue.enqueue_many([("bulk", {"i": i}) for i in range(10_000)])
        assert len(set(many)) == 10_000
        async with pool.acquire() as connection, connection.transaction():
            ids.append(await queue.enqueue("t", {}, connection=connection))
        ids.append(
            await pool.fetchval(
                "SELECT pgqueue_enqueue('t', '{}', queue => $1, unique_key => 'sql',"
                " group_key => 'g', after => NULL)",
                queue_name,
            )
        )
        ids.append(
            await pool.fetchval(
                "SELECT pgqueue_enqueue('t', '{}', queue => $1, after => ARRAY[$2::bigint])",
                queue_name,
                parent,
            )
        )
    with psycopg.connect(roles.dsn["producer"], autocommit=True) as conn:
        ids.append(
            pgqueue.sync.Queue(conn, queue_name).enqueue("t", {}, unique_key="y")
        )
        ids += pgqueue.sync.Queue(conn, queue_name).enqueue_many([("t", {}), ("t", {})])
    url = roles.dsn["producer"].replace("postgresql://", "postgresql+asyncpg://", 1)
    engine = create_async_engine(url)
    try:
        async with AsyncSession(engine) as session, session.begin():
            ids.append(
                await pgqueue.sqlalchemy.enqueue(
                    session, "t", {}, queue=queue_name, unique_key="z"
                )
            )
    finally:
        await engine.dispose()
    owner = await asyncpg.connect(roles.owner)
    try:
        found = {
            row["id"]: row
            for row in await owner.fetch(
                "SELECT id, status, group_key, priority FROM pgqueue_jobs WHERE queue = $1",
                queue_name,
            )
        }
    finally:
        await owner.close()
    assert set(ids) <= set(found)
    assert found[ids[1]]["group_key"] == "g"
    assert found[ids[1]]["priority"] == 3
    assert ids[2] == ids[3]
    assert found[ids[5]]["status"] == "waiting"


@pytest.mark.parametrize(
    ("what", "statement"),
    [
        (
            "an id",
            "INSERT INTO pgqueue_jobs (id, queue, job_type) VALUES (10000000, 'q', 't')",
        ),
        (
            "a status",
            "INSERT INTO pgqueue_jobs (queue, job_type, status) VALUES ('q', 't', 'completed')",
        ),
        (
            "a result",
            "INSERT INTO pgqueue_jobs (queue, job_type, result) VALUES ('q', 't', '1')",
        ),
        (
            "attempts",
            "INSERT INTO pgqueue_jobs (queue, job_type, attempts) VALUES ('q', 't', 9)",
        ),
        (
            "a key",
            "INSERT INTO pgqueue_jobs (queue, job_type, unique_key) VALUES ('q', 't', 'periodic:x@1')",
        ),
        ("an update", "UPDATE pgqueue_jobs SET payload = '{}' WHERE id = 1"),
        ("a delete", "DELETE FROM pgqueue_jobs WHERE id = 1"),
        (
            "an edge",
            "INSERT INTO pgqueue_dependencies (parent_id, child_id) VALUES (1, 2)",
        ),
        ("another's payload", "SELECT payload FROM pgqueue_jobs"),
        ("a head", "INSERT INTO pgqueue_groups VALUES ('q', 'g', 'infinity')"),
        ("a claim's turn", "SELECT FROM pgqueue_turns FOR UPDATE"),
        ("a lease", "DELETE FROM pgqueue_leases"),
        ("a pause", "INSERT INTO pgqueue_paused (queue) VALUES ('q')"),
    ],
)
async def test_a_producer_cannot_write_or_read_what_is_not_its_own(
    roles: Roles, what: str, statement: str
) -> None:
    producer = await asyncpg.connect(roles.dsn["producer"])
    try:
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await producer.execute(statement)
    finally:
        await producer.close()


async def test_the_definer_functions_refuse_what_a_producer_may_not_write(
    roles: Roles,
) -> None:
    producer = await asyncpg.connect(roles.dsn["producer"])
    try:
        bad = [
            # a schedule's key
            (
                (
                    "SELECT pgqueue_enqueue_replace('q', 't', '{}', 5, now(), 0, false, NULL,"
                    " 'periodic:s@2026', false, false, NULL)"
                ),
                "reserved",
            ),
            # a control character in a type
            (
                (
                    "SELECT pgqueue_enqueue_replace('q', E't\\x01', '{}', 5, now(), 0, false, NULL,"
                    " 'k', false, false, NULL)"
                ),
                "control character",
            ),
            # an edge to a job that is not of the call
            (
                (
                    "SELECT pgqueue_enqueue_after('q', '{t}', '[{}]', '{5}', '{NULL}', '{NULL}',"
                    " '{0}', '{f}', NULL, '{1}', '{-1}', '{run}', false)"
                ),
                "earlier job",
            ),
            # no such parent
            (
                (
                    "SELECT pgqueue_enqueue_after('q', '{t}', '[{}]', '{5}', '{NULL}', '{NULL}',"
                    " '{0}', '{f}', NULL, '{1}', '{999999999}', '{run}', false)"
                ),
                "does not exist",
            ),
        ]
        for statement, message in bad:
            with pytest.raises(asyncpg.PostgresError, match=message):
                await producer.execute(statement)
    finally:
        await producer.close()


async def test_producers_do_not_wait_for_each_other(
    roles: Roles, queue_name: str
) -> None:
    async with _pool(roles.dsn["producer"]) as pool:
        queue = pgqueue.Queue(pool, name=queue_name)
        parent = await queue.enqueue("t", {}, delay=3600)
        await queue.enqueue("t", {}, group="g")  # the group's head exists
        await queue.enqueue("t", {}, after=[parent])  # and the parent is one
        async with pool.acquire() as first, first.transaction():
            await queue.enqueue("t", {}, unique_key="a", connection=first)
            await queue.enqueue("t", {}, group="g", connection=first)
            await queue.enqueue("t", {}, after=[parent], connection=first)
            # Another producer's enqueues of its own key, the same group and a
            # child of the same parent go through while the first is open.
            with anyio.fail_after(5):
                await queue.enqueue("t", {}, unique_key="b")
                await queue.enqueue("t", {}, group="g")
                await queue.enqueue("t", {}, after=[parent])


async def test_worker_operator_and_reader_do_their_jobs(
    roles: Roles, queue_name: str
) -> None:
    async with _pool(roles.dsn["producer"]) as producers:
        queue = pgqueue.Queue(producers, name=queue_name)
        grouped = pgqueue.Queue(producers, name=f"{queue_name}-g")
        rated = pgqueue.Queue(producers, name=f"{queue_name}-r")
        dead = await queue.enqueue("dies", {}, max_attempts=1)
        for _ in range(3):
            await queue.enqueue("t", {})
            await grouped.enqueue("t", {}, group="g")
            await rated.enqueue("t", {})
        pending = await queue.enqueue("later", {}, delay=3600)
    async with _pool(roles.dsn["worker"]) as workers:
        worker = pgqueue.Worker(
            workers,
            queues={queue_name: 2, grouped.name: 2, rated.name: 2},
            group_limit={grouped.name: 1},
            rate_limit={rated.name: pgqueue.RateLimit(100, per=1.0)},
            retain=3600,
            poll_interval=0.2,
        )

        @worker.handler("t")
        async def handle(job: pgqueue.Job) -> None:
            await pgqueue.publish(workers, "pgq_trust", str(job.id))

        @worker.handler("dies")
        async def dies(job: pgqueue.Job) -> None:
            raise pgqueue.Permanent("dead")

        # A tick a second: the schedule's job inserted with the id it reserved.
        worker.periodic("tick", every=1, job_type="t", queue=queue_name)
        async with running(worker):
            await wait_until(lambda: _completed(workers, 10, queue_name))
    async with _pool(roles.dsn["operator"]) as operators:
        admin = pgqueue.Admin(operators)
        [stats] = await admin.stats(queue_name)
        assert stats.dead == 1
        assert await admin.retry(dead) == {dead: "retried"}
        assert await admin.cancel(pending) == {pending: "cancelled"}
        await admin.pause(queue_name)
        await admin.resume(queue_name)
        assert await admin.prune(0, queue=rated.name) == 3
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await pgqueue.Queue(operators, name=queue_name).enqueue("t", {})
    async with _pool(roles.dsn["reader"]) as readers:
        admin = pgqueue.Admin(readers)
        [stats] = await admin.stats(queue_name)
        assert stats.cancelled == 1
        cancelled = await admin.jobs(queue=queue_name, status="cancelled")
        assert [job.id for job in cancelled] == [pending]
        for action in (
            lambda: admin.retry(pending),
            lambda: admin.cancel(dead),
            lambda: admin.pause(queue_name),
            lambda: admin.prune(0),
        ):
            with pytest.raises(asyncpg.InsufficientPrivilegeError):
                await action()


async def _completed(pool: asyncpg.Pool, count: int, queue_name: str) -> bool:
    done: int = await pool.fetchval(
        "SELECT count(*) FROM pgqueue_jobs WHERE queue LIKE $1 || '%'"
        " AND status = 'completed' AND job_type = 't'",
        queue_name,
    )
    return done >= count


async def test_the_go_modules_statements_work_with_these_grants(
    roles: Roles, queue_name: str
) -> None:
    producer = await asyncpg.connect(roles.dsn["producer"])
    worker = await asyncpg.connect(roles.dsn["worker"])
    try:
        job_id = await producer.fetchval(
            GO_INSERT, queue_name, "t", "{}", 5, datetime.now(UTC)
        )
        await producer.execute("SELECT pg_notify('pgqueue_jobs', $1)", queue_name)
        [claimed] = await worker.fetch(GO_CLAIM, queue_name, 10)
        assert claimed["id"] == job_id
        assert (
            await worker.execute(GO_COMPLETE, job_id, claimed["attempts"]) == "UPDATE 1"
        )
    finally:
        await producer.close()
        await worker.close()


# --- claims no outsider can stall ---------------------------------------------------


async def test_a_held_advisory_lock_of_any_number_stops_no_limited_claim(
    roles: Roles, queue_name: str
) -> None:
    outsider = await asyncpg.connect(roles.dsn["reader"])
    try:
        # The key the claims took before, and a few others.
        await outsider.execute(
            "SELECT pg_advisory_lock(hashtextextended('pgqueue_claims:' || $1, 0)),"
            " pg_advisory_lock(0), pg_advisory_lock(1), pg_advisory_lock(-1)",
            queue_name,
        )
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await outsider.execute("SELECT FROM pgqueue_turns FOR UPDATE")
        async with _pool(roles.dsn["worker"]) as pool:
            queue = pgqueue.Queue(pool, name=queue_name)
            for _ in range(4):
                await queue.enqueue("t", {}, group="a")
            worker = pgqueue.Worker(
                pool,
                queue=queue_name,
                group_limit=1,
                rate_limit=pgqueue.RateLimit(100, per=1.0),
            )

            @worker.handler("t")
            async def handle(job: pgqueue.Job) -> None:
                return None

            with anyio.fail_after(20):
                await worker.run(until_empty=True)
            assert await _completed(pool, 4, queue_name)
    finally:
        await outsider.close()


async def test_a_claim_that_waits_for_its_turn_says_so_and_goes_on(
    fresh_dsn: str, queue_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="pgqueue")
    async with _pool(fresh_dsn) as pool:
        queue = pgqueue.Queue(pool, name=queue_name)
        await pool.execute("INSERT INTO pgqueue_turns VALUES ($1)", queue_name)
        worker = pgqueue.Worker(
            pool, queue=queue_name, rate_limit=pgqueue.RateLimit(100, per=1.0)
        )
        done = anyio.Event()

        @worker.handler("t")
        async def handle(job: pgqueue.Job) -> None:
            done.set()

        holder = await asyncpg.connect(fresh_dsn)
        try:
            transaction = holder.transaction()
            await transaction.start()
            await holder.execute(
                "SELECT FROM pgqueue_turns WHERE queue = $1 FOR UPDATE", queue_name
            )
            async with running(worker):
                await queue.enqueue("t", {})
                # A stuck peer: the claim waits for the row, a second or more.
                await wait_until(lambda: _waiting_on_a_lock(holder, 1.0))
                await transaction.rollback()
                with anyio.fail_after(10):
                    await done.wait()
        finally:
            await holder.close()
    assert any("for the queue's turn" in r.getMessage() for r in caplog.records)


async def _waiting_on_a_lock(holder: asyncpg.Connection, seconds: float) -> bool:
    waiting: bool = await holder.fetchval(
        "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database()"
        " AND clock_timestamp() - query_start > make_interval(secs => $1))",
        seconds,
    )
    return waiting


# --- reserved keys ------------------------------------------------------------------


async def test_a_schedules_keys_are_its_own(
    pool: asyncpg.Pool, dsn: str, queue_name: str
) -> None:
    import psycopg

    import pgqueue.sync

    queue = pgqueue.Queue(pool, name=queue_name)
    with pytest.raises(ValueError, match="reserved for periodic schedules"):
        await queue.enqueue("t", {}, unique_key="periodic:s@2026-01-01T00:00:00+00:00")
    with pytest.raises(ValueError, match="reserved for periodic schedules"):
        await queue.enqueue_many([pgqueue.NewJob("t", {}, unique_key="periodic:x")])
    with (
        psycopg.connect(dsn, autocommit=True) as conn,
        pytest.raises(ValueError, match="reserved"),
    ):
        pgqueue.sync.Queue(conn, queue_name).enqueue("t", {}, unique_key="periodic:x")
    with pytest.raises(asyncpg.InvalidParameterValueError, match="reserved"):
        await pool.fetchval(
            "SELECT pgqueue_enqueue('t', '{}', queue => $1, unique_key => 'periodic:x')",
            queue_name,
        )


async def test_a_forged_key_does_not_silence_a_schedule(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    name = f"forged-{uuid.uuid4().hex[:8]}"

    async def ticks() -> list[int]:
        rows = await pool.fetch(
            "SELECT id FROM pgqueue_jobs WHERE queue = $1 AND job_type = 'tick'"
            " AND unique_key LIKE 'periodic:%' ORDER BY id",
            queue_name,
        )
        return [row["id"] for row in rows]

    worker = pgqueue.Worker(pool, queue=queue_name, poll_interval=0.2)
    ran = anyio.Event()

    @worker.handler("tick")
    async def tick(job: pgqueue.Job) -> None:
        ran.set()

    worker.periodic(name, every=1, job_type="tick", unique=True)
    async with running(worker):
        with anyio.fail_after(10):
            await ran.wait()
        last_key = await pool.fetchval(
            "SELECT last_job_key FROM pgqueue_periodic WHERE name = $1", name
        )
        await wait_until(lambda: _finished(pool, last_key))
        # Forged by a role that may insert keys (the owner here): a job with
        # the schedule's last key, pending for a day. The check used to go by
        # the key, and skipped every tick after this.
        await pool.execute(
            "INSERT INTO pgqueue_jobs (queue, job_type, unique_key, run_at)"
            " VALUES ($1, 'tick', $2, now() + interval '1 day')",
            queue_name,
            last_key,
        )
        # What the check by key saw: the schedule's last job, live.
        assert await pool.fetchval(
            "SELECT EXISTS (SELECT FROM pgqueue_jobs WHERE queue = $1 AND job_type = 'tick'"
            " AND unique_key = $2 AND status IN ('pending', 'running'))",
            queue_name,
            last_key,
        )
        before = len(await ticks())
        await wait_until(lambda: _more(ticks, before + 2))


async def _finished(pool: asyncpg.Pool, key: str) -> bool:
    live: bool = await pool.fetchval(
        "SELECT EXISTS (SELECT FROM pgqueue_jobs WHERE unique_key = $1"
        " AND status IN ('pending', 'running'))",
        key,
    )
    return not live


async def _more(ticks: Any, count: int) -> bool:
    return len(await ticks()) >= count


# --- group claims bounded -----------------------------------------------------------


async def test_a_group_claim_costs_the_same_beside_10000_future_groups(
    fresh_dsn: str,
) -> None:
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await connection.execute(
            "INSERT INTO pgqueue_jobs (queue, job_type, group_key)"
            " SELECT 'q', 't', 'due' || (i % 20) FROM generate_series(1, 200) AS i"
        )
        await connection.execute("ANALYZE pgqueue_jobs; ANALYZE pgqueue_groups")
        alone = await _group_claim_buffers(connection)
        await connection.execute(
            "INSERT INTO pgqueue_jobs (queue, job_type, group_key, run_at)"
            " SELECT 'q', 't', 'later' || i, now() + interval '1 day'"
            " FROM generate_series(1, 10000) AS i"
        )
        await connection.execute("ANALYZE pgqueue_jobs; ANALYZE pgqueue_groups")
        assert (
            await connection.fetchval("SELECT count(*) FROM pgqueue_groups") == 10_020
        )
        beside = await _group_claim_buffers(connection)
    finally:
        await connection.close()
    assert beside <= 2 * alone, (alone, beside)


async def _group_claim_buffers(connection: asyncpg.Connection) -> int:
    """Buffers a claim of 20 jobs (one of each due group) touches, planned as the worker plans it; rolled back."""
    import json

    transaction = connection.transaction()
    await transaction.start()
    try:
        for name, value in WORKER_SETTINGS.items():
            await connection.execute(f"SET LOCAL {name} = {value}")
        raw = await connection.fetchval(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CLAIM_GROUPS,
            "q",
            20,
            1,
            None,
        )
        plan = json.loads(raw)[0]["Plan"]
        assert plan["Actual Rows"] == 20
        return plan_buffers(plan)
    finally:
        await transaction.rollback()


async def test_a_groups_head_follows_its_jobs(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    """A group whose jobs were all claimed loses its head; a retried job brings it back."""
    queue = pgqueue.Queue(pool, name=queue_name)
    job_id = await queue.enqueue("t", {}, group="g")
    head = "SELECT due_at FROM pgqueue_groups WHERE queue = $1 AND group_key = 'g'"
    assert await pool.fetchval(head, queue_name) is not None
    failed = anyio.Event()
    worker = pgqueue.Worker(
        pool, queue=queue_name, group_limit=1, backoff=lambda _a: 3600.0
    )

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        failed.set()
        raise RuntimeError("again in an hour")

    async with running(worker):
        with anyio.fail_after(10):
            await failed.wait()
        # Retried in an hour: the head moves to then.
        await wait_until(lambda: _head_after(pool, queue_name, timedelta(minutes=59)))
    job = await pgqueue.Admin(pool).job(job_id)
    assert job is not None
    assert job.status == "pending"


async def _head_after(pool: asyncpg.Pool, queue_name: str, ahead: timedelta) -> bool:
    due = await pool.fetchval(
        "SELECT due_at - now() FROM pgqueue_groups WHERE queue = $1 AND group_key = 'g'",
        queue_name,
    )
    return due is not None and due > ahead


# --- bounded names ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("job_type", "t" * 256, "at most 255"),
        ("job_type", "a\x1b[31mb", "control character"),
        ("group", "g" * 256, "at most 255"),
        ("group", "g\u0085", "control character"),
        ("unique_key", "k" * 1025, "at most 1024"),
        ("unique_key", "k\x7f", "control character"),
        ("queue", "q\n", "control character"),
    ],
)
async def test_names_are_bounded_and_plain_at_every_entry_point(
    pool: asyncpg.Pool, queue_name: str, field: str, value: str, message: str
) -> None:
    fields: dict[str, Any] = {
        "job_type": "t",
        "queue": queue_name,
        "group": None,
        "unique_key": None,
        field: value,
    }

    async def enqueue() -> None:
        queue = pgqueue.Queue(pool, name=fields["queue"])
        await queue.enqueue(
            fields["job_type"],
            {},
            group=fields["group"],
            unique_key=fields["unique_key"],
        )

    with pytest.raises(ValueError, match=message):
        await enqueue()
    with pytest.raises(asyncpg.InvalidParameterValueError, match=message):
        await pool.fetchval(
            "SELECT pgqueue_enqueue($1, '{}', queue => $2, group_key => $3, unique_key => $4)",
            fields["job_type"],
            fields["queue"],
            fields["group"],
            fields["unique_key"],
        )
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM pgqueue_jobs WHERE queue = $1", queue_name
        )
        == 0
    )


async def test_pgqueue_schema_grants_prints_the_statements() -> None:
    from tests.test_cli import EXIT_OK, EXIT_USAGE, cli

    printed = await cli(None, "schema", "grants", "producer", 'an "odd" role')
    assert (printed.code, printed.out) == (
        EXIT_OK,
        pgqueue.grants("producer", 'an "odd" role'),
    )
    refused = await cli(None, "schema", "grants", "owner", "app")
    assert refused.code == EXIT_USAGE
    assert "invalid choice" in refused.err


async def test_a_rescued_grouped_job_gets_its_groups_head_back(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name)
    await queue.enqueue("t", {}, group="g")
    # Claimed, its group's head raised away (no other job), then orphaned.
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'running', attempts = 1,"
        " updated_at = now() - interval '1 hour' WHERE queue = $1",
        queue_name,
    )
    await pool.execute("DELETE FROM pgqueue_groups WHERE queue = $1", queue_name)
    await pool.fetch(RESCUE, [queue_name], 60.0, 100)
    assert await pool.fetchval(
        "SELECT due_at <= now() FROM pgqueue_groups WHERE queue = $1 AND group_key = 'g'",
        queue_name,
    )


async def test_a_claim_whose_parents_cannot_be_read_gives_its_jobs_back_at_once(
    roles: Roles, queue_name: str
) -> None:
    owner = await asyncpg.connect(roles.owner)
    worker_role = roles.name["worker"]
    ran: list[dict[int, Any]] = []
    try:
        async with _pool(roles.dsn["worker"]) as pool:
            queue = pgqueue.Queue(pool, name=queue_name)
            parent = await queue.enqueue("t", {})
            await pool.execute(
                "UPDATE pgqueue_jobs SET status = 'completed', result = '7' WHERE id = $1",
                parent,
            )
            child = await queue.enqueue("t", {}, after=[parent])
            # The claim works, the read of the parents' results does not.
            await owner.execute(
                f'REVOKE SELECT ON pgqueue_dependencies FROM "{worker_role}"'
            )
            worker = pgqueue.Worker(pool, queue=queue_name, poll_interval=0.2)

            @worker.handler("t")
            async def handle(job: pgqueue.Job) -> None:
                ran.append(dict(job.parent_results))

            async with running(worker):
                await wait_until(lambda: _released(pool, child))
                await owner.execute(
                    f'GRANT SELECT ON pgqueue_dependencies TO "{worker_role}"'
                )
                await wait_until(lambda: _done(pool, child))
    finally:
        await owner.close()
    assert ran == [{parent: 7}]


async def _released(pool: asyncpg.Pool, job_id: int) -> bool:
    """Claimed at least once, and back to pending with no attempt used."""
    row = await pool.fetchrow(
        "SELECT status, attempts, claimed_at FROM pgqueue_jobs WHERE id = $1", job_id
    )
    assert row is not None
    return (
        bool(row["claimed_at"]) and row["status"] == "pending" and row["attempts"] == 0
    )


async def _done(pool: asyncpg.Pool, job_id: int) -> bool:
    status: str = await pool.fetchval(
        "SELECT status FROM pgqueue_jobs WHERE id = $1", job_id
    )
    return status == "completed"
