"""The failover tier: a primary and a synchronous standby of the machine's PostgreSQL.

Every test makes its own pair (`tests.replicated`), reaches it through a
multi-host DSN with ``target_session_attrs=read-write``, causes the fault
for real (an immediate stop and a promotion, a primary turned read-only)
and removes both servers afterwards. Marked ``failover``; skipped, saying
why, where the PostgreSQL binaries are missing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import httpx
import pytest

import pgqueue
from pgqueue.web import create_app
from tests.cli_apps import RUNS
from tests.helpers import RecordingLogger, running, wait_until
from tests.replicated import binaries, replicated_cluster
from tests.test_cli_worker import APPS, started

if TYPE_CHECKING:
    import subprocess
    from collections.abc import (
        AsyncIterator,
        Awaitable,
        Callable,
        Iterator,
        Mapping,
        Sequence,
    )

    from tests.replicated import ReplicatedCluster

pytestmark = [pytest.mark.failover, pytest.mark.timeout(90)]

BINDIR = binaries()

UNAVAILABLE = "database %s unavailable (%s); retrying until it is back"
BACK = "database %s available again after %.1f s"

# What a producer meets during a failover: the server gone, shutting down or read-only.
FAILOVER_ERRORS = (
    OSError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.ReadOnlySQLTransactionError,
)


@pytest.fixture
def cluster() -> Iterator[ReplicatedCluster]:
    """A primary and a synchronous standby, removed afterwards even on failure."""
    if BINDIR is None:
        pytest.skip(
            "failover tier skipped: initdb, pg_ctl and pg_basebackup not found "
            "(install PostgreSQL's server binaries or set PG_BINDIR)"
        )
    with replicated_cluster(BINDIR) as made:
        yield made


@pytest.fixture
async def pool(cluster: ReplicatedCluster) -> AsyncIterator[asyncpg.Pool]:
    """A pool on the multi-host DSN, with the schema installed on the primary."""
    async with asyncpg.create_pool(cluster.multi_dsn, min_size=1, max_size=8) as made:
        await pgqueue.install(made)
        yield made


async def set_read_only(cluster: ReplicatedCluster, *, on: bool) -> None:
    """Turn the primary read-only (as a demoted primary or a cloud failover does), or back."""
    connection = await asyncpg.connect(cluster.primary.dsn)
    try:
        await connection.execute("SET default_transaction_read_only = off")
        if on:
            await connection.execute(
                "ALTER SYSTEM SET default_transaction_read_only = on"
            )
        else:
            await connection.execute("ALTER SYSTEM RESET default_transaction_read_only")
        await connection.execute("SELECT pg_reload_conf()")
    finally:
        await connection.close()


async def fail_over(cluster: ReplicatedCluster) -> None:
    """Stop the primary in immediate mode, promote the standby (off the event loop)."""
    await anyio.to_thread.run_sync(cluster.fail_over)


def server(node_port: int) -> str:
    """The name pgqueue logs for a server of the cluster."""
    return f"postgres@127.0.0.1:{node_port}/postgres"


def completed(dsn: str, queue: str, total: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        rows = await job_rows(dsn, queue)
        done = sum(1 for r in rows if r["status"] == "completed")
        return done >= total

    return check


async def job_rows(dsn: str, queue: str) -> list[dict[str, Any]]:
    connection = await asyncpg.connect(dsn)
    try:
        records = await connection.fetch(
            "SELECT id, status, attempts, last_error FROM pgqueue_jobs"
            " WHERE queue = $1 ORDER BY id",
            queue,
        )
    finally:
        await connection.close()
    return [dict(r) for r in records]


async def test_a_read_only_primary_mid_drain_uses_no_attempt(
    cluster: ReplicatedCluster, pool: asyncpg.Pool
) -> None:
    """25006 on the worker's writes is an outage: held outcomes are written once it ends."""
    total = 1000
    queue = pgqueue.Queue(pool, name="ro")
    await queue.enqueue_many([("t", {"n": n}) for n in range(total)])
    logger = RecordingLogger()
    concurrency = 20
    worker = pgqueue.Worker(pool, queue="ro", concurrency=concurrency, logger=logger)
    runs: Counter[int] = Counter()
    held = 0  # handlers waiting for the primary to turn read-only
    read_only = anyio.Event()

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        nonlocal held
        runs[job.id] += 1
        if len(runs) > 200 and not read_only.is_set():
            held += 1
            await read_only.wait()  # they finish once it is: outcomes held
        await anyio.sleep(0.002)

    async def turn_read_only_for_a_while() -> None:
        async def all_slots_held() -> bool:
            return held == concurrency

        await wait_until(all_slots_held, within=20)
        await set_read_only(cluster, on=True)
        read_only.set()
        # Until the writer has met the read-only server and kept its outcomes.
        await logger.wait_until_logged(
            lambda _level, msg, extra: (
                "writing job outcomes failed" in msg
                and "ReadOnlySQLTransaction" in str(extra.get("error"))
            ),
            within=20,
        )
        await set_read_only(cluster, on=False)

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(turn_read_only_for_a_while)
            await worker.run(until_empty=True)

    rows = await job_rows(cluster.primary.dsn, "ro")
    assert len(rows) == total
    assert Counter(r["status"] for r in rows) == {"completed": total}
    assert {r["attempts"] for r in rows} == {1}
    assert set(runs.values()) == {1}
    assert len(runs) == total
    messages = " ".join(logger.messages())
    # One outage, said once.
    assert logger.messages("warning") == [UNAVAILABLE]
    assert logger.messages("error") == []
    assert "placeholder" not in messages
    assert "refused" not in messages
    assert "stale run" not in messages


