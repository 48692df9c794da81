"""The store of a distributed schema (Citus): each queue's rows on its shard.

Every write names its queue, so that Citus routes it to one shard (a write
without it goes to every shard, with a two-phase commit): the calls that
give only ids look the ids' queues up first, and a batch of many queues
is written one statement a queue. Wakeups and announcements are sent from
the coordinator, where the workers listen, in statements of their own.
Statements Citus refuses whole run as steps in one transaction.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pgqueue._sql.admin import (
    DISTRIBUTED_CANCEL,
    DISTRIBUTED_PRUNE,
    DISTRIBUTED_PRUNE_BATCH,
    DISTRIBUTED_RETRY,
    FINISHED_QUEUES,
    QUEUES_OF,
)
from pgqueue._sql.bulk import DISTRIBUTED_DELETE, DISTRIBUTED_UPDATE
from pgqueue._sql.channels import ANNOUNCE, JOBS_CHANNEL, NOTIFY
from pgqueue._sql.claims import (
    CLAIM_COLUMNS,
    CLOCK,
    DISTRIBUTED_CLAIM,
    DISTRIBUTED_CLAIM_GROUPS,
    DISTRIBUTED_CLAIM_GROUPS_RATED,
    DISTRIBUTED_CLAIM_RATED,
    DISTRIBUTED_CLAIM_TYPES,
    DISTRIBUTED_CLAIM_TYPES_RATED,
    DISTRIBUTED_CLAIM_ZERO,
    DISTRIBUTED_CLAIM_ZERO_TYPES,
    DISTRIBUTED_RATE_ROOM,
    DISTRIBUTED_RECORD_START,
)
from pgqueue._sql.durable import (
    DISTRIBUTED_PROGRESS,
    DISTRIBUTED_SPAWN_LOCK,
    DISTRIBUTED_STEP,
    PROGRESS_CHANNEL,
)
from pgqueue._sql.durable_distributed import (
    CHILD_WAITERS,
    DISTRIBUTED_MARK_CHILD,
    DISTRIBUTED_SLEEP,
    DISTRIBUTED_WAIT_CHILD,
    DISTRIBUTED_WAIT_SIGNAL,
    DISTRIBUTED_WAKE_WAITERS,
    LIVE_OF,
    PARKED_ON_CHILDREN,
)
from pgqueue._sql.enqueue import NOTIFY_JOBS
from pgqueue._sql.functions import FUNCTIONS
from pgqueue._sql.leases import (
    DISTRIBUTED_LEASE_EXPIRE,
    DISTRIBUTED_LEASE_GRANT,
    DISTRIBUTED_LEASE_WRITE,
    DISTRIBUTED_RELEASE_LEASE,
    LOCK_LIMIT,
    SEED_LIMIT,
)
from pgqueue._sql.literals import array, claim_places
from pgqueue._sql.outcomes import (
    DISTRIBUTED_CHECKPOINT,
    DISTRIBUTED_COMPLETE,
    DISTRIBUTED_FINISH,
    DISTRIBUTED_RESCUE,
    DISTRIBUTED_TOUCH,
)
from pgqueue._sql.periodic import (
    DISTRIBUTED_PERIODIC_REGISTER,
    DISTRIBUTED_TICK_ADVANCE,
    DISTRIBUTED_TICK_JOB,
    DISTRIBUTED_TICK_LIVE,
    DISTRIBUTED_TICK_NEW,
    DISTRIBUTED_TICK_SEEN,
)
from pgqueue._sql.schema import SCHEMA_DISTRIBUTED
from pgqueue._sql.trend import (
    DISTRIBUTED_TREND_ADD,
    DISTRIBUTED_TREND_LOCK,
    DISTRIBUTED_TREND_MINUTE,
    DISTRIBUTED_TREND_NEW,
    DISTRIBUTED_TREND_PRUNE,
)
from pgqueue._store.postgres import Store, outcome_args

if TYPE_CHECKING:
    from collections.abc import (
        AsyncIterator,
        Awaitable,
        Callable,
        Iterable,
        Mapping,
        Sequence,
    )
    from datetime import datetime

    import asyncpg

    from pgqueue._core.options import RateLimit
    from pgqueue._core.outcome import Key, Outcome
    from pgqueue._store.executor import Connection, Dedicated, Executor
    from pgqueue._store.postgres import Definition, TrendCounts

__all__ = ["CitusStore"]

T = TypeVar("T")

# The column after a claim's own: whether the queue had jobs with a
# priority pending (DISTRIBUTED_CLAIM), or a rated claim's group.
_EXTRA = len(CLAIM_COLUMNS)


class CitusStore(Store):
    """A distributed schema on a Citus coordinator: no triggers, no dependencies, no group heads.

    Durable handlers run there whole: each write of a run on its job's
    shard; a signal through ``pgqueue_signal`` (the job's queue looked up
    first); a job waiting for a child woken by the writes that end the
    child (outcomes, the rescue sweep, cancels), with the rescue sweep as
    the safety net of any end that sends no wakeup.

    Connections plan every statement again (Citus cannot plan them
    generically), so the worker's own carry no startup settings.
    """

    distributed: ClassVar[bool] = True
    functions: ClassVar[frozenset[str]] = frozenset(
        signature
        for signature in FUNCTIONS
        if f"CREATE OR REPLACE FUNCTION {signature.partition('(')[0]}("
        in SCHEMA_DISTRIBUTED
    )
    """Those `SCHEMA_DISTRIBUTED` creates: no triggers, no keyed replace, no ``after=``."""

    copies: ClassVar[bool] = False
    """A COPY into a distributed table is a two-phase commit: `plan_many`'s
    INSERTs of one queue's rows are not (one shard, one node)."""

    def __init__(self) -> None:
        # By queue: whether its last claim saw jobs with a priority pending.
        self._prioritized: dict[str, bool] = {}

    @property
    def settings(self) -> dict[str, str]:
        """None: Citus plans each statement with its values."""
        return {}

    async def claim(
        self,
        db: Dedicated,
        queue: str,
        limit: int,
        places: Mapping[int, tuple[datetime, int]],
        types: list[str] | None,
    ) -> Sequence[asyncpg.Record | tuple[Any, ...]]:
        """A claim of priority 0's line only, while the queue's last claim saw no other priority pending.

        A job with a priority that commits during a drain is seen by the
        next claim and taken by the one after it. An empty claim says
        nothing (it may have been of priority 0 only): the next looks at
        every priority.
        """
        run_ats, ids = claim_places(places)
        prioritized = self._prioritized.get(queue, True)
        if types is None:
            statement = DISTRIBUTED_CLAIM if prioritized else DISTRIBUTED_CLAIM_ZERO
            rows = await db.fetch(statement, queue, limit, run_ats, ids)
        else:
            statement = (
                DISTRIBUTED_CLAIM_TYPES if prioritized else DISTRIBUTED_CLAIM_ZERO_TYPES
            )
            rows = await db.fetch(statement, queue, limit, run_ats, ids, types)
        self._prioritized[queue] = not rows or rows[0][_EXTRA]
        return [row[:_EXTRA] for row in rows]

    async def _claim_groups(
        self,
        connection: asyncpg.Connection[Any],
        queue: str,
        limit: int,
        group_limit: int,
        types: list[str] | None,
    ) -> Sequence[asyncpg.Record | tuple[Any, ...]]:
        """The groups found by a skip scan (no heads on Citus)."""
        return await connection.fetch(
            DISTRIBUTED_CLAIM_GROUPS, queue, limit, group_limit, types
        )

    async def _rate_room(
        self, connection: asyncpg.Connection[Any], queue: str, rate: RateLimit
    ) -> tuple[datetime, int, float | None]:
        """The window at the clock's time, read first (Citus refuses it inside the statement)."""
        at = await connection.fetchval(CLOCK)
        window = await connection.fetchrow(
            DISTRIBUTED_RATE_ROOM, queue, rate.limit, rate.per, rate.per_group, at
        )
        assert window is not None
        return window["at"], window["room"], window["wait"]

    _CLAIMS_RATED = (
        DISTRIBUTED_CLAIM_GROUPS_RATED,
        DISTRIBUTED_CLAIM_RATED,
        DISTRIBUTED_CLAIM_TYPES_RATED,
    )
    _RATED_STARTS: ClassVar[bool] = False

    async def _rated(
        self,
        connection: asyncpg.Connection[Any],
        queue: str,
        rows: Sequence[asyncpg.Record | tuple[Any, ...]],
        at: datetime,
        *,
        grouped: bool,
    ) -> Sequence[asyncpg.Record | tuple[Any, ...]]:
        """The rated claim's starts recorded after it, one row a statement."""
        if rows:
            await connection.executemany(
                DISTRIBUTED_RECORD_START, [(queue, row[_EXTRA], at) for row in rows]
            )
        return [row[:_EXTRA] for row in rows]

    def parts(self, outcomes: list[Outcome]) -> list[list[Outcome]]:
        """One part per queue: each is written on its queue's shard."""
        return list(_grouped(outcomes, lambda outcome: outcome.job.queue).values())

    async def finish(self, db: Dedicated, part: list[Outcome]) -> list[asyncpg.Record]:
        """The outcomes of one queue's runs; tracked jobs that ended are announced after."""
        completed, args = outcome_args(part)
        statement = DISTRIBUTED_COMPLETE if completed else DISTRIBUTED_FINISH
        rows = await db.fetch(statement, *args, part[0].job.queue)
        await _announce(db, rows)
        await _wake_waiters(db, rows)
        return rows

    async def checkpoint(
        self, db: Dedicated, job_id: int, attempts: int, queue: str, text: str
    ) -> bool:
        """The checkpoint, on its queue's shard."""
        row = await db.fetchrow(DISTRIBUTED_CHECKPOINT, job_id, attempts, text, queue)
        return row is not None

    async def step(
        self,
        db: Dedicated,
        job_id: int,
        attempts: int,
        queue: str,
        name: str,
        text: str,
    ) -> datetime | None:
        """Record step ``name`` of the run on its queue's shard; when, or None if the run no longer holds its attempt."""
        row = await db.fetchrow(DISTRIBUTED_STEP, job_id, attempts, name, text, queue)
        return None if row is None else row["at"]

    async def steps(
        self, db: Dedicated, steps: Sequence[tuple[int, int, str, str, str]]
    ) -> dict[tuple[int, int], datetime]:
        """Each step on its queue's shard, a statement each."""
        recorded = {}
        for job_id, attempts, queue, name, text in steps:
            at = await self.step(db, job_id, attempts, queue, name, text)
            if at is not None:
                recorded[job_id, attempts] = at
        return recorded

    async def progress(
        self,
        db: Dedicated,
        job_id: int,
        attempts: int,
        queue: str,
        fraction: float,
        message: str | None,
    ) -> bool:
        """The progress, on its queue's shard; announced from the coordinator."""
        row = await db.fetchrow(
            DISTRIBUTED_PROGRESS, job_id, attempts, fraction, message, queue
        )
        if row is None:
            return False
        await db.fetch(NOTIFY, [PROGRESS_CHANNEL], [row["announced"]])
        return True

    async def sleep(
        self,
        db: Dedicated,
        job_id: int,
        attempts: int,
        queue: str,
        seconds: float | None,
        until: datetime | None,
    ) -> asyncpg.Record | None:
        """SLEEP on the job's shard."""
        row = await db.fetchrow(
            DISTRIBUTED_SLEEP, job_id, attempts, seconds, until, queue
        )
        return await _suspended(db, job_id, row)

    async def wait_signal(
        self,
        db: Dedicated,
        job_id: int,
        attempts: int,
        queue: str,
        name: str,
        limit: float | None,
    ) -> asyncpg.Record | None:
        """WAIT_SIGNAL on the job's shard (its signals are on its row)."""
        row = await db.fetchrow(
            DISTRIBUTED_WAIT_SIGNAL, job_id, attempts, name, limit, queue
        )
        return await _suspended(db, job_id, row)

    async def wait_child(
        self,
        db: Dedicated,
        job_id: int,
        attempts: int,
        queue: str,
        child_id: int,
        limit: float | None,
    ) -> asyncpg.Record | None:
        """WAIT_CHILD in two steps of one transaction: the child marked on its shard, then the wait on the job's.

        A child in a queue on another node makes it a two-phase commit.
        The child's end wakes the job (`finish`, `rescue`, `cancel`; the
        rescue sweep finds any other).
        """

        async def steps(connection: asyncpg.Connection[Any]) -> asyncpg.Record | None:
            for child_queue in await _by_queue(connection, [child_id]):
                child = await connection.fetchrow(
                    DISTRIBUTED_MARK_CHILD, child_id, child_queue
                )
                if child is None:  # deleted meanwhile
                    return None
                ended = (
                    (child["status"], child["result"], child["last_error"])
                    if child["ended"]
                    else (None, None, None)
                )
                # The child's id as text: the statement's first use of it.
                return await connection.fetchrow(
                    DISTRIBUTED_WAIT_CHILD,
                    job_id,
                    attempts,
                    str(child_id),
                    limit,
                    queue,
                    *ended,
                )
            return None

        return await _suspended(db, job_id, await db.run_in_transaction(steps))

    async def spawn(
        self,
        db: Dedicated,
        job_id: int,
        attempts: int,
        queue: str,
        name: str,
        enqueue: Callable[[Connection], Awaitable[int]],
    ) -> int | None:
        """As plain PostgreSQL's, on the job's shard; a child in a queue on another node makes it a two-phase commit."""

        async def spawn(connection: Connection) -> int | None:
            row = await connection.fetchrow(
                DISTRIBUTED_SPAWN_LOCK, job_id, attempts, name, queue
            )
            if row is None:
                return None
            if row["child"] is not None:
                return int(json.loads(row["child"]))
            child = await enqueue(connection)
            await connection.fetchrow(
                DISTRIBUTED_STEP, job_id, attempts, name, str(child), queue
            )
            return child

        return await db.run_in_transaction(spawn)

    async def add_trend(self, db: Dedicated, rows: Sequence[TrendCounts]) -> None:
        """Row by row on the queue's shard, a transaction per queue (see DISTRIBUTED_TREND_NEW)."""

        async def add(
            connection: asyncpg.Connection[Any], part: list[TrendCounts]
        ) -> None:
            minute = await connection.fetchval(DISTRIBUTED_TREND_MINUTE)
            for queue, job_type, *counts, histogram in part:
                key = (queue, job_type, minute)
                while True:
                    found = await connection.fetchrow(DISTRIBUTED_TREND_LOCK, *key)
                    if found is not None:
                        merged = _merged(found["run_times"], histogram)
                        await connection.execute(
                            DISTRIBUTED_TREND_ADD, *key, *counts, merged
                        )
                        break
                    if await connection.fetchval(
                        DISTRIBUTED_TREND_NEW, *key, *counts, histogram
                    ):
                        break

        for part in _grouped(rows, lambda row: row[0]).values():
            await db.run_in_transaction(partial(add, part=part))

    async def prune_trend(self, db: Dedicated, queues: list[str], kept: float) -> None:
        """One statement per queue, on its shard."""
        for queue in queues:
            await db.fetch(DISTRIBUTED_TREND_PRUNE, queue, kept)

    async def touch(
        self, db: Dedicated, keys_by_queue: Mapping[str, list[Key]]
    ) -> list[int]:
        """The heartbeat: one statement per queue, on its shard."""
        cancelled: list[int] = []
        for queue, unsorted in keys_by_queue.items():
            keys = sorted(unsorted)
            if keys:
                rows = await db.fetch(
                    DISTRIBUTED_TOUCH,
                    array(key[0] for key in keys),
                    array(key[1] for key in keys),
                    queue,
                )
                cancelled += [row["id"] for row in rows]
        return cancelled

    async def rescue(
        self, db: Dedicated, queues: list[str], after: float, batch: int
    ) -> AsyncIterator[dict[str, Counter[str]]]:
        """The rescue sweep queue by queue; tracked jobs that ended are announced after.

        Then the queue's jobs parked for a child that has ended, or whose
        row is gone, are woken: the safety net of the wakeups a child's end
        sends (a Go worker's outcome, `Admin.delete`, a wait that parked on
        another node while the child ended there, send none).
        """
        for queue in queues:
            while True:
                rows = await db.fetch(DISTRIBUTED_RESCUE, queue, after, batch)
                statuses: Counter[str] = Counter(row["status"] for row in rows)
                await _announce(db, rows)
                await _wake_waiters(db, rows)
                yield {queue: statuses} if statuses else {}
                if len(rows) < batch:
                    break
            parked = await db.fetch(PARKED_ON_CHILDREN, queue)
            if parked:
                children = sorted({row["child"] for row in parked})
                found = await db.fetch(LIVE_OF, array(int(child) for child in children))
                live = {row["id"] for row in found}
                await _wake(
                    db, [row for row in parked if row["child"] not in live], queue
                )

    async def sweep(
        self, db: Dedicated, queues: list[str], retain: float, batch: int
    ) -> int:
        """The retention sweep queue by queue, each on its shard."""
        removed = 0
        for queue in queues:
            after = 0
            while True:
                row = await db.fetchrow(
                    DISTRIBUTED_PRUNE_BATCH, queue, retain, after, batch
                )
                assert row is not None
                count: int = row["removed"]
                after = row["last_id"]
                removed += count
                if count < batch:
                    break
        return removed

    async def prune_orphan_edges(self, db: Dedicated | Executor, batch: int) -> int:
        """Nothing: no dependencies on Citus."""
        return 0

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
        """LEASE in steps, in the transaction that holds the queue's row, each on its shard."""

        async def steps(connection: asyncpg.Connection[Any]) -> int | None:
            if not await connection.fetch(LOCK_LIMIT, queue):
                return None
            await connection.execute(DISTRIBUTED_LEASE_EXPIRE, queue, worker)
            granted: int = await connection.fetchval(
                DISTRIBUTED_LEASE_GRANT, queue, worker, limit, wanted
            )
            await connection.execute(
                DISTRIBUTED_LEASE_WRITE, queue, worker, max(granted, held), wanted, ttl
            )
            return granted

        while True:
            granted = await db.run_in_transaction(steps)
            if granted is not None:
                return granted
            await db.fetch(SEED_LIMIT, queue, limit)

    async def release(self, db: Dedicated, worker: str, queues: list[str]) -> None:
        """Each queue's lease given back on its shard."""
        for queue in queues:
            await db.fetch(DISTRIBUTED_RELEASE_LEASE, queue, worker)

    async def register(
        self, db: Dedicated, definition: Definition, next_tick: datetime, now: datetime
    ) -> None:
        """PERIODIC_REGISTER as Citus allows it (no now() in its update)."""
        await db.fetchrow(DISTRIBUTED_PERIODIC_REGISTER, *definition, next_tick, now)

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
        """PERIODIC_TICK's answer in steps in one transaction (see ``DISTRIBUTED_TICK_SEEN``)."""
        name, _, _, queue, job_type = definition

        async def steps(connection: asyncpg.Connection[Any]) -> dict[str, Any]:
            seen = await connection.fetchrow(DISTRIBUTED_TICK_SEEN, name)
            done_until = None
            live = False
            if seen is None:
                made = await connection.fetchrow(
                    DISTRIBUTED_TICK_NEW, *definition, tick, following, now
                )
                if made is None:  # another scheduler made it first: read it again
                    return {"advanced": False, "done_until": None, "job_id": None}
            else:
                done_until = seen["last_tick"] or seen["created_at"]
                if done_until >= tick:
                    return {"advanced": False, "done_until": done_until, "job_id": None}
                # Only the schedule's own last job counts (by its id), never
                # another job carrying its key; a row from before
                # last_job_id, by its key.
                live = (
                    unique
                    and (
                        seen["last_job_id"] is not None
                        or seen["last_job_key"] is not None
                    )
                    and await connection.fetchval(
                        DISTRIBUTED_TICK_LIVE,
                        queue,
                        job_type,
                        seen["last_job_key"],
                        seen["last_job_id"],
                    )
                )
            job_id = None
            if not live:
                job_id = await connection.fetchval(
                    DISTRIBUTED_TICK_JOB, queue, job_type, payload, max_attempts, key
                )
                if job_id is not None:
                    await connection.execute(NOTIFY_JOBS, queue)
            await connection.execute(
                DISTRIBUTED_TICK_ADVANCE,
                name,
                tick,
                following,
                None if live else key,
                job_id,
            )
            return {"advanced": True, "done_until": done_until, "job_id": job_id}

        return await db.run_in_transaction(steps)

    async def cancel(self, executor: Executor, ids: list[int]) -> dict[int, str]:
        """The ids' queues looked up, then one statement per queue, on its shard.

        The NOTIFYs (control requests, tracked outcomes) go from the
        coordinator. Each queue's statement commits by itself unless
        ``executor`` is a connection in a transaction.
        """
        done = dict.fromkeys(ids, "not_found")
        channels: list[str] = []
        payloads: list[str] = []
        waited: list[asyncpg.Record] = []
        for queue, queued in (await _by_queue(executor, ids)).items():
            rows = await executor.fetch(DISTRIBUTED_CANCEL, array(queued), queue)
            for row in rows:
                done[row["id"]] = row["result"]
                if row["channel"] is not None:
                    channels.append(row["channel"])
                    payloads.append(str(row["id"]))
            waited += rows
        if channels:
            await executor.execute(NOTIFY, channels, payloads)
        await _wake_waiters(executor, waited)
        return done

    async def retry(
        self,
        executor: Executor,
        ids: list[int],
        attempts: int | None,
        *,
        reset_steps: bool = False,
    ) -> dict[int, str]:
        """As `cancel`, waking each queue with a job retried."""
        done = dict.fromkeys(ids, "not_found")
        woken: list[str] = []
        for queue, queued in (await _by_queue(executor, ids)).items():
            rows = await executor.fetch(
                DISTRIBUTED_RETRY, array(queued), attempts, queue, reset_steps
            )
            for row in rows:
                done[row["id"]] = row["result"]
            if any(row["result"] == "retried" for row in rows):
                woken.append(queue)
        if woken:
            await executor.execute(NOTIFY, [JOBS_CHANNEL] * len(woken), woken)
        return done

    async def redrive(
        self,
        executor: Executor,
        ids: list[int],
        attempts: int | None,
        queue: str,
        *,
        reset_steps: bool = False,
    ) -> dict[int, str]:
        """Refused: Citus distributes the jobs by queue, and a row cannot change its shard."""
        raise _no_move()

    async def move(self, executor: Executor, ids: list[int], queue: str) -> int:
        """Refused, as `redrive` into another queue."""
        raise _no_move()

    async def delete(self, executor: Executor, ids: list[int]) -> int:
        """One statement per queue, on its shard (no dependencies to keep)."""
        deleted = 0
        for queue, queued in (await _by_queue(executor, ids)).items():
            deleted += await executor.fetchval(DISTRIBUTED_DELETE, array(queued), queue)
        return deleted

    async def update(
        self, executor: Executor, job_id: int, values: tuple[object, ...]
    ) -> asyncpg.Record | None:
        """The job's queue looked up, then the update on its shard; the wakeup from the coordinator."""
        for queue in await _by_queue(executor, [job_id]):
            row = await executor.fetchrow(DISTRIBUTED_UPDATE, job_id, *values, queue)
            if row is not None and row["wake"]:
                await executor.execute(NOTIFY, [JOBS_CHANNEL], [queue])
            return row
        return None

    async def prune(self, executor: Executor, queue: str, older_than: float) -> int:
        """Retention of one queue, on its shard (no dependencies to keep)."""
        removed: int = await executor.fetchval(DISTRIBUTED_PRUNE, queue, older_than)
        return removed

    async def prune_scopes(
        self, executor: Executor, queue: str | None
    ) -> list[str | None]:
        """Queue by queue: every queue with finished jobs, or ``queue``."""
        if queue is not None:
            return [queue]
        return [row["queue"] for row in await executor.fetch(FINISHED_QUEUES)]

    async def prune_batch(
        self,
        executor: Executor,
        queue: str | None,
        older_than: float,
        after: int,
        size: int,
    ) -> tuple[int, int]:
        """A batch of one queue's retention, on its shard."""
        row = await self._without_jit(
            executor, DISTRIBUTED_PRUNE_BATCH, queue, older_than, after, size
        )
        return int(row["removed"]), int(row["last_id"])


