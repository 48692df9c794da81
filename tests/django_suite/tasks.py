"""Tasks only the Django suite enqueues."""

from __future__ import annotations

from datetime import UTC, datetime

from django.tasks import task


@task
def now() -> datetime:
    """Returns what JSON cannot hold."""
    return datetime.now(UTC)
