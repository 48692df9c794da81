"""``pgqueue worker MODULE:ATTR``: run a worker defined in your code.

A module can simply say::

    pool = asyncpg.create_pool(os.environ["PGQUEUE_DSN"])
    worker = pgqueue.Worker(pool)

(`pgqueue.cli._target` finds the worker and opens its pool). Every `Worker`
option has a flag, built from the fields of `pgqueue.WorkerOptions`
(their `pgqueue._core.options.Flag`) by `pgqueue._core.flags`, which
``manage.py pgqueue_worker`` shares; a flag given on the command line replaces
what the worker was built with (``--middleware`` and ``--observer`` are
added after the worker's own). ``--queue`` gives either option: ``--queue
NAME`` the one queue (``queue``), ``--queue NAME=N``, repeated, several
queues with their concurrency (``queues``).

With ``--processes N`` the command becomes a parent of N children
(`pgqueue.cli._processes`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskStatus

from pgqueue import SchemaError
from pgqueue._extension import Flag, JsonFormatter, add_option_flags, option_flags
from pgqueue.cli._common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_STOP_TIMEOUT,
    UsageError,
    optional_duration,
    port,
    positive_int,
    schema_message,
    text_log_handler,
)
from pgqueue.cli._processes import LISTEN_DSN_VARIABLE, run_processes
from pgqueue.cli._target import (
    WorkerFailed,
    describe,
    open_worker,
    option_values,
    resolve,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from pgqueue import Worker
    from pgqueue.cli._common import Commands

__all__ = ["OPTION_FLAGS", "add_to", "drive", "run"]

logger = logging.getLogger("pgqueue.cli")

OPTION_FLAGS: dict[str, Flag] = option_flags()
"""The flag of each `Worker` option that has one (the fields of `WorkerOptions`
with a `Flag`). Each flag's parsed value lands under the option's own name
(``--queue NAME=N`` under ``queues``)."""

DJANGO_TARGET = "pgqueue.django:worker"
"""What ``--django`` runs; imported only then, by name (Django is an extra)."""

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d]: %(message)s"

METRICS_EXTRA = "pip install 'pgqueue-asyncio[prometheus]'"

DESCRIPTION = """\
Run the worker that MODULE:ATTR defines: a pgqueue.Worker, a function (sync
or async) returning one, or an async context manager factory yielding one
(--django: the worker of Django's tasks, pgqueue.django:worker).
The current directory is importable. A Worker whose pool was made with
asyncpg.create_pool(...) and not awaited is opened here and closed on exit.
Flags given here replace the worker's own options (--middleware and
--observer add to them)."""

EPILOG = """\
durations:
  Every DURATION is 30s, 10m, 2h, 7d, 1h30m or plain seconds (2.5).

signals:
  The first SIGTERM or SIGINT stops claiming and lets the jobs in flight
  finish for up to --shutdown-timeout seconds; jobs still running then are
  cut off and go back to pending at once. A second signal cuts them off now.
  With --processes, the parent forwards both signals to every child, and when
  one child exits (without --burst) or fails, it stops the others.

metrics:
  --metrics-port PORT serves /metrics on --metrics-host (127.0.0.1 unless
  given); with --processes N, child i (from 0) serves on PORT + i. Job types
  the worker has no handler for are counted under job_type="(unknown)".

