"""``pgqueue worker --processes N``: a parent of N worker processes.

Each child is ``python -m pgqueue worker`` with the same arguments:
subprocesses rather than multiprocessing, so that each child is exactly the
command an operator could run by hand (no pickling of the user's objects,
the same import path, the same signal handling), and a child's crash cannot
take the parent's state with it. Children run in sessions of their own, so
that a terminal's Ctrl-C reaches them once, through the parent, and not
twice; they stop gracefully when the parent dies (their stdin, a pipe from
the parent, ends).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING

import anyio

from pgqueue._extension import option_flags
from pgqueue.cli._common import EXIT_ERROR, EXIT_OK

if TYPE_CHECKING:
    import argparse

    from anyio.abc import Process

__all__ = [
    "LISTEN_DSN_VARIABLE",
    "child_command",
    "child_environment",
    "run_processes",
]

logger = logging.getLogger("pgqueue.cli")

LISTEN_DSN_VARIABLE = "PGQUEUE_LISTEN_DSN"
"""Where a child of ``--processes`` finds the parent's ``--listen=DSN``."""


def child_command(args: argparse.Namespace, index: int) -> list[str]:
    """The command line of child ``index``: the same arguments, minus --processes.

    DSNs hold passwords and a command line is public (``ps``): they go in
    the child's environment instead (`child_environment`).
    """
    command = [sys.executable, "-m", "pgqueue"]
    command += ["worker", args.target, "--supervised", "--log-level", args.log_level]
    command += ["--log-format", args.log_format]
    if args.burst:
        command.append("--burst")
    if hasattr(args, "shutdown_timeout"):
        command += [f"--shutdown-timeout={_number(args.shutdown_timeout)}"]
    if args.metrics_port is not None:
        command += ["--metrics-port", str(args.metrics_port + index)]
        command += ["--metrics-host", args.metrics_host]
    for name, flag in option_flags().items():
        if not hasattr(args, name):
            continue
        value = getattr(args, name)
        if flag.kind == "listen":
            command.append(
                "--no-listen"
                if value is False
                else "--listen"
                if value is True
                else "--listen-from-env"
            )
        elif flag.kind == "callables":
            command += [f"{flag.name}={ref}" for ref in value]
        elif isinstance(value, dict):  # --queue NAME=N, --global-limit NAME=N
            command += [f"{flag.name}={queue}={n}" for queue, n in value.items()]
        else:
            command.append(f"{flag.name}={_number(value)}")
    return command


def child_environment(args: argparse.Namespace) -> dict[str, str]:
    """The environment of every child: this one's, with ``--dsn`` and ``--listen=DSN``."""
    env = dict(os.environ)
    if getattr(args, "dsn", None):
        env["PGQUEUE_DSN"] = args.dsn
    listen = getattr(args, "listen", None)
    if isinstance(listen, str):
        env[LISTEN_DSN_VARIABLE] = listen
    return env


def _number(value: object) -> str:
    """``value`` as its flag takes it: ``none``, a whole number, or seconds with no exponent."""
    if value is None:
        return "none"
    if isinstance(value, float):
        text = repr(value)
        return format(Decimal(text), "f") if "e" in text else text
    return str(value)


@dataclass
class _Children:
    """The parent's view of its children."""

    processes: list[Process]
    burst: bool
    signalled: set[signal.Signals] = field(default_factory=set)
    codes: list[int] = field(default_factory=list)
    stopping: bool = False

    def send(self, signum: signal.Signals) -> None:
        self.signalled.add(signum)
        for process in self.processes:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signum)

    def code_of(self, returncode: int) -> int:
        if returncode >= 0:
            return returncode
        # Killed by a signal this parent sent: it came before the child
        # could catch it, that is before it took any job; a clean stop.
        signalled = {int(signum) for signum in self.signalled}
        return EXIT_OK if -returncode in signalled else EXIT_ERROR


async def run_processes(args: argparse.Namespace) -> int:
    """Run ``--processes`` children; forward signals; return the first failure's code."""
    children = _Children([], burst=args.burst)
    env = child_environment(args)
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            for index in range(args.processes):
                process = await anyio.open_process(
                    child_command(args, index),
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=None,
                    stderr=None,
                    start_new_session=True,
                )
                children.processes.append(process)
            logger.info(
                "started %d worker processes: %s",
                len(children.processes),
                ", ".join(str(p.pid) for p in children.processes),
            )

            async def forward() -> None:
                async for signum in signals:
                    logger.info(
                        "%s: passing it on to the worker processes",
                        signal.Signals(signum).name,
                    )
                    children.stopping = True
                    children.send(signum)

            async with anyio.create_task_group() as forwarding:
                forwarding.start_soon(forward)
                async with anyio.create_task_group() as waits:
                    for index, process in enumerate(children.processes):
                        waits.start_soon(_wait_child, children, index, process)
                forwarding.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                for process in children.processes:
                    if process.returncode is None:  # only when this parent failed
                        process.kill()
                    await process.aclose()
    return next((code for code in children.codes if code != EXIT_OK), EXIT_OK)


async def _wait_child(children: _Children, index: int, process: Process) -> None:
    returncode = await process.wait()
    code = children.code_of(returncode)
    children.codes.append(code)
    if children.stopping or (children.burst and code == EXIT_OK):
        return
    how = (
        f"killed by {signal.Signals(-returncode).name}"
        if returncode < 0
        else f"exit code {returncode}"
    )
    logger.error(
        "worker process %d (pid %d) ended (%s); stopping the others",
        index,
        process.pid,
        how,
    )
    children.stopping = True
    children.send(signal.SIGTERM)
