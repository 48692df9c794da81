"""What `pgqueue.Admin` is built on, and its actions on the jobs a filter matches.

`AdminBase` holds an admin's executor, logger and store; `FilterActions`
adds `redrive`, `delete` and `move` (and the bulk forms of ``retry`` and
``cancel``, which `pgqueue.Admin` routes here), each walked by
`pgqueue._bulk.run`.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from pgqueue._bulk import (
    SEARCH_TIMEOUT,
    check_filter,
    check_pace,
    eligible,
    move_each,
    retry_each,
    run,
)
from pgqueue._core.checks import check_bool, check_int, check_queue_name
from pgqueue._core.lifecycle import FAILED, LIFECYCLE, Status
from pgqueue._core.log import Logger, default_logger
from pgqueue._sql.filters import condition
from pgqueue._store.postgres import Store
from pgqueue._store.schema import SCHEMA_ERRORS, schema_failure, store_for

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable

    from pgqueue._core.filter import JobFilter
    from pgqueue._queue import Executor

__all__ = ["NOT_RUNNING", "AdminBase", "FilterActions"]

NOT_RUNNING = tuple(status for status in LIFECYCLE if status != Status.RUNNING)
"""What delete and move act on."""


class AdminBase:
    """An admin's executor (a pool or a connection), logger and store."""

    __slots__ = ("_executor", "_found", "_logger")

    def __init__(self, executor: Executor, *, logger: Logger | None = None) -> None:
        self._executor = executor
        self._logger = default_logger(logger)
        self._found: Store | None = None

    async def _store(self) -> Store:
        """The store of the database: looked up once per Admin (and database)."""
        if self._found is None:
            found = await store_for(self._executor)
            if found is None:
                return Store()
            self._found = found
        return self._found

    @asynccontextmanager
    async def _schema_checked(self) -> AsyncIterator[None]:
        """Turn a statement's missing table or column into a `SchemaError` naming what is missing."""
        try:
            yield
        except SCHEMA_ERRORS as exc:
            raise await schema_failure(self._executor, str(exc)) from exc


