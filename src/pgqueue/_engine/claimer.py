"""The claim loop: claims jobs into the ledger whenever the policy says so."""

from __future__ import annotations

import asyncio
import json
import operator
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio

from pgqueue._core.errors import describe, is_transient
from pgqueue._core.job import NO_PARENTS, NO_STEPS, Job, claimed_job, stored_steps
from pgqueue._core.lifecycle import OutcomeKind
from pgqueue._core.outcome import Outcome
from pgqueue._core.retry import MAX_RETRY_WAIT, Failures
from pgqueue._engine.lease import take
from pgqueue._engine.runner import job_fields, job_label
from pgqueue._sql.claims import CLAIM_COLUMNS
from pgqueue._store.postgres import NO_GROUP_LIMIT
from pgqueue._store.schema import SCHEMA_ERRORS, check_schema, schema_failure

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping, Sequence

    import asyncpg

    from pgqueue._core.options import LaneSettings, WorkerOptions
    from pgqueue._engine.lease import Lease
    from pgqueue._engine.ledger import Claims
    from pgqueue._engine.policy import Bounds, ClaimPolicy
    from pgqueue._engine.services import LaneServices
    from pgqueue._store.postgres import Turn

__all__ = ["Claimed", "Claimer", "jobs_from_rows"]


