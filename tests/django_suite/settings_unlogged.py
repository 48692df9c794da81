"""The example project's settings without LOGGING: Django's default logging, as a new project has."""

from __future__ import annotations

from tests.django_suite.settings import *  # noqa: F403 - the suite's settings, then one change

del LOGGING  # noqa: F821 - defined by the project's settings