def _grouped(items: Iterable[T], queue_of: Callable[[T], str]) -> dict[str, list[T]]:
    """``items`` by queue, queues and items in the order first seen."""
    grouped: dict[str, list[T]] = {}
    for item in items:
        grouped.setdefault(queue_of(item), []).append(item)
    return grouped


def _merged(stored: str | None, added: str) -> str:
    """Two trend histograms (JSON text: bucket -> count) as one."""
    counts: Counter[str] = Counter(json.loads(stored) if stored else {})
    counts.update(json.loads(added))
    return json.dumps(counts)


def _no_move() -> ValueError:
    return ValueError(
        "on Citus a job cannot move to another queue: the jobs are distributed by queue"
    )


async def _announce(db: Dedicated, rows: Sequence[asyncpg.Record]) -> None:
    """Announce on the coordinator the tracked jobs that ended (their rows say ``ended``)."""
    ended = [str(row["id"]) for row in rows if row["ended"]]
    if ended:
        await db.fetch(ANNOUNCE, ended)


async def _by_queue(executor: Executor, ids: list[int]) -> dict[str, list[int]]:
    """The jobs ``ids`` that have a row, by queue (one read of every shard)."""
    rows = await executor.fetch(QUEUES_OF, array(ids))
    return {
        queue: [row["id"] for row in found]
        for queue, found in _grouped(rows, lambda row: row["queue"]).items()
    }


