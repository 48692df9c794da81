"""Periodic jobs: one job per (schedule, tick), however many workers, on a clock the test moves.

Each worker's scheduler is given a clock (`tests.helpers.TableClock`, in
the worker's private ``_schedules``) that reads ``SELECT t FROM <clock
table>``, one row the test updates, so that every worker (and every
process) sees the same time, moved in steps. Tests wait for a scheduler's
pass (the clock's ``wait_pass()``) or for rows, under deadlines.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

import anyio
import asyncpg
import pytest
from croniter import croniter

import pgqueue
from pgqueue._engine.periodic import CRON_MISSING
from pgqueue._sql.periodic import PERIODIC_REGISTER, PERIODIC_TICK
from tests.helpers import RecordingLogger, TableClock, running, wait_until
from tests.test_cli import cli
from tests.test_cli_worker import ROOT, Child

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

T0 = datetime(2030, 1, 1, 0, 0, 30, tzinfo=UTC)
"""Half a minute past a tick of ``every=60``."""


class Clock:
    """The time every scheduler of a test reads: one row of a table of the test's own."""

    def __init__(self, pool: asyncpg.Pool, table: str) -> None:
        self.pool = pool
        self.table = table

    async def set(self, when: datetime) -> None:
        await self.pool.execute(f"UPDATE {self.table} SET t = $1", when)


@contextlib.asynccontextmanager
async def clock_on(pool: asyncpg.Pool, start: datetime) -> AsyncIterator[Clock]:
    table = f"clock_{uuid.uuid4().hex[:12]}"
    await pool.execute(f"CREATE TABLE {table} (t timestamptz NOT NULL)")
    await pool.execute(f"INSERT INTO {table} VALUES ($1)", start)
    try:
        yield Clock(pool, table)
    finally:
        await pool.execute(f"DROP TABLE IF EXISTS {table}")


def on_clock(worker: pgqueue.Worker, clock: Clock) -> pgqueue.Worker:
    """``worker``, its scheduler reading ``clock``."""
    worker._schedules.clock = TableClock(clock.table)
    return worker


async def step(worker: pgqueue.Worker, clock: Clock, when: datetime) -> None:
    """Move the clock to ``when`` and wait until the worker's scheduler has seen it."""
    await clock.set(when)
    scheduler_clock = worker._schedules.clock
    assert isinstance(scheduler_clock, TableClock)
    with anyio.fail_after(10):
        await scheduler_clock.wait_pass()


async def jobs_of(pool: asyncpg.Pool, name: str) -> list[dict[str, Any]]:
    """The jobs of schedule ``name``, by id."""
    records = await pool.fetch(
        "SELECT * FROM pgqueue_jobs WHERE starts_with(unique_key, $1) ORDER BY id",
        f"periodic:{name}@",
    )
    return [dict(r) for r in records]


async def ticks_of(pool: asyncpg.Pool, name: str) -> list[datetime]:
    return [_tick(job["unique_key"]) for job in await jobs_of(pool, name)]


def _keyed_job(key: str | None) -> pgqueue.Job:
    """A job with this unique key (and nothing else of note)."""
    return pgqueue.Job(
        id=1,
        queue="q",
        type="t",
        payload={},
        attempts=1,
        max_attempts=1,
        run_at=T0,
        created_at=T0,
        unique_key=key,
    )


def _tick(key: str) -> datetime:
    tick = _keyed_job(key).tick
    assert tick is not None
    return tick


def name_for(queue_name: str) -> str:
    return f"sched-{queue_name}"


async def _noop(_job: pgqueue.Job) -> None:
    pass


# --- one worker, in process -------------------------------------------------------------


