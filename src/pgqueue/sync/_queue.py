"""`Queue`: enqueue jobs on a psycopg connection, in its transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pgqueue import DuplicateJobError
from pgqueue._extension import (
    admin_statements,
    array,
    check_bool,
    check_group,
    check_job_id,
    check_job_type,
    check_jobs,
    check_max_attempts,
    check_on_conflict,
    check_priority,
    check_queue_name,
    check_replace,
    check_unique_key,
    check_when,
    encode_payload,
    encode_payloads,
    enqueue_statements,
    insert_many,
    payload_encoder,
)
from pgqueue.sync._statements import fetch, fetch_dicts, fetch_one

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from datetime import datetime, timedelta

    import psycopg

    from pgqueue import NewJob

__all__ = ["Queue"]


class Queue:
    """Enqueue jobs onto one named queue, on a psycopg 3 connection.

    The synchronous twin of `pgqueue.Queue`: the same arguments, checks,
    rows and errors. Each call is one statement on ``connection``; inside
    a transaction the jobs ride it, and so does their wakeup (a NOTIFY
    that takes effect on commit); on an autocommit connection each call
    commits by itself. The connection is borrowed, never closed;
    constructing a queue does no I/O.

    Args:
        connection: a ``psycopg.Connection``.
        name: the queue's name; workers consume one queue each.
        max_attempts: the default for jobs enqueued without their own.
        json_encoder: as `pgqueue.Queue`'s: ``json.dumps``'s ``default``.

    Usage::

        with psycopg.connect(dsn) as conn:
            queue = pgqueue.sync.Queue(conn)
            queue.enqueue("send_welcome_email", {"user_id": "01J5"})

    .. versionadded:: 0.1
    """

    __slots__ = ("_connection", "_encoder", "_max_attempts", "_name")

    def __init__(
        self,
        connection: psycopg.Connection[Any],
        name: str = "default",
        *,
        max_attempts: int = 5,
        json_encoder: Callable[[Any], Any] | None = None,
    ) -> None:
        self._connection = connection
        self._name = check_queue_name(name)
        self._max_attempts = check_max_attempts(max_attempts)
        self._encoder = payload_encoder(json_encoder)

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._name

    def enqueue(
        self,
        job_type: str,
        payload: Any = None,
        *,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        max_attempts: int | None = None,
        priority: int = 0,
        unique_key: str | None = None,
        on_conflict: Literal["return", "raise", "replace"] = "return",
        debounce: float | timedelta | None = None,
        track: bool = False,
        group: str | None = None,
    ) -> int:
        """Insert a job and wake the queue's workers when it commits; its id.

        The arguments are `pgqueue.Queue.enqueue`'s; all are checked before
        any SQL runs. A duplicate ``unique_key`` returns the pending or
        running job's id (no wakeup), or with ``on_conflict="raise"`` raises
        `pgqueue.DuplicateJobError`; either way the transaction stays usable.
        ``on_conflict="replace"`` and ``debounce`` replace the key's pending
        job, or queue the job after a started one, and return the id of the
        job that runs with this payload.

        Raises:
            DuplicateJobError: a duplicate key, with ``on_conflict="raise"``.
            SchemaError: ``pgqueue_jobs`` is missing or out of date.
            TypeError, ValueError: as `pgqueue.Queue.enqueue`.
        """
        when, seconds = check_when(run_at, delay)
        args = (
            self._name,
            check_job_type(job_type),
            encode_payload(payload, self._encoder),
            self._max_attempts
            if max_attempts is None
            else check_max_attempts(max_attempts),
            when,
            check_priority(priority),
            check_bool("track", track),
            None,  # no trace context: enqueue hooks are the async Queue's
        )
        key = check_unique_key(unique_key)
        conflict = check_on_conflict(on_conflict)
        group_key = None if group is None else check_group(group)
        replace, debounced = check_replace(key, conflict, debounce, run_at, delay)
        if replace:
            if group_key is not None:
                msg = "a job with a group cannot replace or debounce (on_conflict='replace', debounce=) yet"
                raise ValueError(msg)
            return int(
                fetch_one(
                    self._connection,
                    enqueue_statements.ENQUEUE_REPLACE,
                    (*args, key, seconds if debounced is None else debounced, True),
                )[0]
            )
        if key is None:
            job_id: int = fetch_one(
                self._connection,
                enqueue_statements.ENQUEUE,
                (*args, seconds, group_key),
            )[0]
            return job_id
        job_id, existed = fetch_one(
            self._connection,
            enqueue_statements.ENQUEUE_UNIQUE,
            (*args, key, seconds, group_key),
        )[:2]
        if existed and conflict == "raise":
            raise DuplicateJobError(job_id, key)
        return job_id

    def enqueue_many(
        self,
        jobs: Iterable[NewJob | tuple[str, Any]],
        *,
        on_conflict: Literal["return", "raise", "replace"] = "return",
    ) -> list[int]:
        """Insert many jobs in one statement with a single wakeup; their ids, in input order.

        As `pgqueue.Queue.enqueue_many`: every job is checked before any
        SQL runs (one bad job, and none is written), unique keys behave as
        in `enqueue`, and the payloads travel as one JSON array (under 256
        MB). Large batches are inserted, not copied.

        Raises:
            DuplicateJobError: a duplicate key, with ``on_conflict="raise"``
                (after the call's new jobs were inserted).
            SchemaError: ``pgqueue_jobs`` is missing or out of date.
            TypeError, ValueError: as `enqueue`, naming the bad job's index.
        """
        conflict = check_on_conflict(on_conflict)
        batch = check_jobs(jobs, self._max_attempts, None, conflict)
        if batch.parents is not None:
            msg = (
                "pgqueue.sync does not enqueue jobs with parents (after=...):"
                " use pgqueue.Queue"
            )
            raise ValueError(msg)
        if not batch.types:
            return []
        payloads = encode_payloads(batch.payloads, self._encoder)
        statement, args = insert_many(self._name, batch, payloads, None, notify=True)
        if not batch.keyed:
            joined: str = fetch_one(self._connection, statement, args)[0]
            return [int(job_id) for job_id in joined.split(",")]
        found = fetch_dicts(self._connection, statement, args)
        if batch.replacing:
            return batch.replaced_ids(found)[0]
        ids, duplicate, _ = batch.ids(found)
        if duplicate is not None and conflict == "raise":
            raise DuplicateJobError(*duplicate)
        return ids

    def cancel(self, *job_ids: int) -> dict[int, str]:
        """Cancel jobs of any queue; what became of each id, as `pgqueue.Queue.cancel` says.

        ``"cancelled"``, ``"requested"``, ``"finished"`` or ``"not_found"``.

        Raises:
            TypeError, ValueError: an id that is not a positive int.
        """
        ids = [check_job_id(job_id) for job_id in job_ids]
        if not ids:
            return {}
        rows = fetch(self._connection, admin_statements.CANCEL, (array(ids),))
        done: dict[int, str] = {job_id: result for job_id, result, _ in rows}
        return {job_id: done[job_id] for job_id in ids}

    def __repr__(self) -> str:
        return f"pgqueue.sync.Queue(name={self._name!r}, max_attempts={self._max_attempts})"
