"""``pgqueue top``: one frame (text and JSON) against a seeded database, the
rates between two frames, the dashboard's statements on their indexes, and
the live dashboard in a real terminal (tmux).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import sys
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest

from pgqueue._core.text import seconds_text as duration
from pgqueue._sql.dashboard import (
    DASHBOARD_ENQUEUED_SHOWN,
    DASHBOARD_NEWEST,
    DASHBOARD_RUNNING_SHOWN,
)
from pgqueue.cli.top import Sampler
from tests.helpers import plan_nodes

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

COUNTED = ("ready", "scheduled", "running", "completed", "dead", "cancelled")

# Three queues with jobs in every state; in "alpha" a job running for two
# hours (unheard of for one) and one dead with an error of three lines.
SEED = """
INSERT INTO pgqueue_jobs (queue, job_type, status, attempts, run_at, updated_at, last_error)
SELECT q, t, s, a, now() + r, now() + u, e
FROM (VALUES
    ('alpha', 'mail',   'pending',   0, interval '-1 minute', interval '0', NULL::text, 3),
    ('alpha', 'mail',   'pending',   0, interval '1 hour',    interval '0', NULL, 2),
    ('alpha', 'report', 'running',   1, interval '-2 hours',  interval '-1 hour', NULL, 1),
    ('alpha', 'mail',   'running',   1, interval '-1 minute', interval '-5 seconds', NULL, 1),
    ('alpha', 'mail',   'completed', 1, interval '-1 hour',   interval '-30 minutes', NULL, 4),
    ('alpha', 'report', 'dead',      5, interval '-1 hour',   interval '-10 minutes',
        E'ValueError: the report is empty\nTraceback (most recent call last):\n  File "x.py"', 1),
    ('alpha', 'mail',   'cancelled', 0, interval '-1 hour',   interval '-20 minutes',
        'cancelled by request', 1),
    ('beta',  'sync',   'pending',   0, interval '-3 minutes', interval '0', NULL, 1),
    ('beta',  'sync',   'dead',      2, interval '-1 hour',   interval '-2 minutes', 'boom', 2),
    ('gamma', 'noop',   'completed', 1, interval '-1 hour',   interval '-1 minute', NULL, 5)
) AS v(q, t, s, a, r, u, e, n), generate_series(1, v.n)
"""

EXPECTED = {
    "alpha": {
        "ready": 3,
        "scheduled": 2,
        "running": 2,
        "completed": 4,
        "dead": 1,
        "cancelled": 1,
    },
    "beta": {
        "ready": 1,
        "scheduled": 0,
        "running": 0,
        "completed": 0,
        "dead": 2,
        "cancelled": 0,
    },
    "gamma": {
        "ready": 0,
        "scheduled": 0,
        "running": 0,
        "completed": 5,
        "dead": 0,
        "cancelled": 0,
    },
}

# What the database says, counted the plain way.
COUNTS = """
SELECT queue,
       count(*) FILTER (WHERE status = 'pending' AND run_at <= now()) AS ready,
       count(*) FILTER (WHERE status = 'pending' AND run_at > now()) AS scheduled,
       count(*) FILTER (WHERE status = 'running') AS running,
       count(*) FILTER (WHERE status = 'completed') AS completed,
       count(*) FILTER (WHERE status = 'dead') AS dead,
       count(*) FILTER (WHERE status = 'cancelled') AS cancelled
FROM pgqueue_jobs GROUP BY queue
"""


@pytest.fixture
async def seeded(fresh_dsn: str) -> AsyncIterator[asyncpg.Connection[Any]]:
    """A connection to a database of the test's own, seeded with `SEED`."""
    conn = await asyncpg.connect(fresh_dsn)
    try:
        await conn.execute(SEED)
        yield conn
    finally:
        await conn.close()


async def database_counts(conn: asyncpg.Connection[Any]) -> dict[str, dict[str, int]]:
    return {
        row["queue"]: {name: row[name] for name in COUNTED}
        for row in await conn.fetch(COUNTS)
    }


