"""The Django suite's setup: the example project (with the suite's settings), migrated on ``PGQUEUE_DSN``'s empty database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ROOT / "examples" / "django_project"

sys.path.insert(0, str(PROJECT))
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django_suite.settings"

import django  # noqa: E402 - after the settings module is named

django.setup()

from django.core.management import call_command  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


@pytest.fixture(scope="session", autouse=True)
def migrated() -> None:
    """Every migration applied (pgqueue's schema, the shop's table)."""
    call_command("migrate", verbosity=0)


def wait_until(check: Callable[[], Any], within: float, what: str) -> Any:
    """Poll ``check`` until it returns something true, for at most ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"not within {within} s: {what}")
        time.sleep(0.02)


class Process:
    """A command of the project's running in the background, its stderr collected."""

    def __init__(self, command: list[str]) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            command,
            cwd=PROJECT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)

    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, within: float = 30.0) -> None:
        def seen() -> bool:
            if self.process.poll() is not None and text not in self.output():
                pytest.fail(f"exited {self.process.returncode}:\n{self.output()}")
            return text in self.output()

        wait_until(seen, within, f"{text!r} in:\n{self.output()}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=30)
        self._reader.join(timeout=5)
        assert self.process.stderr is not None
        self.process.stderr.close()
        return code


@pytest.fixture
def worker() -> Iterator[Process]:
    """``manage.py pgqueue_worker`` polling once a minute: only NOTIFY wakes it in time."""
    running = Process(
        [sys.executable, "manage.py", "pgqueue_worker", "--poll-interval", "60"]
    )
    try:
        running.wait_for("worker ready")
        yield running
    finally:
        code = running.stop()
    assert code == 0, running.output()