async def test_a_drain_through_an_immediate_stop_and_promotion(
    cluster: ReplicatedCluster, pool: asyncpg.Pool
) -> None:
    """Every job completed once; at most one claim's jobs rerun as attempt 2; none dead."""
    total, concurrency = 3000, 20
    await pgqueue.Queue(pool, name="drain").enqueue_many(
        [("t", {"n": n}) for n in range(total)]
    )
    logger = RecordingLogger()
    worker = pgqueue.Worker(
        pool, queue="drain", concurrency=concurrency, rescue_after=4.0, logger=logger
    )
    runs: dict[int, list[int]] = defaultdict(list)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        runs[job.id].append(job.attempts)
        await anyio.sleep(0.002)

    async with running(worker):

        async def a_third_done() -> bool:
            return len(runs) >= total // 3

        await wait_until(a_third_done, within=30)
        await fail_over(cluster)
        assert len(runs) < total, "the drain ended before the failover"
        await wait_until(completed(cluster.standby.dsn, "drain", total), within=60)

    rows = await job_rows(cluster.standby.dsn, "drain")
    assert Counter(r["status"] for r in rows) == {"completed": total}
    assert set(runs) == {r["id"] for r in rows}
    # A run is never repeated under its attempt number (outcomes are fenced).
    assert all(len(set(attempts)) == len(attempts) for attempts in runs.values())
    # Only a claim lost in the crash (committed, never answered) runs again,
    # rescued as attempt 2: at most one claim's worth of jobs.
    again = [r for r in rows if r["attempts"] > 1]
    assert len(again) <= 2 * concurrency
    assert {r["attempts"] for r in again} <= {2}
    assert all(runs[r["id"]][-1] == r["attempts"] for r in rows)
    assert logger.messages("warning").count(UNAVAILABLE) >= 1


async def test_pgqueue_worker_rides_through_a_failover_and_exits_0_on_sigterm(
    cluster: ReplicatedCluster, pool: asyncpg.Pool
) -> None:
    """The command keeps running across the failover, runs jobs on the new primary, stops cleanly."""
    await pool.execute(RUNS)
    queue = pgqueue.Queue(pool, name="cli")
    async with started(cluster.multi_dsn, "cli", f"{APPS}:worker") as child:
        await queue.enqueue_many([("work", {}) for _ in range(10)])
        await wait_until(completed(cluster.primary.dsn, "cli", 10), within=20)
        await fail_over(cluster)
        await child.wait_for("unavailable", within=20)
        await child.wait_for("available again", within=20)
        await queue.enqueue_many([("work", {}) for _ in range(10)])
        await wait_until(completed(cluster.standby.dsn, "cli", 20), within=20)
        assert child.process.returncode is None
        child.process.send_signal(signal.SIGTERM)
        assert await child.exit_code() == 0