@dataclass(eq=False)
class Claimer:
    """Claim jobs into ``claims`` when ``policy`` says so, until cancelled.

    Claims run on a connection of their own and are never cancelled in
    flight (the server may commit a claim the client gave up on, leaving
    jobs nobody runs until rescue); each is bounded by the connection's
    statement deadline instead. Failures are retried with the retry-delay
    rule, capped at ``poll_interval``. A missing table or column raises
    `SchemaError`.

    A worker of several queues has one claimer per queue, sharing the claim
    connection (their claims take turns on it).

    Args:
        services: the worker's: claims run on its ``connection`` and take
            only its ``types``; ``put`` takes the outcome of each claimed
            job that cannot run (dead: a payload or time Python cannot
            represent; or released when its parents' results could not be
            read); its ``budget``, the overall cap
            shared with the other queues' claimers, if any: a claim takes
            no more than it allows, and holds its slots while in flight.
        settings: the queue to claim from, and its limits: with a group
            limit, every job that ends calls for a claim (it may have freed
            its group); with a rate limit, each claim first counts the
            starts in the window, takes no more than it leaves and records
            its own, and with the window full the claimer sleeps until its
            oldest start leaves it.
        options: the worker's options (``poll_interval`` caps the retry
            delay; with a ``global_limit`` on any queue the schema check
            requires the fleet-wide limits' tables).
        on_claimed: called with the jobs ready to run after each claim.
        on_spare: called after a claim that took fewer jobs than the budget
            held for it (the other queues may claim them).
        schema_checked: set once another claimer has checked the schema;
            with it, this one waits for that instead of checking too.
        lease: the worker's lease of the queue's slots, if the queue has a
            fleet-wide limit: taken before the first claim, and claims take
            no more than it leaves.

    The claims themselves are the store's (`pgqueue._store`): under a group
    or a rate limit, claims of the queue take turns across the fleet.
    """

    services: LaneServices
    policy: ClaimPolicy
    claims: Claims
    settings: LaneSettings
    options: WorkerOptions
    _: KW_ONLY
    on_claimed: Callable[[], None]
    on_spare: Callable[[], None] | None = None
    schema_checked: anyio.Event | None = None
    lease: Lease | None = None

    def __post_init__(self) -> None:
        # The schema check then requires the fleet-wide limits' tables.
        self._needs_limits = self.lease is not None or bool(self.options.limits())
        # Per-group rates need the group claim (no limit of running jobs).
        settings = self.settings
        rate_limit = settings.rate_limit
        self._group_claim = (
            NO_GROUP_LIMIT
            if settings.group_limit is None
            and rate_limit is not None
            and rate_limit.per_group
            else settings.group_limit
        )
        self._rate_wait: float | None = None  # set by a claim the rate cut short
        self._event = asyncio.Event()
        self._until_empty = False
        self.checked = anyio.Event()
        """Set once the schema has been checked (the worker is ready to claim)."""

    def wake(self) -> None:
        """Jobs may be ready: claim as soon as there is room."""
        self.policy.wake()
        self._event.set()

    def nudge(self) -> None:
        """A timer changed: look again."""
        self._event.set()

    def _free(self) -> int:
        """How many jobs a claim may take now (and, claiming ahead, the batch worth claiming).

        Under a fleet-wide limit, no more than the worker's lease leaves.
        """
        claims = self.claims
        if (claim_at := claims.claim_at) is not None:
            self.policy.claim_at = claim_at
        free = claims.free
        if self.services.budget is not None:
            free = min(free, self.services.budget.free)
        if self.lease is not None:
            free = min(free, self.lease.free(anyio.current_time()))
        return free

    def room(self) -> None:
        """Claims ended or settled: claim if jobs may be ready and a claim is worth it."""
        if self._group_claim is not None:
            self.policy.wake()  # an ended job may have made room in its group
        free = self._free()
        if (self.policy.more and free >= self.policy.claim_at) or (
            self._until_empty and self.claims.held == 0
        ):
            self._event.set()

    async def run(self, *, until_empty: bool = False) -> None:
        """Check the schema, then claim until cancelled.

        With ``until_empty``, return once no job is ready and none is held:
        after a claim that came back empty with every outcome durable and
        none settled since it began (a retry written meanwhile may be due).

        Raises:
            SchemaError: the table or a column is missing.
        """
        self._until_empty = until_empty
        if self.schema_checked is None:
            await self._retrying("schema check", self._check_schema)
        else:
            await self.schema_checked.wait()
        if self.lease is not None:
            await self._retrying(
                "taking a lease of the queue's slots", self._take_lease
            )
        self.checked.set()
        clock = asyncio.get_running_loop().time
        policy, claims = self.policy, self.claims
        empty_since: int | None = None  # settled_count when an empty claim began
        failures = Failures(
            self.services.logger,
            "claim failed; retrying",
            cap=self._retry_cap,
            fields={"queue": self.settings.name},
            quiet=True,
        )
        while True:
            now = clock()
            free = self._free()
            decision = policy.next_claim(free, now)
            if decision is None:
                # (free is short of a claim only when the budget is spent:
                # this queue holds nothing, so its own slots are all free.)
                if until_empty and claims.held == 0 and free >= policy.claim_at:
                    if empty_since == claims.settled_count:
                        return
                    policy.wake()
                    continue
                self._event.clear()
                with anyio.move_on_after(policy.wait(now)):
                    await self._event.wait()
                continue
            limit, bounds = decision
            settled_before = claims.settled_count
            try:
                rows, parents = await self._claim(limit, bounds)
            except UnreadParents as unread:
                # Claimed, but their parents' results could not be read: given
                # back at once (no attempt used), not left running until rescue.
                unrun = jobs_from_rows(unread.rows)
                for outcome in [
                    *unrun.dead,
                    *(Outcome(job, OutcomeKind.RELEASED) for job in unrun.jobs),
                ]:
                    claims.add([outcome.job], ready=False)
                    self.services.put(outcome)
                wait = failures.failed(unread.error)
                policy.failed()
                await anyio.sleep(wait)
                continue
            except SCHEMA_ERRORS as exc:
                # Says what is missing.
                raise await schema_failure(
                    self.services.connection, describe(exc), limits=self._needs_limits
                ) from exc
            except Exception as exc:
                wait = failures.failed(exc)
                policy.failed()
                if self.on_spare is not None:
                    self.on_spare()
                await anyio.sleep(wait)
                continue
            failures.succeeded()
            claims.backlog = len(rows) >= limit
            claimed = jobs_from_rows(rows, parents)
            for outcome in claimed.dead:
                self.services.logger.error(
                    "%s dead: %s",
                    job_label(outcome.job),
                    outcome.error,
                    extra={**job_fields(outcome.job), "error": outcome.error},
                )
                claims.add([outcome.job], ready=False)
                self.services.put(outcome)
            if claimed.jobs:
                claims.add(claimed.jobs)
                self.on_claimed()
            if len(rows) < limit and self.on_spare is not None:
                self.on_spare()
            policy.claimed(
                limit, bounds, len(rows), claimed.last, clock(), claimed.claimed_at
            )
            rated_short = self._rate_wait is not None
            if self._rate_wait is not None:
                # The window is full: claim again once its oldest start leaves
                # (jobs may be ready: not an empty claim).
                policy.retry_written(self._rate_wait, clock())
                self._rate_wait = None
            empty_since = None if rows or rated_short else settled_before
            if not policy.more and not until_empty:
                await self._look_ahead(clock)

    async def _look_ahead(self, clock: Callable[[], float]) -> None:
        """The claim saw every due job: learn when the queue's next one falls due.

        A job enqueued to run later (by any producer, in any process: its
        wakeup came at its enqueue, and found nothing due), retried or
        snoozed by another worker, then starts on time rather than at the
        next poll. Never cancelled in flight, like a claim (it shares the
        claim connection; its statement deadline bounds it). A failure only
        costs the timer: the next poll claims as ever, and a claim that
        fails says so.
        """
        try:
            with anyio.CancelScope(shield=True):
                delay = await self.services.connection.store.next_due(
                    self.services.connection, self.settings.name
                )
        except Exception as exc:
            self.services.logger.debug(
                "could not learn when the next job falls due: %s",
                describe(exc),
                extra={"queue": self.settings.name},
            )
            return
        self.policy.due_in(delay, clock())

    @property
    def _retry_cap(self) -> float:
        return min(self.options.poll_interval, MAX_RETRY_WAIT)

    async def _claim(
        self, limit: int, bounds: Bounds
    ) -> tuple[Sequence[asyncpg.Record | tuple[Any, ...]], dict[int, str]]:
        """Claim up to ``limit`` jobs; the results of their parents, for those with parents."""
        budget, lease = self.services.budget, self.lease
        if budget is not None:
            budget.reserved += limit
        if lease is not None:
            lease.claiming = limit
        try:
            with anyio.CancelScope(shield=True):
                store = self.services.connection.store
                rows: Sequence[asyncpg.Record | tuple[Any, ...]]
                if (
                    self._group_claim is not None
                    or self.settings.rate_limit is not None
                ):
                    turn = await self.services.connection.run_in_transaction(
                        lambda connection: store.claim_in_turn(
                            connection,
                            self.settings.name,
                            limit,
                            bounds,
                            types=self.services.types,
                            group_limit=self._group_claim,
                            rate=self.settings.rate_limit,
                        )
                    )
                    self._took_turn(turn)
                    rows = turn.rows
                else:
                    rows = await store.claim(
                        self.services.connection,
                        self.settings.name,
                        limit,
                        bounds,
                        self.services.types,
                    )
                try:
                    parents, pruned = await store.parent_results(
                        self.services.connection,
                        [row[0] for row in rows if row[_HAS_PARENTS]],
                    )
                except Exception as exc:
                    raise UnreadParents(rows, exc) from exc
        finally:
            # Given back before the jobs go to the ledger, with no await in
            # between: the slots are never counted twice, nor left uncounted.
            if budget is not None:
                budget.reserved -= limit
            if lease is not None:
                lease.claiming = 0
        for child, gone in pruned.items():
            # Only a Go worker's Prune deletes a parent whose child has not
            # run (pgqueue's retention keeps it): the child runs, and its
            # parent_results holds None for that parent, said here.
            self.services.logger.warning(
                "job %s: parent jobs %s were deleted before it ran (a Go worker's"
                " Prune?): their results read as None",
                child,
                gone,
                extra={"job_id": child, "parents": gone, "queue": self.settings.name},
            )
        return rows, parents

    def _took_turn(self, turn: Turn) -> None:
        """Say a long wait for the queue's turn; remember a window the rate filled."""
        if turn.waited >= TURN_WAIT_WARNING:
            self.services.logger.warning(
                "waited %.1fs for the queue's turn to claim (another worker's claim held it)",
                turn.waited,
                extra={"queue": self.settings.name, "waited": turn.waited},
            )
        if turn.rate_wait is not None:
            self._rate_wait = turn.rate_wait

    async def _check_schema(self) -> None:
        if not await check_schema(self.services.connection, limits=self._needs_limits):
            self.services.logger.debug(
                "the table pgqueue_jobs has never been analyzed: the planner guesses its "
                "size (the worker's statements plan by index regardless)",
                extra={"queue": self.settings.name},
            )
        await self.services.connection.detect_store()

    async def _take_lease(self) -> None:
        assert self.lease is not None
        await take(self.services.connection, self.lease)

    async def _retrying(self, what: str, step: Callable[[], Awaitable[None]]) -> None:
        """Run ``step`` until it succeeds, retrying transient failures."""
        failures = Failures(
            self.services.logger,
            f"{what} failed; retrying",
            cap=self._retry_cap,
            fields={"queue": self.settings.name},
            quiet=True,
        )
        while True:
            try:
                await step()
            except Exception as exc:
                if not is_transient(exc):
                    raise
                await anyio.sleep(failures.failed(exc))
            else:
                return


