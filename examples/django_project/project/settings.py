"""Settings of the example project: the database from ``PGQUEUE_DSN``, tasks on pgqueue."""

from __future__ import annotations

import os
from urllib.parse import parse_qs, unquote, urlsplit

_dsn = urlsplit(
    os.environ.get("PGQUEUE_DSN", "postgresql://postgres@127.0.0.1:5432/shop")
)

SECRET_KEY = "example-only"  # an example's, never deployed
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
ROOT_URLCONF = "project.urls"
USE_TZ = True

INSTALLED_APPS = ["pgqueue.django", "shop"]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _dsn.path.lstrip("/"),
        "USER": unquote(_dsn.username or ""),
        "PASSWORD": unquote(_dsn.password or ""),
        # A socket directory comes as ?host=/path.
        "HOST": _dsn.hostname or parse_qs(_dsn.query).get("host", [""])[0],
        "PORT": _dsn.port or "",
    }
}


def retry_soon(attempt: int) -> float:
    """Seconds before a failed task runs again (pgqueue's default backs off from 2 s)."""
    return 0.2


TASKS = {
    "default": {
        "BACKEND": "pgqueue.django.Backend",
        "QUEUES": ["default", "payments"],
        "OPTIONS": {
            "MAX_ATTEMPTS": 2,  # a failing task runs twice, then is FAILED
            "WORKER": {"concurrency": 4, "backoff": retry_soon},
        },
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["stderr"], "level": "INFO"},
}