async def test_every_tick_enqueues_one_job_and_the_handler_sees_its_tick(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    name = name_for(queue_name)
    seen: list[tuple[datetime | None, Any]] = []
    done = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue_name)

    @worker.handler("report")
    async def report(job: pgqueue.Job) -> None:
        seen.append((job.tick, job.payload))
        if len(seen) == 2:
            done.set()

    worker.periodic(name, every=60, job_type="report", payload=[1, "two"])
    async with clock_on(pool, T0) as clock, running(on_clock(worker, clock)):
        await step(worker, clock, T0)
        # A new schedule starts after it was first registered: 00:00:00 never runs.
        assert await jobs_of(pool, name) == []
        await step(worker, clock, T0 + timedelta(seconds=45))  # 00:01:15
        await step(worker, clock, T0 + timedelta(seconds=50))  # the same tick again
        await step(worker, clock, T0 + timedelta(seconds=100))  # 00:02:10
        with anyio.fail_after(10):
            await done.wait()
    first, second = T0 + timedelta(seconds=30), T0 + timedelta(seconds=90)
    assert seen == [(first, [1, "two"]), (second, [1, "two"])]
    jobs = await jobs_of(pool, name)
    assert [job["unique_key"] for job in jobs] == [
        f"periodic:{name}@2030-01-01T00:01:00+00:00",
        f"periodic:{name}@2030-01-01T00:02:00+00:00",
    ]
    assert {job["queue"] for job in jobs} == {queue_name}
    [info] = [s for s in await pgqueue.Admin(pool).schedules() if s.name == name]
    assert info.schedule == "@every 60s"
    assert info.last_tick == second
    assert info.next_tick == second + timedelta(seconds=60)
    assert (info.queue, info.job_type, info.timezone) == (queue_name, "report", "UTC")


