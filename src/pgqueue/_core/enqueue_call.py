"""An enqueue as a call of the SQL function ``pgqueue_enqueue``, for drivers other than asyncpg.

`enqueue_params` checks the arguments as `Queue.enqueue` does, before any SQL
runs; the caller then runs `ENQUEUE_CALL` with them on its own connection
(psycopg, psycopg2 through Django: both take ``%(name)s`` placeholders), in
its own transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgqueue._core.checks import (
    check_bool,
    check_conflict,
    check_job_type,
    check_max_attempts,
    check_priority,
    check_queue_name,
    check_unique_key,
    check_when,
)
from pgqueue._core.codec import encode_payload, payload_encoder

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["ENQUEUE_CALL", "enqueue_params"]

# Every argument is cast: drivers send Python ints as int8 or numeric and
# None untyped, and a function's arguments are not cast down implicitly.
ENQUEUE_CALL = """SELECT pgqueue_enqueue(
    CAST(%(job_type)s AS text),
    CAST(CAST(%(payload)s AS text) AS jsonb),
    queue => CAST(%(queue)s AS text),
    run_at => CAST(%(run_at)s AS timestamptz),
    delay => make_interval(secs => CAST(%(delay)s AS float8)),
    max_attempts => CAST(%(max_attempts)s AS int),
    priority => CAST(%(priority)s AS int),
    unique_key => CAST(%(unique_key)s AS text),
    on_conflict => CAST(%(on_conflict)s AS text),
    track => CAST(%(track)s AS boolean)
)"""
"""``SELECT pgqueue_enqueue(...)`` with ``%(name)s`` placeholders for `enqueue_params`."""


def enqueue_params(
    job_type: object,
    payload: Any,
    *,
    queue: object = "default",
    run_at: object = None,
    delay: object = None,
    max_attempts: object = 5,
    priority: object = 0,
    unique_key: object = None,
    on_conflict: object = "return",
    debounce: object = None,
    track: object = False,
    json_encoder: Callable[[Any], Any] | None = None,
) -> dict[str, object]:
    """The parameters of `ENQUEUE_CALL`, checked as `Queue.enqueue` checks them.

    ``json_encoder`` is `Queue`'s: ``json.dumps``'s ``default``. A
    ``debounce`` is ``on_conflict='replace'`` with that ``delay``.

    Raises:
        TypeError, ValueError: as `Queue.enqueue` for the same arguments.
    """
    when, seconds = check_when(run_at, delay)
    key = check_unique_key(unique_key)
    conflict, seconds = check_conflict(
        key, on_conflict, debounce, run_at, delay, seconds
    )
    return {
        "job_type": check_job_type(job_type),
        "payload": encode_payload(payload, payload_encoder(json_encoder)),
        "queue": check_queue_name(queue),
        "run_at": when,
        "delay": seconds,
        "max_attempts": check_max_attempts(max_attempts),
        "priority": check_priority(priority),
        "unique_key": key,
        "on_conflict": conflict,
        "track": check_bool("track", track),
    }
