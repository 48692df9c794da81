"""Hostile text in jobs, run through the real command line as subprocesses.

A producer controls a job's queue, type, payload, unique key and (through
its handler) its error. None of it may be read as rich markup, and none of
the characters a terminal acts on (C0 controls but tab, DEL, C1 controls)
may reach a human-readable output raw: they are shown escaped (``\\x1b``,
``\\n``). ``--json`` keeps every value exact.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

ROOT = Path(__file__).resolve().parent.parent

# What a terminal acts on instead of showing: C0 but tab, DEL, C1.
CONTROLS = frozenset(
    [chr(c) for c in range(0x20) if c != 0x09] + [chr(c) for c in range(0x7F, 0xA0)]
)

MARKUP_ERROR = "ValueError: invalid literal for int() with base 10: '[/]'"
LINK = "[link=https://evil.example]click[/link]"
CLEAR = "\x1b[2J"
TITLE = "\x1b]0;pwned\x07"
CLIPBOARD = "\x1b]52;c;ZXZpbA==\x07"
C1_CSI = "\x9b31m"
DEL = "\x7f"

HOSTILE_ERROR = f"{TITLE}{CLIPBOARD}boom{C1_CSI}{DEL}"
HOSTILE_QUEUE = f"q{CLEAR}"
HOSTILE_TYPE = f"t{TITLE}"
HOSTILE_PAYLOAD = {f"k{CLEAR}": f"v{C1_CSI}{DEL}\nforged line", "link": LINK}


def raw_controls(text: str) -> set[str]:
    """The control characters in ``text`` other than the line feeds between lines."""
    return {char for char in text if char in CONTROLS and char != "\n"}


def escaped(text: str) -> str:
    """``text`` as the command line shows it."""
    out = []
    for char in text:
        if char == "\n":
            out.append("\\n")
        elif char in CONTROLS:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return "".join(out)


def environment(dsn: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    return {**env, "PGQUEUE_DSN": dsn, "COLUMNS": "250", "NO_COLOR": "1", **extra}


async def pgqueue(dsn: str, *args: str, **env: str) -> tuple[int, str, str]:
    """Run ``python -m pgqueue ARGS``; its exit code, stdout and stderr."""
    with anyio.fail_after(30):
        done = await anyio.run_process(
            [sys.executable, "-m", "pgqueue", *args],
            env=environment(dsn, **env),
            cwd=ROOT,
            check=False,
        )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


@pytest.fixture
async def hostile(fresh_dsn: str) -> AsyncIterator[dict[str, int]]:
    """Jobs with hostile fields in a database of the test's own; their ids by role."""
    conn = await asyncpg.connect(fresh_dsn)
    try:
        insert = (
            "INSERT INTO pgqueue_jobs (queue, job_type, status, attempts, payload,"
            " last_error, unique_key) VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7)"
            " RETURNING id"
        )
        ids = {
            "markup": await conn.fetchval(
                insert, "q[/]", LINK, "dead", 5, "{}", MARKUP_ERROR, None
            ),
            "controls": await conn.fetchval(
                insert,
                HOSTILE_QUEUE,
                HOSTILE_TYPE,
                "dead",
                5,
                json.dumps(HOSTILE_PAYLOAD),
                HOSTILE_ERROR,
                f"key{CLEAR}",
            ),
            "completed": await conn.fetchval(
                insert, "q", "mail", "completed", 2, "{}", "an earlier failure", None
            ),
        }
        await conn.execute(
            "UPDATE pgqueue_jobs SET result = $2::jsonb WHERE id = $1",
            ids["controls"],
            json.dumps({"r": f"{TITLE}{DEL}"}),
        )
        await conn.execute(
            "INSERT INTO pgqueue_periodic (name, schedule, queue, job_type)"
            " VALUES ($1, '@every 60s', $2, $3)",
            f"nightly{CLEAR}[/]",
            HOSTILE_QUEUE,
            HOSTILE_TYPE,
        )
        yield ids
    finally:
        await conn.close()


def assert_shown_as_text(out: str, *values: str) -> None:
    assert not raw_controls(out), (raw_controls(out), out)
    for value in values:
        assert escaped(value) in out, (escaped(value), out)