exit codes:
  0  stopped cleanly (or, with --burst, drained what was ready)
  1  error: the schema is missing, the database refused, a handler raised
     SystemExit with a non-zero code, a child process died
  2  bad usage: a bad flag, a MODULE:ATTR that does not import or is no worker
  3  the graceful stop ran out of time (or a second signal cut jobs off)"""


# --------------------------------------------------------------------------
# The parser


def add_to(commands: Commands) -> None:
    """Add ``pgqueue worker`` to the commands."""
    parser = commands.add_parser(
        "worker",
        help="run a worker defined in your code",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "target", metavar="MODULE:ATTR", nargs="?", help="the worker to run"
    )
    parser.add_argument(
        "--django",
        action="store_true",
        help=f"run the tasks of Django's TASKS['default'] (a pgqueue.django.Backend; "
        f"settings from DJANGO_SETTINGS_MODULE): MODULE:ATTR is {DJANGO_TARGET}",
    )
    options = parser.add_argument_group(
        "worker options", "each replaces the option the worker was built with"
    )
    add_option_flags(options)
    # A child of --processes: --listen=DSN, the DSN from the environment (not argv).
    options.add_argument(
        "--listen-from-env",
        dest="listen",
        action=_ListenFromEnv,
        nargs=0,
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )

    running = parser.add_argument_group("running")  # not a status
    running.add_argument(
        "--burst",
        action="store_true",
        help="drain the jobs that are ready, then exit 0",
    )
    running.add_argument(
        "--processes",
        type=positive_int,
        default=1,
        metavar="N",
        help="run N worker processes under this one (default 1)",
    )
    running.add_argument(
        "--shutdown-timeout",
        type=optional_duration,
        default=argparse.SUPPRESS,
        metavar="DURATION|none",
        help="how long the jobs in flight may finish after the first signal "
        "(default: the worker's shutdown_grace, 30 s unless set)",
    )
    running.add_argument(
        "--log-level",
        type=str.upper,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        default="INFO",
        help="log to stderr from this level (default INFO)",
    )
    running.add_argument(
        "--log-format",
        choices=["text", "json"],
        default="text",
        help="text lines, or one JSON object a line with every field (default text)",
    )
    running.add_argument(
        "--metrics-port",
        type=port,
        metavar="PORT",
        help="serve Prometheus metrics on /metrics at this port",
    )
    running.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="the address --metrics-port listens on (default 127.0.0.1, this "
        "machine only; 0.0.0.0 for every interface)",
    )
    # A child of --processes: stop gracefully when stdin (a pipe from the parent) ends.
    running.add_argument("--supervised", action="store_true", help=argparse.SUPPRESS)
    parser.set_defaults(run=run)


class _ListenFromEnv(argparse.Action):
    """``--listen-from-env``: ``--listen`` with the DSN in `LISTEN_DSN_VARIABLE`."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        namespace.listen = os.environ.get(LISTEN_DSN_VARIABLE) or True


# --------------------------------------------------------------------------
# Running one worker


async def run(args: argparse.Namespace) -> int:
    """The body of ``pgqueue worker``: one worker here, or ``--processes`` children."""
    if args.django:
        if args.target is not None:
            msg = "give MODULE:ATTR or --django, not both"
            raise UsageError(msg)
        args.target = DJANGO_TARGET
    elif args.target is None:
        msg = "the worker to run is missing: give MODULE:ATTR (or --django)"
        raise UsageError(msg)
    handler = text_log_handler(LOG_FORMAT)
    if args.log_format == "json":
        handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=args.log_level, handlers=[handler])
    if args.processes > 1:
        # Bad input fails here, once, rather than once in every child.
        resolve(args.target)
        option_values(args)
        _metrics(args)
        return await run_processes(args)
    return await run_one(args)


def _metrics(args: argparse.Namespace) -> Any:
    """``pgqueue.prometheus`` when ``--metrics-port`` is given, else None."""
    if args.metrics_port is None:
        return None
    try:
        import pgqueue.prometheus as prometheus  # only with the extra
    except ImportError as exc:
        msg = f"--metrics-port needs the prometheus extra: {METRICS_EXTRA}"
        raise UsageError(msg) from exc
    return prometheus


async def run_one(args: argparse.Namespace) -> int:
    """Run the worker in this process until it stops; return the exit code."""
    middleware: list[Any] = []
    observers: list[Any] = []
    metrics = None
    prometheus = _metrics(args)
    if prometheus is not None:
        metrics = prometheus.WorkerMetrics()
        middleware.append(metrics.middleware)
        observers.append(metrics.observer)
        host = args.metrics_host
        where = (
            f"[{host}]:{args.metrics_port}"
            if ":" in host
            else f"{host}:{args.metrics_port}"
        )
        try:
            prometheus.serve(args.metrics_port, host)
        except OSError as exc:
            print(
                f"pgqueue: cannot serve metrics on {where}: {describe(exc)}",
                file=sys.stderr,
            )
            return EXIT_ERROR
        logger.info("serving metrics on http://%s/metrics", where)
    # Signals are caught from here on: one that comes while the worker is
    # being made waits in the receiver and stops it as soon as it runs.
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with contextlib.AsyncExitStack() as stack:
            try:
                worker = await open_worker(
                    args, stack, middleware=middleware, observers=observers
                )
            except WorkerFailed as exc:
                cause = exc.__cause__ or exc
                logger.debug("%s failed", exc, exc_info=cause)
                print(f"pgqueue: {exc} failed: {describe(cause)}", file=sys.stderr)
                return EXIT_ERROR
            if metrics is not None:  # its handlers' types, labelled from the start
                metrics.job_types.update(worker.job_types)
            timeout = getattr(args, "shutdown_timeout", worker.options.shutdown_grace)
            return await drive(
                worker,
                signals,
                burst=args.burst,
                shutdown_timeout=timeout,
                supervised=args.supervised,
            )


