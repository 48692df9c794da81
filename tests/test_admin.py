"""The operations API, `pgqueue.Admin`, against a real server."""

from __future__ import annotations

import math
from typing import Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue._admin import QUEUE_COUNTS
from pgqueue._dashboard import Sampler
from pgqueue._sql.claims import CLAIM
from pgqueue._sql.leases import SEED_LIMIT
from pgqueue._sql.literals import array, claim_places
from pgqueue._sql.outcomes import COMPLETE, FINISH
from tests.go_module import GO_SCHEMA
from tests.helpers import listening, row, rows, running, wait_until

FINISHED_AGO = "now() - interval '2 days'"


class _Recording:
    """An executor that records every statement and answers none."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        async def call(*args: object, **kwargs: object) -> Any:
            self.calls.append(name)
            raise AssertionError(f"SQL ran: {name}")

        return call


class _Counting:
    """A connection that counts the deletions of jobs run through it (not of edges)."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.calls = 0

    async def fetchrow(self, query: str, *args: Any) -> Any:
        if "DELETE FROM pgqueue_jobs" in query:
            self.calls += 1
        return await self.connection.fetchrow(query, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.connection, name)


async def _insert(
    pool: asyncpg.Pool, queue: str, status: str, n: int = 1, **columns: str
) -> list[int]:
    """``n`` rows of ``queue`` in ``status``, other columns as SQL expressions."""
    row = {"queue": "$1", "job_type": "'t'", "status": "$2", **columns}
    names, values = list(row), list(row.values())
    ids: list[int] = [
        r[0]
        for r in await pool.fetch(
            f"INSERT INTO pgqueue_jobs ({', '.join(names)})"
            f" SELECT {', '.join(values)} FROM generate_series(1, {n}) RETURNING id",
            queue,
            status,
        )
    ]
    return ids


# --- bad input -------------------------------------------------------------------------


BAD_CALLS = [
    ("stats", (), {"queue": ""}),
    ("stats", (), {"queue": "a\x00"}),
    ("jobs", (), {"status": "bogus"}),
    ("jobs", (), {"limit": 0}),
    ("jobs", (), {"limit": "5"}),
    ("jobs", (), {"before_id": 0}),
    ("jobs", (), {"after_id": 0}),
    ("jobs", (), {"before_id": 2, "after_id": 1}),
    ("jobs", (), {"job_type": ""}),
    ("job", ("1",), {}),
    ("job", (-1,), {}),
    ("retry", (1, "2"), {}),
    ("retry", (1, True), {}),
    ("retry", (1,), {"attempts": 0}),
    ("retry_all", (), {"status": "pending"}),
    ("retry_all", (), {"attempts": -1}),
    ("dead_count", (), {"queue": ""}),
    ("dead_count", (), {"job_type": "a\x00"}),
    ("cancel", (1, 0), {}),
    ("prune", (-1,), {}),
    ("prune", (math.nan,), {}),
    ("prune", ("1d",), {}),
    ("prune", (60,), {"batch_size": 0}),
    ("prune", (60,), {"queue": ""}),
]


@pytest.mark.parametrize(("method", "args", "kwargs"), BAD_CALLS)
async def test_bad_input_raises_before_any_sql(
    method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    executor = _Recording()
    admin = pgqueue.Admin(executor)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError)):
        await getattr(admin, method)(*args, **kwargs)
    assert executor.calls == []


