"""pgqueue's schema: `pgqueue.SCHEMA` on a new database, `pgqueue.SCHEMA_UPGRADE` on an existing table.

A ``pgqueue_jobs`` table a Go producer (or an earlier pgqueue) made is
brought up to date in place, its jobs kept: `pgqueue.SCHEMA` alone would
fail on its missing columns, `pgqueue.SCHEMA_UPGRADE` alone on a database
without the table. Reversed, `pgqueue.SCHEMA_DOWN` drops the tables, but
only while every job in them is the Django backend's: jobs of other
producers stop it with an error.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations

from pgqueue import SCHEMA, SCHEMA_DOWN, SCHEMA_UPGRADE
from pgqueue._extension import FOREIGN_JOBS_PYFORMAT, TABLE_EXISTS
from pgqueue.django._outcome import JOB_TYPE


def apply(apps: Any, schema_editor: Any) -> None:
    """Create the schema, or upgrade the table that is there."""
    if schema_editor.connection.vendor != "postgresql":
        return  # another database of the project: pgqueue lives in PostgreSQL
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(TABLE_EXISTS)
        (exists,) = cursor.fetchone()
        cursor.execute(SCHEMA_UPGRADE if exists else SCHEMA)


def revert(apps: Any, schema_editor: Any) -> None:
    """Drop the schema, unless its table holds jobs of other producers."""
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(TABLE_EXISTS)
        (exists,) = cursor.fetchone()
        if exists:
            cursor.execute(FOREIGN_JOBS_PYFORMAT, {"job_type": JOB_TYPE})
            (foreign,) = cursor.fetchone()
            if foreign:
                msg = (
                    "pgqueue_jobs holds jobs that are not Django tasks (a Go "
                    "producer's?): not dropping it; delete them first, or drop "
                    "the schema by hand with pgqueue.SCHEMA_DOWN"
                )
                raise RuntimeError(msg)
        cursor.execute(SCHEMA_DOWN)


class Migration(migrations.Migration):
    """Apply pgqueue's schema on the backend's database."""

    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [migrations.RunPython(apply, revert)]
