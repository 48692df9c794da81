"""The Django app of ``pgqueue.django``: it carries the schema's migration."""

from __future__ import annotations

from django.apps import AppConfig


class PgQueueConfig(AppConfig):
    """``INSTALLED_APPS += ["pgqueue.django"]``: the label is ``pgqueue``."""

    name = "pgqueue.django"
    label = "pgqueue"
    verbose_name = "pgqueue"