class Claimed(NamedTuple):
    """What one claim returned."""

    jobs: list[Job]
    """The jobs to run, highest priority first, then in ``(run_at, id)`` order."""
    dead: list[Outcome]
    """The outcomes of claimed jobs that cannot run."""
    last: Bounds
    """For each priority claimed, the place of the last row taken."""
    claimed_at: datetime | None
    """When the claim ran, on the database clock (None if it took nothing)."""


def jobs_from_rows(
    rows: Sequence[asyncpg.Record | tuple[Any, ...]],
    parents: Mapping[int, str] | None = None,
) -> Claimed:
    """Read the rows a claim returned (and ``parents``: `PARENT_RESULTS`'s rows, by child).

    A job whose payload Python cannot decode (a 5000-digit number, nesting
    past the recursion limit) or whose times it cannot represent (a BC date)
    was written by another producer; it is dead-lettered with the reason.
    Times are always timezone-aware: ``-infinity`` and ``infinity`` come
    back as ``datetime.min`` and ``datetime.max`` in UTC.

    Each row is unpacked in the order of `pgqueue._sql.claims.CLAIM_COLUMNS`,
    which the claim's ``RETURNING`` is built from: as fast as indexes,
    named as the columns.
    """
    jobs: list[Job] = []
    dead: list[Outcome] = []
    for (
        job_id,
        queue,
        job_type,
        payload_text,
        attempts,
        max_attempts,
        run_at,
        created_at,
        last_error,
        unrepresentable,
        priority,
        unique_key,
        snoozes,
        _claimed_at,
        trace_context,
        checkpoint_text,
        has_parents,
        steps_text,
    ) in rows:
        error = None
        try:
            payload = json.loads(payload_text)
        except (ValueError, RecursionError) as exc:
            payload = None
            error = f"payload could not be decoded: {describe(exc)}"[:1000]
        checkpoint = None
        if checkpoint_text is not None:
            try:
                checkpoint = json.loads(checkpoint_text)
            except (ValueError, RecursionError) as exc:
                error = f"checkpoint could not be decoded: {describe(exc)}"[:1000]
        steps = NO_STEPS
        if steps_text is not None:
            try:
                steps = stored_steps(steps_text)
            except (ValueError, RecursionError) as exc:
                error = f"steps could not be decoded: {describe(exc)}"[:1000]
        parent_results = NO_PARENTS
        parents_text = parents.get(job_id) if has_parents and parents else None
        if parents_text is not None:
            try:
                parent_results = {
                    int(key): value for key, value in json.loads(parents_text).items()
                }
            except (ValueError, RecursionError) as exc:
                error = f"a parent's result could not be decoded: {describe(exc)}"[
                    :1000
                ]
        if unrepresentable is not None:
            run_at = created_at = _UNREPRESENTABLE
            error = f"a time Python cannot represent ({unrepresentable})"
        else:
            # asyncpg reads '-infinity' and 'infinity' as naive datetime.min and max.
            if run_at.tzinfo is None:
                run_at = run_at.replace(tzinfo=UTC)
            if created_at.tzinfo is None:
                created_at = created_at.replace(tzinfo=UTC)
        job = claimed_job(
            job_id,
            queue,
            job_type,
            payload,
            attempts,
            max_attempts,
            run_at,
            created_at,
            last_error,
            priority,
            unique_key,
            snoozes,
            trace_context,
            checkpoint,
            parent_results,
            steps,
        )
        if error is None:
            jobs.append(job)
        else:
            dead.append(Outcome(job, OutcomeKind.DEAD, error=error))
    if not rows:
        return Claimed(jobs, dead, {}, None)
    last: Bounds = {}
    if jobs:
        jobs.sort(key=_PLACE)
        if any(job.priority != jobs[0].priority for job in jobs):
            jobs.sort(key=_PRIORITY, reverse=True)  # stable: places stay in order
            for job in jobs:
                last[job.priority] = _PLACE(job)
        else:
            last[jobs[0].priority] = _PLACE(jobs[-1])
    for outcome in dead:
        job = outcome.job
        if job.run_at is not _UNREPRESENTABLE:
            place = _PLACE(job)
            if job.priority not in last or place > last[job.priority]:
                last[job.priority] = place
    at = rows[0][_CLAIMED_AT]  # None on Citus
    return Claimed(
        jobs, dead, last, None if at is None else _EPOCH + timedelta(microseconds=at)
    )


# Stands in for a time Python cannot represent, in a job that never runs.
_UNREPRESENTABLE = datetime.min.replace(tzinfo=UTC)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CLAIMED_AT = CLAIM_COLUMNS.index("claimed_at")
_HAS_PARENTS = CLAIM_COLUMNS.index("has_parents")


class UnreadParents(Exception):
    """A claim's rows whose parents' results could not be read."""

    def __init__(
        self, rows: Sequence[asyncpg.Record | tuple[Any, ...]], error: Exception
    ) -> None:
        super().__init__(str(error))
        self.rows = rows
        self.error = error


TURN_WAIT_WARNING = 1.0
"""Seconds a limited claim may wait for its queue's turn before the worker says so."""

_PLACE = operator.attrgetter("run_at", "id")


_PRIORITY = operator.attrgetter("priority")
