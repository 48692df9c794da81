"""The store of plain PostgreSQL: every operation on pgqueue's tables, as one server runs it.

`pgqueue._store.citus.CitusStore` overrides what Citus runs otherwise. The
operations take what they run on: the worker's own connections
(`Dedicated`) or the caller's pool or connection (`Executor`).
"""

from __future__ import annotations

import json
import operator
import time
from collections import Counter
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, TypeAlias

import asyncpg

from pgqueue._core.lifecycle import OutcomeKind
from pgqueue._sql.admin import (
    CANCEL,
    PRUNE,
    PRUNE_BATCH,
    PRUNE_BATCH_ANY,
    PRUNE_ORPHAN_EDGES,
    REDRIVE,
    RETRY,
)
from pgqueue._sql.bulk import DELETE, MOVE, UPDATE, matching_count, matching_ids
from pgqueue._sql.claims import (
    CLAIM,
    CLAIM_COLUMNS,
    CLAIM_GROUPS,
    CLAIM_GROUPS_RATED,
    CLAIM_RATED,
    CLAIM_TYPES,
    CLAIM_TYPES_RATED,
    GROUP_HEADS,
    LOCK_CLAIMS,
    NEXT_DUE,
    PARENT_RESULTS,
    RATE_ROOM,
)
from pgqueue._sql.durable import (
    JOB_STATE,
    PROGRESS,
    SIGNAL,
    SLEEP,
    SPAWN_LOCK,
    STEP,
    STEPS,
    WAIT_CHILD,
    WAIT_SIGNAL,
)
from pgqueue._sql.functions import FUNCTIONS
from pgqueue._sql.leases import LEASE, LOCK_LIMIT, RELEASE_LEASES, SEED_LIMIT
from pgqueue._sql.literals import array, claim_places
from pgqueue._sql.outcomes import CHECKPOINT, COMPLETE, FINISH, RESCUE, TOUCH
from pgqueue._sql.periodic import PERIODIC_REGISTER, PERIODIC_TICK
from pgqueue._sql.settings import (
    JIT_BACK,
    JIT_OFF,
    NO_JIT,
    TIMEOUT,
    TIMEOUT_BACK,
    TIMEOUT_SET,
    WORKER_SETTINGS,
)
from pgqueue._sql.trend import TREND_FLUSH, TREND_PRUNE
from pgqueue._store import plan

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
    from datetime import datetime

    from pgqueue._core.options import RateLimit
    from pgqueue._core.outcome import Key, Outcome
    from pgqueue._core.request import Batch, Request
    from pgqueue._sql.filters import Condition
    from pgqueue._store.executor import Connection, Dedicated, Executor

__all__ = [
    "NO_GROUP_LIMIT",
    "Definition",
    "Row",
    "Store",
    "TrendCounts",
    "Turn",
    "bounded_fetch",
    "outcome_args",
    "trend_columns",
]

TrendCounts: TypeAlias = tuple[str, str, int, int, int, int, float, str]
"""One (queue, job type)'s counts since a worker's last trend flush: completed,
failed, dead, runs, the sum of run times and the histogram (JSON text)."""


def trend_columns(rows: Sequence[TrendCounts]) -> tuple[object, ...]:
    """TREND_FLUSH's arrays, one element a row."""
    queues, types, completed, failed, dead, runs, sums, histograms = zip(
        *rows, strict=True
    )
    return (
        list(queues),
        list(types),
        array(completed),
        array(failed),
        array(dead),
        array(runs),
        array(sums),
        list(histograms),
    )


Row = "asyncpg.Record | tuple[Any, ...]"
"""A claimed job's row: its `CLAIM_COLUMNS`, in order."""

Definition = tuple[str, str, str, str, str]
"""A periodic schedule as its row holds it: name, schedule, timezone, queue, job type."""

NO_GROUP_LIMIT = 2**31 - 1
"""A group limit that limits nothing (a per-group rate without a group limit)."""

_GROUP_KEY = len(CLAIM_COLUMNS)  # the column after a claim's own: its group


