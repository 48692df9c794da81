"""``python manage.py pgqueue_worker``: run the tasks of a ``pgqueue.django.Backend``."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.tasks import task_backends

from pgqueue import SchemaError
from pgqueue._extension import (
    FlagError,
    add_option_flags,
    option_values,
    optional_duration,
)
from pgqueue.django._backend import MIGRATE
from pgqueue.django._runner import run_worker


class Command(BaseCommand):
    """Run a pgqueue worker of the tasks until SIGINT or SIGTERM."""

    help = (
        "Run the tasks of a pgqueue.django.Backend until SIGINT or SIGTERM, "
        "taking every worker option's flag that `pgqueue worker` takes."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        """The backend, every worker option's flag (as ``pgqueue worker`` has it), and running."""
        add_arguments(parser)

    def handle(self, *args: Any, **given: Any) -> None:
        """Run the worker until a signal, or drained with --burst."""
        try:
            options = option_values(argparse.Namespace(**given))
        except FlagError as exc:
            raise CommandError(str(exc)) from exc.__cause__
        log_unless_configured()
        backend = task_backends[given["backend"]]
        database = getattr(backend, "database", None)
        if database is not None:
            # The database's own checks too (the pgqueue migration applied).
            self.check(databases=[database])
        try:
            run_worker(
                given["backend"],
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments: the backend, the worker options' flags, running."""
    parser.add_argument(
        "--backend", default="default", help="the alias in TASKS (default: default)"
    )
    add_option_flags(
        parser.add_argument_group(
            "worker options",
            "each replaces the backend's OPTIONS['WORKER'] (--queue: its QUEUES)",
        )
    )
    running = parser.add_argument_group("running")  # not a status
    running.add_argument(
        "--burst",
        action="store_true",
        help="run the tasks that are ready, then exit",
    )
    running.add_argument(
        "--shutdown-timeout",
        type=optional_duration,
        default=30.0,
        metavar="DURATION|none",
        help="how long the tasks in flight may finish after a signal (default 30s)",
    )


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