async def test_bad_input_writes_nothing(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("t", {})
    await pool.execute("UPDATE pgqueue_jobs SET status = 'dead' WHERE id = $1", job_id)
    admin = pgqueue.Admin(pool)
    before = await rows(pool, queue.name)
    with pytest.raises(TypeError):
        await admin.retry(job_id, "x")  # type: ignore[call-overload]
    with pytest.raises(TypeError):
        await admin.cancel(job_id, None)  # type: ignore[call-overload]
    assert await rows(pool, queue.name) == before


async def test_no_ids_is_no_call(pool: asyncpg.Pool) -> None:
    admin = pgqueue.Admin(_Recording())  # type: ignore[arg-type]
    assert await admin.retry() == {}
    assert await admin.cancel() == {}


# --- stats -----------------------------------------------------------------------------


async def test_stats_are_exact_on_a_small_table(fresh_dsn: str) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=2) as pool:
        await _insert(pool, "a", "pending", 3, run_at="now() - interval '30 seconds'")
        await _insert(pool, "a", "pending", 2, run_at="now() + interval '1 hour'")
        await _insert(
            pool,
            "a",
            "running",
            1,
            attempts="1",
            run_at="now() - interval '1 hour'",
            updated_at="now() - interval '10 seconds'",
        )
        await _insert(pool, "a", "completed", 4, completed_at="now()")
        await _insert(pool, "a", "dead", 2, last_error="'boom'")
        await _insert(pool, "a", "cancelled", 1)
        await _insert(pool, "a", "waiting", 3)
        await _insert(pool, "b", "completed", 1)
        await _insert(pool, "c", "waiting", 2)
        admin = pgqueue.Admin(pool)
        everything = await admin.stats()
        assert [s.queue for s in everything] == ["a", "b", "c"]
        a, b, c = everything
        assert (a.waiting, b.waiting, c.waiting) == (3, 0, 2)
        assert (c.ready, c.running, c.completed, c.lag) == (0, 0, 0, None)
        assert (
            a.ready,
            a.scheduled,
            a.running,
            a.completed,
            a.dead,
            a.cancelled,
            a.completed_estimated,
        ) == (3, 2, 1, 4, 2, 1, False)
        assert a.lag is not None
        assert 29 < a.lag < 120
        assert a.longest_running is not None
        assert 3599 < a.longest_running < 3700
        assert a.oldest_heartbeat is not None
        assert 9 < a.oldest_heartbeat < 100
        assert (b.ready, b.running, b.completed, b.dead) == (0, 0, 1, 0)
        assert (b.lag, b.longest_running, b.oldest_heartbeat) == (None, None, None)

        [only] = await admin.stats("a")
        assert (only.queue, only.ready, only.completed, only.dead) == ("a", 3, 4, 2)
        [empty] = await admin.stats("nothing-here")
        assert empty.to_json() == {
            "queue": "nothing-here",
            "ready": 0,
            "scheduled": 0,
            "running": 0,
            "completed": 0,
            "dead": 0,
            "cancelled": 0,
            "lag": None,
            "longest_running": None,
            "oldest_heartbeat": None,
            "completed_estimated": False,
            "slots_in_use": None,
            "global_limit": None,
            "waiting": 0,
            "parked": 0,
            "paused": False,
        }

        # The same counts, the most jobs to do first: a (9), c (2), b (none).
        def counts(stats: pgqueue.QueueStats) -> tuple[object, ...]:
            return tuple(getattr(stats, name) for name in QUEUE_COUNTS)

        top = await admin.top_queues()
        assert [s.queue for s in top.queues] == ["a", "c", "b"]
        assert {s.queue: counts(s) for s in top.queues} == {
            s.queue: counts(s) for s in everything
        }
        assert top.more == 0
        first = await admin.top_queues(1)
        assert ([s.queue for s in first.queues], first.more) == (["a"], 2)
        found = await admin.top_queues(contains="b")
        assert [s.queue for s in found.queues] == ["b"]
        await admin.pause("idle")  # paused, and no job: listed all the same
        listed = await admin.top_queues(queues=["c", "nothing-here", "idle"])
        assert [s.queue for s in listed.queues] == ["c", "idle", "nothing-here"]
        assert listed.queues[2] == empty
        assert listed.queues[1].paused
        for bad, error in (
            ({"limit": 0}, ValueError),
            ({"contains": ""}, ValueError),
            ({"contains": "a\x1b"}, ValueError),
            ({"queues": "ab"}, TypeError),
        ):
            with pytest.raises(error):
                await admin.top_queues(**bad)