async def test_an_idle_worker_is_woken_on_the_new_primary_and_says_the_outage_once(
    cluster: ReplicatedCluster, pool: asyncpg.Pool
) -> None:
    """Poll interval 60 s: the enqueue on the new primary wakes it; one warning, one info."""
    logger = RecordingLogger()
    woke = anyio.Event()
    worker = pgqueue.Worker(pool, queue="idle", poll_interval=60, logger=logger)

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        woke.set()

    async with running(worker):
        before = len(logger.records)
        await fail_over(cluster)
        # LISTEN is back on the new primary before this line is logged.
        await logger.wait_for("available again", within=20)
        await pgqueue.Queue(pool, name="idle").enqueue("t", {})
        with anyio.fail_after(2):
            await woke.wait()
        since = logger.records[before:]

    loud = [(lv, m) for lv, m, _ in logger.records if lv in ("warning", "error")]
    assert loud == [("warning", UNAVAILABLE)]
    # Its start and its end, one line each (LISTEN's reconnect is at DEBUG).
    said = [(lv, m) for lv, m, _ in since if lv != "debug"]
    assert said == [("warning", UNAVAILABLE), ("info", BACK)]
    down = [e for _, m, e in logger.records if m == UNAVAILABLE]
    back = [e for _, m, e in logger.records if m == BACK]
    # Named after the server the worker used, whichever of its connections
    # failed first (one not opened yet too), never the DSN's list of hosts.
    assert [e["database"] for e in down] == [server(cluster.primary.port)]
    assert [e["database"] for e in back] == [server(cluster.standby.port)]
    assert back[0]["seconds"] > 0
    retries = [m for lv, m, _ in logger.records if lv == "debug" and "LISTEN" in m]
    assert retries, "the LISTEN connection's retries are logged at DEBUG"


async def test_producers_fail_fast_and_recover_on_the_same_pool(
    cluster: ReplicatedCluster, pool: asyncpg.Pool
) -> None:
    queue = pgqueue.Queue(pool, name="produce")
    before = await queue.enqueue("t", {"n": 0})
    await anyio.to_thread.run_sync(cluster.primary.stop, "immediate")
    # No primary at all: an enqueue raises at once rather than hanging.
    began = anyio.current_time()
    with pytest.raises(FAILOVER_ERRORS):
        await queue.enqueue("t", {"n": 1})
    assert anyio.current_time() - began < 2
    await anyio.to_thread.run_sync(cluster.standby.promote)
    after = await queue.enqueue("t", {"n": 2})  # the same pool, on the new primary
    rows = await job_rows(cluster.standby.dsn, "produce")
    assert [r["id"] for r in rows] == [before, after]


async def test_every_acknowledged_enqueue_and_outcome_is_on_the_new_primary(
    cluster: ReplicatedCluster, pool: asyncpg.Pool
) -> None:
    """Synchronous replication: what was acknowledged before the crash survives it."""
    queue = pgqueue.Queue(pool, name="acks")
    acked: list[int] = []
    written: set[int] = set()

    class Written:
        def on_written(
            self, outcomes: Sequence[pgqueue.Outcome], fenced: Sequence[pgqueue.Outcome]
        ) -> None:
            # Completions: at the stop, jobs claimed but not started are
            # written back as released (pending), and are no completion.
            stale = {o.job.id for o in fenced}
            written.update(
                o.job.id
                for o in outcomes
                if o.job.id not in stale and o.status == "completed"
            )

        def on_rescued(self, queue: str, statuses: Mapping[str, int]) -> None:
            pass

    worker = pgqueue.Worker(
        pool, queue="acks", concurrency=10, rescue_after=4.0, observers=[Written()]
    )
    worker.register("t", lambda _job: None)
    producing = True

    async def produce() -> None:
        n = 0
        while producing:
            try:
                acked.append(await queue.enqueue("t", {"n": n}))
                n += 1
            except FAILOVER_ERRORS:
                await anyio.sleep(0.01)

    async with running(worker), anyio.create_task_group() as tg:
        tg.start_soon(produce)

        async def busy() -> bool:
            return len(acked) >= 300 and len(written) >= 200

        await wait_until(busy, within=30)
        await fail_over(cluster)
        resumed_at = len(acked)

        async def resumed() -> bool:
            return len(acked) >= resumed_at + 100

        await wait_until(resumed, within=30)
        producing = False
    rows = {r["id"]: r for r in await job_rows(cluster.standby.dsn, "acks")}
    assert set(acked) <= set(rows)
    assert all(rows[job_id]["status"] == "completed" for job_id in written)