async def test_jobs_list_shows_markup_and_controls_as_text(
    fresh_dsn: str, hostile: dict[str, int]
) -> None:
    code, out, err = await pgqueue(fresh_dsn, "jobs", "list")
    assert code == 0, err
    assert_shown_as_text(out, "q[/]", LINK, HOSTILE_QUEUE, HOSTILE_TYPE)
    assert "'[/]'" in out


async def test_a_completed_job_does_not_show_an_earlier_attempts_error(
    fresh_dsn: str, hostile: dict[str, int]
) -> None:
    code, out, err = await pgqueue(fresh_dsn, "jobs", "list", "--status", "completed")
    assert code == 0, err
    assert "mail" in out
    assert "an earlier failure" not in out
    code, out, err = await pgqueue(fresh_dsn, "jobs", "show", str(hostile["completed"]))
    assert code == 0, err
    (line,) = [line for line in out.splitlines() if "an earlier failure" in line]
    assert line.startswith("earlier attempt's error"), line
    assert "last_error" not in out
    # The JSON keeps the column as it is.
    code, out, err = await pgqueue(
        fresh_dsn, "jobs", "show", str(hostile["completed"]), "--json"
    )
    assert json.loads(out)["last_error"] == "an earlier failure"


async def test_jobs_show_escapes_every_field(
    fresh_dsn: str, hostile: dict[str, int]
) -> None:
    code, out, err = await pgqueue(fresh_dsn, "jobs", "show", str(hostile["controls"]))
    assert code == 0, err
    assert_shown_as_text(out, HOSTILE_QUEUE, HOSTILE_TYPE, HOSTILE_ERROR, LINK)
    assert escaped(f"key{CLEAR}") in out
    assert "forged line" in out
    assert not any(line.startswith("forged line") for line in out.splitlines())
    code, out, err = await pgqueue(fresh_dsn, "jobs", "show", str(hostile["markup"]))
    assert code == 0, err
    assert_shown_as_text(out, LINK, MARKUP_ERROR)


async def test_json_stays_exact_and_safe(
    fresh_dsn: str, hostile: dict[str, int]
) -> None:
    code, out, err = await pgqueue(fresh_dsn, "jobs", "list", "--json")
    assert code == 0, err
    assert not raw_controls(out)
    found = {job["id"]: job for job in json.loads(out)}
    job = found[hostile["controls"]]
    assert (job["queue"], job["job_type"], job["last_error"]) == (
        HOSTILE_QUEUE,
        HOSTILE_TYPE,
        HOSTILE_ERROR,
    )
    code, out, err = await pgqueue(
        fresh_dsn, "jobs", "show", str(hostile["controls"]), "--json"
    )
    assert code == 0, err
    assert not raw_controls(out)
    job = json.loads(out)
    assert job["payload"] == HOSTILE_PAYLOAD
    assert job["result"] == {"r": f"{TITLE}{DEL}"}
    assert job["unique_key"] == f"key{CLEAR}"


async def test_stats_periodic_and_top_once(
    fresh_dsn: str, hostile: dict[str, int]
) -> None:
    code, out, err = await pgqueue(fresh_dsn, "stats")
    assert code == 0, err
    assert_shown_as_text(out, "q[/]", HOSTILE_QUEUE)
    code, out, err = await pgqueue(fresh_dsn, "periodic", "list")
    assert code == 0, err
    assert_shown_as_text(out, f"nightly{CLEAR}[/]", HOSTILE_QUEUE, HOSTILE_TYPE)
    code, out, err = await pgqueue(fresh_dsn, "top", "--once", COLUMNS="400")
    assert code == 0, err
    assert_shown_as_text(out, "q[/]", HOSTILE_QUEUE, HOSTILE_TYPE, LINK, MARKUP_ERROR)


async def test_rich_markup_never_becomes_a_link_on_a_terminal(
    fresh_dsn: str, hostile: dict[str, int]
) -> None:
    """Forced onto a terminal, rich would write OSC 8 links: none may come from a job."""
    for args in (("jobs", "list"), ("top", "--once")):
        code, out, err = await pgqueue(
            fresh_dsn, *args, FORCE_COLOR="1", TERM="xterm-256color", COLUMNS="400"
        )
        assert code == 0, err
        assert "\x1b]8;" not in out
        assert "evil.example" in out
        for sequence in (CLEAR, TITLE, CLIPBOARD, "\x9b", DEL):
            assert sequence not in out


