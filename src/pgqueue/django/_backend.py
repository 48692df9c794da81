"""`Backend`: tasks enqueued on Django's own connection, results read from their jobs."""

from __future__ import annotations

import contextlib
import json
import re
from contextvars import ContextVar
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Unpack

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.db import IntegrityError, ProgrammingError, connections, transaction
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import Task, TaskError
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.utils.module_loading import import_string

from pgqueue import DuplicateJobError, JobNotFoundError, SchemaError, Status
from pgqueue._extension import (
    JOB_PYFORMAT,
    TABLE_EXISTS,
    Store,
    check_request,
    encode_payload,
    store_on,
    unencodable,
)
from pgqueue.django._outcome import JOB_TYPE, read_error

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from pgqueue import EnqueueOptions

__all__ = [
    "Backend",
    "RefusedTask",
    "check_migrated",
    "job_options",
    "pgqueue_priority",
]

_options: ContextVar[dict[str, Any] | None] = ContextVar(
    "pgqueue_django_options", default=None
)


@contextlib.contextmanager
def job_options(**options: Unpack[EnqueueOptions]) -> Iterator[None]:
    """pgqueue's options for the tasks enqueued in the block, as `pgqueue.Queue.enqueue` takes them.

    A task's queue, priority and ``run_after`` are Django's (``task.using(...)``);
    everything else a job can have is given here. ``max_attempts``
    overrides the backend's ``MAX_ATTEMPTS``; ``after`` takes job ids (a
    `TaskResult`'s ``id``, as an int). Checked at each enqueue.

    Usage::

        with pgqueue.django.job_options(group=f"customer:{customer.pk}"):
            send_invoice.enqueue(invoice.pk)

    Raises:
        ValueError: ``run_at`` or ``priority``, which a task has of its own.

    .. versionadded:: 0.1
    """
    for own in ("run_at", "priority"):
        if own in options:
            msg = f"{own} is the task's: give it with task.using(run_after=..., priority=...)"
            raise ValueError(msg)
    token = _options.set(dict(options))
    try:
        yield
    finally:
        _options.reset(token)


MIGRATE = (
    'run python manage.py migrate (with "pgqueue.django" in INSTALLED_APPS: '
    "its migration creates pgqueue_jobs)"
)
"""How a Django project adds pgqueue's schema."""

JSON_VALUES = (
    "Django's tasks take and return JSON values (str, int, float, bool, None, "
    "and lists and dicts of them): pass a model's pk rather than the model, "
    "a datetime's isoformat() rather than the datetime"
)
"""What a task's arguments and return value may be, said the Django way."""


def _task_status(status: Status) -> TaskResultStatus:
    """Django's word for a job's status: a job waiting for its parents
    (enqueued after=[...] through pgqueue, not Django) is not running yet."""
    if status.ended:
        return TaskResultStatus.FAILED if status.failed else TaskResultStatus.SUCCESSFUL
    return (
        TaskResultStatus.RUNNING if status == Status.RUNNING else TaskResultStatus.READY
    )


_MAX_ID = 2**63 - 1

_TASK_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_TASK_PATH_CHARS = 255
"""The longest task path a job may name (dotted Python names)."""


class RefusedTask(InvalidTask):
    """A job names a task its backend does not run; nothing was imported.

    Another backend's task, a queue not in its ``QUEUES``, or a path that
    is not in the modules its tasks may come from (``TASK_MODULES``).
    """


def _shown(value: object) -> str:
    """A value of a job's payload in a message: its repr, cut at 100 characters."""
    text = repr(value)
    return text if len(text) <= 100 else f"{text[:100]}..."


def pgqueue_priority(priority: int) -> int:
    """Django's priority (-100 to 100) as pgqueue's (-5 to 5), higher first in both.

    Bands of 20 counted away from 0: 1 to 20 is 1, 81 to 100 is 5, -1 to
    -20 is -1, so only 0 stays 0 and the order is kept (ties aside).
    """
    band = (abs(priority) + 19) // 20
    return band if priority >= 0 else -band


