"""``pgqueue worker MODULE:ATTR``: run a worker defined in your code.

``ATTR`` names a `pgqueue.Worker`, a function (sync or async) returning one,
or an async context manager factory yielding one (so that it can open its own
pool and close it afterwards). A worker whose pool was made with
``asyncpg.create_pool(...)`` and never awaited is opened here and closed on
exit, so a module can simply say::

    pool = asyncpg.create_pool(os.environ["PGQUEUE_DSN"])
    worker = pgqueue.Worker(pool)

The current directory is importable, as with uvicorn and celery. Every
`Worker` option has a flag (``OPTION_FLAGS``); a flag given on the command
line replaces what the worker was built with (``--middleware`` and
``--observer`` are added after the worker's own). ``--queue`` gives either
option: ``--queue NAME`` the one queue (``queue``), ``--queue NAME=N``,
repeated, several queues with their concurrency (``queues``).

With ``--processes N`` the command becomes a parent of N children, each
``python -m pgqueue worker`` with the same arguments: subprocesses rather
than multiprocessing, so that each child is exactly the command an operator
could run by hand (no pickling of the user's objects, the same import path,
the same signal handling), and a child's crash cannot take the parent's
state with it. Children run in sessions of their own, so that a terminal's
Ctrl-C reaches them once, through the parent, and not twice; they stop
gracefully when the parent dies (their stdin, a pipe from the parent, ends).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import logging
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskStatus

from pgqueue import SchemaError, Worker
from pgqueue._extension import JsonFormatter, check_dsn, target_of
from pgqueue.cli._common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_STOP_TIMEOUT,
    UsageError,
    printable,
    text_log_handler,
)

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterable

    from anyio.abc import Process

    from pgqueue.cli._common import Commands

__all__ = ["NO_FLAG", "OPTION_FLAGS", "add_to", "open_worker", "run"]

logger = logging.getLogger("pgqueue.cli")

OPTION_FLAGS: dict[str, str] = {
    "queue": "--queue",
    "concurrency": "--concurrency",
    "queues": "--queue",  # --queue NAME=N, repeated
    "max_concurrency": "--max-concurrency",
    "global_limit": "--global-limit",  # N, or NAME=N repeated
    "prefetch": "--prefetch",
    "poll_interval": "--poll-interval",
    "listen": "--listen",
    "backoff": "--backoff",
    "rescue_after": "--rescue-after",
    "job_timeout": "--job-timeout",
    "unknown_types": "--unknown-types",
    "retain": "--retain",
    "shutdown_grace": "--shutdown-grace",
    "middleware": "--middleware",
    "logger": "--logger",
    "observers": "--observer",
}
"""The flag of each `Worker` option (the pool comes from your code). Each
flag's parsed value lands under the option's own name (``--queue NAME=N``
under ``queues``); a test checks that every option of ``Worker.__init__`` is
here."""

NO_FLAG = frozenset({"connections"})
"""`Worker` options without a flag: objects your code makes (a worker built
with ``connections=`` keeps them)."""

_ADDED = frozenset({"middleware", "observers"})
"""Options whose flags add to what the worker has instead of replacing it."""

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d]: %(message)s"

METRICS_EXTRA = "pip install 'pgqueue-asyncio[prometheus]'"

DESCRIPTION = """\
Run the worker that MODULE:ATTR defines: a pgqueue.Worker, a function (sync
or async) returning one, or an async context manager factory yielding one.
The current directory is importable. A Worker whose pool was made with
asyncpg.create_pool(...) and not awaited is opened here and closed on exit.
Flags given here replace the worker's own options (--middleware and
--observer add to them)."""

EPILOG = """\
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
    parser.add_argument("target", metavar="MODULE:ATTR", help="the worker to run")
    options = parser.add_argument_group(
        "worker options", "each replaces the option the worker was built with"
    )
    keep = argparse.SUPPRESS  # an option not given is not in the namespace

    def flag(name: str, *aliases: str, **kwargs: Any) -> None:
        options.add_argument(
            OPTION_FLAGS[name], *aliases, dest=name, default=keep, **kwargs
        )

    flag(
        "queue",
        action=_QueueAction,
        metavar="NAME|NAME=N",
        help="the queue to consume; or, repeated as NAME=N, several queues, "
        "each with its concurrency (--queue default=10 --queue emails=2)",
    )
    flag("concurrency", type=int, metavar="N", help="most handlers running at once")
    flag(
        "max_concurrency",
        type=_optional_int,
        metavar="N|none",
        help="most jobs running (or prefetched) across every queue",
    )
    flag(
        "global_limit",
        action=_GlobalLimitAction,
        metavar="N|NAME=N",
        help="most jobs of the queue running at once across every worker and "
        "process; or, repeated as NAME=N, of each queue named "
        "(--global-limit emails=3); 'none' for no limit",
    )
    flag("prefetch", type=int, metavar="N", help="jobs claimed beyond --concurrency")
    flag(
        "poll_interval",
        type=_seconds,
        metavar="SECONDS",
        help="seconds between claims when nothing wakes the worker",
    )
    flag(
        "listen",
        nargs="?",
        const=True,
        metavar="DSN",
        help="wake on NOTIFY (the default), optionally over --listen=DSN",
    )
    # A child of --processes: --listen=DSN, the DSN from the environment (not argv).
    options.add_argument(
        "--listen-from-env",
        dest="listen",
        action=_ListenFromEnv,
        nargs=0,
        default=keep,
        help=argparse.SUPPRESS,
    )
    options.add_argument(
        "--no-listen",
        dest="listen",
        action="store_const",
        const=False,
        default=keep,
        help="poll only",
    )
    flag(
        "backoff",
        metavar="MODULE:ATTR",
        help="seconds before a retry, from the attempt number",
    )
    flag(
        "rescue_after",
        type=_seconds,
        metavar="SECONDS",
        help="seconds without a heartbeat before a running job is rescued",
    )
    flag(
        "job_timeout",
        type=_optional_seconds,
        metavar="SECONDS|none",
        help="seconds a handler may run",
    )
    flag(
        "unknown_types",
        choices=["dead", "wait"],
        help="a job whose type has no handler: dead at once (the default), or "
        "left pending for a worker that has one (rolling deploys)",
    )
    flag(
        "retain",
        type=_optional_seconds,
        metavar="SECONDS|none",
        help="prune finished jobs older than this",
    )
    flag(
        "shutdown_grace",
        type=_optional_seconds,
        metavar="SECONDS|none",
        help="drain bound when run() is cancelled",
    )
    flag(
        "middleware",
        action="append",
        metavar="MODULE:ATTR",
        help="wrap every handler (repeatable; added after the worker's own)",
    )
    flag(
        "logger",
        metavar="NAME|MODULE:ATTR",
        help="a logging logger name, or a logger object",
    )
    flag(
        "observers",
        action="append",
        metavar="MODULE:ATTR",
        help="observe the worker (repeatable; added after the worker's own)",
    )

    running = parser.add_argument_group("running")
    running.add_argument(
        "--burst",
        action="store_true",
        help="drain the jobs that are ready, then exit 0",
    )
    running.add_argument(
        "--processes",
        type=_positive_int,
        default=1,
        metavar="N",
        help="run N worker processes under this one (default 1)",
    )
    running.add_argument(
        "--shutdown-timeout",
        type=_optional_seconds,
        default=keep,
        metavar="SECONDS|none",
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
        type=_port,
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


class _QueueAction(argparse.Action):
    """``--queue NAME`` (the one queue), or ``--queue NAME=N`` repeated (``queues``); not both.

    ``NAME=N`` is read as a queue and its concurrency only when N is a whole
    number; any other text is one queue's name.
    """

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        text = str(values)
        name, sep, number = text.rpartition("=")
        if sep and name and number.isdigit():
            if hasattr(namespace, "queue"):
                raise argparse.ArgumentError(self, _MIXED)
            queues: dict[str, int] = getattr(namespace, "queues", {})
            if name in queues:
                msg = f"queue {name!r} given twice"
                raise argparse.ArgumentError(self, msg)
            queues[name] = int(number)
            namespace.queues = queues
        else:
            if hasattr(namespace, "queues"):
                raise argparse.ArgumentError(self, _MIXED)
            namespace.queue = text


_MIXED = "give either one --queue NAME or several --queue NAME=N, not both"

LISTEN_DSN_VARIABLE = "PGQUEUE_LISTEN_DSN"
"""Where a child of ``--processes`` finds the parent's ``--listen=DSN``."""


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


class _GlobalLimitAction(argparse.Action):
    """``--global-limit N`` (the one queue's), ``none``, or ``--global-limit NAME=N`` repeated."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        text = str(values)
        name, sep, number = text.rpartition("=")
        given = getattr(namespace, "global_limit", {})
        if sep and name:
            if not isinstance(given, dict):
                raise argparse.ArgumentError(self, _MIXED_LIMITS)
            if name in given:
                msg = f"queue {name!r} given twice"
                raise argparse.ArgumentError(self, msg)
            given[name] = _whole(self, number)
            namespace.global_limit = given
        else:
            if hasattr(namespace, "global_limit"):
                raise argparse.ArgumentError(self, _MIXED_LIMITS)
            namespace.global_limit = (
                None if text.lower() == "none" else _whole(self, text)
            )


_MIXED_LIMITS = (
    "give either one --global-limit N or several --global-limit NAME=N, not both"
)


def _whole(action: argparse.Action, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        msg = f"not a whole number: {text!r}"
        raise argparse.ArgumentError(action, msg) from None


def _optional_int(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        msg = f"not a whole number: {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        msg = f"not a number of seconds: {text!r}"
        raise argparse.ArgumentTypeError(msg) from None


def _optional_seconds(text: str) -> float | None:
    return None if text.lower() == "none" else _seconds(text)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        msg = f"not a positive whole number: {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _port(text: str) -> int:
    value = _positive_int(text)
    if value > 65535:
        msg = f"not a port: {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return value


# --------------------------------------------------------------------------
# From MODULE:ATTR to a worker


def resolve(reference: str, what: str = "MODULE:ATTR") -> Any:
    """Import ``MODULE`` and return its attribute ``ATTR`` (dotted names allowed).

    Raises:
        UsageError: not of the form ``MODULE:ATTR``, the module does not
            import, or it has no such attribute.
    """
    module_name, sep, attr = reference.partition(":")
    if not (sep and module_name and attr):
        msg = f"{what} {reference!r} is not of the form MODULE:ATTR"
        raise UsageError(msg)
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # whatever the module raises, it does not import
        logger.debug("importing %s failed", module_name, exc_info=exc)
        msg = f"cannot import {module_name!r} (of {what} {reference}): {_describe(exc)}"
        raise UsageError(msg) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            msg = f"{module_name!r} has no attribute {attr!r} (of {what} {reference})"
            raise UsageError(msg) from None
    return obj


def _describe(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return printable(
        f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    )


def _kind(obj: object) -> str:
    return "None" if obj is None else f"a {type(obj).__name__}"


def _callable(reference: str, what: str) -> Any:
    obj = resolve(reference, what)
    if not callable(obj):
        msg = f"{what} {reference} is of type {type(obj).__name__}, not callable"
        raise UsageError(msg)
    return obj


def _logger(reference: str) -> Any:
    if ":" not in reference:
        return logging.getLogger(reference)
    obj = resolve(reference, "--logger")
    if not all(
        callable(getattr(obj, level, None))
        for level in ("debug", "info", "warning", "error")
    ):
        msg = f"--logger {reference} is of type {type(obj).__name__}, not a logger"
        raise UsageError(msg)
    return obj


def option_values(args: argparse.Namespace) -> dict[str, Any]:
    """The `Worker` options the command line gives, resolved (imports done).

    ``middleware`` and ``observers`` hold only the flags' entries; `open_worker`
    adds them to the worker's own.
    """
    values: dict[str, Any] = {}
    for name in OPTION_FLAGS:
        if not hasattr(args, name):
            continue
        value = getattr(args, name)
        if name == "backoff":
            value = _callable(value, "--backoff")
        elif name in _ADDED:
            value = [_callable(ref, OPTION_FLAGS[name]) for ref in value]
        elif name == "logger":
            value = _logger(value)
        values[name] = value
    return values


class _WorkerFailed(Exception):
    """The user's code failed while giving the worker (exit code 1)."""


async def open_worker(
    args: argparse.Namespace,
    stack: contextlib.AsyncExitStack,
    *,
    middleware: Iterable[Any] = (),
    observers: Iterable[Any] = (),
) -> Worker:
    """The worker ``args.target`` gives, with the command line's options applied.

    Whatever has to be closed (the factory's context, a pool opened here) is
    pushed on ``stack``. ``middleware`` and ``observers`` are added after the
    command line's own (metrics).

    Raises:
        UsageError: a bad reference, something that is no worker, a bad option.
        _WorkerFailed: the user's factory, or opening the pool, failed.
    """
    target = args.target
    options = option_values(args)
    obj = resolve(target)
    if not isinstance(obj, Worker):
        obj = await _produce(obj, target, stack)
    worker = obj
    extra = {
        "middleware": [*options.pop("middleware", ()), *middleware],
        "observers": [*options.pop("observers", ()), *observers],
    }
    takes = inspect.signature(Worker).parameters
    for name, added in extra.items():
        if not added:
            continue
        if name not in takes:
            msg = f"this pgqueue's Worker takes no {name} ({OPTION_FLAGS[name]})"
            raise UsageError(msg)
        options[name] = (*getattr(worker, f"_{name}"), *added)
    if options:
        try:
            worker = worker._replace(**options)
        except (TypeError, ValueError) as exc:
            msg = f"bad worker option: {exc}"
            raise UsageError(msg) from exc
    await _open_pool(worker, stack)
    return worker


async def _produce(obj: Any, target: str, stack: contextlib.AsyncExitStack) -> Worker:
    """Call the factory ``obj`` and enter what it returns, down to a `Worker`."""
    if not (callable(obj) or hasattr(obj, "__aenter__")):
        msg = f"{target} is of type {type(obj).__name__}, not a Worker or a factory of one"
        raise UsageError(msg)
    if not hasattr(obj, "__aenter__"):
        try:
            inspect.signature(obj).bind()
        except TypeError:
            msg = f"{target} must be callable without arguments"
            raise UsageError(msg) from None
        except ValueError:  # no signature to read (a builtin): try it
            pass
        try:
            obj = obj()
            if inspect.isawaitable(obj):
                obj = await obj
        except Exception as exc:
            raise _WorkerFailed(target) from exc
    if hasattr(obj, "__aenter__") and hasattr(obj, "__aexit__"):
        try:
            obj = await stack.enter_async_context(obj)
        except Exception as exc:
            raise _WorkerFailed(target) from exc
    if not isinstance(obj, Worker):
        msg = f"{target} gave {_kind(obj)}, not a Worker"
        raise UsageError(msg)
    return obj


async def _open_pool(worker: Worker, stack: contextlib.AsyncExitStack) -> None:
    """Open the worker's pool if nobody has (``asyncpg.create_pool`` not awaited)."""
    pool = worker._pool
    if getattr(pool, "_initialized", True) or getattr(pool, "_initializing", False):
        return
    dsn = next(iter(getattr(pool, "_connect_args", ())), None)
    if isinstance(dsn, str):
        try:
            check_dsn(dsn)  # asyncpg's own error would quote a part of it
        except ValueError as exc:
            msg = f"the worker's pool: {exc}"
            raise UsageError(msg) from None
    where = target_of(pool) or "its database"
    try:
        await pool
    except Exception as exc:
        msg = f"opening the worker's pool ({where})"
        raise _WorkerFailed(msg) from exc
    stack.push_async_callback(pool.close)


# --------------------------------------------------------------------------
# Running one worker


async def run(args: argparse.Namespace) -> int:
    """The body of ``pgqueue worker``: one worker here, or ``--processes`` children."""
    handler = text_log_handler(LOG_FORMAT)
    if args.log_format == "json":
        handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=args.log_level, handlers=[handler])
    if args.processes > 1:
        return await run_processes(args)
    return await run_one(args)