async def test_a_subscriber_and_a_tracker_across_a_failover(
    cluster: ReplicatedCluster, pool: asyncpg.Pool
) -> None:
    received: list[str] = []
    arrived = anyio.Event()
    reconnected = anyio.Event()

    async def on_reconnect() -> None:
        reconnected.set()

    subscriber = pgqueue.Subscriber(cluster.multi_dsn, on_reconnect=on_reconnect)

    @subscriber.handler("news")
    async def on_news(payload: str) -> None:
        received.append(payload)
        arrived.set()

    queue = pgqueue.Queue(pool, name="tracked")
    job_id = await queue.enqueue("t", {}, track=True)
    async with (
        pgqueue.Tracker(cluster.multi_dsn, poll_interval=60) as tracker,
        anyio.create_task_group() as tg,
    ):
        await tg.start(subscriber.run)
        await pgqueue.publish(pool, "news", "before")
        with anyio.fail_after(10):
            await arrived.wait()

        outcome: list[pgqueue.JobOutcome] = []

        async def wait_for_the_job() -> None:
            outcome.append(await tracker.wait(job_id, timeout=30))

        tg.start_soon(wait_for_the_job)
        await fail_over(cluster)
        with anyio.fail_after(20):
            await reconnected.wait()
        arrived = anyio.Event()
        await pgqueue.publish(pool, "news", "after")
        with anyio.fail_after(10):
            await arrived.wait()
        # The job runs on the new primary; the tracker's wait, begun before
        # the failover, learns its outcome there.
        worker = pgqueue.Worker(pool, queue="tracked", poll_interval=60)
        worker.register("t", lambda _job: "done")
        async with running(worker):
            with anyio.fail_after(10):
                while not outcome:
                    await anyio.sleep(0.01)
        subscriber.stop()
    assert received == ["before", "after"]
    assert outcome[0].status == "completed"


async def _lists(standby: asyncpg.Pool, queue: str, ids: list[int]) -> bool:
    """Whether the standby has replayed the jobs ``ids`` of ``queue`` (and the schema before them)."""
    try:
        jobs = await pgqueue.Admin(standby).jobs(queue=queue)
    except pgqueue.SchemaError:  # the tables are not replayed yet
        return False
    return [job.id for job in jobs] == ids


async def test_admin_reads_on_a_standby_and_its_writes_fail_at_once(
    cluster: ReplicatedCluster, pool: asyncpg.Pool
) -> None:
    """Replay paused: what Admin shows is the standby's, not the primary's."""
    queue = pgqueue.Queue(pool, name="admin")
    first = await queue.enqueue("t", {})
    async with asyncpg.create_pool(cluster.standby.dsn, min_size=1) as standby:
        admin = pgqueue.Admin(standby)

        await wait_until(lambda: _lists(standby, "admin", [first]), within=10)
        await standby.execute("SELECT pg_wal_replay_pause()")
        try:
            second = await queue.enqueue("t", {})  # committed on both, not replayed
            assert [j.id for j in await admin.jobs(queue="admin")] == [first]
            stats = {s.queue: s for s in await admin.stats()}
            assert stats["admin"].ready == 1
            with (
                anyio.fail_after(2),
                pytest.raises(asyncpg.ReadOnlySQLTransactionError),
            ):
                await admin.cancel(first)
        finally:
            await standby.execute("SELECT pg_wal_replay_resume()")

        async def both() -> bool:
            return {j.id for j in await admin.jobs(queue="admin")} == {first, second}

        await wait_until(both, within=10)