async def test_a_restart_neither_doubles_nor_backfills(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    name = name_for(queue_name)

    def make() -> pgqueue.Worker:
        worker = pgqueue.Worker(pool, queue=queue_name)
        worker.register("t", _noop)
        worker.periodic(name, every=60, job_type="t", max_lateness=30)
        return worker

    def minute(n: int, second: int = 0) -> datetime:
        return datetime(2030, 1, 1, 0, n, second, tzinfo=UTC)

    async with clock_on(pool, minute(0, 30)) as clock:
        worker = on_clock(make(), clock)
        async with running(worker):
            await step(worker, clock, minute(0, 30))  # registered
            await step(worker, clock, minute(1, 10))
        assert await ticks_of(pool, name) == [minute(1)]

        # Restarted within the same tick: nothing more.
        worker = on_clock(make(), clock)
        async with running(worker):
            await step(worker, clock, minute(1, 50))
        assert await ticks_of(pool, name) == [minute(1)]

        # Down across the ticks of 00:02 to 00:05; back 20 s after 00:05:
        # only 00:05 runs (within max_lateness), once.
        await clock.set(minute(5, 20))
        worker = on_clock(make(), clock)
        async with running(worker):
            await step(worker, clock, minute(5, 25))
            await step(worker, clock, minute(5, 59))
        assert await ticks_of(pool, name) == [minute(1), minute(5)]

        # Down again; back 40 s after 00:09, later than max_lateness: no job;
        # the next tick runs as usual.
        await clock.set(minute(9, 40))
        worker = on_clock(make(), clock)
        async with running(worker):
            await step(worker, clock, minute(9, 45))
            assert await ticks_of(pool, name) == [minute(1), minute(5)]
            await step(worker, clock, minute(10, 1))
        assert await ticks_of(pool, name) == [minute(1), minute(5), minute(10)]


async def test_max_lateness_is_inclusive(pool: asyncpg.Pool, queue_name: str) -> None:
    name = name_for(queue_name)
    worker = pgqueue.Worker(pool, queue=queue_name)
    worker.register("t", _noop)
    worker.periodic(name, every=60, job_type="t", max_lateness=30)
    async with clock_on(pool, T0) as clock, running(on_clock(worker, clock)):
        await step(worker, clock, T0)  # registered
        await step(worker, clock, T0 + timedelta(seconds=60))  # 00:01:30: 30 s late
    assert await ticks_of(pool, name) == [T0 + timedelta(seconds=30)]


def croniter_ticks(
    expression: str, zone: str, start: datetime, end: datetime
) -> list[datetime]:
    """What croniter says: the ticks in (start, end], as UTC."""
    walk = croniter(expression, start.astimezone(ZoneInfo(zone)))
    found = []
    while (tick := walk.get_next(datetime).astimezone(UTC)) <= end:
        found.append(tick)
    return found


@pytest.mark.parametrize(
    ("expression", "start", "end", "step_minutes"),
    [
        # Spring forward (02:00 CET -> 03:00 CEST on 29 March 2026): 02:30 does not exist.
        ("30 2 * * *", datetime(2026, 3, 27, 22, tzinfo=UTC), datetime(2026, 3, 30, 3, tzinfo=UTC), 20),
        # Fall back (03:00 CEST -> 02:00 CET on 25 October 2026): 02:30 happens twice.
        ("30 2 * * *", datetime(2026, 10, 23, 22, tzinfo=UTC), datetime(2026, 10, 26, 3, tzinfo=UTC), 20),
        # Hourly across the fall back: 02:00 CEST and 02:00 CET are two ticks.
        ("0 * * * *", datetime(2026, 10, 24, 21, tzinfo=UTC), datetime(2026, 10, 25, 5, tzinfo=UTC), 20),
    ],
)  # fmt: skip
async def test_cron_in_a_zone_across_daylight_saving_runs_the_ticks_croniter_gives_once(
    pool: asyncpg.Pool,
    queue_name: str,
    expression: str,
    start: datetime,
    end: datetime,
    step_minutes: int,
) -> None:
    name = name_for(queue_name)
    zone = "Europe/Berlin"
    worker = pgqueue.Worker(pool, queue=queue_name, concurrency=4)
    worker.register("t", _noop)
    worker.periodic(name, expression, job_type="t", tz=zone, unique=False)
    async with clock_on(pool, start) as clock, running(on_clock(worker, clock)):
        await step(worker, clock, start)
        now = start
        while now < end:
            now = min(now + timedelta(minutes=step_minutes), end)
            await step(worker, clock, now)
    expected = croniter_ticks(expression, zone, start, end)
    assert len(expected) >= 3
    assert await ticks_of(pool, name) == expected
    if expression == "0 * * * *":
        assert datetime(2026, 10, 25, 0, tzinfo=UTC) in expected  # 02:00 CEST
        assert datetime(2026, 10, 25, 1, tzinfo=UTC) in expected  # 02:00 CET


async def test_unique_skips_ticks_while_the_previous_job_runs(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    name = name_for(queue_name)
    release = anyio.Event()
    started = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue_name, concurrency=2)

    @worker.handler("slow")
    async def slow(job: pgqueue.Job) -> None:
        started.set()
        await release.wait()

    worker.periodic(name, every=60, job_type="slow")  # unique=True by default

    def minute(n: int, second: int = 10) -> datetime:
        return datetime(2030, 1, 1, 0, n, second, tzinfo=UTC)

    async with clock_on(pool, T0) as clock, running(on_clock(worker, clock)):
        await step(worker, clock, T0)  # registered
        await step(worker, clock, minute(1))
        with anyio.fail_after(10):
            await started.wait()
        for n in (2, 3):
            await step(worker, clock, minute(n))
        # The run of 00:01 still holds the schedule: 00:02 and 00:03 were skipped.
        assert await ticks_of(pool, name) == [minute(1, 0)]
        [info] = [s for s in await pgqueue.Admin(pool).schedules() if s.name == name]
        assert info.last_tick == minute(3, 0)  # a skipped tick still counts as run
        release.set()
        [first] = await jobs_of(pool, name)

        async def completed() -> bool:
            status = await pool.fetchval(
                "SELECT status FROM pgqueue_jobs WHERE id = $1", first["id"]
            )
            return bool(status == "completed")

        await wait_until(completed)
        await step(worker, clock, minute(4))
    assert await ticks_of(pool, name) == [minute(1, 0), minute(4, 0)]


async def test_without_unique_every_tick_is_enqueued_while_one_hangs(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    name = name_for(queue_name)
    worker = pgqueue.Worker(pool, queue=queue_name, concurrency=1, shutdown_grace=0.1)

    @worker.handler("slow")
    async def slow(job: pgqueue.Job) -> None:
        await anyio.sleep_forever()

    worker.periodic(name, every=60, job_type="slow", unique=False)
    async with clock_on(pool, T0) as clock, running(on_clock(worker, clock)):
        await step(worker, clock, T0)  # registered
        for n in (1, 2, 3):
            await step(worker, clock, datetime(2030, 1, 1, 0, n, 5, tzinfo=UTC))
        assert len(await ticks_of(pool, name)) == 3
        with pytest.raises(TimeoutError):
            await worker.stop(timeout=0.1)


async def test_on_the_database_clock_without_a_test_hook(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    name = name_for(queue_name)
    ticks: list[datetime | None] = []
    two = anyio.Event()
    worker = pgqueue.Worker(pool, queue=queue_name)

    @worker.handler("fast")
    async def fast(job: pgqueue.Job) -> None:
        ticks.append(job.tick)
        if len(ticks) == 2:
            two.set()

    worker.periodic(name, every=0.2, job_type="fast")
    async with running(worker):
        with anyio.fail_after(10):
            await two.wait()
    first, second = ticks[:2]
    assert first is not None
    assert second is not None
    assert second > first
    assert (first - datetime(1970, 1, 1, tzinfo=UTC)) % timedelta(
        milliseconds=200
    ) == timedelta(0)


async def test_a_worker_of_several_queues_puts_schedules_without_a_queue_on_its_first(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    first, second = f"{queue_name}-a", f"{queue_name}-b"
    name = name_for(queue_name)
    ran: list[str] = []
    done = anyio.Event()
    worker = pgqueue.Worker(pool, queues={first: 1, second: 1})

    @worker.handler("report")
    async def report(job: pgqueue.Job) -> None:
        ran.append(job.queue)
        done.set()

    worker.periodic(name, every=60, job_type="report")
    worker.periodic(f"{name}-b", every=60, job_type="report", queue=second)
    async with clock_on(pool, T0) as clock, running(on_clock(worker, clock)):
        await step(worker, clock, T0)
        await step(worker, clock, T0 + timedelta(seconds=45))
        with anyio.fail_after(10):
            await done.wait()
    assert {job["queue"] for job in await jobs_of(pool, name)} == {first}
    assert {job["queue"] for job in await jobs_of(pool, f"{name}-b")} == {second}


async def test_the_schedule_is_made_again_after_remove_while_a_worker_registers_it(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    name = name_for(queue_name)
    admin = pgqueue.Admin(pool)
    worker = pgqueue.Worker(pool, queue=queue_name)
    worker.register("t", _noop)
    worker.periodic(name, every=60, job_type="t")
    async with clock_on(pool, T0) as clock, running(on_clock(worker, clock)):
        await step(worker, clock, T0)
        assert name in [s.name for s in await admin.schedules()]
        assert await admin.remove_schedule(name) is True
        assert await admin.remove_schedule(name) is False
        assert name not in [s.name for s in await admin.schedules()]
        await step(worker, clock, T0 + timedelta(seconds=40))
        assert name in [s.name for s in await admin.schedules()]
    assert await ticks_of(pool, name) == [T0 + timedelta(seconds=30)]


async def test_a_missing_table_is_logged_and_the_worker_keeps_working(
    fresh_dsn: str, queue_name: str
) -> None:
    logger = RecordingLogger()
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool:
        await pool.execute("DROP TABLE pgqueue_periodic")
        worker = pgqueue.Worker(pool, queue=queue_name, logger=logger)
        done = anyio.Event()

        @worker.handler("plain")
        async def plain(job: pgqueue.Job) -> None:
            done.set()

        worker.periodic("p", every=0.05, job_type="plain")
        async with running(worker):
            extra = await logger.wait_for("pgqueue.SCHEMA_UPGRADE")
            assert "pgqueue_periodic" in extra["error"]
            await pgqueue.Queue(pool, name=queue_name).enqueue("plain")
            with anyio.fail_after(10):
                await done.wait()
            # Once the table is there, ticks run.
            await pool.execute(pgqueue.SCHEMA_UPGRADE)
            await wait_until(lambda: _has_jobs(pool, "p"), within=15)
        assert (await pgqueue.Admin(pool).schema_state()).kind == "current"
        await pool.execute("DROP TABLE pgqueue_periodic")
        state = await pgqueue.Admin(pool).schema_state()
        assert (state.kind, state.missing) == ("partial", ("table pgqueue_periodic",))
        assert state.fix is not None
        assert "SCHEMA_UPGRADE" in state.fix
        with pytest.raises(pgqueue.SchemaError, match="SCHEMA_UPGRADE"):
            await pgqueue.Admin(pool).schedules()
        with pytest.raises(pgqueue.SchemaError, match="SCHEMA_UPGRADE"):
            await pgqueue.Admin(pool).remove_schedule("p")


async def _has_jobs(pool: asyncpg.Pool, name: str) -> bool:
    return bool(await jobs_of(pool, name))


async def test_a_tick_that_waited_for_a_racing_commit_changes_nothing_until_run_again(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    """Racing ticks of one schedule: the later one must see the earlier one's job.

    Worker A runs 00:01 (late), worker B runs 00:02 at the same moment. B's
    statement waits for A's row lock; its snapshot predates A's job, so it
    must not advance then (it would miss A's job and enqueue a second live
    one with unique=True). Run again, it sees the job and skips the tick.
    """
    name = name_for(queue_name)
    one, two = T0 + timedelta(seconds=30), T0 + timedelta(seconds=90)

    def tick(at: datetime) -> tuple[Any, ...]:
        return (
            name, "@every 60s", "UTC", queue_name, "t", at, at + timedelta(seconds=60),
            at, "{}", 5, True, f"periodic:{name}@{at.isoformat()}",
        )  # fmt: skip

    await pool.execute(
        PERIODIC_REGISTER, name, "@every 60s", "UTC", queue_name, "t", one, T0
    )
    a = await asyncpg.connect(_dsn_of(pool))
    b = await asyncpg.connect(_dsn_of(pool))
    try:
        transaction = a.transaction()
        await transaction.start()
        first = await a.fetchrow(PERIODIC_TICK, *tick(one))
        assert first is not None
        assert first["advanced"]
        assert first["job_id"] is not None
        b_pid = b.get_server_pid()
        async with anyio.create_task_group() as tg:
            answers: list[asyncpg.Record] = []

            async def race() -> None:
                answer = await b.fetchrow(PERIODIC_TICK, *tick(two))
                assert answer is not None
                answers.append(answer)

            tg.start_soon(race)

            async def b_waits() -> bool:
                return bool(
                    await pool.fetchval(
                        "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1",
                        b_pid,
                    )
                )

            await wait_until(b_waits)
            await transaction.commit()
        [raced] = answers
        assert not raced["advanced"]
        assert raced["done_until"] < two  # so the scheduler runs it again
        again = await b.fetchrow(PERIODIC_TICK, *tick(two))
        assert again is not None
        assert again["advanced"]
        assert again["job_id"] is None  # skipped: the job of 00:01 is pending
    finally:
        await a.close()
        await b.close()
    assert await ticks_of(pool, name) == [one]


def _dsn_of(pool: asyncpg.Pool) -> str:
    dsn: str = pool._connect_args[0]  # type: ignore[attr-defined]
    return dsn


@pytest.mark.parametrize("last_job", ["by id", "by key, from before last_job_id"])
async def test_the_tick_statement_finds_its_last_job_through_an_index(
    fresh_dsn: str, last_job: str
) -> None:
    """As the worker's connections plan it (generically), on a table of 20,000 jobs."""
    from tests.test_statement_plans import _plans, _table_scans

    connection = await asyncpg.connect(fresh_dsn)
    try:
        await connection.execute(
            "INSERT INTO pgqueue_jobs (queue, job_type, status, unique_key)"
            " SELECT 'q', 't', CASE WHEN i % 2 = 0 THEN 'completed' ELSE 'pending' END,"
            " 'periodic:other@' || i FROM generate_series(1, 20000) AS i"
        )
        await connection.execute("ANALYZE pgqueue_jobs")
        await connection.execute(
            PERIODIC_REGISTER, "s", "@every 60s", "UTC", "q", "t", T0, T0
        )
        await connection.execute(
            "UPDATE pgqueue_periodic SET last_job_key = 'periodic:other@3',"
            " last_job_id = CASE WHEN $1 THEN (SELECT id FROM pgqueue_jobs"
            " WHERE unique_key = 'periodic:other@3') END",
            last_job == "by id",
        )
        tick = T0 + timedelta(seconds=30)
        plans = await _plans(
            connection,
            PERIODIC_TICK,
            "s",
            "@every 60s",
            "UTC",
            "q",
            "t",
            tick,
            tick + timedelta(seconds=60),
            tick,
            "{}",
            5,
            True,
            f"periodic:s@{tick.isoformat()}",
            modes=("generic",),
        )
    finally:
        await connection.close()
    nodes = plans["generic"]
    scans = _table_scans(nodes)
    assert sorted(scans) == [
        ("Index Only Scan", "idx_pgqueue_jobs_unique"),
        ("Index Scan", "pgqueue_jobs_pkey"),
    ], scans
    index = "pgqueue_jobs_pkey" if last_job == "by id" else "idx_pgqueue_jobs_unique"
    [lookup] = [n for n in nodes if n.get("Index Name") == index]
    conditions = ("id =",) if last_job == "by id" else ("unique_key =", "job_type =")
    for condition in conditions:
        assert condition in lookup["Index Cond"], lookup
    assert lookup["Actual Rows"] == 1  # the last job, pending: the tick is skipped


# --- registration -----------------------------------------------------------------------


BAD = [
    ({"cron": "61 * * * *"}, ValueError, "invalid cron expression"),
    ({"cron": "* * *"}, ValueError, "5 fields"),
    ({"cron": "* * * * * * *"}, ValueError, "5 fields"),
    ({"cron": "R * * * *"}, ValueError, "random"),
    ({"cron": "x y z a b"}, ValueError, "invalid cron expression"),
    ({"cron": "0 0 31 2 *"}, ValueError, "invalid cron expression"),  # never
    ({"cron": 5}, TypeError, "cron must be a str"),
    ({}, TypeError, "either a cron expression or every="),
    ({"cron": "* * * * *", "every": 5}, TypeError, "not both"),
    ({"every": 0}, ValueError, "positive"),
    ({"every": -1}, ValueError, "positive"),
    ({"every": float("nan")}, ValueError, "finite"),
    ({"every": True}, TypeError, "number"),
    ({"every": 0.0001}, ValueError, "at least"),
    ({"every": 60, "tz": "Mars/Olympus"}, ValueError, "unknown time zone"),
    ({"every": 60, "tz": None}, TypeError, "IANA"),
    ({"every": 60, "max_lateness": -1}, ValueError, "max_lateness"),
    ({"every": 60, "payload": {1, 2}}, TypeError, "JSON"),
    ({"every": 60, "queue": ""}, ValueError, "queue"),
    ({"every": 60, "job_type": ""}, ValueError, "job type"),
    ({"every": 60, "unique": "yes"}, TypeError, "unique"),
    ({"every": 60, "max_attempts": 0}, ValueError, "max_attempts"),
    ({"every": 60, "name": ""}, ValueError, "schedule name"),
]


@pytest.mark.parametrize(("kwargs", "error", "message"), BAD)
async def test_bad_registrations_raise_before_any_sql(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    class NoPool:
        def __getattr__(self, name: str) -> Any:
            raise AssertionError(f"the pool was used: {name}")

    worker = pgqueue.Worker(NoPool(), queue="q")  # type: ignore[arg-type]
    arguments: dict[str, Any] = {"name": "n", "job_type": "t", **kwargs}
    name = arguments.pop("name")
    cron = arguments.pop("cron", None)
    with pytest.raises(error, match=message):
        worker.periodic(name, cron, **arguments)
    assert not worker._schedules


async def test_names_are_unique_and_registration_closes_at_run(
    pool: asyncpg.Pool,
) -> None:
    worker = pgqueue.Worker(pool, queue="q")
    worker.periodic("n", "*/5 * * * *", job_type="t", tz="Europe/Berlin")
    worker.periodic("six", "*/10 * * * * *", job_type="t")  # seconds first
    worker.periodic("alias", "@hourly", job_type="t")
    worker.periodic("hashed", "H * * * *", job_type="t")
    with pytest.raises(ValueError, match="already registered"):
        worker.periodic("n", every=5, job_type="t")
    copy = worker.with_options(concurrency=3)
    assert [s.name for s in copy._schedules] == ["n", "six", "alias", "hashed"]
    async with running(worker):
        with pytest.raises(pgqueue.AlreadyStartedError):
            worker.periodic("late", every=5, job_type="t")


def test_six_fields_put_seconds_first() -> None:
    from pgqueue._engine.periodic import check_schedule

    schedule = check_schedule(
        name="s",
        cron="*/10 * * * * *",
        every=None,
        job_type="t",
        payload=None,
        queue=None,
        tz="UTC",
        unique=True,
        max_lateness=1.0,
        max_attempts=1,
    )
    assert schedule.after(T0) == T0 + timedelta(seconds=10)
    assert replace(schedule, cron=None, every=1234567.0).spelled == "@every 1234567s"
    assert replace(schedule, cron=None, every=0.25).spelled == "@every 0.25s"


def test_a_cron_schedule_without_croniter_names_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_import = builtins.__import__

    def no_croniter(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "croniter" or name.startswith("croniter."):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_croniter)
    worker = pgqueue.Worker(None, queue="q")  # type: ignore[arg-type]
    with pytest.raises(ModuleNotFoundError) as caught:
        worker.periodic("n", "* * * * *", job_type="t")
    assert str(caught.value) == CRON_MISSING
    assert "pip install 'pgqueue-asyncio[cron]'" in CRON_MISSING
    worker.periodic("n", every=60, job_type="t")  # no extra needed


def test_the_tick_of_a_job_without_a_periodic_key_is_none() -> None:
    job = _keyed_job

    assert job(None).tick is None
    assert job("user-key").tick is None
    assert job("periodic:no-tick").tick is None
    assert job("periodic:x@not a time").tick is None
    assert job("periodic:a@b@2030-01-01T00:00:00+00:00").tick == datetime(
        2030, 1, 1, tzinfo=UTC
    )


# --- schema -----------------------------------------------------------------------------


PERIODIC_CATALOG = """
SELECT json_agg(json_build_array(column_name, data_type, is_nullable, column_default)
                ORDER BY column_name)::text
FROM information_schema.columns WHERE table_name = 'pgqueue_periodic'
"""


async def test_the_upgrade_adds_the_periodic_table_to_a_go_table_idempotently(
    fresh_dsn: str,
) -> None:
    from tests.go_module import GO_SCHEMA

    connection = await asyncpg.connect(fresh_dsn)
    try:
        installed = await connection.fetchval(PERIODIC_CATALOG)
        assert installed is not None
        await connection.execute(pgqueue.SCHEMA_DOWN)
        assert (
            await connection.fetchval("SELECT to_regclass('pgqueue_periodic')") is None
        )
        await connection.execute(GO_SCHEMA)
        await connection.execute(pgqueue.SCHEMA_UPGRADE)
        await connection.execute(pgqueue.SCHEMA_UPGRADE)
        assert await connection.fetchval(PERIODIC_CATALOG) == installed
        # A row survives another upgrade, and install() on top.
        await connection.execute(
            "INSERT INTO pgqueue_periodic (name, schedule, queue, job_type)"
            " VALUES ('kept', '@every 5s', 'q', 't')"
        )
        await connection.execute(pgqueue.SCHEMA_UPGRADE)
        await pgqueue.install(connection)
        assert await connection.fetchval("SELECT count(*) FROM pgqueue_periodic") == 1
        await pgqueue.uninstall(connection)
        assert (
            await connection.fetchval("SELECT to_regclass('pgqueue_periodic')") is None
        )
    finally:
        await connection.close()


# --- the command line -------------------------------------------------------------------


async def test_cli_periodic_list_and_remove(fresh_dsn: str) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool:
        worker = pgqueue.Worker(pool, queue="cli")
        worker.register("t", _noop)
        worker.periodic("nightly", "30 2 * * *", job_type="t", tz="Europe/Berlin")
        worker.periodic("often", every=60, job_type="t", queue="other")
        async with clock_on(pool, T0) as clock, running(on_clock(worker, clock)):
            await step(worker, clock, T0)  # registered
            await step(worker, clock, T0 + timedelta(seconds=40))
        listed = await cli(fresh_dsn, "periodic", "list", "--json")
        assert listed.code == 0, listed
        by_name = {entry["name"]: entry for entry in listed.json()}
        assert list(by_name) == ["nightly", "often"]
        assert by_name["nightly"]["schedule"] == "30 2 * * *"
        assert by_name["nightly"]["timezone"] == "Europe/Berlin"
        assert by_name["nightly"]["last_tick"] is None
        assert by_name["nightly"]["next_tick"] == "2030-01-01T01:30:00+00:00"
        assert by_name["often"] == {
            **by_name["often"],
            "schedule": "@every 60s",
            "queue": "other",
            "job_type": "t",
            "last_tick": "2030-01-01T00:01:00+00:00",
            "next_tick": "2030-01-01T00:02:00+00:00",
        }
        text = await cli(fresh_dsn, "periodic", "list")
        assert text.code == 0, text
        assert "nightly" in text.out
        assert "Europe/Berlin" in text.out

        removed = await cli(fresh_dsn, "periodic", "remove", "often")
        assert (removed.code, removed.out.strip()) == (0, "removed often")
        again = await cli(fresh_dsn, "periodic", "remove", "often")
        assert again.code == 1
        assert "no schedule is named 'often'" in again.err
        listed = await cli(fresh_dsn, "periodic", "list", "--json")
        assert [entry["name"] for entry in listed.json()] == ["nightly"]

        await pool.execute("DELETE FROM pgqueue_periodic")
        empty = await cli(fresh_dsn, "periodic", "list")
        assert (empty.code, empty.out.strip()) == (0, "no schedules")


# --- many processes ---------------------------------------------------------------------


@contextlib.asynccontextmanager
async def processes(env: dict[str, str], n: int) -> AsyncIterator[list[Child]]:
    """Start ``n`` ``pgqueue worker`` processes of the periodic app; stop them on the way out."""
    children: list[Child] = []
    try:
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                process = await anyio.open_process(
                    [
                        sys.executable,
                        "-m",
                        "pgqueue",
                        "worker",
                        "tests.cli_apps.periodic_app:worker",
                        "--log-level",
                        "DEBUG",
                    ],
                    env=env,
                    cwd=ROOT,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
                child = Child(process)
                children.append(child)
                tg.start_soon(child.read)
            yield children
            for child in children:
                if child.process.returncode is None:
                    child.process.send_signal(signal.SIGTERM)
            with anyio.fail_after(20):
                for child in children:
                    await child.process.wait()
    finally:
        for child in children:
            if child.process.returncode is None:
                child.process.kill()
            with anyio.CancelScope(shield=True):
                await child.process.aclose()


@pytest.mark.slow
async def test_five_processes_over_twenty_ticks_enqueue_twenty_jobs(
    fresh_dsn: str,
) -> None:
    name = "five"
    async with (
        asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool,
        clock_on(pool, T0) as clock,
    ):
        env = {
            **os.environ,
            "PGQUEUE_DSN": fresh_dsn,
            "CLI_QUEUE": "periodic",
            "PERIODIC_NAME": name,
            "PERIODIC_CLOCK": clock.table,
        }
        async with processes(env, 5) as children:
            for child in children:
                await child.wait_for("periodic scheduler started", within=30)

            async def tick(k: int) -> None:
                # 30 s past tick k: every process finds it due at once.
                await clock.set(T0 + timedelta(minutes=k))

                async def caught_up() -> bool:
                    return len(await jobs_of(pool, name)) >= k

                await wait_until(caught_up, within=15)

            def enqueued() -> list[int]:
                return [c.text.count("periodic job enqueued") for c in children]

            async def logged(n: int) -> bool:
                return sum(enqueued()) == n

            for k in range(1, 11):
                await tick(k)
            # No leader is elected: with the processes that ran the first
            # ten ticks stopped (all but one, if every one did), the others
            # run the rest.
            # (Which process wins a tick is timing: the winner's next pass
            # comes first, so one may win every tick while all run.)
            await wait_until(functools.partial(logged, 10), within=15)
            first = enqueued()
            winners = sorted(
                (c for c, n in zip(children, first, strict=True) if n),
                key=lambda c: -first[children.index(c)],
            )
            stopped = winners[:4]  # one process at least runs on
            for child in stopped:
                child.process.send_signal(signal.SIGTERM)
            with anyio.fail_after(20):
                for child in stopped:
                    await child.process.wait()
            for k in range(11, 21):
                await tick(k)
            await wait_until(functools.partial(logged, 20), within=15)
        for child in children:
            assert child.process.returncode == 0, child.text
        # Every process ran the ticks' statements; one enqueued each tick.
        last = enqueued()
        already = [c.text.count("periodic tick already run") for c in children]
        assert sum(last) == 20, (last, already)
        assert sum(already) >= 20, (last, already)
        ran_on = [
            n - m
            for c, n, m in zip(children, last, first, strict=True)
            if c not in stopped
        ]
        assert sum(ran_on) == 10, (first, last)
        jobs = await jobs_of(pool, name)
        expected = [T0 + timedelta(minutes=k, seconds=-30) for k in range(1, 21)]
        assert [_tick(job["unique_key"]) for job in jobs] == expected
        completed = {job["status"] for job in jobs}
        assert completed <= {"completed", "pending", "running"}


@pytest.mark.parametrize(
    ("cron", "every", "now", "lateness", "expected"),
    [
        (None, 60.0, "2030-01-01T10:00:59", 1e9, "2030-01-01T10:00:00"),
        (None, 60.0, "2030-01-01T10:00:00", 0.0, "2030-01-01T10:00:00"),
        (None, 60.0, "2030-01-01T10:00:30", 29.0, None),
        ("0 3 * * *", None, "2030-01-05T10:00:00", 30 * 86400.0, "2030-01-05T03:00:00"),
        ("0 3 * * *", None, "2030-01-05T10:00:00", 6 * 3600.0, None),
        ("0 3 * * *", None, "2030-01-05T10:00:00", 7 * 3600.0, "2030-01-05T03:00:00"),
        ("* * * * * *", None, "2030-01-05T10:00:00.5", 1e6, "2030-01-05T10:00:00"),
    ],
)  # fmt: skip
def test_the_latest_due_tick_is_found_without_walking_the_whole_window(
    cron: str | None,
    every: float | None,
    now: str,
    lateness: float,
    expected: str | None,
) -> None:
    from pgqueue._engine.periodic import check_schedule

    schedule = check_schedule(
        name="s",
        cron=cron,
        every=every,
        job_type="t",
        payload=None,
        queue=None,
        tz="UTC",
        unique=True,
        max_lateness=lateness,
        max_attempts=1,
    )
    at = datetime.fromisoformat(now).replace(tzinfo=UTC)
    tick, following = schedule.latest_due(at, None)
    want = (
        None
        if expected is None
        else datetime.fromisoformat(expected).replace(tzinfo=UTC)
    )
    assert tick == want
    assert following > at
    assert following == schedule.after(at)
