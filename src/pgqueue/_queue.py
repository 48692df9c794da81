"""The producer side: enqueue jobs and prune finished ones."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

from pgqueue import _sql
from pgqueue._checks import (
    check_duration,
    check_max_attempts,
    check_name,
    check_queue_name,
    check_run_at,
    encode_payload,
    encode_payloads,
)
from pgqueue._job import NewJob
from pgqueue._log import Logger, default_logger

if TYPE_CHECKING:
    from collections.abc import Iterable
    from datetime import datetime

    import asyncpg
    from asyncpg.pool import PoolConnectionProxy

__all__ = ["Connection", "Executor", "Queue", "install", "uninstall"]

Connection: TypeAlias = "asyncpg.Connection[Any] | PoolConnectionProxy[Any]"
"""An asyncpg connection, or one acquired from a pool."""

Executor: TypeAlias = "asyncpg.Pool[Any] | Connection"
"""An asyncpg pool, or a connection (inside a transaction, writes ride it)."""


async def install(executor: Executor) -> None:
    """Create the ``pgqueue_jobs`` table and its indexes by running `SCHEMA`.

    Meant for quick starts and tests; applications should put `SCHEMA` in
    their own migrations. Not idempotent: it fails if the table exists.
    """
    await executor.execute(_sql.SCHEMA)


async def uninstall(executor: Executor) -> None:
    """Drop the ``pgqueue_jobs`` table by running `SCHEMA_DOWN`."""
    await executor.execute(_sql.SCHEMA_DOWN)


class Queue:
    """Enqueue jobs onto one named queue.

    The pool is borrowed, never closed. Constructing a queue does no I/O.

    Args:
        pool: the asyncpg pool to write through.
        name: the queue's name; workers consume one queue each.
        max_attempts: the default for jobs enqueued without their own.
        logger: where to log; the ``pgqueue`` logger by default.

    Usage::

        queue = pgqueue.Queue(pool)
        job_id = await queue.enqueue("send_welcome_email", {"user_id": "01J5"})
    """

    __slots__ = ("_logger", "_max_attempts", "_name", "_pool")

    def __init__(
        self,
        pool: asyncpg.Pool[Any],
        name: str = "default",
        max_attempts: int = 5,
        *,
        logger: Logger | None = None,
    ) -> None:
        self._pool = pool
        self._name = check_queue_name(name)
        self._max_attempts = check_max_attempts(max_attempts)
        self._logger = default_logger(logger)

    @property
    def name(self) -> str:
        """The queue's name."""
        return self._name

    @property
    def max_attempts(self) -> int:
        """The default number of attempts for a job."""
        return self._max_attempts

    async def enqueue(
        self,
        job_type: str,
        payload: Any = None,
        *,
        run_at: datetime | None = None,
        max_attempts: int | None = None,
        connection: Connection | None = None,
    ) -> int:
        """Insert a job and wake the queue's workers, in one round trip.

        Returns once the row is committed. With ``connection`` inside a
        transaction, the row and its wakeup become visible only if that
        transaction commits.

        Args:
            job_type: selects the handler that runs the job.
            payload: any JSON-serializable value (``None`` is stored as
                ``{}``), or ``bytes`` holding JSON text.
            run_at: a timezone-aware time before which the job does not run.
            max_attempts: overrides the queue's default.
            connection: run on this connection (and its transaction).

        Returns:
            The new job's id.

        Raises:
            TypeError: a payload that is not JSON-serializable, or an
                argument of the wrong type.
            ValueError: bytes that are not JSON, a NUL character, an empty
                job type, ``max_attempts < 1`` or a naive ``run_at``.
        """
        args = self._row(job_type, payload, run_at, max_attempts)
        executor: Executor = connection if connection is not None else self._pool
        job_id: int = await executor.fetchval(_sql.ENQUEUE, self._name, *args)
        self._logger.debug(
            "job enqueued",
            extra={"job_id": job_id, "job_type": job_type, "queue": self._name},
        )
        return job_id

    async def enqueue_many(
        self,
        jobs: Iterable[NewJob | tuple[str, Any]],
        *,
        connection: Connection | None = None,
    ) -> list[int]:
        """Insert many jobs in one round trip with a single wakeup.

        All jobs are checked before anything is sent; one bad job means none
        is written. Returns the new ids in input order. The payloads travel
        as one JSON array, so one call's payloads must stay under 256 MB
        (PostgreSQL's limit for a jsonb value); beyond it the server refuses
        the call and nothing is written.

        Args:
            jobs: `NewJob` values or ``(job_type, payload)`` tuples.
            connection: run on this connection (and its transaction).

        Raises:
            TypeError, ValueError: as `enqueue`, naming the bad job's index.
        """
        types: list[str] = []
        payloads: list[Any] = []
        attempts: list[int] = []
        run_ats: list[datetime | None] = []
        checked_types: set[str] = set()
        for index, job in enumerate(jobs):
            try:
                job_type, payload, max_attempts, run_at = _unpack(job)
                if type(job_type) is str and job_type in checked_types:
                    types.append(job_type)
                else:
                    types.append(check_name("job type", job_type))
                    checked_types.add(types[-1])
                attempts.append(self._attempts(max_attempts))
                run_ats.append(check_run_at(run_at))
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"job {index}: {exc}") from exc
            payloads.append(payload)
        if not types:
            return []
        payload_array = encode_payloads(payloads)
        executor: Executor = connection if connection is not None else self._pool
        joined: str = await executor.fetchval(
            _sql.ENQUEUE_MANY,
            self._name,
            types,
            payload_array,
            _sql.array(attempts),
            _sql.timestamps(run_ats),
        )
        ids = [int(job_id) for job_id in joined.split(",")]
        self._logger.debug(
            "jobs enqueued", extra={"count": len(ids), "queue": self._name}
        )
        return ids

    async def prune(
        self, older_than: float, *, connection: Connection | None = None
    ) -> int:
        """Delete this queue's completed and dead jobs last updated over ``older_than`` seconds ago.

        Pending and running jobs are never touched. Returns how many rows
        were deleted.

        Raises:
            ValueError: ``older_than`` is negative or not finite.
        """
        seconds = check_duration("older_than", older_than)
        executor: Executor = connection if connection is not None else self._pool
        status: str = await executor.execute(_sql.PRUNE, self._name, seconds)
        removed = int(status.rsplit(" ", 1)[-1])
        if removed:
            self._logger.debug(
                "pruned finished jobs",
                extra={"count": removed, "queue": self._name},
            )
        return removed

    def _row(
        self, job_type: object, payload: Any, run_at: object, max_attempts: object
    ) -> tuple[str, str, int, datetime | None]:
        return (
            check_name("job type", job_type),
            encode_payload(payload),
            self._attempts(max_attempts),
            check_run_at(run_at),
        )

    def _attempts(self, max_attempts: object) -> int:
        """A job's ``max_attempts``: its own, checked, or the queue's default."""
        return (
            self._max_attempts
            if max_attempts is None
            else check_max_attempts(max_attempts)
        )

    def __repr__(self) -> str:
        return f"Queue(name={self._name!r}, max_attempts={self._max_attempts})"


def _unpack(job: object) -> tuple[object, Any, object, object]:
    """(job_type, payload, max_attempts, run_at) of one job for enqueue_many."""
    if isinstance(job, tuple) and len(job) == 2:
        return job[0], job[1], None, None
    if isinstance(job, NewJob):
        return job.job_type, job.payload, job.max_attempts, job.run_at
    msg = f"expected a NewJob or a (job_type, payload) tuple, got {job!r:.80}"
    raise TypeError(msg)
