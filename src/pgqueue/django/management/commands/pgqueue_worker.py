"""``python manage.py pgqueue_worker``: run the tasks of a ``pgqueue.django.Backend``."""

from __future__ import annotations

import logging
import sys
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.tasks import task_backends

from pgqueue import SchemaError
from pgqueue.django._backend import MIGRATE
from pgqueue.django._runner import run_worker


class Command(BaseCommand):
    """Run a pgqueue worker of the tasks until SIGINT or SIGTERM."""

    help = (
        "Run the tasks of a pgqueue.django.Backend until SIGINT or SIGTERM. "
        "`pgqueue worker --django` runs the same worker with every option of pgqueue's."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        """The backend, its queues, and the worker options most often set."""
        parser.add_argument(
            "--backend", default="default", help="the alias in TASKS (default: default)"
        )
        parser.add_argument(
            "--queue",
            action="append",
            dest="queue_names",
            metavar="NAME",
            help="a queue to take tasks from, repeated (default: the backend's QUEUES)",
        )
        parser.add_argument(
            "--concurrency", type=int, help="tasks run at once (per queue)"
        )
        parser.add_argument(
            "--poll-interval",
            type=float,
            metavar="SECONDS",
            help="look for due tasks this often besides the wakeups",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="run the tasks that are ready, then exit",
        )
        parser.add_argument(
            "--shutdown-timeout",
            type=float,
            default=30.0,
            metavar="SECONDS",
            help="how long the tasks in flight may finish after a signal (default 30)",
        )

    def handle(self, *args: Any, **given: Any) -> None:
        """Run the worker until a signal, or drained with --burst."""
        options = {
            name: given[name]
            for name in ("concurrency", "poll_interval")
            if given[name] is not None
        }
        log_unless_configured()
        backend = task_backends[given["backend"]]
        database = getattr(backend, "database", None)
        if database is not None:
            # The database's own checks too (the pgqueue migration applied).
            self.check(databases=[database])
        try:
            run_worker(
                given["backend"],
                queue_names=given["queue_names"],
                burst=given["burst"],
                shutdown_timeout=given["shutdown_timeout"],
                **options,
            )
        except* SchemaError as failed:  # out of the worker's task groups
            error = failed.exceptions[0]
            assert isinstance(error, SchemaError)
            raise CommandError(error.fixed_by(MIGRATE)) from None
        except* ImproperlyConfigured as failed:  # a queue not the backend's
            raise CommandError(str(failed.exceptions[0])) from None


def log_unless_configured() -> None:
    """pgqueue's INFO lines on stderr, unless LOGGING sends them somewhere.

    Django's default logging configures only its own loggers: without this
    the worker would say nothing, not its start, not a failed task.
    """
    found = logging.getLogger("pgqueue")
    current: logging.Logger | None = found
    while current is not None:
        # pgqueue's own NullHandler says nothing.
        if any(not isinstance(h, logging.NullHandler) for h in current.handlers):
            return
        current = current.parent if current.propagate else None
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    found.addHandler(handler)
    if found.level == logging.NOTSET:
        found.setLevel(logging.INFO)