class Backend(BaseTaskBackend):
    """A ``django.tasks`` backend that enqueues pgqueue jobs in Django's transaction.

    Settings::

        TASKS = {
            "default": {
                "BACKEND": "pgqueue.django.Backend",
                "QUEUES": ["default", "emails"],
                "OPTIONS": {
                    "DATABASE": "default",  # the alias holding pgqueue_jobs
                    "MAX_ATTEMPTS": 3,  # runs of a task before it fails (default 1)
                    "WORKER": {"concurrency": 8},  # pgqueue.Worker keyword arguments
                    "TASK_MODULES": ["shop"],  # default: every INSTALLED_APPS package
                },
            }
        }

    ``enqueue`` runs ``pgqueue_enqueue(...)`` on the connection of
    ``DATABASE``: inside ``transaction.atomic()`` the job, and the wakeup
    of the workers, exist only once the transaction commits. The result's
    id is the job's id.

    The worker runs a job only if it is this backend's (the payload names
    its alias, or none: a job of an older version), in one of its
    ``QUEUES``, and names a task in ``TASK_MODULES`` (modules, with the
    modules under them); it checks this before it imports anything, and
    dead-letters any other job (`RefusedTask`): a row anyone wrote cannot
    make it import a module of their choosing.
    """

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.database: str = self.options.get("DATABASE", "default")
        self.max_attempts: object = self.options.get("MAX_ATTEMPTS", 1)
        self.worker_options: dict[str, Any] = dict(self.options.get("WORKER", {}))
        self._store: Store | None = None

    @property
    def task_modules(self) -> tuple[str, ...]:
        """The modules the backend's tasks may come from, each with the modules under it.

        ``OPTIONS["TASK_MODULES"]``, else the package of every installed app
        (``INSTALLED_APPS``). One that is not a list of names allows none
        (``pgqueue.E005`` says so).
        """
        configured = self.options.get("TASK_MODULES")
        if configured is None:
            return tuple(app.name for app in apps.get_app_configs())
        if not _names(configured):
            return ()
        return tuple(configured)

    def enqueue(
        self, task: Task, args: Sequence[Any], kwargs: dict[str, Any]
    ) -> TaskResult:
        """Insert the task's job in the current transaction of ``DATABASE``.

        Raises:
            InvalidTask: the task does not suit this backend (its queue, priority...).
            TypeError: an argument is not JSON; ValueError: a bad ``MAX_ATTEMPTS``
                or `job_options`. Both before any SQL runs.
            DuplicateJobError: a duplicate key, with ``on_conflict="raise"``.
            JobNotFoundError: a parent in ``after`` that no job has (nothing
                is written; the transaction stays usable).
        """
        self.validate_task(task)
        run_after = task.run_after
        payload = {
            "task": task.module_path,
            "backend": self.alias,
            "args": list(args),
            "kwargs": dict(kwargs),
            "priority": task.priority,
            "run_after": None if run_after is None else run_after.isoformat(),
        }
        options: dict[str, Any] = dict(_options.get() or {})
        if options.get("max_attempts") is None:
            options["max_attempts"] = self.max_attempts
        request = check_request(
            JOB_TYPE,
            payload,
            default_attempts=1,  # (max_attempts is always given)
            run_at=run_after,
            priority=pgqueue_priority(task.priority),
            **options,
        )
        queue = task.queue_name
        try:
            text = encode_payload(payload)
        except TypeError as exc:
            found = unencodable({"args": payload["args"], "kwargs": payload["kwargs"]})
            if found is None or found.path is None or found.value_type is None:
                msg = f"the arguments of task {task.module_path} must be JSON: {exc}"
            else:
                msg = (
                    f"task {task.module_path}: {found.path} "
                    f"({found.value_type.__name__}) is not JSON; {JSON_VALUES}"
                )
            raise TypeError(msg) from exc
        # One transaction (or the caller's): the row is read as inserted,
        # before a worker woken by its commit can claim it.
        dependent = bool(request.after)
        try:
            # A job with parents in a savepoint: an unknown parent fails it,
            # not the caller's transaction.
            with (
                transaction.atomic(using=self.database, savepoint=dependent),
                connections[self.database].cursor() as cursor,
            ):
                if self._store is None:
                    self._store = store_on(cursor)
                plan = (self._store or Store()).plan_one(
                    queue, request, text, None, notify=True
                )
                done = plan.run(cursor, queue)
                row = _fetch(cursor, done.ids[0])
        except IntegrityError as exc:
            cause = exc.__cause__
            if not dependent or getattr(cause, "sqlstate", None) != "23503":
                raise
            detail = getattr(getattr(cause, "diag", None), "message_detail", None)
            raise JobNotFoundError(int(detail or 0)) from exc
        except ProgrammingError as exc:
            # 42883: no function of the schema; 42P01: no table pgqueue_jobs.
            if getattr(exc.__cause__, "sqlstate", None) not in ("42883", "42P01"):
                raise
            msg = f"database {self.database!r} has no pgqueue schema: {MIGRATE}"
            raise SchemaError(msg) from exc
        if done.existing is not None and request.conflict == "raise":
            raise DuplicateJobError(*done.existing)
        assert row is not None  # inserted by this transaction
        return self._result(task, row)

    def get_result(self, result_id: str) -> TaskResult:
        """The task's state from its job's row, read on ``DATABASE``'s connection.

        Raises:
            TaskResultDoesNotExist: no job of the backend's has this id.
        """
        text = str(result_id)
        if not (text.isascii() and text.isdigit() and int(text) <= _MAX_ID):
            raise TaskResultDoesNotExist(result_id)
        with connections[self.database].cursor() as cursor:
            row = _fetch(cursor, int(text))
        if row is None or row["job_type"] != JOB_TYPE:
            raise TaskResultDoesNotExist(result_id)
        payload = json.loads(row["payload"])
        if self._foreign(payload, row["queue"]) is not None:
            raise TaskResultDoesNotExist(result_id)
        return self._result(self._task(payload, row["queue"]), row)

    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        """Django's system check of the backend's settings (no query).

        ``pgqueue.E001``: ``DATABASE`` is not in ``DATABASES``; ``E002``: it
        is not PostgreSQL; ``E003``: ``pgqueue.django`` is not in
        ``INSTALLED_APPS`` (its migration makes the schema); ``E004``:
        ``QUEUES`` is empty, so no worker takes the tasks; ``E005``:
        ``TASK_MODULES`` is not a list of module names; ``E006``: another
        pgqueue backend on the same ``DATABASE`` lists one of its queues
        (each backend's worker runs only its own tasks, and dead-letters the
        other's). `check_migrated` (``manage.py check --database``) looks at
        the database itself.
        """
        found = settings.DATABASES.get(self.database)
        errors: list[checks.CheckMessage] = []
        if found is None:
            errors.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]: DATABASE {self.database!r} is not in DATABASES",
                    id="pgqueue.E001",
                )
            )
        elif "postgresql" not in found.get("ENGINE", ""):
            errors.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]: DATABASE {self.database!r} is not PostgreSQL",
                    id="pgqueue.E002",
                )
            )
        if not apps.is_installed("pgqueue.django"):
            errors.append(
                checks.Error(
                    '"pgqueue.django" is not in INSTALLED_APPS: nothing creates '
                    "pgqueue_jobs, and enqueue fails",
                    hint='add "pgqueue.django" to INSTALLED_APPS, then run '
                    "python manage.py migrate",
                    id="pgqueue.E003",
                )
            )
        if not self.queues:
            errors.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]: QUEUES is empty: no worker takes its "
                    "tasks (manage.py pgqueue_worker runs the queues it lists)",
                    hint='list the queues your tasks use, e.g. "QUEUES": ["default"]',
                    id="pgqueue.E004",
                )
            )
        modules = self.options.get("TASK_MODULES")
        if modules is not None and not _names(modules):
            errors.append(
                checks.Error(
                    f"TASKS[{self.alias!r}]: OPTIONS['TASK_MODULES'] is not a list of "
                    "module names: the worker imports no task",
                    hint='name the modules of your tasks, e.g. "TASK_MODULES": ["shop"]',
                    id="pgqueue.E005",
                )
            )
        errors.extend(self._shared_queues())
        return errors

    def _shared_queues(self) -> list[checks.CheckMessage]:
        """``pgqueue.E006`` for each backend after this one that lists one of its queues."""
        from django.tasks import task_backends

        found = []
        for other in task_backends.all():
            if (
                isinstance(other, Backend)
                and other.alias > self.alias
                and other.database == self.database
                and self.queues & other.queues
            ):
                shared = ", ".join(sorted(self.queues & other.queues))
                found.append(
                    checks.Error(
                        f"TASKS[{self.alias!r}] and TASKS[{other.alias!r}] share "
                        f"queues on database {self.database!r}: {shared}",
                        hint="give each backend queues of its own: a worker runs "
                        "only its backend's tasks, and dead-letters the other's",
                        id="pgqueue.E006",
                    )
                )
        return found

    def _foreign(self, payload: object, queue: str) -> str | None:
        """Why a job is not this backend's to run or read (another's, another queue), or None."""
        if not isinstance(payload, dict):
            return "its payload is not a task's"
        backend = payload.get("backend", self.alias)
        if backend != self.alias:
            return f"it was enqueued through TASKS[{_shown(backend)}]"
        if self.queues and queue not in self.queues:
            return (
                f"its queue {_shown(queue)} is not in TASKS[{self.alias!r}]['QUEUES']"
            )
        return None

    def _task_path(self, payload: object, queue: str) -> str:
        """The task path a job names, once checked: this backend's, in its modules.

        Raises:
            RefusedTask: it is not (nothing is imported).
        """
        why = self._foreign(payload, queue)
        if why is None:
            assert isinstance(payload, dict)
            path = payload.get("task")
            why = self._path_refused(path)
            if why is None:
                assert isinstance(path, str)
                return path
        msg = (
            f"backend {self.alias!r} does not run this job: {why}; nothing was imported"
        )
        raise RefusedTask(msg)

    def _path_refused(self, path: object) -> str | None:
        """Why ``path`` is no task this backend imports, or None."""
        if not (
            isinstance(path, str)
            and len(path) <= _TASK_PATH_CHARS
            and _TASK_PATH.fullmatch(path)
        ):
            return f"{_shown(path)} is not a task's import path"
        module = path.rpartition(".")[0]
        if any(
            module == allowed or module.startswith(f"{allowed}.")
            for allowed in self.task_modules
        ):
            return None
        return (
            f"{path!r} is not in TASKS[{self.alias!r}]['OPTIONS']['TASK_MODULES'] "
            "(by default the packages of INSTALLED_APPS)"
        )

    def _task(self, payload: dict[str, Any], queue: str) -> Task:
        """The task a job's payload names, as it was enqueued.

        Raises:
            RefusedTask: the job is not this backend's to run (`_task_path`).
            InvalidTask: its path does not import as a task.
        """
        path = self._task_path(payload, queue)
        try:
            task = import_string(path)
        except (ImportError, AttributeError, TypeError) as exc:
            msg = f"{path!r} does not import as a task"
            raise InvalidTask(msg) from exc
        if not isinstance(task, Task):
            msg = f"{path!r} is not a task"
            raise InvalidTask(msg)
        run_after = payload.get("run_after")
        return replace(
            task,
            queue_name=queue,
            priority=payload.get("priority", 0),
            run_after=None if run_after is None else datetime.fromisoformat(run_after),
            backend=self.alias,
        )

    def _result(self, task: Task, row: dict[str, Any]) -> TaskResult:
        payload = json.loads(row["payload"])
        status = Status(row["status"])
        outcome = json.loads(row["result"]) if row["result"] is not None else None
        if not isinstance(outcome, dict) or "return_value" not in outcome:
            outcome = None
        error = None if row["last_error"] is None else read_error(row["last_error"])
        # The table keeps one start, the last attempt's: in the result of a
        # completed job, in the error of a failed attempt, or updated_at
        # (the claim, then each heartbeat) while it runs.
        started: Any = None
        worker_id = None
        if status == Status.RUNNING:
            started = row["updated_at"]
        elif status == Status.COMPLETED and outcome is not None:
            started, worker_id = outcome.get("started_at"), outcome.get("worker_id")
        elif error is not None and status != Status.COMPLETED:
            started, worker_id = error.started_at, error.worker_id
        if isinstance(started, str):
            started = datetime.fromisoformat(started)
        result = TaskResult(
            task=task,
            id=str(row["id"]),
            status=_task_status(status),
            enqueued_at=row["created_at"],
            started_at=started,
            finished_at=(row["completed_at"] or row["updated_at"])
            if status.ended
            else None,
            last_attempted_at=started,
            args=payload.get("args", []),
            kwargs=payload.get("kwargs", {}),
            backend=self.alias,
            errors=[]
            if error is None
            else [
                TaskError(
                    exception_class_path=error.exception_class_path,
                    traceback=error.traceback,
                )
            ],
            # One per attempt; the table does not say which worker ran which.
            worker_ids=[worker_id or ""] * row["attempts"],
        )
        if outcome is not None:
            object.__setattr__(result, "_return_value", outcome["return_value"])
        return result