@dataclass
class _Stopping:
    """What the signals did to a worker."""

    signals: int = 0
    timed_out: bool = False


class _Ready(TaskStatus[None]):
    """The worker's ``task_status``: logs once it is ready."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    def started(self, value: None = None) -> None:
        worker = self._worker
        # run() also calls it when done early.
        if worker.state != "running":  # not a status
            return
        options = worker.options
        if options.queues is None:
            logger.info(
                "worker ready (queue %r, concurrency %d%s)",
                options.queue,
                options.concurrency,
                ""
                if options.global_limit is None
                else f", global_limit {options.global_limit}",
            )
        else:
            logger.info(
                "worker ready (queues %s, max_concurrency %s)",
                ", ".join(f"{name}={n}" for name, n in options.queues.items()),
                options.max_concurrency,
            )


async def drive(
    worker: Worker,
    signals: AsyncIterator[signal.Signals],
    *,
    burst: bool,
    shutdown_timeout: float | None,
    supervised: bool = False,
) -> int:
    """Run ``worker`` until it stops, stopping it on signals; return the exit code."""
    stopping = _Stopping()
    code = EXIT_OK
    # Stops run in ``stops`` and end by themselves once the worker has
    # stopped (a stop that timed out must still report it); the watchers
    # are cancelled once run() returns.
    async with anyio.create_task_group() as stops:

        async def stop(bound: float | None) -> None:
            try:
                await worker.stop(bound)
            except TimeoutError as exc:
                stopping.timed_out = True
                logger.warning("%s", exc)

        def on_signal(what: str) -> None:
            stopping.signals += 1
            if stopping.signals == 1:
                bound = (
                    "as long as they take"
                    if shutdown_timeout is None
                    else f"{shutdown_timeout:g} s"
                )
                logger.info(
                    "%s: stopping; jobs in flight get %s to finish", what, bound
                )
                stops.start_soon(stop, shutdown_timeout)
            else:
                logger.warning("%s: cutting the jobs in flight off now", what)
                stops.start_soon(stop, 0)

        async def watch_signals() -> None:
            async for signum in signals:
                on_signal(signal.Signals(signum).name)

        async def watch_parent() -> None:
            await _parent_gone()
            if stopping.signals == 0:
                on_signal("parent process gone")

        async with anyio.create_task_group() as watchers:
            watchers.start_soon(watch_signals)
            if supervised:
                watchers.start_soon(watch_parent)
            try:
                await worker.run(until_empty=burst, task_status=_Ready(worker))
            except SchemaError as exc:
                print(f"pgqueue: {schema_message(exc)}", file=sys.stderr)
                code = EXIT_ERROR
            except SystemExit as exc:
                if exc.code not in (None, 0):
                    logger.error("a handler exited with %r", exc.code)
                    code = EXIT_ERROR
            except KeyboardInterrupt:
                logger.error("a handler raised KeyboardInterrupt")
                code = EXIT_ERROR
            except Exception:
                logger.exception("the worker failed")
                code = EXIT_ERROR
            finally:
                watchers.cancel_scope.cancel()
    if stopping.timed_out and code == EXIT_OK:
        return EXIT_STOP_TIMEOUT
    return code


async def _parent_gone() -> None:
    """Return once stdin, a pipe from the parent, ends."""
    fd = sys.stdin.fileno()
    while True:
        await anyio.wait_readable(fd)
        if not os.read(fd, 4096):
            return


# --------------------------------------------------------------------------
# --processes N: a parent of N children