def test_the_servers_and_their_files_are_removed_even_when_a_test_fails() -> None:
    if BINDIR is None:
        pytest.skip("failover tier skipped: initdb, pg_ctl and pg_basebackup not found")
    made: list[ReplicatedCluster] = []
    with (  # noqa: PT012
        pytest.raises(RuntimeError, match="a failing test"),
        replicated_cluster(BINDIR) as cluster,
    ):
        made.append(cluster)
        assert (cluster.primary.data / "postmaster.pid").exists()
        raise RuntimeError("a failing test")
    assert not made[0].root.exists()
    for node in (made[0].primary, made[0].standby):
        with socket.socket() as sock:  # no server listens on the port any more
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", node.port))
            sock.listen()


async def pgqueue_cli(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run ``pgqueue ARGS`` to its end."""
    with anyio.fail_after(30):
        return await anyio.run_process(
            [sys.executable, "-m", "pgqueue", *args],
            env={**os.environ, **(env or {})},
            check=False,
        )


async def test_the_read_dsn_commands_and_the_dashboard_read_the_standby(
    cluster: ReplicatedCluster, pool: asyncpg.Pool
) -> None:
    """Replay paused: listings and counts show the standby's rows; actions go to the primary."""
    queue = pgqueue.Queue(pool, name="reads")
    first = await queue.enqueue("t", {})
    primary, standby = cluster.primary.dsn, cluster.standby.dsn
    async with asyncpg.create_pool(standby, min_size=1) as standby_pool:
        await wait_until(lambda: _lists(standby_pool, "reads", [first]), within=10)
        await standby_pool.execute("SELECT pg_wal_replay_pause()")
        try:
            second = await queue.enqueue("t", {})  # not on the standby yet
            stats = await pgqueue_cli(
                "stats", "--dsn", primary, "--read-dsn", standby, "--json"
            )
            assert stats.returncode == 0, stats.stderr
            (reads,) = [s for s in json.loads(stats.stdout) if s["queue"] == "reads"]
            assert reads["ready"] == 1
            listed = await pgqueue_cli(
                "jobs", "list", "--queue", "reads", "--json", "--dsn", primary,
                env={"PGQUEUE_READ_DSN": standby},
            )  # fmt: skip
            assert listed.returncode == 0, listed.stderr
            assert [j["id"] for j in json.loads(listed.stdout)] == [first]
            shown = await pgqueue_cli(
                "jobs", "show", str(second), "--dsn", primary, "--read-dsn", standby
            )
            assert shown.returncode == 1
            assert b"no job has id" in shown.stderr
            top = await pgqueue_cli(
                "top", "--once", "--json", "--queue", "reads",
                "--dsn", primary, "--read-dsn", standby,
            )  # fmt: skip
            assert top.returncode == 0, top.stderr
            assert '"ready": 1' in top.stdout.decode()
            # Without a read DSN every command reads the primary.
            both = await pgqueue_cli("stats", "--dsn", primary, "--json")
            (reads,) = [s for s in json.loads(both.stdout) if s["queue"] == "reads"]
            assert reads["ready"] == 2
            # The dashboard reads the standby; its actions (and the
            # confirmation that reads the job acted on) go to the primary.
            app = create_app(pool, read=standby_pool, read_only=False)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://127.0.0.1"
            ) as client:
                listing = await client.get("/jobs", params={"queue": "reads"})
                assert listing.status_code == 200
                assert f"/jobs/{first}" in listing.text
                assert f"/jobs/{second}" not in listing.text
                assert (await client.get(f"/jobs/{second}")).status_code == 404
                confirm = await client.get(f"/jobs/{second}/cancel")
                assert confirm.status_code == 200
        finally:
            await standby_pool.execute("SELECT pg_wal_replay_resume()")