def _metrics(args: argparse.Namespace) -> Any:
    """``pgqueue.prometheus`` when ``--metrics-port`` is given, else None."""
    if args.metrics_port is None:
        return None
    try:
        return importlib.import_module("pgqueue.prometheus")
    except ImportError as exc:
        msg = f"--metrics-port needs the prometheus extra: {METRICS_EXTRA}"
        raise UsageError(msg) from exc


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
                f"pgqueue: cannot serve metrics on {where}: {_describe(exc)}",
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
            except _WorkerFailed as exc:
                cause = exc.__cause__ or exc
                logger.debug("%s failed", exc, exc_info=cause)
                print(f"pgqueue: {exc} failed: {_describe(cause)}", file=sys.stderr)
                return EXIT_ERROR
            if metrics is not None:  # its handlers' types, labelled from the start
                metrics.job_types.update(worker._registered)
            timeout = getattr(args, "shutdown_timeout", worker._shutdown_grace)
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
        if worker._state != "running":  # run() also calls it when done early
            return
        if worker._queues is None:
            logger.info(
                "worker ready (queue %r, concurrency %d%s)",
                worker.queue,
                worker._concurrency,
                ""
                if worker._global_limit is None
                else f", global_limit {worker._global_limit}",
            )
        else:
            logger.info(
                "worker ready (queues %s, max_concurrency %s)",
                ", ".join(f"{name}={n}" for name, n in worker.queues.items()),
                worker._max_concurrency,
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
                print(f"pgqueue: {printable(str(exc))}", file=sys.stderr)
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
    for name, flag in OPTION_FLAGS.items():
        if not hasattr(args, name):
            continue
        value = getattr(args, name)
        if name == "listen":
            command.append(
                "--no-listen"
                if value is False
                else "--listen"
                if value is True
                else "--listen-from-env"
            )
        elif name in _ADDED:
            command += [f"{flag}={ref}" for ref in value]
        elif name == "queues" or (name == "global_limit" and isinstance(value, dict)):
            command += [f"{flag}={queue}={n}" for queue, n in value.items()]
        else:
            command.append(f"{flag}={_number(value)}")
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
    return (
        "none"
        if value is None
        else repr(value)
        if isinstance(value, float)
        else str(value)
    )


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
    # Bad input fails here, once, rather than once in every child.
    resolve(args.target)
    option_values(args)
    _metrics(args)
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