async def pgqueue(dsn: str, *args: str) -> tuple[int, str, str]:
    """Run ``python -m pgqueue ARGS`` on ``dsn``; its exit code, stdout, stderr."""
    env = {**os.environ, "PGQUEUE_DSN": dsn, "COLUMNS": "160", "NO_COLOR": "1"}
    with anyio.fail_after(20):
        done = await anyio.run_process(
            [sys.executable, "-m", "pgqueue", *args], env=env, check=False
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


def queue_rows(text: str) -> dict[str, list[str]]:
    """The rows of the queues table in a rendered frame, by queue name."""
    rows = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 10 and words[0] in EXPECTED:
            rows[words[0]] = words[1:]
    return rows


async def test_once_json_matches_the_database(
    fresh_dsn: str, seeded: asyncpg.Connection[Any]
) -> None:
    code, out, err = await pgqueue(fresh_dsn, "top", "--once", "--json")
    assert (code, err) == (0, "")
    frame = json.loads(out)
    assert set(frame) == {
        "at",
        "queues",
        "longest_running",
        "latest_dead",
        "more_queues",
    }
    datetime.fromisoformat(frame["at"])
    assert frame["more_queues"] == 0

    counts = await database_counts(seeded)
    assert counts == EXPECTED
    assert [q["queue"] for q in frame["queues"]] == ["alpha", "beta", "gamma"]
    for q in frame["queues"]:
        assert set(q) == {
            "queue",
            *COUNTED,
            "completed_estimated",
            "lag",
            "enqueued_per_second",
            "finished_per_second",
            "slots_in_use",
            "global_limit",
            "waiting",
            "parked",
            "paused",
        }
        assert q["waiting"] == q["parked"] == 0
        assert q["completed_estimated"] is False
        assert q["slots_in_use"] is q["global_limit"] is None
        assert {name: q[name] for name in COUNTED} == counts[q["queue"]]
        # The first frame has no previous one to measure rates from.
        assert q["enqueued_per_second"] is None
        assert q["finished_per_second"] is None
    lags = {q["queue"]: q["lag"] for q in frame["queues"]}
    assert 60 <= lags["alpha"] < 120
    assert 180 <= lags["beta"] < 240
    assert lags["gamma"] is None

    running = frame["longest_running"]
    assert [(r["queue"], r["job_type"]) for r in running] == [
        ("alpha", "report"),
        ("alpha", "mail"),
    ]
    assert 7200 <= running[0]["running_for"] < 7260
    assert 3600 <= running[0]["heard_from"] < 3660
    assert 60 <= running[1]["running_for"] < 120
    assert 5 <= running[1]["heard_from"] < 65
    stale_id = await seeded.fetchval(
        "SELECT id FROM pgqueue_jobs WHERE status = 'running' AND job_type = 'report'"
    )
    assert running[0]["id"] == stale_id

    dead = frame["latest_dead"]
    dead_ids = await seeded.fetch(
        "SELECT id FROM pgqueue_jobs WHERE status = 'dead' ORDER BY id DESC"
    )
    assert [d["id"] for d in dead] == [row["id"] for row in dead_ids]
    errors = {d["queue"]: d["error"] for d in dead}
    assert errors == {"alpha": "ValueError: the report is empty", "beta": "boom"}
    for d in dead:
        datetime.fromisoformat(d["died_at"])


async def test_once_one_queue(fresh_dsn: str, seeded: asyncpg.Connection[Any]) -> None:
    code, out, _ = await pgqueue(
        fresh_dsn, "top", "--once", "--json", "--queue", "beta"
    )
    assert code == 0
    frame = json.loads(out)
    assert [q["queue"] for q in frame["queues"]] == ["beta"]
    assert frame["longest_running"] == []
    assert [d["queue"] for d in frame["latest_dead"]] == ["beta", "beta"]


async def test_once_text(fresh_dsn: str, seeded: asyncpg.Connection[Any]) -> None:
    code, out, err = await pgqueue(fresh_dsn, "top", "--once")
    assert (code, err) == (0, "")
    counts = await database_counts(seeded)
    rows = queue_rows(out)
    assert set(rows) == set(EXPECTED)
    for name, words in rows.items():
        assert words[:6] == [str(counts[name][c]) for c in COUNTED]
        assert words[7:] == ["-", "-"]  # no rates on the first frame
    assert rows["alpha"][6].endswith("s")  # a lag of a minute and a bit
    assert rows["gamma"][6] == "-"
    assert "Longest running" in out
    assert "2h00m" in out  # the job running longest
    assert "1h00m ago" in out  # and unheard of for an hour
    assert "ValueError: the report is empty" in out
    assert "Traceback" not in out


async def test_rates_between_frames(
    fresh_dsn: str, seeded: asyncpg.Connection[Any]
) -> None:
    watcher = await asyncpg.connect(fresh_dsn)
    try:
        sampler = Sampler(watcher, queue=None)
        first = await sampler.frame()
        # Ten new jobs in alpha, three of alpha's ready ones completed (the
        # queue's live jobs grow by 7: 10 enqueued, 3 finished) and one of
        # beta's put to dead (1 finished, none enqueued).
        await seeded.execute(
            "INSERT INTO pgqueue_jobs (queue, job_type) "
            "SELECT 'alpha', 'mail' FROM generate_series(1, 10)"
        )
        await seeded.execute(
            "UPDATE pgqueue_jobs SET status = 'completed' WHERE id IN "
            "(SELECT id FROM pgqueue_jobs WHERE queue = 'alpha' AND status = 'pending'"
            " AND run_at < now() - interval '30 seconds' LIMIT 3)"
        )
        await seeded.execute(
            "UPDATE pgqueue_jobs SET status = 'dead' WHERE queue = 'beta' AND status = 'pending'"
        )
        second = await sampler.frame()
    finally:
        await watcher.close()
    elapsed = (second.at - first.at).total_seconds()
    assert elapsed > 0
    rates = {
        q.queue: (q.enqueued_per_second, q.finished_per_second) for q in second.queues
    }
    measured = {
        name: (round(enq * elapsed), round(fin * elapsed))
        for name, (enq, fin) in rates.items()
        if enq is not None and fin is not None
    }
    assert measured == {"alpha": (10, 3), "beta": (0, 1), "gamma": (0, 0)}


async def test_hide_payloads_hides_the_checkpoints(
    fresh_dsn: str, seeded: asyncpg.Connection[Any]
) -> None:
    await seeded.execute(
        'UPDATE pgqueue_jobs SET checkpoint = \'{"card": "4111-1111"}\''
        " WHERE status = 'running'"
    )
    for hidden in (False, True):
        options = ["--hide-payloads"] if hidden else []
        for shape in ([], ["--json"]):
            code, out, err = await pgqueue(fresh_dsn, "top", "--once", *shape, *options)
            assert (code, err) == (0, "")
            assert ("4111" in out) is not hidden, (hidden, shape)


async def test_a_filter_and_a_limit_choose_the_queues(
    fresh_dsn: str, seeded: asyncpg.Connection[Any]
) -> None:
    code, out, err = await pgqueue(fresh_dsn, "top", "--once", "--json", "--limit", "2")
    assert (code, err) == (0, "")
    frame = json.loads(out)
    # The most jobs to do first (alpha: 7, beta: 1, gamma: none).
    assert [q["queue"] for q in frame["queues"]] == ["alpha", "beta"]
    assert frame["more_queues"] == 1
    code, out, err = await pgqueue(fresh_dsn, "top", "--once", "--limit", "2")
    assert "and 1 more (--match TEXT or --queue NAME to see them)" in out
    code, out, err = await pgqueue(
        fresh_dsn, "top", "--once", "--json", "--match", "mm"
    )
    frame = json.loads(out)
    assert ([q["queue"] for q in frame["queues"]], frame["more_queues"]) == (
        ["gamma"],
        0,
    )
    assert frame["longest_running"] == []  # alpha's: not a queue shown
    code, out, err = await pgqueue(
        fresh_dsn, "top", "--once", "--queue", "alpha", "--match", "a"
    )
    assert (code, out) == (2, "")
    assert err == "pgqueue: give --queue or --match, not both\n"


async def test_bad_input_is_one_line_exit_2(fresh_dsn: str) -> None:
    code, out, err = await pgqueue(fresh_dsn, "top", "--once", "--interval", "0")
    assert (code, out) == (2, "")
    assert err.startswith("pgqueue: --interval must be more than 0")
    assert len(err.splitlines()) == 1

    code, out, err = await pgqueue(fresh_dsn, "top", "--once", "--queue", "")
    assert (code, out) == (2, "")
    assert err == "pgqueue: --queue: queue name must not be empty\n"

    closed = "postgresql://postgres@127.0.0.1:1/nowhere"
    code, out, err = await pgqueue(closed, "top", "--once")
    assert (code, out) == (2, "")
    assert err.startswith("pgqueue: cannot connect to postgres@127.0.0.1:1/nowhere")
    assert len(err.splitlines()) == 1


# The dashboard's own statements, on a table of mostly finished rows: each
# goes through its index (the primary key or the rescue index), never a
# scan of the table, whether planned for its values or generically.
DASHBOARD_FILL = """
INSERT INTO pgqueue_jobs (queue, job_type, status, attempts, updated_at, completed_at)
SELECT 'q' || (g % 7), 'noop', 'completed', 1, now() - interval '1 day', now() - interval '1 day'
FROM generate_series(1, 100000) AS g;
INSERT INTO pgqueue_jobs (queue, job_type, status, attempts)
SELECT 'q' || (g % 7), 'noop', 'running', 1 FROM generate_series(1, 20) AS g;
ANALYZE pgqueue_jobs;
"""


async def test_dashboard_statements_use_indexes(fresh_dsn: str) -> None:
    conn = await asyncpg.connect(fresh_dsn)
    try:
        await conn.execute(DASHBOARD_FILL)
        newest = await conn.fetchval("SELECT max(id) FROM pgqueue_jobs")
        cases = [
            (DASHBOARD_NEWEST, (), "pgqueue_jobs_pkey"),
            (
                DASHBOARD_ENQUEUED_SHOWN,
                (newest - 50, newest, ["q1", "q2"]),
                "pgqueue_jobs_pkey",
            ),
            *(
                (
                    DASHBOARD_RUNNING_SHOWN,
                    (*where, 5, True),
                    "idx_pgqueue_jobs_rescue",
                )
                for where in ((None, None), (["q1"], None), (None, "1"))
            ),
        ]
        for mode in ("force_custom_plan", "force_generic_plan"):
            await conn.execute(f"SET plan_cache_mode = {mode}")
            for statement, args, index in cases:
                explained = await conn.fetchval(
                    f"EXPLAIN (FORMAT JSON) {statement}", *args
                )
                nodes = plan_nodes(json.loads(explained)[0]["Plan"])
                scans = [
                    (node["Node Type"], node.get("Index Name"))
                    for node in nodes
                    if node.get("Relation Name") == "pgqueue_jobs"
                ]
                where = (mode, statement, scans)
                assert scans, where
                assert all(name == index for _, name in scans), where
                assert not any("Seq" in kind for kind, _ in scans), where
    finally:
        await conn.close()


TMUX = shutil.which("tmux")


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (apt-get install tmux)")
async def test_live_in_a_terminal(
    fresh_dsn: str, seeded: asyncpg.Connection[Any], tmp_path: Any
) -> None:
    assert TMUX is not None
    server = f"pgqueue-top-{uuid.uuid4().hex[:12]}"  # a tmux server of its own
    exit_file = tmp_path / "exit-code"
    command = (
        f"env PGQUEUE_DSN={shlex.quote(fresh_dsn)} "
        f"{shlex.quote(sys.executable)} -m pgqueue top --interval 0.5; "
        f"echo $? > {shlex.quote(str(exit_file))}"
    )

    async def tmux(*args: str) -> str:
        done = await anyio.run_process([TMUX, "-L", server, "-f", "/dev/null", *args])
        return done.stdout.decode()

    async def pane_until(wanted: Any) -> str:
        """The pane's text once ``wanted(rows)`` holds for its queue rows."""
        text = ""
        try:
            with anyio.fail_after(10):
                while True:
                    text = await tmux("capture-pane", "-p", "-t", "top")
                    if wanted(queue_rows(text)):
                        return text
                    await anyio.sleep(0.1)
        except TimeoutError:
            pytest.fail(f"the pane never showed what was expected:\n{text}")

    try:
        await tmux("new-session", "-d", "-s", "top", "-x", "160", "-y", "50", command)
        counts = await database_counts(seeded)
        expected = {name: [str(counts[name][c]) for c in COUNTED] for name in counts}
        text = await pane_until(
            lambda rows: {name: words[:6] for name, words in rows.items()} == expected
        )
        assert "Ctrl-C quits" in text
        assert "ValueError: the report is empty" in text

        # Seven more jobs in beta: the count and the enqueue rate follow.
        await seeded.execute(
            "INSERT INTO pgqueue_jobs (queue, job_type) "
            "SELECT 'beta', 'sync' FROM generate_series(1, 7)"
        )
        beta = [str(counts["beta"]["ready"] + 7), *expected["beta"][1:]]
        text = await pane_until(
            lambda rows: (
                "beta" in rows
                and rows["beta"][:6] == beta
                and rows["beta"][7] not in {"-", "0.0"}
            )
        )
        assert queue_rows(text)["alpha"][:6] == expected["alpha"]

        await tmux("send-keys", "-t", "top", "C-c")
        with anyio.fail_after(10):
            while not exit_file.exists() or not exit_file.read_text():
                await anyio.sleep(0.05)
        assert exit_file.read_text().strip() == "0"
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.run_process([TMUX, "-L", server, "kill-server"], check=False)


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "-"),
        (0.04, "0.0s"),
        (9.94, "9.9s"),
        (59.9, "59s"),
        (185, "3m05s"),
        (2 * 3600 + 3 * 60 + 59, "2h03m"),
        (3 * 86400 + 4 * 3600, "3d04h"),
    ],
)
def test_duration(seconds: float | None, shown: str) -> None:
    assert duration(seconds) == shown


