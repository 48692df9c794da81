"""`Queue`: enqueue jobs on a psycopg connection, in its transaction."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Unpack

import psycopg

from pgqueue import DuplicateJobError, JobNotFoundError
from pgqueue._extension import (
    Store,
    admin_statements,
    array,
    check_job_id,
    check_jobs,
    check_max_attempts,
    check_queue_name,
    check_request,
    check_signal,
    durable_statements,
    encode_payload,
    encode_payloads,
    payload_encoder,
)
from pgqueue.sync._statements import fetch, run, store_of

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from pgqueue import EnqueueOptions, NewJob
    from pgqueue._extension import Enqueued, Plan

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

    __slots__ = ("_connection", "_encoder", "_max_attempts", "_name", "_store")

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
        self._store: Store | None = None

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._name

    def enqueue(
        self,
        job_type: str,
        payload: Any = None,
        **options: Unpack[EnqueueOptions],
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
            JobNotFoundError: a parent in ``after`` that no job has
                (nothing is written; the transaction stays usable).
            SchemaError: ``pgqueue_jobs`` is missing or out of date.
            TypeError, ValueError: as `pgqueue.Queue.enqueue`.

        .. versionchanged:: 0.1
           ``after`` and ``on_parent_failure``.
        """
        request = check_request(
            job_type, payload, default_attempts=self._max_attempts, **options
        )
        text = encode_payload(payload, self._encoder)
        plan = self._store_of().plan_one(self._name, request, text, None, notify=True)
        done = self._run(plan)
        if done.existing is not None and request.conflict == "raise":
            raise DuplicateJobError(*done.existing)
        return done.ids[0]

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
            JobNotFoundError: a parent in a job's ``after`` that no job has.
            SchemaError: ``pgqueue_jobs`` is missing or out of date.
            TypeError, ValueError: as `enqueue`, naming the bad job's index.

        .. versionchanged:: 0.1
           Jobs with ``after``.
        """
        batch = check_jobs(jobs, self._max_attempts, None, on_conflict)
        if not batch.types:
            return []
        payloads = encode_payloads(batch.payloads, self._encoder)
        plan = self._store_of().plan_many(
            self._name, batch, payloads, None, notify=True
        )
        done = self._run(plan)
        if done.existing is not None and on_conflict == "raise":
            raise DuplicateJobError(*done.existing)
        return done.ids

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

    def signal(self, job_id: int, name: str, payload: Any = None) -> bool:
        """Send the signal ``name``, with ``payload``, to the durable handler of job ``job_id``, as `pgqueue.Queue.signal` does.

        In the connection's transaction: the signal exists only if it commits.

        Returns:
            True once stored; False if the job has ended (nothing is stored).

        Raises:
            JobNotFoundError: no job has that id (the transaction stays usable).
            TypeError, ValueError: as `pgqueue.Queue.signal` (before any SQL).

        .. versionadded:: 0.1
        """
        text = "null" if payload is None else encode_payload(payload, self._encoder)
        checked, name = check_signal(job_id, name, text)
        try:
            with self._connection.transaction():
                rows = fetch(
                    self._connection, durable_statements.SIGNAL, (checked, name, text)
                )
        except psycopg.errors.NoDataFound as exc:
            raise JobNotFoundError(checked) from exc
        return bool(rows[0][0])

    def _store_of(self) -> Store:
        """The store of the connection's database, looked up once (plain PostgreSQL's while there is no table)."""
        if self._store is None:
            found = store_of(self._connection)
            if found is None:
                return Store()
            self._store = found
        return self._store

    def _run(self, plan: Plan) -> Enqueued:
        return run(self._connection, plan, self._name)

    def __repr__(self) -> str:
        return f"pgqueue.sync.Queue(name={self._name!r}, max_attempts={self._max_attempts})"