async def test_stats_give_the_slots_in_use_of_queues_with_a_fleet_wide_limit(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    await queue.enqueue("t", {})
    await queue.enqueue("t", {})
    limited = pgqueue.Queue(pool, name=f"{queue.name}-limited")
    await limited.enqueue("t", {})
    await pool.execute(SEED_LIMIT, limited.name, 3)
    # One worker's lease holds a slot; an expired one counts for nothing.
    await pool.execute(
        "INSERT INTO pgqueue_leases (queue, worker, slots, wanted, expires_at)"
        " VALUES ($1, 'a', 1, 3, now() + interval '1 minute'),"
        " ($1, 'b', 2, 3, now() - interval '1 second')",
        limited.name,
    )
    admin = pgqueue.Admin(pool)
    [plain] = await admin.stats(queue.name)
    assert (plain.slots_in_use, plain.global_limit) == (None, None)
    [capped] = await admin.stats(limited.name)
    assert (capped.slots_in_use, capped.global_limit) == (1, 3)
    by_name = {s.queue: s for s in await admin.stats()}
    assert by_name[limited.name].to_json()["slots_in_use"] == 1
    assert by_name[queue.name].global_limit is None


async def test_stats_without_the_limits_table_give_no_slots(fresh_dsn: str) -> None:
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await connection.execute("DROP TABLE pgqueue_limits, pgqueue_leases")
        await connection.execute(
            "INSERT INTO pgqueue_jobs (queue, job_type) VALUES ('a', 't')"
        )
        [a] = await pgqueue.Admin(connection).stats()
        assert (a.ready, a.slots_in_use, a.global_limit) == (1, None, None)
    finally:
        await connection.close()


async def test_stats_on_a_missing_table_raise_a_schema_error(fresh_dsn: str) -> None:
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await pgqueue.uninstall(connection)
        admin = pgqueue.Admin(connection)
        with pytest.raises(pgqueue.SchemaError, match=r"pgqueue\.SCHEMA"):
            await admin.stats()
        with pytest.raises(pgqueue.SchemaError):
            await admin.jobs()
    finally:
        await connection.close()


# --- jobs and job ----------------------------------------------------------------------


async def test_jobs_lists_newest_first_by_keyset_and_filters(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    ids = [await queue.enqueue("t", {"n": n}) for n in range(5)]
    later = await pool.fetchval("SELECT now() + interval '1 hour'")
    scheduled = await queue.enqueue("u", [1, "x"], run_at=later, priority=3)
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'dead', last_error = 'boom' WHERE id = $1",
        ids[1],
    )
    admin = pgqueue.Admin(pool)

    page = await admin.jobs(queue=queue.name, limit=2)
    assert [j.id for j in page] == [scheduled, ids[4]]
    page = await admin.jobs(queue=queue.name, limit=2, before_id=page[-1].id)
    assert [j.id for j in page] == [ids[3], ids[2]]
    page = await admin.jobs(queue=queue.name, limit=2, after_id=page[0].id)
    assert [j.id for j in page] == [scheduled, ids[4]]
    page = await admin.jobs(queue=queue.name, limit=2, after_id=ids[0])
    assert [j.id for j in page] == [ids[2], ids[1]]

    def listed(found: list[pgqueue.JobInfo]) -> list[int]:
        return [j.id for j in found]

    assert listed(await admin.jobs(queue=queue.name, status="ready")) == [
        ids[4],
        ids[3],
        ids[2],
        ids[0],
    ]
    assert listed(await admin.jobs(queue=queue.name, status="scheduled")) == [scheduled]
    assert len(await admin.jobs(queue=queue.name, status="pending")) == 5
    assert listed(await admin.jobs(queue=queue.name, status="dead")) == [ids[1]]
    assert listed(await admin.jobs(queue=queue.name, job_type="u")) == [scheduled]
    assert await admin.jobs(queue=queue.name, status="completed") == []

    info = await admin.job(scheduled)
    assert info is not None
    assert (info.queue, info.job_type, info.status, info.priority) == (
        queue.name,
        "u",
        "pending",
        3,
    )
    assert info.payload == [1, "x"]
    assert info.run_at == later
    assert info.result is None
    shape = info.to_json()
    assert list(shape) == [
        "id",
        "queue",
        "job_type",
        "status",
        "attempts",
        "max_attempts",
        "priority",
        "run_at",
        "created_at",
        "updated_at",
        "completed_at",
        "last_error",
        "unique_key",
        "snoozes",
        "cancel_requested",
        "payload",
        "result",
        "errors",
        "snoozed",
        "checkpoint",
        "steps",
        "steps_total",
        "signals",
        "signals_total",
        "wait",
        "progress",
    ]
    assert shape["run_at"] == later.isoformat()
    assert await admin.job(2**62) is None


async def test_job_decodes_the_result_as_text_whatever_the_pools_codecs(
    dsn: str, queue: pgqueue.Queue
) -> None:
    async def init(connection: asyncpg.Connection) -> None:
        await connection.set_type_codec(
            "jsonb", encoder=str, decoder=lambda _: "codec!", schema="pg_catalog"
        )

    job_id = await queue.enqueue("t", {"a": 1})
    async with asyncpg.create_pool(dsn, min_size=1, max_size=1, init=init) as pool:
        await pool.execute(
            "UPDATE pgqueue_jobs SET status = 'completed', result = '{\"ok\": true}'"
            " WHERE id = $1",
            job_id,
        )
        info = await pgqueue.Admin(pool).job(job_id)
    assert info is not None
    assert (info.payload, info.result) == ({"a": 1}, {"ok": True})


# --- retry -----------------------------------------------------------------------------


async def test_retry_puts_dead_and_cancelled_jobs_back_and_wakes_their_queue(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    dead, cancelled, pending, completed = [
        await queue.enqueue("t", {}, max_attempts=3) for _ in range(4)
    ]
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'dead', attempts = 3, last_error = 'boom',"
        " run_at = now() - interval '1 day' WHERE id = $1",
        dead,
    )
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed', attempts = 1 WHERE id = $1",
        completed,
    )
    admin = pgqueue.Admin(pool)
    assert await admin.cancel(cancelled) == {cancelled: "cancelled"}
    missing = 2**62
    async with listening(dsn, pgqueue.JOBS_CHANNEL) as wakeups:
        done = await admin.retry(dead, cancelled, pending, completed, missing, dead)
        await wakeups.wait_for(queue.name)
    assert done == {
        dead: "retried",
        cancelled: "retried",
        pending: "not_retryable",
        completed: "not_retryable",
        missing: "not_found",
    }
    now = await pool.fetchval("SELECT now()")
    stored = await row(pool, dead)
    assert (stored["status"], stored["attempts"], stored["max_attempts"]) == (
        "pending",
        3,
        6,
    )
    assert stored["last_error"] == "boom"
    assert abs((stored["run_at"] - now).total_seconds()) < 5
    stored = await row(pool, cancelled)
    assert (stored["status"], stored["attempts"], stored["max_attempts"]) == (
        "pending",
        0,
        3,
    )
    assert stored["cancel_requested"] is False
    assert (await row(pool, completed))["status"] == "completed"

    # Dead again: retried with a chosen number of more attempts.
    await pool.execute("UPDATE pgqueue_jobs SET status = 'dead' WHERE id = $1", dead)
    assert await admin.retry(dead, attempts=2) == {dead: "retried"}
    assert (await row(pool, dead))["max_attempts"] == 5