async def test_live_json_survives_a_lost_connection(
    fresh_dsn: str, seeded: asyncpg.Connection[Any]
) -> None:
    """Without a terminal, one JSON frame a line; a lost connection is
    reported on stderr and replaced; SIGINT ends it with exit code 0."""
    env = {**os.environ, "PGQUEUE_DSN": fresh_dsn}
    command = [sys.executable, "-m", "pgqueue", "top", "--json", "--interval", "0.2"]
    async with await anyio.open_process(command, env=env) as process:
        assert process.stdout is not None
        assert process.stderr is not None
        lines = TextLines(process.stdout)
        try:
            with anyio.fail_after(15):
                first = json.loads(await lines.next())
                assert first["queues"][0]["enqueued_per_second"] is None
                second = json.loads(await lines.next())
                assert second["queues"][0]["enqueued_per_second"] == 0

                # The server ends the dashboard's session.
                terminated = await seeded.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                assert terminated == 1
                await seeded.execute(
                    "INSERT INTO pgqueue_jobs (queue, job_type) "
                    "SELECT 'gamma', 'noop' FROM generate_series(1, 4)"
                )
                # Frames go on, on a new session, with the rates carried over.
                while True:
                    frame = json.loads(await lines.next())
                    gamma = {q["queue"]: q for q in frame["queues"]}["gamma"]
                    if gamma["ready"] == 4:
                        break
                assert gamma["enqueued_per_second"] > 0
                process.send_signal(signal.SIGINT)
                assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
        errors = (await process.stderr.receive()).decode()
        assert errors.startswith("pgqueue: top: database postgres@")
        assert " unreachable (" in errors
        assert "Traceback" not in errors