async def _suspended(
    db: Dedicated, job_id: int, row: asyncpg.Record | None
) -> asyncpg.Record | None:
    """A suspending write's row, once a tracked job it cancelled (its cancel was requested) is announced."""
    if row is not None and row["ended"]:
        await db.fetch(ANNOUNCE, [str(job_id)])
    return row


async def _wake_waiters(
    executor: Executor | Dedicated, rows: Sequence[asyncpg.Record]
) -> None:
    """Wake the jobs that wait (`pgqueue.Job.wait_child`) for those of ``rows`` that ended (``waited``)."""
    ended = [str(row["id"]) for row in rows if row["waited"]]
    if ended:
        await _wake(executor, await executor.fetch(CHILD_WAITERS, ended))


async def _wake(
    executor: Executor | Dedicated,
    waiters: Sequence[asyncpg.Record],
    queue: str | None = None,
) -> None:
    """Make ``waiters`` (id, child, and queue unless ``queue``) pending, due now, on their shards; each queue woken from the coordinator."""
    woken = [
        name
        for name, rows in _grouped(waiters, lambda row: queue or row["queue"]).items()
        if await executor.fetch(
            DISTRIBUTED_WAKE_WAITERS,
            name,
            array(row["id"] for row in rows),
            [row["child"] for row in rows],
        )
    ]
    if woken:
        await executor.fetch(NOTIFY, [JOBS_CHANNEL] * len(woken), woken)