async def test_retry_skips_a_job_whose_unique_key_is_live_again(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    first = await queue.enqueue("t", {}, unique_key="k")
    await pool.execute("UPDATE pgqueue_jobs SET status = 'dead' WHERE id = $1", first)
    live = await queue.enqueue("t", {}, unique_key="k")
    assert live != first
    admin = pgqueue.Admin(pool)
    assert await admin.retry(first) == {first: "duplicate"}
    assert (await row(pool, first))["status"] == "dead"

    # Two dead jobs of one key in one call: the newest one goes back.
    await pool.execute("UPDATE pgqueue_jobs SET status = 'dead' WHERE id = $1", live)
    assert await admin.retry(first, live) == {first: "duplicate", live: "retried"}
    assert (await row(pool, live))["status"] == "pending"
    # Other keys and types are not in the way.
    other = await queue.enqueue("u", {}, unique_key="k")
    await pool.execute("UPDATE pgqueue_jobs SET status = 'dead' WHERE id = $1", other)
    assert await admin.retry(other) == {other: "retried"}


async def test_retry_over_a_connection_in_a_transaction(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("t", {})
    await pool.execute("UPDATE pgqueue_jobs SET status = 'dead' WHERE id = $1", job_id)
    async with pool.acquire() as connection:
        transaction = connection.transaction()
        await transaction.start()
        assert await pgqueue.Admin(connection).retry(job_id) == {job_id: "retried"}
        await transaction.rollback()
    assert (await row(pool, job_id))["status"] == "dead"


@pytest.mark.parametrize("ended", ["dead", "cancelled"])
async def test_a_stale_run_stays_fenced_off_after_a_retry(
    pool: asyncpg.Pool, queue: pgqueue.Queue, ended: str
) -> None:
    """Run A holds attempt 1; the job ends (dead or cancelled) and is retried;
    A's late outcome write matches nothing, before and after run B claims it."""
    places = claim_places({})
    job_id = await queue.enqueue("t", {}, max_attempts=1)

    async def claim() -> int:
        (claimed,) = await pool.fetch(CLAIM, queue.name, 1, *places)
        attempts: int = claimed["attempts"]
        return attempts

    async def write(attempt: int, status: str) -> bool:
        key = (array([job_id]), array([attempt]))
        written = await pool.fetch(
            FINISH, *key, [status], array([0.0]), ["late"], [None]
        )
        if status == "completed":
            written += await pool.fetch(COMPLETE, *key, [None])
        return bool(written)

    a = await claim()
    assert a == 1
    # The job ends while A still runs (a rescue dead-letters it, or a cancel).
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = $2, updated_at = now() WHERE id = $1",
        job_id,
        ended,
    )
    admin = pgqueue.Admin(pool)
    assert await admin.retry(job_id) == {job_id: "retried"}
    stored = await row(pool, job_id)
    assert (stored["status"], stored["attempts"], stored["max_attempts"]) == (
        "pending",
        1,
        2,
    )
    for status in ("completed", "dead", "pending", "cancelled"):
        assert not await write(a, status)
    b = await claim()
    assert b == 2
    for status in ("completed", "dead", "pending", "cancelled"):
        assert not await write(a, status)
    assert await write(b, "completed")
    stored = await row(pool, job_id)
    assert (stored["status"], stored["attempts"]) == ("completed", 2)


async def test_retry_all_walks_the_dead_jobs_in_batches(
    pool: asyncpg.Pool, queue: pgqueue.Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("pgqueue._admin.RETRY_BATCH", 2)
    dead = await _insert(pool, queue.name, "dead", 5, attempts="5")
    other_type = await _insert(pool, queue.name, "dead", 1, job_type="'u'")
    cancelled = await _insert(pool, queue.name, "cancelled", 1)
    keyed = await _insert(pool, queue.name, "dead", 1, unique_key="'k'")
    await queue.enqueue("t", {}, unique_key="k")
    admin = pgqueue.Admin(pool)
    done = await admin.retry_all(queue=queue.name, job_type="t")
    assert done == {**dict.fromkeys(dead, "retried"), keyed[0]: "duplicate"}
    assert [(await row(pool, i))["max_attempts"] for i in dead] == [10] * len(dead)
    assert (await row(pool, other_type[0]))["status"] == "dead"
    assert await admin.retry_all(queue=queue.name, status="cancelled") == {
        cancelled[0]: "retried"
    }
    assert await admin.retry_all(queue=queue.name, job_type="t") == {
        keyed[0]: "duplicate"
    }


async def test_dead_count_counts_the_dead_jobs_retry_all_would_retry(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    await _insert(pool, queue.name, "dead", 3)
    await _insert(pool, queue.name, "dead", 2, job_type="'u'")
    await _insert(pool, queue.name, "cancelled", 1)
    await _insert(pool, queue.name, "pending", 1)
    await _insert(pool, f"{queue.name}-other", "dead", 4)
    admin = pgqueue.Admin(pool)
    assert await admin.dead_count(queue=queue.name) == 5
    assert await admin.dead_count(queue=queue.name, job_type="u") == 2
    assert await admin.dead_count(job_type="t") >= 7
    assert await admin.dead_count(queue="no such queue") == 0
    assert len(await admin.retry_all(queue=queue.name, job_type="t")) == 3
    assert await admin.dead_count(queue=queue.name, job_type="t") == 0


# --- cancel ----------------------------------------------------------------------------


async def test_cancel_answers_as_queue_cancel(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    pending, running, dead = [await queue.enqueue("t", {}) for _ in range(3)]
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'running', attempts = 1 WHERE id = $1",
        running,
    )
    await pool.execute("UPDATE pgqueue_jobs SET status = 'dead' WHERE id = $1", dead)
    done = await pgqueue.Admin(pool).cancel(pending, running, dead, 2**62)
    assert done == {
        pending: "cancelled",
        running: "requested",
        dead: "finished",
        2**62: "not_found",
    }
    assert (await row(pool, running))["cancel_requested"] is True


# --- prune -----------------------------------------------------------------------------


async def test_prune_deletes_only_old_finished_rows_in_batches(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    other = queue_name + "-other"
    old = [
        *await _insert(pool, queue_name, "completed", 5, updated_at=FINISHED_AGO),
        *await _insert(pool, queue_name, "dead", 2, updated_at=FINISHED_AGO),
        *await _insert(pool, queue_name, "cancelled", 1, updated_at=FINISHED_AGO),
    ]
    kept = [
        *await _insert(pool, queue_name, "completed", 2),
        *await _insert(pool, queue_name, "pending", 1, updated_at=FINISHED_AGO),
        *await _insert(pool, queue_name, "running", 1, updated_at=FINISHED_AGO),
    ]
    elsewhere = await _insert(pool, other, "completed", 2, updated_at=FINISHED_AGO)
    async with pool.acquire() as connection:
        counting = _Counting(connection)
        admin = pgqueue.Admin(counting)  # type: ignore[arg-type]
        assert await admin.prune(86400, queue=queue_name, batch_size=3) == len(old)
        # 3 + 3 + 2 rows.
        assert counting.calls == 3
    assert [r["id"] for r in await rows(pool, queue_name)] == kept
    assert len(await rows(pool, other)) == len(elsewhere)
    assert await pgqueue.Admin(pool).prune(3 * 86400) == 0
    assert await pgqueue.Admin(pool).prune(86400) >= len(elsewhere)
    assert await rows(pool, other) == []


# --- schema state ----------------------------------------------------------------------


async def test_schema_state_tells_missing_go_partial_and_current(
    fresh_dsn: str,
) -> None:
    connection = await asyncpg.connect(fresh_dsn)
    try:
        admin = pgqueue.Admin(connection)
        state = await admin.schema_state()
        assert (state.kind, state.missing, state.fix) == ("current", (), None)
        await connection.execute("DROP INDEX idx_pgqueue_jobs_failed")
        state = await admin.schema_state()
        assert (state.kind, state.missing) == (
            "partial",
            ("index idx_pgqueue_jobs_failed",),
        )
        assert state.to_json() == {
            "kind": "partial",
            "missing": ["index idx_pgqueue_jobs_failed"],
            "analyzed": False,
        }
        await connection.execute("DROP FUNCTION pgqueue_enqueue_after")
        state = await admin.schema_state()
        assert state.missing == (
            "index idx_pgqueue_jobs_failed",
            "function pgqueue_enqueue_after",
        )
        await pgqueue.uninstall(connection)
        state = await admin.schema_state()
        assert (state.kind, state.missing) == ("missing", ("table pgqueue_jobs",))
        assert state.fix is not None
        assert "pgqueue.SCHEMA " in state.fix
        await connection.execute(GO_SCHEMA)
        state = await admin.schema_state()
        assert state.kind == "go"
        assert state.missing[0] == "column priority"
        assert "index idx_pgqueue_jobs_failed" in state.missing
        assert state.fix is not None
        assert "SCHEMA_UPGRADE" in state.fix
        await connection.execute(pgqueue.SCHEMA_UPGRADE)
        assert (await admin.schema_state()).kind == "current"
    finally:
        await connection.close()


async def test_a_retry_racing_an_enqueue_of_its_key_reports_a_duplicate(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    """The enqueue is uncommitted when the retry looks, and commits while it waits."""
    dead = await queue.enqueue("t", {}, unique_key="race")
    await pool.execute("UPDATE pgqueue_jobs SET status = 'dead' WHERE id = $1", dead)
    admin = pgqueue.Admin(pool)
    done: dict[int, str] = {}

    async def retry() -> None:
        done.update(await admin.retry(dead))

    async with pool.acquire() as enqueuer:
        transaction = enqueuer.transaction()
        await transaction.start()
        live = await queue.enqueue("t", {}, unique_key="race", connection=enqueuer)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(retry)
            with anyio.fail_after(10):
                while not await pool.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    " AND query LIKE '%retried AS (%'"
                ):
                    await anyio.sleep(0.01)
            await transaction.commit()
    assert done == {dead: "duplicate"}
    assert (await row(pool, dead))["status"] == "dead"
    assert (await row(pool, live))["status"] == "pending"


async def test_running_for_counts_from_the_claim_whatever_the_heartbeats(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    # Due an hour ago, claimed now: it has run for seconds, not an hour.
    job_id = await pgqueue.Queue(pool, name=queue_name).enqueue("slow", {})
    await pool.execute(
        "UPDATE pgqueue_jobs SET run_at = now() - interval '1 hour' WHERE id = $1",
        job_id,
    )
    started, release = anyio.Event(), anyio.Event()
    # Heartbeats every 0.1 s move updated_at; the claim time stays.
    worker = pgqueue.Worker(pool, queue=queue_name, rescue_after=0.3)

    @worker.handler("slow")
    async def slow(_job: pgqueue.Job) -> None:
        started.set()
        await release.wait()

    async with running(worker):
        try:
            with anyio.fail_after(10):
                await started.wait()
            claimed = (await row(pool, job_id))["claimed_at"]

            async def heartbeat_moved_on() -> bool:
                return bool((await row(pool, job_id))["updated_at"] > claimed)

            await wait_until(heartbeat_moved_on)
            stored = await row(pool, job_id)
            assert stored["claimed_at"] == claimed
            [stats] = await pgqueue.Admin(pool).stats(queue_name)
            assert stats.longest_running is not None
            assert 0 <= stats.longest_running < 60
            async with pool.acquire() as conn:
                frame = await Sampler(conn, queue=queue_name).frame()
            [shown] = [r for r in frame.longest_running if r.id == job_id]
            assert shown.running_for is not None
            assert 0 <= shown.running_for < 60
        finally:
            release.set()
