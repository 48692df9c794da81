"""Enqueue and read jobs from synchronous code, on a psycopg 3 connection.

For producers that are not asyncio: a Flask or Django view, a script, a
cron job (``pip install 'pgqueue-asyncio[psycopg]'``). `Queue` writes the
same rows as `pgqueue.Queue` and wakes the same workers; `Admin` reads
what `pgqueue.Admin` reads, as the same dataclasses.

Every statement runs on the connection given, in its transaction: a job
enqueued in an open transaction (``with conn.transaction():``, or the
transaction a connection that is not in autocommit mode opens) is written,
and its workers woken, only if that transaction commits; on an autocommit
connection each call commits by itself. The connection is borrowed, never
closed.

.. versionadded:: 0.1
"""

from __future__ import annotations

from pgqueue.sync._admin import Admin
from pgqueue.sync._queue import Queue

__all__ = ["Admin", "Queue"]


def __dir__() -> list[str]:
    """The public names: ``__all__``."""
    from pgqueue._extension import public_names  # only when asked

    return public_names(globals(), __all__)
