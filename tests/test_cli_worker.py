"""``pgqueue worker MODULE:ATTR``, run as a real subprocess against the real server.

The workers live in ``tests/cli_apps/apps.py``; their handler records each
run in ``cli_runs`` (queue, job id, pid), which is what the tests wait on,
together with lines on the command's stderr and its exit. Each test has a
queue of its own in this run's database.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

import pgqueue
from pgqueue._core.options import FLAG, NO_FLAG
from pgqueue.cli import _processes, _target, build_parser
from pgqueue.cli import worker as cli_worker
from pgqueue.cli._common import UsageError
from tests.cli_apps import RUNS
from tests.helpers import wait_until

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import asyncpg
    from anyio.abc import Process

ROOT = Path(__file__).resolve().parent.parent
APPS = "tests.cli_apps.apps"


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "pgqueue", "worker", *args]


def environment(dsn: str, queue: str) -> dict[str, str]:
    return {**os.environ, "PGQUEUE_DSN": dsn, "CLI_QUEUE": queue}


async def run_cli(
    dsn: str, queue: str, *args: str, within: float = 20.0
) -> subprocess.CompletedProcess[bytes]:
    """Run ``pgqueue worker ARGS`` to its end (from the project's root)."""
    with anyio.fail_after(within):
        return await anyio.run_process(
            command(*args), env=environment(dsn, queue), cwd=ROOT, check=False
        )


class Child:
    """A running ``pgqueue worker``, its stderr read line by line as it comes."""

    def __init__(self, process: Process) -> None:
        self.process = process
        self.lines: list[str] = []
        self.closed = anyio.Event()
        """Set once every writer of stderr (children included) has gone."""
        self._changed = anyio.Event()

    async def read(self) -> None:
        assert self.process.stderr is not None
        stream = BufferedByteReceiveStream(self.process.stderr)
        with contextlib.suppress(anyio.EndOfStream, anyio.IncompleteRead):
            while True:
                line = await stream.receive_until(b"\n", 65536)
                self.lines.append(line.decode())
                self._changed.set()
        self.closed.set()
        self._changed.set()

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    async def wait_for(
        self,
        pattern: str,
        count: int = 1,
        within: float = 15.0,
        *,
        after_exit: bool = False,
    ) -> list[str]:
        """Wait until ``count`` lines match ``pattern``; return them."""
        with anyio.fail_after(within):
            while True:
                found = [line for line in self.lines if re.search(pattern, line)]
                if len(found) >= count:
                    return found
                if self.process.returncode is not None and not after_exit:
                    pytest.fail(f"exited with {self.process.returncode}:\n{self.text}")
                self._changed = anyio.Event()
                with anyio.move_on_after(0.1):  # also notice an exit
                    await self._changed.wait()

    async def exit_code(self, within: float = 15.0) -> int:
        with anyio.fail_after(within):
            return await self.process.wait()


@contextlib.asynccontextmanager
async def started(dsn: str, queue: str, *args: str) -> AsyncIterator[Child]:
    """Start ``pgqueue worker ARGS``; kill it if the test leaves early."""
    process = await anyio.open_process(
        command(*args),
        env=environment(dsn, queue),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    child = Child(process)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(child.read)
            yield child
            with anyio.fail_after(15):
                await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
        with anyio.CancelScope(shield=True):
            await process.aclose()


async def enqueue(pool: asyncpg.Pool, queue: str, n: int, **payload: Any) -> list[int]:
    await pool.execute(RUNS)
    return await pgqueue.Queue(pool, name=queue).enqueue_many([("work", payload)] * n)


async def statuses(pool: asyncpg.Pool, queue: str) -> Counter[str]:
    records = await pool.fetch(
        "SELECT status FROM pgqueue_jobs WHERE queue = $1", queue
    )
    return Counter(r["status"] for r in records)


async def runs(pool: asyncpg.Pool, queue: str) -> list[tuple[int, int]]:
    """(job id, pid) of every handler run of the queue."""
    records = await pool.fetch(
        "SELECT job_id, pid FROM cli_runs WHERE queue = $1", queue
    )
    return [(r["job_id"], r["pid"]) for r in records]


def started_runs(pool: asyncpg.Pool, queue: str, n: int = 1) -> Any:
    async def check() -> bool:
        return len(await runs(pool, queue)) >= n

    return check


# --------------------------------------------------------------------------
# Flags, in-process


def worker_parser() -> Any:
    parser = build_parser()
    [commands] = [
        a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
    ]
    return commands.choices["worker"]


def test_every_worker_option_has_a_flag_or_a_reason() -> None:
    parser = worker_parser()
    by_flag = {
        flag: action for action in parser._actions for flag in action.option_strings
    }
    for field in dataclasses.fields(pgqueue.WorkerOptions):
        if NO_FLAG in field.metadata:
            assert field.metadata[NO_FLAG], f"say why {field.name!r} has no flag"
            continue
        assert FLAG in field.metadata, f"option {field.name!r}: a flag or a reason"
        flag = field.metadata[FLAG]
        assert flag.name in by_flag, f"{flag.name} is not a flag of pgqueue worker"
        assert field.name in cli_worker.OPTION_FLAGS
        # --queue NAME=N gives queues (see test_queue_flag_gives_one_queue_or_several).
        expected = "queue" if field.name == "queues" else field.name
        assert by_flag[flag.name].dest == expected
        assert flag.help, field.name


SAMPLES = {
    "queue": ["--queue", "q2"],
    "concurrency": ["--concurrency", "7"],
    "queues": [],  # the other form of --queue, refused with --queue NAME; see below
    "max_concurrency": ["--max-concurrency", "6"],
    "global_limit": ["--global-limit", "4"],
    "group_limit": ["--group-limit", "2"],
    "rate_limit": ["--rate-limit", "100/60s"],
    "prefetch": ["--prefetch", "3"],
    "poll_interval": ["--poll-interval", "0.25"],
    "listen": ["--no-listen"],
    "backoff": ["--backoff", f"{APPS}:backoff"],
    "rescue_after": ["--rescue-after", "60"],
    "job_timeout": ["--job-timeout", "none"],
    "block_warning": ["--block-warning", "none"],
    "unknown_types": ["--unknown-types", "dead"],
    "retain": ["--retain", "3600"],
    "shutdown_grace": ["--shutdown-grace", "5"],
    "middleware": ["--middleware", f"{APPS}:tag", "--middleware", f"{APPS}:tag"],
    "logger": ["--logger", "my.app"],
    "observers": [],  # none to hand here; the flag is checked above
    "connections": [],  # no flag: made in your code (its NO_FLAG reason)
}


async def test_flags_replace_the_workers_options_and_keep_its_handlers(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PGQUEUE_DSN", dsn)
    monkeypatch.chdir(ROOT)
    names = [field.name for field in dataclasses.fields(pgqueue.WorkerOptions)]
    assert set(names) <= set(SAMPLES), "add a sample for the new option"
    argv = ["worker", f"{APPS}:sync_factory", "--job-timeout", "9"]
    argv += [arg for name in names for arg in SAMPLES[name]]
    args = build_parser().parse_args(argv)
    async with contextlib.AsyncExitStack() as stack:
        worker = await _target.open_worker(args, stack)
        options = worker.options
        assert options.queue == "q2"
        assert options.concurrency == 7
        assert options.max_concurrency == 6
        assert options.global_limit == 4
        assert worker._lanes[0].settings.global_limit == 4
        assert worker._lanes[0].settings.group_limit == 2
        assert options.rate_limit == pgqueue.RateLimit(100, per=60.0)
        assert options.prefetch == 3
        assert options.poll_interval == 0.25
        assert options.listen is False
        assert options.backoff is sys.modules[APPS].backoff
        assert options.rescue_after == 60.0
        assert options.job_timeout is None  # the last flag wins, "none" included
        assert options.block_warning is None
        assert options.unknown_types == "dead"
        assert options.retain == 3600.0
        assert options.shutdown_grace == 5.0
        assert options.middleware == (sys.modules[APPS].tag,) * 2
        assert options.logger.name == "my.app"  # type: ignore[union-attr]
        assert worker.job_types == ("work",)
        assert worker.pool._initialized  # type: ignore[attr-defined]  # opened here


@pytest.mark.parametrize(
    ("flag", "one", "value", "form"),
    [
        ("--global-limit", "4", 4, "N"),
        ("--group-limit", "1", 1, "N"),
        (
            "--rate-limit",
            "5/1s:per-group",
            pgqueue.RateLimit(5, per=1.0, per_group=True),
            "N/DURATION",
        ),
    ],
)
def test_per_queue_flags_take_one_value_or_one_per_queue_never_both(
    flag: str, one: str, value: object, form: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = build_parser()
    dest = flag[2:].replace("-", "_")
    base = ["worker", f"{APPS}:sync_factory"]
    assert getattr(parser.parse_args([*base, flag, one]), dest) == value
    assert getattr(parser.parse_args([*base, flag, "none"]), dest) is None
    both = parser.parse_args([*base, flag, f"a={one}", flag, f"b={one}"])
    assert getattr(both, dest) == {"a": value, "b": value}
    for argv, error in (
        (
            [flag, one, flag, f"a={one}"],
            f"give either one {flag} {form} or several {flag} NAME={form}, not both",
        ),
        (
            [flag, f"a={one}", flag, one],
            f"give either one {flag} {form} or several {flag} NAME={form}, not both",
        ),
        ([flag, f"a={one}", flag, f"a={one}"], "queue 'a' given twice"),
    ):
        with pytest.raises(SystemExit):
            parser.parse_args([*base, *argv])
        assert error in capsys.readouterr().err


def test_metrics_without_the_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pgqueue.prometheus", None)  # an import fails
    args = build_parser().parse_args(["worker", "m:a", "--metrics-port", "9191"])
    with pytest.raises(
        UsageError, match=r"pip install 'pgqueue-asyncio\[prometheus\]'"
    ):
        cli_worker._metrics(args)


# --------------------------------------------------------------------------
# The forms of MODULE:ATTR


@pytest.mark.parametrize(
    "attr", ["worker", "sync_factory", "async_factory", "lifespan"]
)
async def test_each_form_runs_jobs_in_a_burst(
    dsn: str, pool: asyncpg.Pool, queue_name: str, attr: str
) -> None:
    ids = await enqueue(pool, queue_name, 5)
    result = await run_cli(dsn, queue_name, f"{APPS}:{attr}", "--burst")
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    assert await statuses(pool, queue_name) == {"completed": 5}
    assert sorted(job_id for job_id, _ in await runs(pool, queue_name)) == ids
    assert "worker ready" in stderr
    if attr == "lifespan":
        assert stderr.splitlines()[-1] == "lifespan closed", stderr


BAD = {
    "no colon": ([APPS], "is not of the form MODULE:ATTR"),
    "no module": (
        ["tests.cli_apps.nosuch:worker"],
        "cannot import 'tests.cli_apps.nosuch'",
    ),
    "import fails": (
        ["tests.cli_apps.broken:worker"],
        "RuntimeError: this module is broken",
    ),
    "no attribute": ([f"{APPS}:nosuch"], "has no attribute 'nosuch'"),
    "not a worker": ([f"{APPS}:not_a_worker"], "is of type int, not a Worker"),
    "needs arguments": ([f"{APPS}:needs_args"], "must be callable without arguments"),
    "gives no worker": ([f"{APPS}:gives_nothing"], "gave None, not a Worker"),
    "bad backoff": ([f"{APPS}:worker", "--backoff", f"{APPS}:nosuch"], "--backoff"),
    "backoff not callable": (
        [f"{APPS}:worker", "--backoff", f"{APPS}:not_a_worker"],
        "not callable",
    ),
    "bad option value": ([f"{APPS}:worker", "--concurrency", "0"], "concurrency"),
    "bad flag": ([f"{APPS}:worker", "--concurrency", "many"], "invalid int value"),
    "bad duration": (
        [f"{APPS}:worker", "--retain", "7x"],
        "argument --retain: not a duration: '7x' (use e.g. 30s, 10m, 2h, 7d, 1h30m",
    ),
    "units out of order": (
        [f"{APPS}:worker", "--shutdown-timeout", "30m1h"],
        "not a duration: '30m1h'",
    ),
    "bad in the parent": ([f"{APPS}:nosuch", "--processes", "2"], "has no attribute"),
    "pool cannot connect": (
        [f"{APPS}:unreachable"],
        "cannot connect to postgres@127.0.0.1:1/nowhere (from the pool of tests.cli_apps.apps:unreachable): ",
    ),
    "factory cannot connect": (
        [f"{APPS}:refused"],
        "cannot connect (from the factory tests.cli_apps.apps:refused): ",
    ),
    "sync context manager": (
        [f"{APPS}:sync_context"],
        "use contextlib.asynccontextmanager",
    ),
}


async def test_bad_targets_exit_2_with_one_line(dsn: str, queue_name: str) -> None:
    results: dict[str, subprocess.CompletedProcess[bytes]] = {}

    async def one(case: str, args: list[str]) -> None:
        results[case] = await run_cli(dsn, queue_name, *args)

    async with anyio.create_task_group() as tg:
        for case, (args, _) in BAD.items():
            tg.start_soon(one, case, args)
    for case, (_, fragment) in BAD.items():
        result = results[case]
        stderr = result.stderr.decode()
        assert result.returncode == 2, (case, stderr)
        assert len(stderr.splitlines()) == 1, (case, stderr)
        assert stderr.startswith("pgqueue: "), (case, stderr)
        assert fragment in stderr, (case, stderr)


async def test_every_duration_flag_takes_units(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    await enqueue(pool, queue_name, 2)
    args = ["--retain", "7d", "--poll-interval", "1h30m", "--rescue-after", "10m"]
    args += [
        "--job-timeout",
        "30s",
        "--shutdown-grace",
        "2m",
        "--shutdown-timeout",
        "1m",
    ]
    result = await run_cli(dsn, queue_name, f"{APPS}:worker", "--burst", *args)
    assert result.returncode == 0, result.stderr.decode()
    assert await statuses(pool, queue_name) == {"completed": 2}
    parsed = build_parser().parse_args(["worker", f"{APPS}:worker", *args])
    assert (parsed.retain, parsed.poll_interval, parsed.rescue_after) == (
        7 * 86400,
        5400,
        600,
    )
    assert (parsed.job_timeout, parsed.shutdown_grace, parsed.shutdown_timeout) == (
        30,
        120,
        60,
    )


async def test_the_concurrency_flag_overrides_the_workers_own(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    # ``single`` has concurrency 1; the three jobs finish only once all three
    # have started, which needs --concurrency 3.
    await enqueue(pool, queue_name, 3, together=3)
    result = await run_cli(
        dsn, queue_name, f"{APPS}:single", "--burst", "--concurrency", "3"
    )
    assert result.returncode == 0, result.stderr.decode()
    assert "concurrency 3" in result.stderr.decode()
    assert await statuses(pool, queue_name) == {"completed": 3}


async def test_a_handler_exiting_non_zero_exits_1(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    await enqueue(pool, queue_name, 1, exit=4)
    result = await run_cli(dsn, queue_name, f"{APPS}:worker", "--burst")
    assert result.returncode == 1, result.stderr.decode()
    assert "a handler exited with 4" in result.stderr.decode()
    assert await statuses(pool, queue_name) == {"pending": 1}


# --------------------------------------------------------------------------
# Signals


async def test_sigterm_lets_the_job_in_flight_finish(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    [job_id] = await enqueue(pool, queue_name, 1, sleep=1.0)
    async with started(dsn, queue_name, f"{APPS}:worker") as child:
        await wait_until(started_runs(pool, queue_name))
        child.process.send_signal(signal.SIGTERM)
        await child.wait_for("SIGTERM: stopping; jobs in flight get 30 s")
        assert await child.exit_code() == 0, child.text
    assert await statuses(pool, queue_name) == {"completed": 1}
    assert await runs(pool, queue_name) == [(job_id, child.process.pid)]


async def test_a_stop_that_times_out_exits_3_with_the_job_pending(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    await enqueue(pool, queue_name, 1, hang=True)
    args = (f"{APPS}:worker", "--shutdown-timeout", "0.5")
    async with started(dsn, queue_name, *args) as child:
        await wait_until(started_runs(pool, queue_name))
        child.process.send_signal(signal.SIGTERM)
        assert await child.exit_code(within=10) == 3, child.text
    assert "1 job(s) returned to pending" in child.text
    assert await statuses(pool, queue_name) == {"pending": 1}


async def test_a_second_signal_cuts_the_jobs_off_at_once(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    await enqueue(pool, queue_name, 1, hang=True)
    args = (f"{APPS}:worker", "--shutdown-timeout", "60")
    async with started(dsn, queue_name, *args) as child:
        await wait_until(started_runs(pool, queue_name))
        child.process.send_signal(signal.SIGTERM)
        await child.wait_for("SIGTERM: stopping; jobs in flight get 60 s")
        child.process.send_signal(signal.SIGINT)
        assert await child.exit_code(within=5) == 3, child.text
    assert "SIGINT: cutting the jobs in flight off now" in child.text
    [row] = await pool.fetch(
        "SELECT status, attempts, last_error FROM pgqueue_jobs WHERE queue = $1",
        queue_name,
    )
    assert (row["status"], row["attempts"]) == ("pending", 1)
    assert row["last_error"]


# --------------------------------------------------------------------------
# --processes


async def test_two_processes_drain_a_burst_running_every_job_once(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    # Each handler waits until both processes have run a job: both must take part.
    ids = await enqueue(pool, queue_name, 200, pids=2)
    args = (f"{APPS}:worker", "--processes", "2", "--burst", "--concurrency", "4")
    result = await run_cli(dsn, queue_name, *args, within=30)
    assert result.returncode == 0, result.stderr.decode()
    done = await runs(pool, queue_name)
    assert sorted(job_id for job_id, _ in done) == ids  # every job, once
    assert len({pid for _, pid in done}) == 2
    assert await statuses(pool, queue_name) == {"completed": 200}


READY = r"\[(\d+)\]: worker ready"


async def test_sigterm_to_the_parent_stops_both_children(
    dsn: str, queue_name: str
) -> None:
    async with started(dsn, queue_name, f"{APPS}:worker", "--processes", "2") as child:
        await child.wait_for(READY, count=2)
        child.process.send_signal(signal.SIGTERM)
        assert await child.exit_code() == 0, child.text
    assert len(re.findall(r"worker stopped", child.text)) == 2, child.text


async def test_a_child_killed_makes_the_parent_stop_the_other_and_fail(
    dsn: str, queue_name: str
) -> None:
    async with started(dsn, queue_name, f"{APPS}:worker", "--processes", "2") as child:
        lines = await child.wait_for(READY, count=2)
        victim, other = (int(m[1]) for line in lines if (m := re.search(READY, line)))
        os.kill(victim, signal.SIGKILL)
        assert await child.exit_code() == 1, child.text
    assert "ended (killed by SIGKILL); stopping the others" in child.text
    assert re.search(rf"\[{other}\]: worker stopped", child.text), child.text
    with pytest.raises(ProcessLookupError):
        os.kill(other, 0)  # ended and reaped by the parent


async def test_children_stop_by_themselves_when_the_parent_dies(
    dsn: str, queue_name: str
) -> None:
    async with started(dsn, queue_name, f"{APPS}:worker", "--processes", "2") as child:
        await child.wait_for(READY, count=2)
        child.process.kill()
        await child.wait_for("parent process gone: stopping", count=2, after_exit=True)
        await child.wait_for("worker stopped", count=2, after_exit=True)
        with anyio.fail_after(10):
            await child.closed.wait()  # both children have exited


def test_children_get_the_same_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = [
        "--dsn", "postgresql://h/db", "worker", f"{APPS}:worker", "--processes", "3",
        "--burst", "--shutdown-timeout", "none", "--log-level", "debug",
        "--log-format", "json",
        "--metrics-port", "9100", "--listen=postgresql://direct/db",
        "--concurrency", "7", "--poll-interval", "0.1", "--job-timeout", "none",
        "--retain", "7d", "--rescue-after", "0.00001", "--shutdown-grace", "1h30m",
        "--unknown-types", "wait",
        "--middleware", f"{APPS}:tag", "--middleware", f"{APPS}:tag",
        "--observer", f"{APPS}:tag", "--logger", "my.app", "--queue", "q:1",
    ]  # fmt: skip
    parent = build_parser().parse_args(argv)
    command = _processes.child_command(parent, 2)
    assert command[:3] == [sys.executable, "-m", "pgqueue"]
    # The DSNs go in the environment, never on the (public) command line.
    assert not [arg for arg in command if "postgresql:" in arg], command
    env = _processes.child_environment(parent)
    assert env["PGQUEUE_DSN"] == "postgresql://h/db"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    child = build_parser().parse_args(command[3:])
    expected = {
        **vars(parent),
        "dsn": None,  # from PGQUEUE_DSN
        "processes": 1,
        "supervised": True,
        "metrics_port": 9102,
    }
    assert vars(child) == expected
    for listen, flag in [(True, "--listen"), (False, "--no-listen")]:
        parent = build_parser().parse_args(["worker", "m:a", flag])
        assert (
            build_parser().parse_args(_processes.child_command(parent, 0)[3:]).listen
            is listen
        )


def free_port_pair() -> int:
    """A port P such that P and P + 1 are free (as far as one can tell)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port: int = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    pytest.fail("no two free ports in a row")


FINISHED = re.compile(
    r"^pgqueue_jobs_finished_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$", re.M
)


async def test_each_child_serves_metrics_on_its_own_port(
    dsn: str, pool: asyncpg.Pool, queue_name: str
) -> None:
    await enqueue(pool, queue_name, 10)
    port = free_port_pair()
    args = (f"{APPS}:worker", "--processes", "2", "--metrics-port", str(port))
    async with started(dsn, queue_name, *args) as child, httpx.AsyncClient() as http:
        await child.wait_for(READY, count=2)

        async def completed() -> float:
            total = 0.0
            for where in (port, port + 1):
                response = await http.get(f"http://127.0.0.1:{where}/metrics")
                assert response.status_code == 200
                for match in FINISHED.finditer(response.text):
                    labels = match["labels"]
                    if (
                        f'queue="{queue_name}"' in labels
                        and 'outcome="completed"' in labels
                    ):
                        total += float(match["value"])
            return total

        async def all_counted() -> bool:
            return await completed() == 10

        await wait_until(all_counted)
        child.process.send_signal(signal.SIGTERM)
        assert await child.exit_code() == 0, child.text
    assert await statuses(pool, queue_name) == {"completed": 10}
