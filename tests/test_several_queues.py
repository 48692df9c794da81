"""One worker, several queues: ``Worker(pool, queues={...}, max_concurrency=...)``.

Each queue has its own slots, claims and poll timer; a NOTIFY wakes only its
queue; the sweeps, the heartbeats, the drain and the fault handling cover
every queue. Against a real server; waits are on events and rows, under
deadlines.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import TYPE_CHECKING, Any

import anyio
import pytest

import pgqueue
from pgqueue.cli import _processes, _target, build_parser
from pgqueue.cli._common import UsageError
from tests.cli_apps import RUNS
from tests.helpers import noop, row, rows, running, wait_for_row, wait_until
from tests.test_cli_worker import APPS, ROOT, run_cli, runs, statuses
from tests.test_faults import (
    listening,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    import asyncpg

# A row in line without the wakeup an enqueue sends (as a producer whose
# NOTIFY was lost): only a claim the worker makes for its own reasons finds it.
SILENT_INSERT = (
    "INSERT INTO pgqueue_jobs (queue, job_type) VALUES ($1, $2) RETURNING id"
)


@pytest.fixture
def names(queue_name: str) -> tuple[str, str]:
    """Two queue names of the test's own."""
    return f"{queue_name}-a", f"{queue_name}-b"


async def idle(worker: pgqueue.Worker) -> None:
    """Wait until every queue's first claims came back short (nothing more to claim)."""

    async def settled() -> bool:
        return not any(lane.policy.more for lane in worker._lanes)

    await wait_until(settled)


async def orphan(pool: asyncpg.Pool, job_id: int, *, attempts: int = 1) -> None:
    """Make the job look claimed by a worker that died an hour ago."""
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'running', attempts = $2,"
        " updated_at = now() - interval '1 hour' WHERE id = $1",
        job_id,
        attempts,
    )


