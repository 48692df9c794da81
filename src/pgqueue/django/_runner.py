"""The worker side: a `pgqueue.Worker` that runs the tasks a `Backend` enqueued."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shlex
import signal
import socket
from dataclasses import dataclass
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import anyio
import anyio.abc
import asyncpg
from asgiref.sync import sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections
from django.tasks import TaskContext, TaskResult, TaskResultStatus, task_backends
from django.utils import timezone
from django.utils.json import normalize_json

import pgqueue
from pgqueue._extension import target
from pgqueue.django._backend import JSON_VALUES, Backend, RefusedTask
from pgqueue.django._outcome import JOB_TYPE, TaskFailed

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable, Iterable

__all__ = ["JobContext", "database_dsn", "run_worker", "worker"]

logger = logging.getLogger("pgqueue.django")


@dataclass(frozen=True, slots=True, kw_only=True)
class JobContext(TaskContext):
    """The context a task that takes one gets from pgqueue's worker: Django's, and the run's `pgqueue.Job`.

    Through ``job``, a task is a durable handler: ``await
    context.job.step(...)``, ``sleep``, ``wait_for``, ``spawn``,
    ``wait_child``, ``progress`` (from a plain ``def`` task, through
    ``anyio.from_thread.run``). See :doc:`/howto/durable-handlers`.

    .. versionadded:: 0.1
    """

    job: pgqueue.Job


# The connection settings of Django's OPTIONS that asyncpg reads from a DSN
# (any other query parameter is sent to the server as a setting, as
# "options" and "application_name" are on purpose).
_DSN_OPTIONS = (
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslcrl",
    "passfile",
    "target_session_attrs",
)


def database_dsn(alias: str = "default") -> str:
    """The DSN of ``settings.DATABASES[alias]``, for asyncpg (it holds the password)."""
    from django.conf import settings

    try:
        database = settings.DATABASES[alias]
    except KeyError:
        msg = f"DATABASES has no {alias!r}"
        raise ImproperlyConfigured(msg) from None
    user = quote(str(database.get("USER") or ""), safe="")
    password = quote(str(database.get("PASSWORD") or ""), safe="")
    host = str(database.get("HOST") or "")
    port = str(database.get("PORT") or "")
    options = database.get("OPTIONS", {})
    query = {k: str(v) for k, v in options.items() if k in _DSN_OPTIONS}
    query.update(_server_settings(alias, options))
    if host.startswith("/"):  # a socket directory
        query["host"] = host
        host = ""
    elif ":" in host:
        host = f"[{host}]"
    credentials = f"{user}:{password}@" if password else f"{user}@" if user else ""
    where = f"{host}:{port}" if port else host
    name = quote(str(database.get("NAME") or ""), safe="")
    dsn = f"postgresql://{credentials}{where}/{name}"
    return f"{dsn}?{urlencode(query)}" if query else dsn


def _server_settings(alias: str, options: dict[str, Any]) -> dict[str, str]:
    """The server settings of ``OPTIONS``: ``options`` (libpq's ``-c name=value``) and ``application_name``.

    The worker's asyncpg connections start with them, as Django's psycopg
    connection does.

    Raises:
        ImproperlyConfigured: ``options`` holds what is not a setting
            (``-c name=value`` or ``--name=value``), or ``assume_role``
            is set (the worker would run as ``USER``, not the role).
    """
    where = f"DATABASES[{alias!r}]['OPTIONS']"
    if "assume_role" in options:
        msg = (
            f"{where}['assume_role'] is not forwarded to pgqueue's worker "
            "(asyncpg cannot SET ROLE on connect): give the database a USER of "
            "that role for the worker"
        )
        raise ImproperlyConfigured(msg)
    found: dict[str, str] = {}
    if "application_name" in options:
        found["application_name"] = str(options["application_name"])
    words = shlex.split(str(options.get("options", "")))
    while words:
        word = words.pop(0)
        if word == "-c" and words:
            word = words.pop(0)
        elif word.startswith(("-c", "--")):
            word = word[2:]
        else:
            msg = f"{where}['options']: {word!r} is not -c name=value"
            raise ImproperlyConfigured(msg)
        name, equals, value = word.partition("=")
        if not (equals and name):
            msg = f"{where}['options']: {word!r} is not name=value"
            raise ImproperlyConfigured(msg)
        found[name.replace("-", "_")] = value
    return found


def _backend(alias: str) -> Backend:
    import django
    from django.apps import apps
    from django.conf import settings

    if not apps.ready:
        if not (settings.configured or os.environ.get("DJANGO_SETTINGS_MODULE")):
            msg = (
                "set DJANGO_SETTINGS_MODULE to the project's settings (mysite.settings)"
            )
            raise ImproperlyConfigured(msg)
        django.setup()
    backend = task_backends[alias]
    if not isinstance(backend, Backend):
        msg = f"TASKS[{alias!r}] is a {type(backend).__name__}, not pgqueue.django.Backend"
        raise ImproperlyConfigured(msg)
    return backend


@contextlib.asynccontextmanager
async def worker(
    backend: str = "default",
    *,
    queue_names: Iterable[str] | None = None,
    **options: Any,
) -> AsyncIterator[pgqueue.Worker]:
    """Open a pool on the backend's database and yield a worker of its tasks.

    Sets Django up first when it is not (``DJANGO_SETTINGS_MODULE``). The
    worker takes the queues ``queue_names`` gives, else the backend's
    ``QUEUES``; ``options`` (`pgqueue.Worker`'s keyword arguments) replace
    those of ``OPTIONS["WORKER"]``. This is what ``pgqueue worker --django``
    runs (its flags then replace the worker's options) and
    ``manage.py pgqueue_worker`` too. The pool is closed on exit.

    Raises:
        ImproperlyConfigured: the backend is not a pgqueue one, names no
            queue, or its ``QUEUES`` do not list a queue asked for.
    """
    chosen = _backend(backend)
    names = sorted(chosen.queues if queue_names is None else set(queue_names))
    if not names:
        msg = f"TASKS[{backend!r}] lists no QUEUES: give the worker its queues"
        raise ImproperlyConfigured(msg)
    kwargs = {**chosen.worker_options, **options}
    if "queue" not in kwargs and "queues" not in kwargs:
        if len(names) == 1:
            kwargs["queue"] = names[0]
        else:
            kwargs["queues"] = dict.fromkeys(names, kwargs.pop("concurrency", 2))
    taken = [kwargs["queue"]] if "queue" in kwargs else list(kwargs["queues"])
    others = sorted(set(taken) - chosen.queues)
    if others:
        msg = (
            f"TASKS[{backend!r}] does not list the queues {', '.join(others)} in "
            "QUEUES: its worker runs only the backend's own queues"
        )
        raise ImproperlyConfigured(msg)
    dsn = database_dsn(chosen.database)
    async with asyncpg.create_pool(dsn, min_size=1, max_size=2) as pool:
        made = pgqueue.Worker(pool, **kwargs)
        made.register(JOB_TYPE, _runner(backend))
        logger.info(
            "running the tasks of backend %s from %s, queues %s",
            backend,
            target(dsn),
            ", ".join(names),
        )
        yield made


def run_worker(
    backend: str = "default",
    *,
    queue_names: Iterable[str] | None = None,
    burst: bool = False,
    shutdown_timeout: float | None = 30.0,
    **options: Any,
) -> None:
    """Run `worker` until SIGINT or SIGTERM (or, with ``burst``, the queues are drained).

    A signal stops claiming and gives the tasks in flight ``shutdown_timeout``
    seconds to finish (None: as long as they take).
    """

    async def main() -> None:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with (
                worker(backend, queue_names=queue_names, **options) as running,
                anyio.create_task_group() as tg,
            ):

                async def work(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                    await running.run(until_empty=burst, task_status=task_status)
                    tg.cancel_scope.cancel()

                await tg.start(work)
                logger.info("worker ready: listening for tasks")
                async for received in signals:
                    logger.info("stopping on %s", signal.Signals(received).name)
                    with anyio.CancelScope(shield=True):
                        await running.stop(shutdown_timeout)
                    return

    anyio.run(main)


def _runner(alias: str) -> Callable[[pgqueue.Job], Any]:
    """The handler of `JOB_TYPE`: run the task the payload names, store its outcome."""
    worker_id = f"{socket.gethostname()}:{os.getpid()}"

    async def run_task(job: pgqueue.Job) -> dict[str, Any]:
        started = timezone.now()
        try:
            value = await _call(alias, job, started, worker_id)
        except RefusedTask as exc:
            # Not this backend's job (another's, or a path outside its task
            # modules): dead at once, with nothing imported; retrying cannot help.
            raise pgqueue.Permanent(str(exc)) from None
        except Exception as exc:
            raise TaskFailed(exc, started_at=started, worker_id=worker_id) from exc
        return {
            "return_value": value,
            "started_at": started.isoformat(),
            "worker_id": worker_id,
        }

    return run_task


async def _call(alias: str, job: pgqueue.Job, started: Any, worker_id: str) -> Any:
    payload = job.payload
    backend = _backend(alias)
    task = backend._task(payload, job.queue)
    args = list(payload.get("args", []))
    kwargs = dict(payload.get("kwargs", {}))
    if task.takes_context:
        result = TaskResult(
            task=task,
            id=str(job.id),
            status=TaskResultStatus.RUNNING,
            enqueued_at=job.created_at,
            started_at=started,
            finished_at=None,
            last_attempted_at=started,
            args=args,
            kwargs=kwargs,
            backend=alias,
            errors=[],
            worker_ids=[worker_id] * job.attempts,
        )
        args.insert(0, JobContext(task_result=result, job=job))
    if iscoroutinefunction(task.func):
        value = await _in_loop(task.func, args, kwargs)
    else:
        value = await anyio.to_thread.run_sync(
            functools.partial(_in_thread, task.func, args, kwargs)
        )
    try:
        return normalize_json(value)
    except (TypeError, ValueError) as exc:
        msg = (
            f"task {task.module_path} returned what is not JSON ({exc}); {JSON_VALUES}"
        )
        raise TypeError(msg) from exc


def _in_thread(
    func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
) -> Any:
    # As around a request: drop connections past CONN_MAX_AGE or broken.
    close_old_connections()
    try:
        return func(*args, **kwargs)
    finally:
        close_old_connections()


async def _in_loop(
    func: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
) -> Any:
    # The async ORM runs in asgiref's thread; its connections are closed there.
    close = sync_to_async(close_old_connections)
    await close()
    try:
        return await func(*args, **kwargs)
    finally:
        with anyio.CancelScope(shield=True):
            await close()
