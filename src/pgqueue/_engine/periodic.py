"""Periodic jobs: schedules a worker registers, and the task that enqueues their ticks.

A schedule is a cron expression (with the ``cron`` extra: croniter) or a
fixed interval aligned to the Unix epoch. Every worker that registers a
schedule runs the same scheduler; none is elected. They agree through the
schedule's row in ``pgqueue_periodic``: the statement that advances its
last tick to a tick inserts that tick's job (`pgqueue._sql.periodic.PERIODIC_TICK`),
so one job per (schedule, tick) is enqueued however many workers race.

Ticks are computed in Python, in the schedule's time zone, and compared
with the database's clock (read with `pgqueue._sql.periodic.PERIODIC_NOW`), never
the worker's own. Only the latest due tick runs, and only if it is at most
``max_lateness`` seconds old: ticks missed while no worker ran are never
run as a backlog.

A job learns its tick from its ``unique_key``, ``periodic:<name>@<tick>``
(the tick in ISO 8601, UTC; see `pgqueue._core.job.PeriodicKey`): `pgqueue.Job.tick`
reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import anyio
import asyncpg

from pgqueue._core.checks import (
    check_bool,
    check_duration,
    check_job_type,
    check_max_attempts,
    check_name,
    check_queue_name,
)
from pgqueue._core.codec import encode_payload
from pgqueue._core.job import PeriodicKey
from pgqueue._core.log import safe_repr
from pgqueue._core.retry import Failures
from pgqueue._sql.periodic import (
    PERIODIC_NOW,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pgqueue._core.log import Logger
    from pgqueue._store.postgres import Definition
    from pgqueue._wire.dedicated import DedicatedConnection

__all__ = ["CRON_MISSING", "Clock", "DatabaseClock", "Schedule", "Schedules"]

CRON_MISSING = (
    "cron schedules need croniter, in the cron extra: "
    "pip install 'pgqueue-asyncio[cron]'"
)

MAX_SLEEP = 60.0
"""The longest the scheduler sleeps before it reads the database's clock again."""

LOOKBACK = 60.0
"""Seconds a cron schedule's first look for its latest due tick spans (then doubled)."""