class Turn(NamedTuple):
    """What a claim under a group or a rate limit took, and what held it up."""

    rows: Sequence[asyncpg.Record | tuple[Any, ...]]
    """The jobs claimed (`CLAIM_COLUMNS`)."""
    rate_wait: float | None
    """Seconds until the rate's window has room again, when the window cut the claim short."""
    waited: float
    """Seconds the claim waited for its queue's turn (another worker's claim held it)."""


class Store:
    """Plain PostgreSQL: one server, the schema's triggers and functions in place."""

    distributed: ClassVar[bool] = False
    """Whether pgqueue's tables are distributed (Citus)."""

    functions: ClassVar[frozenset[str]] = frozenset(FUNCTIONS)
    """The schema's functions (signatures) this kind of server has."""

    copies: ClassVar[bool] = True
    """Whether enqueue_many may COPY a large batch (`pgqueue._copy`) rather
    than take `plan_many`'s statement."""

    @property
    def settings(self) -> dict[str, str]:
        """The startup parameters of the worker's own connections (see `WORKER_SETTINGS`)."""
        return dict(WORKER_SETTINGS)

    # Claims ------------------------------------------------------------------

    async def claim(
        self,
        db: Dedicated,
        queue: str,
        limit: int,
        places: Mapping[int, tuple[datetime, int]],
        types: list[str] | None,
    ) -> Sequence[asyncpg.Record | tuple[Any, ...]]:
        """Claim up to ``limit`` due jobs of ``queue`` in line, from ``places`` (of ``types``, if given)."""
        run_ats, ids = claim_places(places)
        if types is None:
            return await db.fetch(CLAIM, queue, limit, run_ats, ids)
        return await db.fetch(CLAIM_TYPES, queue, limit, run_ats, ids, types)

    async def claim_in_turn(
        self,
        connection: asyncpg.Connection[Any],
        queue: str,
        limit: int,
        places: Mapping[int, tuple[datetime, int]],
        *,
        types: list[str] | None,
        group_limit: int | None,
        rate: RateLimit | None,
    ) -> Turn:
        """Claim up to ``limit`` jobs of ``queue`` under its group or rate limit, in its turn.

        In the claim's transaction (``connection``'s), after the queue's
        claims before it: its turn is taken first.
        """
        asked = time.monotonic()
        await connection.execute(LOCK_CLAIMS, queue)
        waited = time.monotonic() - asked
        if rate is None:
            assert group_limit is not None
            rows = await self._claim_groups(
                connection, queue, limit, group_limit, types
            )
            return Turn(rows, None, waited)
        at, room, wait = await self._rate_room(connection, queue, rate)
        take = min(limit, room)
        rows = []
        if take > 0:
            rows = await self._claim_rated(
                connection, queue, take, places, types, group_limit, rate, at
            )
        # Cut short by the window (it took all the window allowed, or per
        # group, maybe): room comes back once the window's oldest start
        # leaves it (a start since then is newer). In a window that was
        # empty, the oldest start is this claim's own, at ``at``.
        if wait is None and rows:
            wait = rate.per
        rate_wait = None
        if wait is not None and (
            len(rows) == take < limit or (rate.per_group and len(rows) < limit)
        ):
            rate_wait = max(wait, 0.0)
        return Turn(rows, rate_wait, waited)

    async def _claim_groups(
        self,
        connection: asyncpg.Connection[Any],
        queue: str,
        limit: int,
        group_limit: int,
        types: list[str] | None,
    ) -> Sequence[asyncpg.Record | tuple[Any, ...]]:
        """A claim under a group limit only; the groups' heads raised after it."""
        rows = await connection.fetch(CLAIM_GROUPS, queue, limit, group_limit, types)
        return await self._raise_heads(connection, queue, rows)

    async def _rate_room(
        self, connection: asyncpg.Connection[Any], queue: str, rate: RateLimit
    ) -> tuple[datetime, int, float | None]:
        """The rate's window now: its time, the starts it has room for, and when room comes back."""
        window = await connection.fetchrow(
            RATE_ROOM, queue, rate.limit, rate.per, rate.per_group
        )
        assert window is not None
        return window["at"], window["room"], window["wait"]

    # The rated claims (groups, plain, of some types), and whether they
    # record the starts themselves (they then take ``at``).
    _CLAIMS_RATED = (CLAIM_GROUPS_RATED, CLAIM_RATED, CLAIM_TYPES_RATED)
    _RATED_STARTS: ClassVar[bool] = True

    async def _claim_rated(
        self,
        connection: asyncpg.Connection[Any],
        queue: str,
        take: int,
        places: Mapping[int, tuple[datetime, int]],
        types: list[str] | None,
        group_limit: int | None,
        rate: RateLimit,
        at: datetime,
    ) -> Sequence[asyncpg.Record | tuple[Any, ...]]:
        """A claim of at most ``take`` jobs under ``rate``, recording their starts at ``at``."""
        groups, plain, typed = self._CLAIMS_RATED
        if group_limit is not None:
            per_group = rate.limit if rate.per_group else NO_GROUP_LIMIT
            rows = await connection.fetch(
                groups, queue, take, group_limit, types, per_group, rate.per, at
            )
        else:
            run_ats, ids = claim_places(places)
            stamp = (at,) if self._RATED_STARTS else ()
            if types is None:
                rows = await connection.fetch(plain, queue, take, run_ats, ids, *stamp)
            else:
                rows = await connection.fetch(
                    typed, queue, take, run_ats, ids, types, *stamp
                )
        return await self._rated(
            connection, queue, rows, at, grouped=group_limit is not None
        )

    async def _rated(
        self,
        connection: asyncpg.Connection[Any],
        queue: str,
        rows: Sequence[asyncpg.Record | tuple[Any, ...]],
        at: datetime,
        *,
        grouped: bool,
    ) -> Sequence[asyncpg.Record | tuple[Any, ...]]:
        """A rated claim's rows, once what follows it is done: the groups' heads raised."""
        if grouped:
            return await self._raise_heads(connection, queue, rows)
        return rows

    async def _raise_heads(
        self,
        connection: asyncpg.Connection[Any],
        queue: str,
        rows: Sequence[asyncpg.Record | tuple[Any, ...]],
    ) -> list[asyncpg.Record | tuple[Any, ...]]:
        """After a group claim (its rows end with their group): raise the groups' heads; the rows without it."""
        claimed = sorted({row[_GROUP_KEY] for row in rows} - {None})
        await connection.execute(GROUP_HEADS, queue, claimed)
        return [row[:_GROUP_KEY] for row in rows]

    async def next_due(self, db: Dedicated, queue: str) -> float | None:
        """Seconds until the first pending job of ``queue`` not yet due falls due; None if none is.

        On the database clock, from when the statement ran.
        """
        found = await db.fetchrow(NEXT_DUE, queue)
        return None if found is None else float(found[0])

    async def parent_results(
        self, db: Dedicated, children: list[int]
    ) -> tuple[dict[int, str], dict[int, list[int]]]:
        """Each of the claimed jobs ``children``: its parents' results, ``{parent id: result}`` as JSON text.

        And, for each child with some, the ids of its parents whose rows are
        gone (deleted by a Go worker's Prune): their results read as null.
        """
        if not children:
            return {}, {}
        found = await db.fetch(PARENT_RESULTS, array(children))
        pruned = {row[0]: json.loads(row[2]) for row in found if row[2] is not None}
        return {row[0]: row[1] for row in found}, pruned

    # What a worker writes of its runs ------------------------------------------

    def parts(self, outcomes: list[Outcome]) -> list[list[Outcome]]:
        """``outcomes`` in the parts `finish` writes each in one statement."""
        return [outcomes]

    async def finish(self, db: Dedicated, part: list[Outcome]) -> list[asyncpg.Record]:
        """Write ``part``'s outcomes, each fenced on its claimed attempt; the rows written (id, attempts)."""
        completed, args = outcome_args(part)
        return await db.fetch(COMPLETE if completed else FINISH, *args)

    async def checkpoint(
        self, db: Dedicated, job_id: int, attempts: int, queue: str, text: str
    ) -> bool:
        """Store ``text`` as the checkpoint of job ``job_id``; whether the run still held attempt ``attempts``."""
        return await db.fetchrow(CHECKPOINT, job_id, attempts, text) is not None

    # Durable handlers (pgqueue._sql.durable): each write fenced on the run.

    async def steps(
        self, db: Dedicated, steps: Sequence[tuple[int, int, str, str, str]]
    ) -> dict[tuple[int, int], datetime]:
        """Record ``steps`` (job id, attempt, queue, name, result JSON) in one statement.

        Returns when each run's steps were recorded, by (job id, attempt): a
        run missing from it no longer holds its attempt.
        """
        rows = await db.fetch(
            STEPS,
            array(step[0] for step in steps),
            array(step[1] for step in steps),
            [step[3] for step in steps],
            [step[4] for step in steps],
        )
        return {(row["id"], row["attempts"]): row["at"] for row in rows}

    async def sleep(
        self,
        db: Dedicated,
        job_id: int,
        attempts: int,
        queue: str,
        seconds: float | None,
        until: datetime | None,
    ) -> asyncpg.Record | None:
        """End the run until ``until`` (or for ``seconds``); its status and seconds until due."""
        return await db.fetchrow(SLEEP, job_id, attempts, seconds, until)

    async def wait_signal(
        self,
        db: Dedicated,
        job_id: int,
        attempts: int,
        queue: str,
        name: str,
        limit: float | None,
    ) -> asyncpg.Record | None:
        """Take signal ``name``, or record that the wait timed out, or end the run until it comes (``limit`` s at most)."""
        return await db.fetchrow(WAIT_SIGNAL, job_id, attempts, name, limit)

    async def wait_child(
        self,
        db: Dedicated,
        job_id: int,
        attempts: int,
        queue: str,
        child_id: int,
        limit: float | None,
    ) -> asyncpg.Record | None:
        """Take how job ``child_id`` ended, or record that the wait timed out, or end the run until it ends."""
        return await db.fetchrow(WAIT_CHILD, job_id, attempts, child_id, limit)

    async def spawn(
        self,
        db: Dedicated,
        job_id: int,
        attempts: int,
        queue: str,
        name: str,
        enqueue: Callable[[Connection], Awaitable[int]],
    ) -> int | None:
        """The child recorded as step ``name``, else ``enqueue``'s, recorded with it in one transaction.

        None if the run no longer holds its attempt (nothing enqueued).
        """

        async def spawn(connection: Connection) -> int | None:
            row = await connection.fetchrow(SPAWN_LOCK, job_id, attempts, name)
            if row is None:
                return None
            if row["child"] is not None:
                return int(json.loads(row["child"]))
            child = await enqueue(connection)
            await connection.fetchrow(STEP, job_id, attempts, name, str(child))
            return child

        return await db.run_in_transaction(spawn)

    async def progress(
        self,
        db: Dedicated,
        job_id: int,
        attempts: int,
        queue: str,
        fraction: float,
        message: str | None,
    ) -> bool:
        """Store and announce the run's progress; whether the run still held its attempt."""
        return (
            await db.fetchrow(PROGRESS, job_id, attempts, fraction, message) is not None
        )

    async def signal(
        self, executor: Executor, job_id: int, name: str, payload: str
    ) -> bool:
        """Send signal ``name`` with ``payload`` (JSON text) to job ``job_id``; whether it was stored."""
        return bool(await executor.fetchval(SIGNAL, job_id, name, payload))

    async def durable_state(
        self, executor: Executor | Dedicated, job_id: int
    ) -> asyncpg.Record | None:
        """Job ``job_id``'s status, steps, signals, wait and progress (JSON text), or None."""
        return await executor.fetchrow(JOB_STATE, job_id)

    async def touch(
        self, db: Dedicated, keys_by_queue: Mapping[str, list[Key]]
    ) -> list[int]:
        """Heartbeat the claims ``keys_by_queue``; the ids of those whose cancel was requested."""
        keys = sorted(key for keys in keys_by_queue.values() for key in keys)
        if not keys:
            return []
        rows = await db.fetch(
            TOUCH, array(key[0] for key in keys), array(key[1] for key in keys)
        )
        return [row["id"] for row in rows]

    async def rescue(
        self, db: Dedicated, queues: list[str], after: float, batch: int
    ) -> AsyncIterator[dict[str, Counter[str]]]:
        """Rescue the orphans of ``queues`` (no heartbeat for ``after`` s), ``batch`` at a time.

        Yields, for each batch, how many became each status, by queue.
        """
        while True:
            rows = await db.fetch(RESCUE, queues, after, batch)
            swept: dict[str, Counter[str]] = {}
            for row in rows:
                swept.setdefault(row["queue"], Counter())[row["status"]] += 1
            yield swept
            if len(rows) < batch:
                return

    async def sweep(
        self, db: Dedicated, queues: list[str], retain: float, batch: int
    ) -> int:
        """The retention sweep of ``queues``: delete finished rows older than ``retain`` s; how many went."""
        removed, after = 0, 0
        while True:
            _, (row,) = await db.transaction(
                [(NO_JIT, ()), (PRUNE_BATCH, (queues, retain, after, batch))]
            )
            count: int = row["removed"]
            after = row["last_id"]
            removed += count
            if count < batch:
                break
        await self.prune_orphan_edges(db, batch)
        return removed

    async def add_trend(self, db: Dedicated, rows: Sequence[TrendCounts]) -> None:
        """Add a worker's counts to ``pgqueue_trend``, in one statement."""
        await db.fetch(TREND_FLUSH, *trend_columns(rows))

    async def prune_trend(self, db: Dedicated, queues: list[str], kept: float) -> None:
        """Delete ``queues``' trend buckets older than ``kept`` seconds."""
        await db.fetch(TREND_PRUNE, queues, kept)

    async def prune_orphan_edges(self, db: Dedicated | Executor, batch: int) -> int:
        """Delete the edges whose child row is gone (a Go worker's Prune), ``batch`` edges walked at a time; how many went."""
        removed, after = 0, 0
        while True:
            row = await db.fetchrow(PRUNE_ORPHAN_EDGES, after, batch)
            assert row is not None
            count: int = row["removed"]
            removed += count
            after = row["last_id"]
            if row["walked"] < batch:
                return removed

    # Fleet-wide limits ---------------------------------------------------------

    async def lease(
        self,
        db: Dedicated,
        queue: str,
        worker: str,
        *,
        limit: int,
        wanted: int,
        held: int,
        ttl: float,
    ) -> int:
        """Take or renew ``worker``'s lease of ``queue``'s slots; the slots granted.

        Makes the queue's row of ``pgqueue_limits`` if it is missing (the
        worker's first lease, or a row deleted by hand).
        """
        while True:
            results = await db.transaction(
                [
                    (LOCK_LIMIT, (queue,)),
                    (LEASE, (queue, worker, limit, wanted, held, ttl)),
                ],
                stop_if_empty=True,
            )
            if results[0]:
                granted: int = results[1][0][0]
                return granted
            await db.fetch(SEED_LIMIT, queue, limit)

    async def release(self, db: Dedicated, worker: str, queues: list[str]) -> None:
        """Give ``worker``'s leases of ``queues`` back (it has stopped)."""
        await db.fetch(RELEASE_LEASES, worker)

    # Periodic jobs -------------------------------------------------------------

    async def register(
        self, db: Dedicated, definition: Definition, next_tick: datetime, now: datetime
    ) -> None:
        """Register a schedule (see `PERIODIC_REGISTER`)."""
        await db.fetchrow(PERIODIC_REGISTER, *definition, next_tick, now)

    async def tick(
        self,
        db: Dedicated,
        definition: Definition,
        tick: datetime,
        following: datetime,
        now: datetime,
        *,
        payload: str,
        max_attempts: int,
        unique: bool,
        key: str,
    ) -> Mapping[str, Any]:
        """Run ``tick`` of a schedule (see `PERIODIC_TICK`): advanced, done_until and job_id."""
        row = await db.fetchrow(
            PERIODIC_TICK,
            *definition,
            tick,
            following,
            now,
            payload,
            max_attempts,
            unique,
            key,
        )
        assert row is not None
        return dict(row)

    # Enqueues -------------------------------------------------------------------

    def plan_one(
        self,
        queue: str,
        request: Request,
        payload: str,
        trace_context: str | None,
        *,
        notify: bool,
    ) -> plan.Plan:
        """The statement of a single enqueue (`pgqueue._store.plan.plan_one`) on this server."""
        return plan.plan_one(
            queue,
            request,
            payload,
            trace_context,
            notify=notify,
            distributed=self.distributed,
        )

    def plan_many(
        self,
        queue: str,
        batch: Batch,
        payloads: str | Sequence[str],
        trace_context: str | None,
        *,
        notify: bool,
    ) -> plan.Plan:
        """The statement of an enqueue_many (`pgqueue._store.plan.plan_many`) on this server."""
        return plan.plan_many(
            queue,
            batch,
            payloads,
            trace_context,
            notify=notify,
            distributed=self.distributed,
        )

    # Operations on jobs by id --------------------------------------------------

    async def cancel(self, executor: Executor, ids: list[int]) -> dict[int, str]:
        """Cancel the jobs ``ids`` (see `CANCEL`): what became of each."""
        rows = await executor.fetch(CANCEL, array(ids))
        return {row["id"]: row["result"] for row in rows}

    async def retry(
        self,
        executor: Executor,
        ids: list[int],
        attempts: int | None,
        *,
        reset_steps: bool = False,
    ) -> dict[int, str]:
        """Retry the dead and cancelled jobs ``ids`` (see `RETRY`): what became of each.

        On a connection, in a savepoint, so that a conflict can be retried.
        """
        if isinstance(executor, asyncpg.Pool):
            rows = await executor.fetch(RETRY, array(ids), attempts, reset_steps)
        else:
            async with executor.transaction():
                rows = await executor.fetch(RETRY, array(ids), attempts, reset_steps)
        return {row["id"]: row["result"] for row in rows}

    async def redrive(
        self,
        executor: Executor,
        ids: list[int],
        attempts: int | None,
        queue: str,
        *,
        reset_steps: bool = False,
    ) -> dict[int, str]:
        """`retry` of the jobs ``ids`` into ``queue`` (see `REDRIVE`): what became of each."""
        args = (array(ids), attempts, queue, reset_steps)
        if isinstance(executor, asyncpg.Pool):
            rows = await executor.fetch(REDRIVE, *args)
        else:
            async with executor.transaction():
                rows = await executor.fetch(REDRIVE, *args)
        return {row["id"]: row["result"] for row in rows}

    async def move(self, executor: Executor, ids: list[int], queue: str) -> int:
        """Move the jobs ``ids`` that are not running into ``queue`` (see `MOVE`); how many moved.

        On a connection, in a savepoint, so that a conflict can be retried.
        """
        if isinstance(executor, asyncpg.Pool):
            row = await executor.fetchrow(MOVE, array(ids), queue)
        else:
            async with executor.transaction():
                row = await executor.fetchrow(MOVE, array(ids), queue)
        assert row is not None
        return int(row["moved"])

    async def delete(self, executor: Executor, ids: list[int]) -> int:
        """Delete the jobs ``ids`` that are not running (see `DELETE`); how many went."""
        deleted: int = await executor.fetchval(DELETE, array(ids))
        return deleted

    async def update(
        self, executor: Executor, job_id: int, values: tuple[object, ...]
    ) -> asyncpg.Record | None:
        """Change the pending or waiting job ``job_id`` (see `UPDATE`); its row, None if there is none."""
        row: asyncpg.Record | None = await executor.fetchrow(UPDATE, job_id, *values)
        return row

    # The jobs a filter matches -------------------------------------------------

    async def matching_ids(
        self,
        executor: Executor,
        condition: Condition,
        after: int,
        size: int,
        server_timeout: float,
    ) -> list[int]:
        """The next ``size`` ids past ``after`` whose jobs match ``condition``, in id order."""
        rows = await bounded_fetch(
            executor,
            server_timeout,
            matching_ids(condition.text),
            after,
            size,
            *condition.args,
        )
        return [row["id"] for row in rows]

    async def matching_count(
        self,
        executor: Executor,
        condition: Condition,
        limit: int | None,
        server_timeout: float,
    ) -> int:
        """How many jobs match ``condition``, counting at most ``limit``."""
        rows = await bounded_fetch(
            executor,
            server_timeout,
            matching_count(condition.text),
            limit,
            *condition.args,
        )
        return int(rows[0][0])

    async def prune(self, executor: Executor, queue: str, older_than: float) -> int:
        """Delete ``queue``'s finished jobs last updated over ``older_than`` s ago, in one statement."""
        removed: int = await executor.fetchval(PRUNE, queue, older_than)
        return removed

    async def prune_scopes(
        self, executor: Executor, queue: str | None
    ) -> list[str | None]:
        """What `prune_batch` prunes in turn for ``queue`` (None: every queue): here, all at once."""
        return [queue]

    async def prune_batch(
        self,
        executor: Executor,
        queue: str | None,
        older_than: float,
        after: int,
        size: int,
    ) -> tuple[int, int]:
        """At most ``size`` finished jobs past id ``after`` deleted (of ``queue``, or every queue), without JIT.

        Returns how many went and the last id among them. Over a pool or a
        connection outside a transaction, the batch is a transaction of its
        own; inside the caller's, ``jit`` is set back after the batch.
        """
        row = await self._without_jit(
            executor, PRUNE_BATCH_ANY, queue, older_than, after, size
        )
        return int(row["removed"]), int(row["last_id"])

    async def _without_jit(
        self, executor: Executor, statement: str, *args: object
    ) -> asyncpg.Record:
        if isinstance(executor, asyncpg.Pool):
            async with executor.acquire() as connection:
                row: asyncpg.Record = await _fetchrow_without_jit(
                    connection, statement, *args
                )
                return row
        return await _fetchrow_without_jit(executor, statement, *args)