class FilterActions(AdminBase):
    """The actions of `pgqueue.Admin` on the jobs a `pgqueue.JobFilter` matches."""

    __slots__ = ()

    async def count(self, *, filter: JobFilter, limit: int | None = None) -> int:
        """How many jobs ``filter`` matches, of any status, counting at most ``limit``.

        What a confirmation states before a bulk action (whose own
        ``dry_run`` counts only the statuses it acts on). One statement,
        cancelled by the server after 30 s.

        Raises:
            TypeError, ValueError: a bad argument (before any SQL runs).

        .. versionadded:: 0.1
        """
        found = check_filter(filter)
        most, _ = check_pace(limit, None)
        async with self._schema_checked():
            store = await self._store()
            matched = condition(found, 2)
            return await store.matching_count(
                self._executor, matched, most, SEARCH_TIMEOUT
            )

    async def redrive(
        self,
        *,
        filter: JobFilter,
        to_queue: str | None = None,
        limit: int | None = None,
        rate: float | None = None,
        dry_run: bool = False,
        attempts: int | None = None,
        reset_steps: bool = False,
    ) -> int:
        """Put the dead and cancelled jobs ``filter`` matches back to pending, due now; how many were.

        Each is retried as `retry` retries one (its attempts kept, its
        ``max_attempts`` raised, its queue's workers woken), in its own
        queue or moved into ``to_queue``, whose workers are then woken (a
        NOTIFY on ``pgqueue_jobs``, as an enqueue sends). A job whose
        unique key a live job holds in its queue is skipped. Other
        matches (pending, running, completed) are left alone.

        The matches are walked in id order, a batch at a time (at most
        500 jobs, each batch a short transaction of its own over a pool);
        each batch locks its rows and tests their status again, so a job
        retried meanwhile is not retried twice. Interrupted, the call has
        done its batches: called again, it finds the rest.

        Args:
            filter: which jobs; a ``status`` other than dead or cancelled
                raises `ValueError`.
            to_queue: the queue they go to; None: each stays in its own.
            limit: at most this many matches are acted on.
            rate: at most this many jobs a second (batches of a tenth of a
                second's), so that workers are not flooded at once.
            dry_run: count the matches (at most ``limit``) and change
                nothing. A job skipped for its unique key is counted.
            attempts: more attempts each job gets, as in `retry`.
            reset_steps: clear a durable handler's steps, as in `retry`.

        Raises:
            TypeError, ValueError: a bad argument (before any SQL runs).

        A batch's search that runs 30 s is cancelled by the server
        (asyncpg's ``QueryCanceledError``).

        .. versionadded:: 0.1

        .. versionchanged:: 0.1
            ``reset_steps``.
        """
        found = check_filter(filter)
        target = None if to_queue is None else check_queue_name(to_queue)
        check_bool("reset_steps", reset_steps)
        extra = None if attempts is None else check_int("attempts", attempts)

        async def act(store: Store, ids: list[int]) -> int:
            done = await retry_each(
                self._executor, store, ids, extra, target, reset_steps=reset_steps
            )
            return sum(result == "retried" for result in done.values())

        statuses = eligible("redrive", FAILED, found)
        return await self._bulk("redrive", found, statuses, act, dry_run, limit, rate)

    async def delete(
        self,
        *,
        filter: JobFilter,
        dry_run: bool = False,
        limit: int | None = None,
        rate: float | None = None,
    ) -> int:
        """Delete the jobs ``filter`` matches, running ones never; how many went.

        Batched, paced and resumable as `redrive`. A job that is the parent
        of an unfinished child stays (its result is the child's
        ``parent_results``); a deleted child's dependency rows go with it.

        Raises:
            TypeError, ValueError: a bad argument, a filter on running jobs.

        .. versionadded:: 0.1
        """

        async def act(store: Store, ids: list[int]) -> int:
            return await store.delete(self._executor, ids)

        found = check_filter(filter)
        statuses = eligible("delete", NOT_RUNNING, found)
        return await self._bulk("delete", found, statuses, act, dry_run, limit, rate)

    async def move(
        self,
        *,
        filter: JobFilter,
        to_queue: str,
        dry_run: bool = False,
        limit: int | None = None,
        rate: float | None = None,
    ) -> int:
        """Move the jobs ``filter`` matches into ``to_queue``, running ones never; how many moved.

        Batched, paced and resumable as `redrive`; the jobs keep their
        status, ``run_at`` and attempts, and ``to_queue``'s workers are
        woken when a pending job came. A pending or waiting job whose
        unique key ``to_queue`` already holds stays. Not on Citus (which
        distributes the jobs by queue).

        Raises:
            TypeError, ValueError: a bad argument, a filter on running jobs.

        .. versionadded:: 0.1
        """
        found = check_filter(filter)
        target = check_queue_name(to_queue)

        async def act(store: Store, ids: list[int]) -> int:
            return await move_each(self._executor, store, ids, target)

        statuses = eligible("move", NOT_RUNNING, found)
        return await self._bulk("move", found, statuses, act, dry_run, limit, rate)

    async def _bulk(
        self,
        action: str,
        found: JobFilter,
        statuses: tuple[Status, ...],
        act: Callable[[Store, list[int]], Awaitable[int]],
        dry_run: object,
        limit: object,
        rate: object,
    ) -> int:
        """Run a bulk action (`pgqueue._bulk.run`) and log what it did."""
        most, pace = check_pace(limit, rate)
        if not isinstance(dry_run, bool):
            msg = f"dry_run must be a bool, not {type(dry_run).__name__}"
            raise TypeError(msg)
        async with self._schema_checked():
            store = await self._store()
            count = await run(
                self._executor,
                store,
                found,
                statuses,
                lambda ids: act(store, ids),
                dry_run=dry_run,
                limit=most,
                rate=pace,
            )
        if not dry_run:
            self._logger.info(
                "bulk action",
                extra={"action": action, "count": count, "filter": str(found)},
            )
        return count