# --------------------------------------------------------------------------
# Options


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"queues": {"a": 1}, "queue": "b"}, TypeError, "either queues"),
        ({"queues": {"a": 1}, "concurrency": 3}, TypeError, "either queues"),
        ({"queues": {}}, ValueError, "at least one"),
        ({"queues": "a"}, TypeError, "mapping"),
        ({"queues": {"a": 0}}, ValueError, "concurrency of queue 'a'"),
        ({"queues": {"a": 1.5}}, TypeError, "concurrency of queue 'a'"),
        ({"queues": {"": 1}}, ValueError, "queue name"),
        ({"queues": {"a": 1}, "max_concurrency": 0}, ValueError, "max_concurrency"),
        ({"max_concurrency": "4"}, TypeError, "max_concurrency"),
    ],
)
def test_constructor_validates_queues(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        pgqueue.Worker(None, **kwargs)  # type: ignore[arg-type]


def test_queue_and_queues_properties() -> None:
    one = pgqueue.Worker(None)  # type: ignore[arg-type]
    assert one.queue == "default"
    assert one.queues == {"default": 2}
    assert repr(one) == "Worker(queue='default', concurrency=2, state='new')"
    several = pgqueue.Worker(
        None,  # type: ignore[arg-type]
        queues={"default": 10, "emails": 2},
        max_concurrency=8,
    )
    assert several.queues == {"default": 10, "emails": 2}
    with pytest.raises(AttributeError, match="several queues"):
        _ = several.queue
    assert repr(several) == (
        "Worker(queues={'default': 10, 'emails': 2}, max_concurrency=8, state='new')"
    )


def test_replace_switches_between_the_forms() -> None:
    one = pgqueue.Worker(None, queue="q", concurrency=3)  # type: ignore[arg-type]
    one.register("t", noop)
    several = one.with_options(queues={"a": 1, "b": 2}, max_concurrency=2)
    assert several.queues == {"a": 1, "b": 2}
    assert several.job_types == ("t",)
    back = several.with_options(queue="c")
    assert back.queues == {"c": 2}
    assert several.with_options(prefetch=4).queues == {"a": 1, "b": 2}
    with pytest.raises(TypeError, match="either queues"):
        several.with_options(concurrency=5)


# --------------------------------------------------------------------------
# Each queue its own slots


async def test_a_queue_with_every_slot_blocked_does_not_hold_up_another(
    pool: asyncpg.Pool, names: tuple[str, str]
) -> None:
    a, b = names
    release = anyio.Event()
    blocked: list[int] = []
    done_b: list[int] = []
    all_b = anyio.Event()
    worker = pgqueue.Worker(pool, queues={a: 2, b: 1})

    @worker.handler("block")
    async def block(job: pgqueue.Job) -> None:
        blocked.append(job.id)
        await release.wait()

    @worker.handler("quick")
    async def quick(job: pgqueue.Job) -> None:
        assert job.queue == b
        done_b.append(job.id)
        if len(done_b) == 5:
            all_b.set()

    a_ids = await pgqueue.Queue(pool, name=a).enqueue_many([("block", {})] * 3)
    async with running(worker):

        async def a_full() -> bool:
            return len(blocked) == 2

        await wait_until(a_full)
        b_ids = await pgqueue.Queue(pool, name=b).enqueue_many([("quick", {})] * 5)
        with anyio.fail_after(10):
            await all_b.wait()
        for job_id in b_ids:
            await wait_for_row(pool, job_id, status="completed")
        assert len(blocked) == 2  # A's third job waits for one of A's slots
        assert (await row(pool, a_ids[2]))["status"] == "pending"
        release.set()
        for job_id in a_ids:
            await wait_for_row(pool, job_id, status="completed")
    assert sorted(done_b) == b_ids


async def test_a_notify_for_one_queue_claims_for_that_queue_only(
    pool: asyncpg.Pool, names: tuple[str, str]
) -> None:
    a, b = names
    ran: dict[str, list[int]] = {a: [], b: []}
    arrived = anyio.Event()

    async def record(job: pgqueue.Job) -> None:
        ran[job.queue].append(job.id)
        arrived.set()

    # A 60 s poll: within the test, only a wakeup makes either queue claim.
    worker = pgqueue.Worker(pool, queues={a: 1, b: 1}, poll_interval=60)
    worker.register("t", record)
    async with running(worker):
        await idle(worker)
        silent = await pool.fetchval(SILENT_INSERT, a, "t")
        # Two NOTIFYs for B, each waited for: a claim for A would come with
        # either, and would find A's job.
        for _ in range(2):
            arrived = anyio.Event()
            await pgqueue.Queue(pool, name=b).enqueue("t", {})
            with anyio.fail_after(10):
                await arrived.wait()
            await idle(worker)
        assert len(ran[b]) == 2
        assert ran[a] == []
        assert (await row(pool, silent))["status"] == "pending"
        # And the reverse: a NOTIFY for A runs A's job at once.
        await pool.execute("SELECT pg_notify('pgqueue_jobs', $1)", a)
        await wait_for_row(pool, silent, within=5, status="completed")
    assert ran[a] == [silent]


async def test_the_overall_cap_is_never_exceeded(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    names = [f"{queue_name}-{i}" for i in range(3)]
    cap = 4
    now = peak = 0
    per_queue: Counter[str] = Counter()
    worker = pgqueue.Worker(
        pool, queues=dict.fromkeys(names, 3), max_concurrency=cap, prefetch=2
    )

    @worker.handler("t")
    async def count(job: pgqueue.Job) -> None:
        nonlocal now, peak
        now += 1
        peak = max(peak, now)
        try:
            await anyio.sleep(0.005)  # the job's work, so that runs overlap
        finally:
            now -= 1
        per_queue[job.queue] += 1

    for name in names:
        await pgqueue.Queue(pool, name=name).enqueue_many([("t", {})] * 30)
    with anyio.fail_after(30):
        await worker.run(until_empty=True)
    assert peak == cap
    assert per_queue == dict.fromkeys(names, 30)
    for name in names:
        assert Counter(r["status"] for r in await rows(pool, name)) == {"completed": 30}


async def test_under_the_cap_a_busy_queue_does_not_starve_another(
    pool: asyncpg.Pool, names: tuple[str, str]
) -> None:
    """A queue whose jobs fill the overall cap still leaves turns to the other one."""
    a, b = names
    release = anyio.Event()
    started: list[str] = []
    worker = pgqueue.Worker(pool, queues={a: 4, b: 4}, max_concurrency=4)

    @worker.handler("t")
    async def hold(job: pgqueue.Job) -> None:
        started.append(job.queue)
        if job.queue == a:
            await release.wait()

    await pgqueue.Queue(pool, name=a).enqueue_many([("t", {})] * 8)
    async with running(worker):

        async def a_full() -> bool:
            return started.count(a) == 4

        await wait_until(a_full)
        b_ids = await pgqueue.Queue(pool, name=b).enqueue_many([("t", {})] * 3)
        release.set()
        for job_id in b_ids:
            await wait_for_row(pool, job_id, status="completed")
        await wait_until(lambda: _true(started.count(a) == 8))
    # As A's jobs ended, B got the first look at the slots they freed: B's
    # jobs started before A's backlog was through, not after it.
    last_of_a = max(i for i, name in enumerate(started) if name == a)
    assert started.index(b) < last_of_a, started


# --------------------------------------------------------------------------
# Sweeps, heartbeats, drain


class Rescues(pgqueue.Observer):
    """An observer that keeps what each rescue sweep reported."""

    def __init__(self) -> None:
        self.seen: Counter[tuple[str, str]] = Counter()

    def on_rescued(self, queue: str, statuses: Mapping[str, int]) -> None:
        for status, n in statuses.items():
            self.seen[queue, status] += n


async def test_rescue_covers_every_queue(
    pool: asyncpg.Pool, names: tuple[str, str]
) -> None:
    a, b = names
    ids = {}
    for name in names:
        job_id = await pgqueue.Queue(pool, name=name).enqueue("t", {})
        await orphan(pool, job_id)
        ids[name] = job_id
    dead = await pgqueue.Queue(pool, name=b).enqueue("t", {}, max_attempts=1)
    await orphan(pool, dead)
    rescues = Rescues()
    attempts: dict[str, list[int]] = {a: [], b: []}
    worker = pgqueue.Worker(
        pool, queues={a: 1, b: 1}, rescue_after=60, observers=[rescues]
    )

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        attempts[job.queue].append(job.attempts)

    async with running(worker):
        for job_id in ids.values():
            await wait_for_row(pool, job_id, status="completed")
        await wait_for_row(pool, dead, status="dead")
    assert attempts == {a: [2], b: [2]}
    assert rescues.seen == {(a, "pending"): 1, (b, "pending"): 1, (b, "dead"): 1}


async def test_heartbeats_keep_long_jobs_of_every_queue_from_rescue(
    pool: asyncpg.Pool, names: tuple[str, str]
) -> None:
    # rescue_after 0.3 s: the sweep runs every 0.15 s and would rescue each
    # job many times over in 1.5 s if heartbeats did not keep its row fresh.
    calls: list[tuple[str, int]] = []
    worker = pgqueue.Worker(
        pool, queues=dict.fromkeys(names, 1), poll_interval=0.05, rescue_after=0.3
    )

    @worker.handler("t")
    async def long_job(job: pgqueue.Job) -> None:
        calls.append((job.queue, job.attempts))
        await anyio.sleep(1.5)  # the work itself, not synchronisation

    ids = [await pgqueue.Queue(pool, name=name).enqueue("t", {}) for name in names]
    async with running(worker):
        for job_id in ids:
            stored = await wait_for_row(pool, job_id, status="completed")
            assert stored["attempts"] == 1
    assert sorted(calls) == sorted((name, 1) for name in names)


async def test_retention_covers_every_queue(
    pool: asyncpg.Pool, names: tuple[str, str]
) -> None:
    kept = {}
    for name in names:
        old, recent = await pgqueue.Queue(pool, name=name).enqueue_many(
            [("t", {}), ("t", {})]
        )
        for job_id, age in ((old, 7200), (recent, 10)):
            await pool.execute(
                "UPDATE pgqueue_jobs SET status = 'completed',"
                " updated_at = now() - make_interval(secs => $2) WHERE id = $1",
                job_id,
                age,
            )
        kept[name] = recent
    worker = pgqueue.Worker(
        pool, queues=dict.fromkeys(names, 1), retain=3600, rescue_after=1e6
    )
    async with running(worker):

        async def pruned() -> bool:
            return [len(await rows(pool, name)) for name in names] == [1, 1]

        await wait_until(pruned)
    for name in names:
        assert [r["id"] for r in await rows(pool, name)] == [kept[name]]


async def test_stop_drains_every_queue(
    pool: asyncpg.Pool, names: tuple[str, str]
) -> None:
    a, b = names
    release = anyio.Event()
    started: list[int] = []
    worker = pgqueue.Worker(pool, queues={a: 1, b: 1}, prefetch=1)

    @worker.handler("t")
    async def hold(job: pgqueue.Job) -> None:
        started.append(job.id)
        await release.wait()

    ids = {
        name: await pgqueue.Queue(pool, name=name).enqueue_many([("t", {})] * 2)
        for name in names
    }
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(10):
            await tg.start(worker.run)

        async def both_running() -> bool:
            return len(started) == 2

        await wait_until(both_running)
        assert sorted(started) == sorted([ids[a][0], ids[b][0]])

        async def stop() -> None:
            with anyio.fail_after(10):
                await worker.stop()

        tg.start_soon(stop)
        await wait_until(lambda: _true(worker._claim_scope.cancel_called))
        release.set()
    for name in names:
        first, second = ids[name]
        assert (await row(pool, first))["status"] == "completed"
        # Prefetched, never started: given back, its attempt uncounted.
        held = await row(pool, second)
        assert (held["status"], held["attempts"]) == ("pending", 0)
    assert worker.running_jobs == 0


async def _true(value: bool) -> bool:
    return value


async def test_run_until_empty_returns_once_every_queue_is_empty(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    names = [f"{queue_name}-{i}" for i in range(3)]
    counts = {names[0]: 0, names[1]: 5, names[2]: 40}
    handled: Counter[str] = Counter()
    worker = pgqueue.Worker(pool, queues={names[0]: 1, names[1]: 1, names[2]: 4})

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        handled[job.queue] += 1
        if job.queue == names[1]:
            await anyio.sleep(0.02)  # a slower queue than the others

    for name, n in counts.items():
        if n:
            await pgqueue.Queue(pool, name=name).enqueue_many([("t", {})] * n)
    with anyio.fail_after(20):
        await worker.run(until_empty=True)
    assert handled == {name: n for name, n in counts.items() if n}
    for name in names:
        assert set(Counter(r["status"] for r in await rows(pool, name))) <= {
            "completed"
        }


async def test_a_cancel_request_reaches_a_job_of_any_queue(
    pool: asyncpg.Pool, names: tuple[str, str]
) -> None:
    a, b = names
    started = anyio.Event()
    worker = pgqueue.Worker(pool, queues={a: 1, b: 1})

    @worker.handler("hang")
    async def hang(_job: pgqueue.Job) -> None:
        started.set()
        await anyio.sleep_forever()

    job_id = await pgqueue.Queue(pool, name=b).enqueue("hang", {})
    async with running(worker):
        with anyio.fail_after(10):
            await started.wait()
        await pgqueue.Admin(pool).cancel(job_id)
        stored = await wait_for_row(pool, job_id, status="cancelled")
    assert stored["last_error"] == "cancelled by request"


# --------------------------------------------------------------------------
# Faults


async def test_listen_connection_terminated_then_wakeups_resume_for_every_queue(
    pool: asyncpg.Pool, names: tuple[str, str]
) -> None:
    a, b = names
    done: dict[str, anyio.Event] = {name: anyio.Event() for name in names}

    async def record(job: pgqueue.Job) -> None:
        done[job.queue].set()

    worker = pgqueue.Worker(pool, queues={a: 1, b: 1}, poll_interval=60)
    worker.register("t", record)
    async with running(worker):
        await idle(worker)
        # Rows no NOTIFY announced: the reconnect wakes every queue.
        silent = [await pool.fetchval(SILENT_INSERT, name, "t") for name in names]
        pid = worker.listener_pid
        assert pid is not None
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", pid)
        for job_id in silent:
            await wait_for_row(pool, job_id, within=10, status="completed")
        await wait_until(listening(worker, other_than={pid}))
        await idle(worker)
        # Then NOTIFY wakes each queue again, long before the 60 s poll.
        for name in names:
            done[name] = anyio.Event()
            await pgqueue.Queue(pool, name=name).enqueue("t", {})
            with anyio.fail_after(5):
                await done[name].wait()


# --------------------------------------------------------------------------
# The command line


def worker_args(*argv: str) -> Any:
    # A factory: a fresh worker and pool for each test's event loop.
    return build_parser().parse_args(["worker", f"{APPS}:sync_factory", *argv])


def test_queue_flag_gives_one_queue_or_several() -> None:
    args = worker_args("--queue", "solo")
    assert (args.queue, hasattr(args, "queues")) == ("solo", False)
    args = worker_args("--queue", "a=3", "--queue", "b=1", "--max-concurrency", "2")
    assert (hasattr(args, "queue"), args.queues) == (False, {"a": 3, "b": 1})
    assert args.max_concurrency == 2
    assert _target.option_values(args) == {
        "queues": {"a": 3, "b": 1},
        "max_concurrency": 2,
    }
    # Not a number after the last "=": one queue of that name.
    assert worker_args("--queue", "x=y").queue == "x=y"
    command = _processes.child_command(
        worker_args("--queue", "a=3", "--queue", "b=1"), 0
    )
    assert command[-2:] == ["--queue=a=3", "--queue=b=1"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--queue", "a=3", "--queue", "solo"],
        ["--queue", "solo", "--queue", "a=3"],
        ["--queue", "a=3", "--queue", "a=4"],
    ],
)
def test_mixing_the_queue_forms_is_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        worker_args(*argv)
    assert exited.value.code == 2
    assert "--queue" in capsys.readouterr().err


async def test_queues_flag_replaces_the_workers_queue(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGQUEUE_DSN", dsn)
    monkeypatch.chdir(ROOT)
    async with contextlib.AsyncExitStack() as stack:
        args = worker_args("--queue", "a=3", "--queue", "b=1")
        worker = await _target.open_worker(args, stack)
        assert worker.queues == {"a": 3, "b": 1}
        assert set(worker._handlers) == {"work"}
        with pytest.raises(UsageError, match="either queues"):
            await _target.open_worker(
                worker_args("--queue", "a=3", "--concurrency", "5"), stack
            )


async def test_pgqueue_worker_runs_several_queues(
    dsn: str, pool: asyncpg.Pool, names: tuple[str, str]
) -> None:
    a, b = names
    await pool.execute(RUNS)
    ids = []
    for name in names:
        ids += await pgqueue.Queue(pool, name=name).enqueue_many([("work", {})] * 3)
    result = await run_cli(
        dsn, a, f"{APPS}:worker", "--queue", f"{a}=2", "--queue", f"{b}=1", "--burst"
    )
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    assert f"worker ready (queues {a}=2, {b}=1, max_concurrency None)" in stderr
    for name in names:
        assert await statuses(pool, name) == {"completed": 3}
    ran = [job_id for job_id, _ in await runs(pool, a) + await runs(pool, b)]
    assert sorted(ran) == sorted(ids)
    mixed = await run_cli(
        dsn, a, f"{APPS}:worker", "--queue", f"{a}=2", "--concurrency", "4"
    )
    assert mixed.returncode == 2, mixed.stderr.decode()