async def test_listen_prints_one_escaped_line_per_notification(
    fresh_dsn: str,
) -> None:
    payload = f"a\nforged line{CLEAR}{C1_CSI}"
    for as_json in (False, True):
        args = [sys.executable, "-m", "pgqueue", "listen", "chan", "--count", "1"]
        async with await anyio.open_process(
            [*args, "--json"] if as_json else args,
            env=environment(fresh_dsn),
            cwd=ROOT,
        ) as process:
            assert process.stderr is not None
            assert process.stdout is not None
            stderr = BufferedByteReceiveStream(process.stderr)
            with anyio.fail_after(20):
                await stderr.receive_until(b"\n", 4096)  # "listening on chan"
                conn = await asyncpg.connect(fresh_dsn)
                try:
                    await conn.execute("SELECT pg_notify('chan', $1)", payload)
                finally:
                    await conn.close()
                out = b""
                async for chunk in process.stdout:
                    out += chunk
                assert await process.wait() == 0
        text = out.decode()
        assert not raw_controls(text)
        if as_json:
            assert json.loads(text)["payload"] == payload
        else:
            assert text == f"chan\t{escaped(payload)}\n"


async def test_worker_text_logs_escape_the_message_and_the_traceback(
    fresh_dsn: str,
) -> None:
    text = f"hello{CLEAR}\nFAKE ERROR pgqueue: forged"
    conn = await asyncpg.connect(fresh_dsn)
    try:
        await conn.execute(
            "INSERT INTO pgqueue_jobs (queue, job_type, payload)"
            " VALUES ('default', 'echo', $1::jsonb)",
            json.dumps({"text": text, "error": HOSTILE_ERROR}),
        )
    finally:
        await conn.close()
    code, _, err = await pgqueue(
        fresh_dsn, "worker", "tests.cli_apps.hostile:worker", "--burst"
    )
    assert code == 0, err
    assert not raw_controls(err), (raw_controls(err), err)
    assert f"payload text: {escaped(text)}" in err
    assert escaped(HOSTILE_ERROR) in err  # in the traceback of the dead job
    assert not any(line.startswith("FAKE ERROR") for line in err.splitlines())


TMUX = shutil.which("tmux")


@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (apt-get install tmux)")
async def test_top_in_a_terminal_shows_hostile_jobs_as_text(
    fresh_dsn: str, hostile: dict[str, int], tmp_path: Any
) -> None:
    assert TMUX is not None
    server = f"pgqueue-hostile-{uuid.uuid4().hex[:12]}"
    exit_file = tmp_path / "exit-code"
    command = (
        f"env PGQUEUE_DSN={shlex.quote(fresh_dsn)} "
        f"{shlex.quote(sys.executable)} -m pgqueue top --interval 0.5; "
        f"echo $? > {shlex.quote(str(exit_file))}"
    )

    async def tmux(*args: str) -> str:
        done = await anyio.run_process([TMUX, "-L", server, "-f", "/dev/null", *args])
        return done.stdout.decode()

    try:
        await tmux("new-session", "-d", "-s", "top", "-x", "250", "-y", "50", command)
        await tmux("set-option", "-t", "top", "-g", "allow-rename", "on")
        text = ""
        with anyio.fail_after(15):
            while escaped(TITLE) not in text or "q[/]" not in text:
                await anyio.sleep(0.1)
                text = await tmux("capture-pane", "-p", "-t", "top")
        assert escaped(CLEAR) in text
        title = await tmux("display-message", "-p", "-t", "top", "#{pane_title}")
        assert "pwned" not in title
        await tmux("send-keys", "-t", "top", "C-c")
        with anyio.fail_after(10):
            while not exit_file.exists() or not exit_file.read_text():
                await anyio.sleep(0.05)
        assert exit_file.read_text().strip() == "0"
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.run_process([TMUX, "-L", server, "kill-server"], check=False)