def _names(value: object) -> bool:
    """Whether ``value`` is a list (or tuple) of module names."""
    return isinstance(value, list | tuple) and all(
        isinstance(name, str) and _TASK_PATH.fullmatch(f"{name}.x") for name in value
    )


def _fetch(cursor: Any, job_id: int) -> dict[str, Any] | None:
    cursor.execute(JOB_PYFORMAT, {"id": job_id})
    found = cursor.fetchone()
    if found is None:
        return None
    return dict(zip((c[0] for c in cursor.description), found, strict=True))


@checks.register(checks.Tags.database)
def check_migrated(
    app_configs: Any = None, databases: Sequence[str] | None = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """``pgqueue.W001``: a pgqueue backend's database has no ``pgqueue_jobs`` (once a database).

    A database check: ``manage.py check --database default``, ``migrate``
    and ``manage.py pgqueue_worker`` run it; plain ``check`` does not query.
    """
    from django.tasks import task_backends

    errors: list[checks.CheckMessage] = []
    seen: set[str] = set()
    for backend in task_backends.all():
        if not isinstance(backend, Backend) or backend.database not in (
            databases or ()
        ):
            continue
        if backend.database not in settings.DATABASES or backend.database in seen:
            continue  # E001 says so; or said for a backend before, on the same database
        seen.add(backend.database)
        with connections[backend.database].cursor() as cursor:
            cursor.execute(TABLE_EXISTS)
            (exists,) = cursor.fetchone()
        if not exists:
            # A warning: migrate runs the database checks before it migrates.
            errors.append(
                checks.Warning(
                    f"database {backend.database!r} of TASKS[{backend.alias!r}] has "
                    "no pgqueue_jobs table: the pgqueue migration is not applied",
                    hint=MIGRATE,
                    id="pgqueue.W001",
                )
            )
    return errors