CAS_ATTEMPTS = 5
"""How often one tick's statement is run again after a racing worker's commit."""

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_MIN_EVERY = 0.001
# croniter's random field ("R") differs from process to process; hashed
# ones ("H") are computed from the schedule's name, the same everywhere.
_RANDOM = re.compile(r"(?<![A-Z])R(?![A-Z])", re.IGNORECASE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """One schedule, as `pgqueue.Worker.periodic` registered it (checked)."""

    name: str
    cron: str | None
    every: float | None
    job_type: str
    payload: str
    queue: str | None
    timezone: str
    unique: bool
    max_lateness: float
    max_attempts: int

    @property
    def spelled(self) -> str:
        """The schedule as ``pgqueue_periodic.schedule`` shows it."""
        if self.cron is not None:
            return self.cron
        every = self.every
        assert every is not None
        return f"@every {int(every) if every.is_integer() else every}s"

    def after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment`` (aware, UTC)."""
        if self.every is not None:
            period = round(self.every * 1_000_000)
            elapsed = (moment - _EPOCH) // _MICROSECOND
            return _EPOCH + timedelta(microseconds=(elapsed // period + 1) * period)
        return _cron_after(self.cron, self.timezone, self.name, moment)

    def latest_due(
        self, now: datetime, start: datetime | None
    ) -> tuple[datetime | None, datetime]:
        """The latest tick at most ``now`` and at most ``max_lateness`` old, and the tick after ``now``.

        ``start``: the earliest tick not yet handled, or None. An interval
        is computed at once. Cron ticks are walked forward one by one from
        ``start`` (or from the latest tick found in a look-back window that
        doubles up to ``max_lateness``), so that every process sees the
        ticks croniter's forward walk gives, and a walk stays short.
        """
        oldest = now - timedelta(seconds=self.max_lateness)
        if self.every is not None:
            following = self.after(now)
            tick = following - timedelta(microseconds=round(self.every * 1_000_000))
            return (tick if tick >= oldest else None), following
        if start is not None and start >= oldest:
            tick = start
        else:
            lookback = min(self.max_lateness, LOOKBACK)
            while True:
                tick = self.after(now - timedelta(seconds=lookback) - _MICROSECOND)
                if tick <= now or lookback >= self.max_lateness:
                    break
                lookback = min(lookback * 2, self.max_lateness)
        if tick > now:
            return None, tick
        while (following := self.after(tick)) <= now:
            tick = following
        return tick, following


def _cron_after(
    expression: str | None, zone: str, name: str, moment: datetime
) -> datetime:
    from croniter import croniter

    local = moment.astimezone(ZoneInfo(zone))
    found: datetime = croniter(
        expression, local, second_at_beginning=True, hash_id=name
    ).get_next(datetime)
    found = found.astimezone(UTC)
    if found <= moment:  # never go backwards, whatever a zone's transition does
        return _cron_after(expression, zone, name, moment + timedelta(seconds=1))
    return found


def check_schedule(
    *,
    name: object,
    cron: object,
    every: object,
    job_type: object,
    payload: object,
    queue: object,
    tz: object,
    unique: object,
    max_lateness: object,
    max_attempts: object,
) -> Schedule:
    """Check what `pgqueue.Worker.periodic` was given; return it as a `Schedule`.

    Raises:
        TypeError, ValueError: see `pgqueue.Worker.periodic`.
    """
    checked_name = check_name("schedule name", name)
    kind = check_job_type(job_type)
    checked_queue = None if queue is None else check_queue_name(queue)
    zone = _check_zone(tz)
    if (cron is None) == (every is None):
        msg = "give a schedule either a cron expression or every=, not both or neither"
        raise TypeError(msg)
    period = None
    expression = None
    if every is not None:
        period = check_duration("every", every, positive=True)
        if period < _MIN_EVERY:
            msg = f"every must be at least {_MIN_EVERY:g} s, got {every!r}"
            raise ValueError(msg)
    else:
        expression = _check_cron(cron, zone, checked_name)
    return Schedule(
        name=checked_name,
        cron=expression,
        every=period,
        job_type=kind,
        payload=encode_payload(payload),
        queue=checked_queue,
        timezone=zone,
        unique=check_bool("unique", unique),
        max_lateness=check_duration("max_lateness", max_lateness),
        max_attempts=check_max_attempts(max_attempts),
    )


def _check_zone(tz: object) -> str:
    if not isinstance(tz, str):
        msg = f"tz must be an IANA time zone name (str), not {type(tz).__name__}"
        raise TypeError(msg)
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        msg = f"unknown time zone {tz!r} (use an IANA name such as 'Europe/Berlin')"
        raise ValueError(msg) from exc
    return tz


def _check_cron(cron: object, zone: str, name: str) -> str:
    if not isinstance(cron, str):
        msg = f"cron must be a str, not {type(cron).__name__}"
        raise TypeError(msg)
    expression = " ".join(cron.split())
    fields = expression.split(" ")
    if not expression.startswith("@") and len(fields) not in (5, 6):
        msg = (
            f"cron expression {cron!r} must have 5 fields (minute hour day month "
            "weekday) or 6 (second first)"
        )
        raise ValueError(msg)
    if _RANDOM.search(expression):
        msg = (
            f"cron expression {cron!r}: random fields (R) would differ between workers"
        )
        raise ValueError(msg)
    try:
        import croniter  # noqa: F401 - whether the extra is installed
    except ImportError as exc:
        raise ModuleNotFoundError(CRON_MISSING) from exc
    try:
        _cron_after(expression, zone, name, datetime.now(UTC))
    except (ValueError, KeyError, TypeError) as exc:
        msg = f"invalid cron expression {cron!r}: {exc}"
        raise ValueError(msg) from exc
    return expression


class Clock(Protocol):
    """Where a scheduler reads the time, and how it waits for its next pass.

    `DatabaseClock` is the real one; tests give one they move themselves.
    """

    async def now(self, connection: DedicatedConnection) -> datetime:
        """The time now (aware), read on the scheduler's ``connection``."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait about ``seconds`` until the next pass (it may wait less)."""
        ...


class DatabaseClock:
    """The database's clock, read with `pgqueue._sql.periodic.PERIODIC_NOW`.

    It sleeps at most `MAX_SLEEP`, so that a drift between the worker's
    clock and the database's is corrected.
    """

    async def now(self, connection: DedicatedConnection) -> datetime:
        """The database's ``now()``."""
        row = await connection.fetchrow(PERIODIC_NOW)
        assert row is not None
        now: datetime = row["now"]
        return now

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, or `MAX_SLEEP` if that is shorter."""
        await anyio.sleep(min(seconds, MAX_SLEEP))


class Schedules:
    """The schedules of one worker, and the scheduler that enqueues their ticks.

    The scheduler is one task in the worker's services. Each pass reads the
    database's clock, registers the schedules not yet registered, and runs
    the statement of each schedule's latest due tick; it then sleeps until
    the next tick is due, on its ``clock`` (the database's, by default). A
    failure is logged and the pass is tried again after the worker's retry
    delay; the connection (the worker's upkeep connection) replaces itself
    when it is lost.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self._schedules: dict[str, Schedule] = {}
        self.clock: Clock = DatabaseClock() if clock is None else clock

    def add(self, schedule: Schedule) -> None:
        """Add ``schedule``; `ValueError` if its name is taken."""
        if schedule.name in self._schedules:
            msg = f"a schedule named {schedule.name!r} is already registered"
            raise ValueError(msg)
        self._schedules[schedule.name] = schedule

    def copy(self) -> Schedules:
        """The same schedules and settings, for a copy of the worker."""
        copy = Schedules(self.clock)
        copy._schedules = dict(self._schedules)
        return copy

    def __bool__(self) -> bool:
        return bool(self._schedules)

    def __iter__(self) -> Iterator[Schedule]:
        return iter(self._schedules.values())

    async def run(
        self, connection: DedicatedConnection, queue: str, logger: Logger
    ) -> None:
        """Enqueue the schedules' ticks until cancelled; never raises but cancellation."""
        schedules = [
            replace(s, queue=queue) if s.queue is None else s
            for s in self._schedules.values()
        ]
        pending = {s.name: s for s in schedules}  # not yet registered
        starts: dict[str, datetime | None] = {s.name: None for s in schedules}
        failures = Failures(
            logger,
            "periodic scheduler failed",
            fields={"queue": queue},
            quiet=True,
        )
        clock = self.clock
        logger.info(
            "periodic scheduler started",
            extra={"schedules": sorted(pending), "queue": queue},
        )
        while True:
            wait = MAX_SLEEP
            try:
                now = await clock.now(connection)
                for schedule in list(pending.values()):
                    await connection.store.register(
                        connection, _definition(schedule), schedule.after(now), now
                    )
                    del pending[schedule.name]
                for schedule in schedules:
                    start = starts[schedule.name]
                    if start is not None and start > now:
                        continue
                    tick, following = schedule.latest_due(now, start)
                    if tick is not None:
                        await self._run_tick(
                            connection, schedule, tick, following, now, logger
                        )
                    starts[schedule.name] = following
                earliest = min(t for t in starts.values() if t is not None)
                wait = (earliest - now).total_seconds()
            except Exception as exc:
                if isinstance(exc, asyncpg.UndefinedTableError):
                    wait = failures.counted()
                    logger.error(
                        "periodic jobs need the table pgqueue_periodic: apply "
                        "pgqueue.SCHEMA_UPGRADE in a migration (or await pgqueue.install(pool))",
                        extra={"error": safe_repr(exc), "failures": failures.count},
                    )
                else:
                    wait = failures.failed(exc)
            else:
                failures.succeeded()
            # A little past the tick: the next pass finds it due.
            await clock.sleep(max(wait, 0.0) + 0.001)

    async def _run_tick(
        self,
        connection: DedicatedConnection,
        schedule: Schedule,
        tick: datetime,
        following: datetime,
        now: datetime,
        logger: Logger,
    ) -> None:
        """Run ``tick``'s statement until it advances the row or finds the tick done."""
        key = str(PeriodicKey(schedule.name, tick))
        extra: dict[str, Any] = {
            "schedule": schedule.name,
            "tick": tick.isoformat(),
            "queue": schedule.queue,
            "job_type": schedule.job_type,
        }
        for _ in range(CAS_ATTEMPTS):
            row = await connection.store.tick(
                connection,
                _definition(schedule),
                tick,
                following,
                now,
                payload=schedule.payload,
                max_attempts=schedule.max_attempts,
                unique=schedule.unique,
                key=key,
            )
            if row["advanced"]:
                if row["job_id"] is not None:
                    logger.info(
                        "periodic job enqueued",
                        extra={**extra, "job_id": row["job_id"]},
                    )
                else:
                    logger.info(
                        "periodic tick skipped: the schedule's previous job is still "
                        "pending or running",
                        extra=extra,
                    )
                return
            done_until = row["done_until"]
            if done_until is not None and done_until >= tick:
                logger.debug("periodic tick already run", extra=extra)
                return
        logger.debug("periodic tick left to other workers", extra=extra)


def _definition(schedule: Schedule) -> Definition:
    """The schedule's row (its queue set: the worker's, unless it names one)."""
    assert schedule.queue is not None
    return (
        schedule.name,
        schedule.spelled,
        schedule.timezone,
        schedule.queue,
        schedule.job_type,
    )