def outcome_args(part: list[Outcome]) -> tuple[bool, tuple[object, ...]]:
    """Whether every outcome of ``part`` completed, and the arguments of COMPLETE (if so) or FINISH.

    ``part`` is sorted by claim first: rows are locked in id order, as the
    heartbeat locks them (two statements locking the same rows in different
    orders deadlock).
    """
    part.sort(key=_KEY)
    ids = array([o.job.id for o in part])
    attempts = array([o.job.attempts for o in part])
    results = [o.result for o in part]
    if all(o.status == OutcomeKind.COMPLETED for o in part):
        return True, (ids, attempts, results)
    statuses = [o.status for o in part]
    delays = array([o.delay for o in part])
    return False, (ids, attempts, statuses, delays, [o.error for o in part], results)


_KEY = operator.attrgetter("key")


async def _fetchrow_without_jit(
    connection: Connection, statement: str, *args: object
) -> asyncpg.Record:
    """``statement``'s row, planned with ``jit`` off on ``connection``, whose setting is kept.

    Outside a transaction, in one of its own with ``SET LOCAL``; inside the
    caller's, ``jit`` is put back afterwards.
    """
    row: asyncpg.Record | None
    if not connection.is_in_transaction():
        async with connection.transaction():
            await connection.execute(NO_JIT)
            row = await connection.fetchrow(statement, *args)
    else:
        was = await connection.fetchval(JIT_OFF)
        try:
            row = await connection.fetchrow(statement, *args)
        finally:
            await connection.execute(JIT_BACK, was)
    assert row is not None
    found: asyncpg.Record = row
    return found


async def bounded_fetch(
    executor: Executor, server_timeout: float, statement: str, *args: object
) -> list[asyncpg.Record]:
    """``statement``'s rows, cancelled by the server after ``server_timeout`` seconds.

    Raises asyncpg's ``QueryCanceledError`` when it runs longer. Over a pool or
    a connection outside a transaction, in a transaction of its own; inside
    the caller's, the setting is put back after it (a statement cancelled
    fails that transaction, whose rollback puts it back).
    """
    setting = f"{max(1, round(server_timeout * 1000))}ms"
    if isinstance(executor, asyncpg.Pool):
        async with executor.acquire() as connection:
            return await _fetch_bounded(connection, setting, statement, *args)
    return await _fetch_bounded(executor, setting, statement, *args)


async def _fetch_bounded(
    connection: Connection, setting: str, statement: str, *args: object
) -> list[asyncpg.Record]:
    if not connection.is_in_transaction():
        async with connection.transaction():
            await connection.execute(TIMEOUT, setting)
            return await connection.fetch(statement, *args)
    was = await connection.fetchval(TIMEOUT_SET, setting)
    rows = await connection.fetch(statement, *args)
    await connection.execute(TIMEOUT_BACK, was)
    return rows