class TextLines:
    """Lines of a byte stream, one at a time."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._buffer = b""

    async def next(self) -> str:
        while b"\n" not in self._buffer:
            self._buffer += await self._stream.receive()
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()


async def test_once_text_counts_waiting_jobs_while_there_are_any(
    fresh_dsn: str, seeded: asyncpg.Connection[Any]
) -> None:
    await seeded.execute(
        "INSERT INTO pgqueue_jobs (queue, job_type, status)"
        " VALUES ('alpha', 'step', 'waiting'), ('alpha', 'step', 'waiting')"
    )
    code, out, err = await pgqueue(fresh_dsn, "top", "--once")
    assert (code, err) == (0, "")
    [header] = [
        line for line in out.splitlines() if line.split()[:2] == ["queue", "waiting"]
    ]
    assert header.split()[2] == "ready"
    counts = await database_counts(seeded)
    rows = {
        words[0]: words[1:]
        for words in map(str.split, out.splitlines())
        if len(words) == 11 and words[0] in EXPECTED
    }
    assert set(rows) == set(EXPECTED)
    assert [rows[name][0] for name in ("alpha", "beta", "gamma")] == ["2", "0", "0"]
    for name, words in rows.items():
        assert words[1:7] == [str(counts[name][c]) for c in COUNTED]
