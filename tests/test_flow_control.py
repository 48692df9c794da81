"""Flow control across the fleet: pausing a queue, and group limits with fair claims.

``Admin.pause(queue)`` writes the queue's row in ``pgqueue_paused``; every
claim checks it, so no worker starts another of the queue's jobs once the
pause has committed (running jobs finish); ``Admin.resume`` deletes it and
wakes the workers with a NOTIFY. ``Worker(group_limit=N)``: at most N
running jobs of one group across the fleet, groups claimed round-robin.
Against a real server, with real worker processes (``pgqueue worker
--processes``); waits are on rows, under deadlines.
"""

from __future__ import annotations

import itertools
import json
import signal
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue._sql.claims import CLAIM
from pgqueue._sql.literals import claim_places
from tests.cli_apps.limited import SAMPLES, make_worker
from tests.helpers import running, wait_until
from tests.test_cli_worker import started, statuses

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

LIMITED = "tests.cli_apps.limited:worker"

# The most runs of one group of the queue ($1) that overlapped, from their
# recorded starts and ends (an end sorts before a start at the same instant).
MAX_GROUP_OVERLAP = """
SELECT coalesce(max(live), 0) FROM (
    SELECT sum(d) OVER (PARTITION BY g ORDER BY t, d ROWS UNBOUNDED PRECEDING) AS live
    FROM (
        SELECT j.group_key AS g, s.started AS t, 1 AS d
        FROM limit_samples AS s JOIN pgqueue_jobs AS j ON j.id = s.job_id
        WHERE s.queue = $1
        UNION ALL
        SELECT j.group_key, s.ended, -1
        FROM limit_samples AS s JOIN pgqueue_jobs AS j ON j.id = s.job_id
        WHERE s.queue = $1 AND s.ended IS NOT NULL
    ) AS events
) AS running
"""


async def sample_count(pool: asyncpg.Pool, queue: str) -> int:
    count: int = await pool.fetchval(
        "SELECT count(*) FROM limit_samples WHERE queue = $1", queue
    )
    return count


async def enqueue(
    pool: asyncpg.Pool, queue: str, n: int, *, group: str | None = None, **payload: Any
) -> list[int]:
    await pool.execute(SAMPLES)
    q = pgqueue.Queue(pool, name=queue)
    if group is None:
        return await q.enqueue_many([("sample", payload)] * n)
    return [await q.enqueue("sample", payload, group=group) for _ in range(n)]


async def nothing_running(pool: asyncpg.Pool, queue: str) -> bool:
    return (await statuses(pool, queue))["running"] == 0


async def no_start_within(pool: asyncpg.Pool, queue: str, seconds: float) -> None:
    """Fail if a run of ``queue`` starts within ``seconds`` from now."""
    before = await sample_count(pool, queue)

    async def started_one() -> bool:
        return await sample_count(pool, queue) > before

    with anyio.move_on_after(seconds):
        await wait_until(started_one, within=seconds + 1)
        pytest.fail("a job started while its queue was paused")


# --------------------------------------------------------------------------
# Pause and resume


@pytest.fixture
async def own_pool(fresh_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    """A pool on a database of the test's own: its thousands of rows would
    make the run's table big enough for other tests' counts to be estimates."""
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=8) as pool:
        yield pool


async def test_pause_stops_every_process_within_a_second_and_resume_wakes_them(
    fresh_dsn: str, own_pool: asyncpg.Pool, queue_name: str
) -> None:
    dsn, pool = fresh_dsn, own_pool
    await enqueue(pool, queue_name, 3000, sleep=0.01)
    admin = pgqueue.Admin(pool)
    # A long poll: only resume's NOTIFY can wake the workers in time.
    flags = ["--processes", "4", "--concurrency", "3", "--poll-interval", "30"]
    async with started(dsn, queue_name, LIMITED, *flags) as child:
        await child.wait_for("worker ready", count=4, within=30)
        await wait_until(lambda: _more_than(pool, queue_name, 50), within=30)
        assert await admin.pause(queue_name)
        assert not await admin.pause(queue_name)  # paused already
        paused_at = (await admin.paused())[queue_name]
        await wait_until(lambda: nothing_running(pool, queue_name), within=10)
        last_start = await pool.fetchval(
            "SELECT max(started) FROM limit_samples WHERE queue = $1", queue_name
        )
        assert last_start < paused_at + timedelta(seconds=1)
        [stats] = await admin.stats(queue_name)
        assert stats.paused
        assert stats.ready > 0
        await no_start_within(pool, queue_name, 1.5)

        assert await admin.resume(queue_name)
        assert not await admin.resume(queue_name)
        resumed_at = await pool.fetchval("SELECT now()")
        await wait_until(lambda: _started_after(pool, queue_name, resumed_at), within=5)
        first = await pool.fetchval(
            "SELECT min(started) FROM limit_samples WHERE queue = $1 AND started > $2",
            queue_name,
            resumed_at,
        )
        assert first - resumed_at < timedelta(seconds=1)
        child.process.send_signal(signal.SIGTERM)
        assert await child.exit_code() == 0, child.text
    [stats] = await admin.stats(queue_name)
    assert not stats.paused


