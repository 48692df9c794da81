"""The bulk actions on the jobs a `JobFilter` matches: walked in batches, paced, resumable.

`pgqueue.Admin.retry`, ``cancel``, ``delete``, ``move`` and ``redrive``
given a filter come here. The matches are found a batch at a time in id
order (each search bounded by a statement timeout) and acted on by id with
a statement that locks the rows and tests their status again, so a job
that changed since it was found (claimed, finished) is left as the action's
rules say. Each batch is a short transaction of its own over a pool, so an
action interrupted part way has done its batches and nothing else: run
again, it finds only the jobs still to do. ``rate`` paces the batches.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import anyio
import asyncpg

from pgqueue._core.checks import check_int
from pgqueue._core.filter import JobFilter
from pgqueue._core.lifecycle import Status
from pgqueue._sql.filters import condition

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Collection

    from pgqueue._store.executor import Executor
    from pgqueue._store.postgres import Store

__all__ = [
    "BATCH",
    "SEARCH_TIMEOUT",
    "check_filter",
    "check_pace",
    "eligible",
    "retry_each",
    "run",
]

BATCH = 500
"""The most jobs one batch of a bulk action acts on (fewer with a ``rate``: a tenth of a second's)."""

SEARCH_TIMEOUT = 30.0
"""Seconds one search of a filter's matches (a listing's page, a batch's ids, a dry run's count) may run."""


def check_filter(found: object) -> JobFilter:
    """``found`` if it is a `JobFilter`."""
    if not isinstance(found, JobFilter):
        msg = f"filter must be a pgqueue.JobFilter, not {type(found).__name__}"
        raise TypeError(msg)
    return found


def check_pace(limit: object, rate: object) -> tuple[int | None, float | None]:
    """A bulk action's ``limit`` (jobs, at least 1) and ``rate`` (jobs a second, positive), None for none."""
    most = None if limit is None else check_int("limit", limit)
    if rate is None:
        return most, None
    if isinstance(rate, bool) or not isinstance(rate, int | float):
        msg = f"rate must be a number of jobs per second, not {type(rate).__name__}"
        raise TypeError(msg)
    if not math.isfinite(rate) or rate <= 0:
        msg = f"rate must be a finite, positive number of jobs per second, got {rate!r}"
        raise ValueError(msg)
    return most, float(rate)


def eligible(
    action: str, allowed: Collection[Status], found: JobFilter
) -> tuple[Status, ...]:
    """The statuses ``action`` acts on among those ``found`` names.

    Raises:
        ValueError: the filter names a status the action never acts on
            (``retry`` of running jobs): it would match nothing.
    """
    if found.status is None:
        return tuple(allowed)
    named = (
        Status.PENDING
        if found.status in ("ready", "scheduled")
        else Status(found.status)
    )
    if named not in allowed:
        shown = ", ".join(allowed)
        msg = f"{action} acts on {shown} jobs only: status={found.status} matches none of them"
        raise ValueError(msg)
    return (named,)


async def run(
    executor: Executor,
    store: Store,
    found: JobFilter,
    statuses: Collection[Status],
    act: Callable[[list[int]], Awaitable[int]],
    *,
    dry_run: bool,
    limit: int | None,
    rate: float | None,
) -> int:
    """Act on the jobs ``found`` matches in ``statuses``, a batch at a time; how many ``act`` changed.

    With ``dry_run``, how many there are (at most ``limit``) instead,
    counted in one statement. ``act`` takes a batch's ids and returns how
    many of them it changed. With ``rate``, batch ``n`` starts no sooner
    than the jobs before it allow at that rate.
    """
    if dry_run:
        counted = condition(found, 2, statuses=statuses)
        return await store.matching_count(executor, counted, limit, SEARCH_TIMEOUT)
    walked = condition(found, 3, statuses=statuses)
    size = BATCH if rate is None else max(1, min(BATCH, math.ceil(rate / 10)))
    changed = seen = after = 0
    started = anyio.current_time()
    while limit is None or seen < limit:
        if rate is not None:
            await anyio.sleep(max(0.0, started + seen / rate - anyio.current_time()))
        want = size if limit is None else min(size, limit - seen)
        ids = await store.matching_ids(executor, walked, after, want, SEARCH_TIMEOUT)
        if not ids:
            break
        seen += len(ids)
        changed += await act(ids)
        after = ids[-1]
        if len(ids) < want:
            break
    return changed


async def retry_each(
    executor: Executor,
    store: Store,
    ids: list[int],
    attempts: int | None,
    queue: str | None,
    *,
    reset_steps: bool = False,
) -> dict[int, str]:
    """Retry (into ``queue``, if given) the jobs ``ids``: what became of each.

    ``reset_steps``: clear their durable handlers' steps, wait and progress.

    A job of the same key enqueued while the statement ran fails it: then
    one id at a time, so that only that job is skipped (``duplicate``).
    """

    async def once(some: list[int]) -> dict[int, str]:
        if queue is None:
            return await store.retry(executor, some, attempts, reset_steps=reset_steps)
        return await store.redrive(
            executor, some, attempts, queue, reset_steps=reset_steps
        )

    try:
        return await once(ids)
    except asyncpg.UniqueViolationError:
        done: dict[int, str] = {}
        for job_id in ids:
            try:
                done.update(await once([job_id]))
            except asyncpg.UniqueViolationError:
                done[job_id] = "duplicate"
        return done


async def move_each(
    executor: Executor, store: Store, ids: list[int], queue: str
) -> int:
    """Move the jobs ``ids`` into ``queue``: how many moved (one at a time after a conflict, as `retry_each`)."""
    try:
        return await store.move(executor, ids, queue)
    except asyncpg.UniqueViolationError:
        moved = 0
        for job_id in ids:
            try:
                moved += await store.move(executor, [job_id], queue)
            except asyncpg.UniqueViolationError:
                continue
        return moved
