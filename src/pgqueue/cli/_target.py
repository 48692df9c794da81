"""``MODULE:ATTR`` to a worker: a `Worker`, a factory of one, and its pool opened.

``ATTR`` names a `pgqueue.Worker`, a function (sync or async) returning one,
or an async context manager factory yielding one (so that it can open its own
pool and close it afterwards). A worker whose pool was made with
``asyncpg.create_pool(...)`` and never awaited is opened here and closed on
exit. The current directory is importable, as with uvicorn and celery.
"""

from __future__ import annotations

import inspect
import logging
import socket
from typing import TYPE_CHECKING, Any

import asyncpg

from pgqueue import Worker
from pgqueue import _extension as flags
from pgqueue._extension import FlagError, check_dsn, target_of
from pgqueue.cli._common import CONNECT_ERRORS, UsageError, first_line, printable

if TYPE_CHECKING:
    import argparse
    import contextlib
    from collections.abc import Iterable

__all__ = ["WorkerFailed", "describe", "open_worker", "option_values", "resolve"]

logger = logging.getLogger("pgqueue.cli")


def resolve(reference: str, what: str = "MODULE:ATTR") -> Any:
    """Import ``MODULE`` and return its attribute ``ATTR`` (dotted names allowed).

    Raises:
        UsageError: not of the form ``MODULE:ATTR``, the module does not
            import, or it has no such attribute.
    """
    try:
        return flags.resolve(reference, what)
    except FlagError as exc:
        raise UsageError(str(exc)) from exc.__cause__


def describe(exc: BaseException) -> str:
    """``exc`` on one printable line: its type and its message's first line."""
    lines = str(exc).strip().splitlines()
    return printable(
        f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    )


def _kind(obj: object) -> str:
    return "None" if obj is None else f"a {type(obj).__name__}"


def option_values(args: argparse.Namespace) -> dict[str, Any]:
    """The `Worker` options the command line gives, resolved (imports done).

    ``middleware`` and ``observers`` hold only the flags' entries; `open_worker`
    adds them to the worker's own.

    Raises:
        UsageError: a ``MODULE:ATTR`` that does not import or is of the
            wrong kind.
    """
    try:
        return flags.option_values(args)
    except FlagError as exc:
        raise UsageError(str(exc)) from exc.__cause__


class WorkerFailed(Exception):
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
        WorkerFailed: the user's factory, or opening the pool, failed.
    """
    target = args.target
    options = option_values(args)
    obj = resolve(target)
    if not isinstance(obj, Worker):
        obj = await _produce(obj, target, stack)
    worker = obj
    # The flags' entries and the caller's are added to the worker's own.
    added = {"middleware": middleware, "observers": observers}
    for name, more in added.items():
        given = [*options.pop(name, ()), *more]
        if given:
            options[name] = (*getattr(worker.options, name), *given)
    if options:
        try:
            worker = worker.with_options(**options)
        except (TypeError, ValueError) as exc:
            msg = f"bad worker option: {exc}"
            raise UsageError(msg) from exc
    await _open_pool(worker, target, stack)
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
        except _REFUSED as exc:
            raise _factory_cannot_connect(exc, target) from exc
        except Exception as exc:
            raise WorkerFailed(target) from exc
    if hasattr(obj, "__aenter__") and hasattr(obj, "__aexit__"):
        try:
            obj = await stack.enter_async_context(obj)
        except _REFUSED as exc:
            raise _factory_cannot_connect(exc, target) from exc
        except Exception as exc:
            raise WorkerFailed(target) from exc
    elif hasattr(obj, "__enter__") and hasattr(obj, "__exit__"):
        msg = (
            f"{target} gave a synchronous context manager ({type(obj).__name__}): "
            "a worker's factory runs in the event loop; use "
            "contextlib.asynccontextmanager (and async with for its pool)"
        )
        raise UsageError(msg)
    if not isinstance(obj, Worker):
        msg = f"{target} gave {_kind(obj)}, not a Worker"
        raise UsageError(msg)
    return obj


_REFUSED = (
    ConnectionError,
    TimeoutError,
    socket.gaierror,
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidCatalogNameError,
    asyncpg.CannotConnectNowError,
)
"""What a factory raises when its pool cannot connect (a refused port, a
wrong password or database, a server starting up): the user's DSN, not the
user's code."""


def _factory_cannot_connect(exc: BaseException, target: str) -> UsageError:
    """`UsageError` (exit 2) for a factory whose pool did not connect.

    The DSN is the factory's own, which pgqueue never sees: the reason names
    what the driver reached.
    """
    return UsageError(f"cannot connect (from the factory {target}): {first_line(exc)}")


async def _open_pool(
    worker: Worker, target: str, stack: contextlib.AsyncExitStack
) -> None:
    """Open the worker's pool if nobody has (``asyncpg.create_pool`` not awaited)."""
    pool = worker.pool
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
    except CONNECT_ERRORS as exc:
        # Like every command's DSN that does not connect: exit 2.
        msg = (
            f"cannot connect to {where} (from the pool of {target}): {first_line(exc)}"
        )
        raise UsageError(msg) from None
    except Exception as exc:
        msg = f"opening the worker's pool ({where})"
        raise WorkerFailed(msg) from exc
    stack.push_async_callback(pool.close)
