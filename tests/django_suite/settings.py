"""The example project's settings, with what the suite adds: its own tasks' module, and a second backend."""

from __future__ import annotations

from typing import Any, cast

from project.settings import *  # noqa: F403 - the project's settings, then the suite's

_options = cast("dict[str, Any]", TASKS["default"]["OPTIONS"])  # noqa: F405
_options["TASK_MODULES"] = ["shop", "tests.django_suite.tasks"]
# Another backend on the same database, with a queue of its own.
TASKS["reports"] = {"BACKEND": "pgqueue.django.Backend", "QUEUES": ["reports"]}  # noqa: F405