async def _more_than(pool: asyncpg.Pool, queue: str, n: int) -> bool:
    return await sample_count(pool, queue) > n


async def _started_after(pool: asyncpg.Pool, queue: str, at: Any) -> bool:
    found: bool = await pool.fetchval(
        "SELECT EXISTS (SELECT FROM limit_samples WHERE queue = $1 AND started > $2)",
        queue,
        at,
    )
    return found


async def test_a_worker_started_on_a_paused_queue_claims_nothing_until_resumed(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    admin = pgqueue.Admin(pool)
    await admin.pause(queue_name)
    await enqueue(pool, queue_name, 5)
    worker = make_worker(pool, queue_name, concurrency=4, poll_interval=0.05)
    async with running(worker):
        # Claims every 50 ms, none taking a job.
        await no_start_within(pool, queue_name, 1.0)
        assert (await statuses(pool, queue_name)) == {"pending": 5}
        await admin.resume(queue_name)
        await wait_until(lambda: _completed(pool, queue_name, 5), within=10)
    assert queue_name not in await admin.paused()


async def _completed(pool: asyncpg.Pool, queue: str, n: int) -> bool:
    return (await statuses(pool, queue))["completed"] >= n


async def test_pause_checks_the_queue_name_before_writing(pool: asyncpg.Pool) -> None:
    admin = pgqueue.Admin(pool)
    for bad in ("", "x" * 2000):
        with pytest.raises(ValueError, match="queue"):
            await admin.pause(bad)
    with pytest.raises(TypeError):
        await admin.resume(3)  # type: ignore[arg-type]
    assert "" not in await admin.paused()


async def test_a_paused_claim_reads_no_job(pool: asyncpg.Pool, queue_name: str) -> None:
    await enqueue(pool, queue_name, 50)
    await pgqueue.Admin(pool).pause(queue_name)
    places = claim_places({})
    async with pool.acquire() as connection, connection.transaction():
        plan = await connection.fetchval(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + CLAIM, queue_name, 10, *places
        )
    text = json.dumps(json.loads(plan))
    # The scans of the jobs never ran: the pause is tested first, once.
    assert '"One-Time Filter"' in text
    assert await statuses(pool, queue_name) == {"pending": 50}
    await pgqueue.Admin(pool).resume(queue_name)


# --------------------------------------------------------------------------
# Groups


async def test_group_limit_one_runs_each_groups_jobs_one_at_a_time_in_order(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    # More groups than one process has slots: the processes share them.
    groups = [f"customer:{n}" for n in range(12)]
    ids: dict[str, list[int]] = {group: [] for group in groups}
    for _ in range(8):
        for group in groups:
            ids[group] += await enqueue(pool, queue_name, 1, group=group, sleep=0.01)
    flags = ["--processes", "3", "--concurrency", "2", "--group-limit", "1"]
    async with started(dsn, queue_name, LIMITED, *flags) as child:
        await child.wait_for("worker ready", count=3, within=30)
        await wait_until(lambda: _completed(pool, queue_name, 96), within=60)
        child.process.send_signal(signal.SIGTERM)
        assert await child.exit_code() == 0, child.text
    assert await pool.fetchval(MAX_GROUP_OVERLAP, queue_name) == 1
    for group in groups:
        order = await pool.fetch(
            "SELECT s.job_id FROM limit_samples AS s JOIN pgqueue_jobs AS j"
            " ON j.id = s.job_id WHERE s.queue = $1 AND j.group_key = $2"
            " ORDER BY s.started",
            queue_name,
            group,
        )
        assert [r[0] for r in order] == ids[group]
    # Every process took part.
    overall = await pool.fetchval(
        "SELECT count(DISTINCT pid) FROM limit_samples WHERE queue = $1", queue_name
    )
    assert overall == 3


async def test_a_latecomer_group_waits_at_most_one_claim_behind_a_flood(
    own_pool: asyncpg.Pool, queue_name: str
) -> None:
    pool = own_pool
    await pool.execute(SAMPLES)
    q = pgqueue.Queue(pool, name=queue_name)
    await pool.execute(
        "INSERT INTO pgqueue_jobs (queue, job_type, payload, group_key)"
        " SELECT $1, 'sample', '{\"sleep\": 0.02}', 'flood' FROM generate_series(1, 10000)",
        queue_name,
    )
    worker = make_worker(
        pool, queue_name, concurrency=4, group_limit=2, poll_interval=0.05
    )
    async with running(worker):
        await wait_until(lambda: _more_than(pool, queue_name, 10), within=10)
        late = await q.enqueue("sample", {}, group="late")
        enqueued_at = await pool.fetchval(
            "SELECT created_at FROM pgqueue_jobs WHERE id = $1", late
        )
        before = await sample_count(pool, queue_name)
        await wait_until(lambda: _ran_job(pool, late), within=5)
        ran_at = await pool.fetchval(
            "SELECT started FROM limit_samples WHERE job_id = $1", late
        )
        between = await pool.fetchval(
            "SELECT count(*) FROM limit_samples WHERE queue = $1 AND started < $2",
            queue_name,
            ran_at,
        )
    # The flood runs 2 at a time: the latecomer starts within one claim
    # round (the flood's 2 slots), not behind 10,000 jobs.
    assert between - before <= 2
    assert ran_at - enqueued_at < timedelta(seconds=1)
    assert await pool.fetchval(MAX_GROUP_OVERLAP, queue_name) <= 2


async def _ran_job(pool: asyncpg.Pool, job_id: int) -> bool:
    found: bool = await pool.fetchval(
        "SELECT EXISTS (SELECT FROM limit_samples WHERE job_id = $1)", job_id
    )
    return found


async def test_group_checks_come_before_any_sql(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    q = pgqueue.Queue(pool, name=queue_name)
    with pytest.raises(ValueError, match="group"):
        await q.enqueue("t", {}, group="")
    with pytest.raises(TypeError):
        await q.enqueue("t", {}, group=5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="group_limit"):
        pgqueue.Worker(pool, queue=queue_name, group_limit={"other": 1})
    with pytest.raises(ValueError, match="group_limit of queue"):
        pgqueue.Worker(pool, queue=queue_name, group_limit=0)
    assert await statuses(pool, queue_name) == {}


# --------------------------------------------------------------------------
# Rate limits

# Every start a rated claim records (pgqueue_starts keeps only the window's),
# copied by a trigger into start_log for the sampler.
START_LOG = """
CREATE TABLE IF NOT EXISTS start_log (
    queue      TEXT        NOT NULL,
    group_key  TEXT,
    started_at TIMESTAMPTZ NOT NULL
);
CREATE OR REPLACE FUNCTION log_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO start_log VALUES (NEW.queue, NEW.group_key, NEW.started_at);
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER log_start AFTER INSERT ON pgqueue_starts
    FOR EACH ROW EXECUTE FUNCTION log_start();
"""

# The most starts of queue $1 (of one group, by group_key) in any window of
# $2 seconds [t, t + $2) that begins at a start.
MAX_IN_WINDOW = """
SELECT coalesce(max((
    SELECT count(*) FROM start_log AS o
    WHERE o.queue = $1 AND o.group_key IS NOT DISTINCT FROM s.group_key
      AND o.started_at >= s.started_at
      AND o.started_at < s.started_at + make_interval(secs => $2::float8)
)), 0)
FROM start_log AS s WHERE s.queue = $1
"""


@pytest.fixture
async def start_log(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """The sampler's trigger, dropped after the test (other tests share the database)."""
    await pool.execute(START_LOG)
    yield
    await pool.execute("DROP TRIGGER log_start ON pgqueue_starts")


@pytest.mark.usefixtures("start_log")
async def test_a_rate_of_20_per_second_over_4_processes_holds_in_every_window(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await enqueue(pool, queue_name, 100)
    flags = ["--processes", "4", "--concurrency", "10", "--rate-limit", "20/1s"]
    async with started(dsn, queue_name, LIMITED, *flags) as child:
        await child.wait_for("worker ready", count=4, within=30)
        await wait_until(lambda: _completed(pool, queue_name, 100), within=30)
        child.process.send_signal(signal.SIGTERM)
        assert await child.exit_code() == 0, child.text
    assert await pool.fetchval(MAX_IN_WINDOW, queue_name, 1.0) <= 20
    assert sorted(await _sampled(pool, queue_name)) == sorted(ids)
    # 100 starts at 20 a second: the last within a little over 4 s of the first.
    first, last, count = await _fetchrow(
        pool,
        "SELECT min(started_at), max(started_at), count(*) FROM start_log"
        " WHERE queue = $1",
        queue_name,
    )
    assert count == 100, child.text
    assert timedelta(seconds=4) <= last - first < timedelta(seconds=6)
    pids = await pool.fetchval(
        "SELECT count(DISTINCT pid) FROM limit_samples WHERE queue = $1", queue_name
    )
    assert pids > 1


async def _fetchrow(pool: asyncpg.Pool, query: str, *args: Any) -> asyncpg.Record:
    found = await pool.fetchrow(query, *args)
    assert found is not None
    return found


async def _sampled(pool: asyncpg.Pool, queue: str) -> list[int]:
    rows = await pool.fetch("SELECT job_id FROM limit_samples WHERE queue = $1", queue)
    return [r[0] for r in rows]


@pytest.mark.usefixtures("start_log")
async def test_a_rate_per_group_holds_for_each_group_on_its_own(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    for _ in range(12):
        for group in ("a", "b"):
            await enqueue(pool, queue_name, 1, group=group)
    rate = pgqueue.RateLimit(4, per=1.0, per_group=True)
    workers = [
        make_worker(pool, queue_name, concurrency=5, rate_limit=rate) for _ in range(2)
    ]
    async with running(workers[0]), running(workers[1]):
        await wait_until(lambda: _completed(pool, queue_name, 24), within=20)
    assert await pool.fetchval(MAX_IN_WINDOW, queue_name, 1.0) == 4
    # The groups ran side by side: 8 starts in the queue's first second.
    both = await pool.fetchval(
        "SELECT count(*) FROM start_log WHERE queue = $1 AND started_at"
        " < (SELECT min(started_at) FROM start_log WHERE queue = $1) + interval '1 s'",
        queue_name,
    )
    assert both == 8
    # 12 starts per group at 4 a second: two more windows after the first.
    first, last = await _fetchrow(
        pool,
        "SELECT min(started_at), max(started_at) FROM start_log WHERE queue = $1",
        queue_name,
    )
    assert timedelta(seconds=2) <= last - first < timedelta(seconds=4)


async def _three_windows_of_three(pool: asyncpg.Pool, queue: str) -> None:
    """9 starts at 3 per 0.5 s: never 4 in a window, the last at least two windows in.

    And not a poll (30 s) later: the test's wait for the 9 jobs is 10 s.
    """
    assert await pool.fetchval(MAX_IN_WINDOW, queue, 0.5) == 3
    spread = await pool.fetchval(
        "SELECT extract(epoch FROM max(started_at) - min(started_at))::float8"
        " FROM start_log WHERE queue = $1",
        queue,
    )
    assert 1.0 <= spread < 5.0


@pytest.mark.usefixtures("start_log")
@pytest.mark.parametrize(
    "concurrency",
    [3, 10],
    ids=["claims-as-large-as-the-window", "claims-larger-than-the-window"],
)
async def test_under_run_a_full_window_sleeps_until_its_oldest_start_leaves_not_the_poll(
    pool: asyncpg.Pool, queue_name: str, concurrency: int
) -> None:
    # With concurrency above the rate, each window's claim takes all it
    # allows and comes back short of what it asked; the poll (30 s) never
    # comes within the test's wait.
    await enqueue(pool, queue_name, 9)
    rate = pgqueue.RateLimit(3, per=0.5)
    worker = make_worker(
        pool, queue_name, concurrency=concurrency, rate_limit=rate, poll_interval=30
    )
    async with running(worker):
        await wait_until(lambda: _completed(pool, queue_name, 9), within=10)
    await _three_windows_of_three(pool, queue_name)


@pytest.mark.usefixtures("start_log")
async def test_pgqueue_worker_rate_limit_holds_its_rate(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    await enqueue(pool, queue_name, 9)
    flags = ["--concurrency", "10", "--rate-limit", "3/0.5s", "--poll-interval", "30"]
    async with started(dsn, queue_name, LIMITED, *flags) as child:
        await child.wait_for("worker ready", within=30)
        await wait_until(lambda: _completed(pool, queue_name, 9), within=10)
        child.process.send_signal(signal.SIGTERM)
        assert await child.exit_code() == 0, child.text
    await _three_windows_of_three(pool, queue_name)


async def test_under_run_a_group_s_room_wakes_the_claim_not_the_poll(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    await enqueue(pool, queue_name, 4, group="one", sleep=0.1)
    worker = make_worker(
        pool, queue_name, concurrency=4, group_limit=1, poll_interval=30
    )
    async with running(worker):
        await wait_until(lambda: _completed(pool, queue_name, 4), within=10)
    found = await pool.fetch(
        "SELECT started, ended FROM limit_samples WHERE queue = $1 ORDER BY started",
        queue_name,
    )
    assert await pool.fetchval(MAX_GROUP_OVERLAP, queue_name) == 1
    # Each job starts as the one before it ends (well within a second),
    # not a poll later.
    for before, after in itertools.pairwise(found):
        assert after["started"] - before["ended"] < timedelta(seconds=1)


# --------------------------------------------------------------------------
# A killed worker


async def test_a_group_held_by_a_killed_worker_comes_back_after_rescue_after(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    hung = await enqueue(pool, queue_name, 1, group="g", hang=True)
    rest = await enqueue(pool, queue_name, 3, group="g")
    flags = ["--concurrency", "4", "--group-limit", "1", "--rescue-after", "2"]
    async with started(dsn, queue_name, LIMITED, *flags) as child:
        await child.wait_for("worker ready")
        await wait_until(lambda: _more_than(pool, queue_name, 0))
        child.process.kill()
        assert await child.exit_code() == -signal.SIGKILL
    # Its run ended with the process.
    await pool.execute(
        "UPDATE limit_samples SET ended = clock_timestamp()"
        " WHERE queue = $1 AND ended IS NULL",
        queue_name,
    )
    # The killed worker's job holds its group until it is rescued.
    worker = make_worker(
        pool,
        queue_name,
        concurrency=4,
        group_limit=1,
        rescue_after=2.0,
        poll_interval=0.1,
    )
    async with running(worker):
        with anyio.move_on_after(1.0):
            await wait_until(lambda: _more_than(pool, queue_name, 1), within=2)
            pytest.fail("the group's next job ran while its first was held")
        await wait_until(lambda: _completed(pool, queue_name, 4), within=15)
    order = await pool.fetch(
        "SELECT job_id FROM limit_samples WHERE queue = $1 ORDER BY started",
        queue_name,
    )
    # The first job again (rescued), then the rest in order, one at a time.
    assert [r[0] for r in order] == hung + hung + rest
    assert await pool.fetchval(MAX_GROUP_OVERLAP, queue_name) == 1


async def test_enqueue_many_and_new_job_take_a_group(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    q = pgqueue.Queue(pool, name=queue_name)
    ids = await q.enqueue_many(
        [
            pgqueue.NewJob("t", {}, group="a"),
            ("t", {}),
            pgqueue.NewJob("t", {}, group="b", delay=0.5, unique_key=queue_name),
        ]
    )
    many = await q.enqueue_many([pgqueue.NewJob("t", n, group="c") for n in range(600)])
    rows = await pool.fetch(
        "SELECT id, group_key FROM pgqueue_jobs WHERE id = ANY($1::bigint[])",
        [*ids, many[0], many[-1]],
    )
    found: dict[int, str | None] = {r[0]: r[1] for r in rows}
    assert [found[i] for i in ids] == ["a", None, "b"]
    assert found[many[0]] == found[many[-1]] == "c"
    with pytest.raises(ValueError, match="job 1: group"):
        await q.enqueue_many([("t", {}), pgqueue.NewJob("t", {}, group="")])
    with pytest.raises(ValueError, match="group cannot have parents"):
        await q.enqueue_many(
            [("t", {}), pgqueue.NewJob("t", {}, group="a", after=[-1])]
        )


# --------------------------------------------------------------------------
# The dashboard


async def test_the_dashboard_pauses_and_resumes_a_queue_behind_the_action_rules(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    from pgqueue.web import create_app
    from tests.test_web import client, token_of

    hostile = f"{queue_name}<b>&\"'"
    await pgqueue.Queue(pool, name=hostile).enqueue("t", {})
    admin = pgqueue.Admin(pool)
    ours = {"queue": queue_name}  # the table holds other tests' queues too
    async with client(create_app(pool)) as c:  # read-only: no button, 403
        page = await c.get("/", params=ours)
        assert ">Pause</a>" not in page.text
        assert (await c.get("/pause", params={"queue": hostile})).status_code == 403
    async with client(create_app(pool, read_only=False)) as c:
        page = await c.get("/", params=ours)
        assert ">Pause</a>" in page.text
        assert "<b>&" not in page.text  # escaped everywhere
        confirm = await c.get("/pause", params={"queue": hostile})
        assert confirm.status_code == 200
        assert "<b>&" not in confirm.text
        assert hostile not in await admin.paused()  # a GET changes nothing
        forged = await c.post("/pause", data={"csrf": "0" * 64, "queue": hostile})
        assert forged.status_code == 403
        # A token is bound to its queue.
        other = await c.post(
            "/pause", data={"csrf": token_of(confirm.text), "queue": "other"}
        )
        assert other.status_code == 403
        done = await c.post(
            "/pause", data={"csrf": token_of(confirm.text), "queue": hostile}
        )
        assert done.status_code == 303
        assert hostile in await admin.paused()
        page = await c.get("/", params=ours)
        assert ">Resume</a>" in page.text
        confirm = await c.get("/resume", params={"queue": hostile})
        done = await c.post(
            "/resume", data={"csrf": token_of(confirm.text), "queue": hostile}
        )
        assert done.status_code == 303
        assert hostile not in await admin.paused()
        assert (await c.get("/pause")).status_code == 400  # no queue


def test_the_sync_queue_takes_a_group(dsn: str, queue_name: str) -> None:
    psycopg = pytest.importorskip("psycopg")
    from pgqueue.sync import Queue as SyncQueue

    with psycopg.connect(dsn, autocommit=True) as connection:
        queue = SyncQueue(connection, name=queue_name)
        job_id = queue.enqueue("t", {}, group="customer:1")
        keyed = queue.enqueue("t", {}, group="customer:2", unique_key=queue_name)
        with pytest.raises(ValueError, match="group"):
            queue.enqueue("t", {}, group="")
        found = connection.execute(
            "SELECT id, group_key FROM pgqueue_jobs WHERE queue = %s ORDER BY id",
            (queue_name,),
        ).fetchall()
    assert found == [(job_id, "customer:1"), (keyed, "customer:2")]


async def test_the_command_line_pauses_resumes_and_marks_a_paused_queue(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    from tests.test_cli import cli

    await pgqueue.Queue(pool, name=queue_name).enqueue("t", {})
    paused = await cli(dsn, "pause", queue_name, "--json")
    assert paused.code == 0, paused
    assert json.loads(paused.out) == {"queue": queue_name, "result": "paused"}
    again = await cli(dsn, "pause", queue_name)
    assert again.out == f"queue {queue_name!r} already paused\n"
    stats = await cli(dsn, "stats", "--queue", queue_name)
    assert f"{queue_name} (paused)" in stats.out
    [found] = json.loads((await cli(dsn, "stats", "--queue", queue_name, "--json")).out)
    assert found["paused"] is True
    resumed = await cli(dsn, "resume", queue_name)
    assert resumed.out == f"queue {queue_name!r} resumed\n"
    assert queue_name not in await pgqueue.Admin(pool).paused()
    bad = await cli(dsn, "pause", "")
    assert bad.code != 0
    assert "" not in await pgqueue.Admin(pool).paused()
