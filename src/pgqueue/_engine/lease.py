"""Fleet-wide limits: each worker's lease of a limited queue's slots."""

from __future__ import annotations

import math
import os
import socket
import uuid
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, cast

import anyio

from pgqueue._core.log import log_failure
from pgqueue._core.retry import Failures
from pgqueue._engine.upkeep import HEARTBEATS_PER_RESCUE

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from pgqueue._core.log import Logger
    from pgqueue._core.options import LaneSettings, WorkerOptions
    from pgqueue._engine.ledger import Claims
    from pgqueue._wire.dedicated import DedicatedConnection

__all__ = ["Lease", "LeaseKeeper", "take", "worker_id"]


class Lease:
    """The slots of a queue with a fleet-wide limit that this worker may fill.

    The database splits the queue's ``global_limit`` among its workers'
    leases (`LEASE`), whose sum never exceeds it. Within its lease a
    worker claims on its own: a claim takes no more than the lease leaves
    after the worker's jobs ready or running, and touches no shared row. A
    slot is free again once its handler has ended, before the outcome is
    written.

    A lease holds for the worker's ``rescue_after`` from when its renewal
    was sent. Past that with no renewal (the database out of reach), the
    worker claims nothing more from the queue, and other workers may take
    its slots: after ``rescue_after`` they would take its jobs' rows too.

    Args:
        settings: the limited queue, with its ``global_limit``.
        options: the worker's options.
        worker: the worker's id (`worker_id`), which names its leases.
        wanted: the most slots the worker could fill (its capacity for the
            queue): the lease asks for that, within a fair share.
        claims: the worker's ledger of the queue (its jobs ready or running
            fill the lease).
    """

    def __init__(
        self,
        settings: LaneSettings,
        options: WorkerOptions,
        *,
        worker: str,
        wanted: int,
        claims: Claims,
    ) -> None:
        if settings.global_limit is None:
            msg = f"queue {settings.name!r} has no global_limit to lease"
            raise ValueError(msg)
        self.settings = settings
        self.options = options
        self.worker = worker
        self.wanted = wanted
        self._claims = claims
        self.slots = 0
        """The slots granted by the last renewal."""
        self.claiming = 0
        """Slots taken by a claim in flight."""
        self._valid_until = -math.inf

    @property
    def limit(self) -> int:
        """The queue's ``global_limit``."""
        return cast("int", self.settings.global_limit)

    @property
    def taken(self) -> bool:
        """Whether the lease was ever granted (the claimer takes it first)."""
        return self._valid_until > -math.inf

    def free(self, now: float) -> int:
        """How many more jobs the lease allows now (none once it has run out)."""
        if now >= self._valid_until:
            return 0
        return max(self.slots - self._claims.active, 0)

    def held(self) -> int:
        """The most slots the worker may fill while a renewal is in flight.

        Its jobs may not stop, and a claim may fill the slots it has: the
        lease records at least this many, so that the slots of a lease that
        shrinks go to others only once its jobs have ended.
        """
        return max(self._claims.active + self.claiming, self.slots)

    def renewed(self, slots: int, sent_at: float) -> bool:
        """The database granted ``slots`` to a renewal sent at ``sent_at``; whether room grew."""
        grew = slots > self.slots or (slots > 0 and sent_at >= self._valid_until)
        self.slots = slots
        self._valid_until = sent_at + self.options.rescue_after
        return grew


async def take(connection: DedicatedConnection, lease: Lease) -> bool:
    """Take or renew ``lease``; whether room grew.

    Makes the queue's row of ``pgqueue_limits`` if it is missing (the
    worker's first lease, or a row deleted by hand).
    """
    sent_at = anyio.current_time()
    granted = await connection.store.lease(
        connection,
        lease.settings.name,
        lease.worker,
        limit=lease.limit,
        wanted=lease.wanted,
        held=lease.held(),
        ttl=lease.options.rescue_after,
    )
    return lease.renewed(granted, sent_at)


def worker_id() -> str:
    """A name for this worker's leases: its host, process and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


@dataclass(eq=False)
class LeaseKeeper:
    """Renew a worker's leases every ``interval``, and give them back as it stops.

    A renewal that frees room wakes the queue's claimer (``on_room``).
    Renewals come every ``poll_interval`` (how soon a lease follows a
    change in the workers wanting slots), and at least three times in a
    lease's ``rescue_after``.

    Args:
        connection: the worker's upkeep connection.
        leases: the worker's leases, one per limited queue.
        options: the worker's options.
        worker: the worker's id (`worker_id`).
        on_room: called with a queue's name when its lease grew.
    """

    connection: DedicatedConnection
    leases: Sequence[Lease]
    options: WorkerOptions
    _: KW_ONLY
    worker: str
    logger: Logger
    fields: Mapping[str, object]
    on_room: Callable[[str], None]

    async def run(self) -> None:
        """Renew every lease each interval, until cancelled."""
        failures = Failures.of(self, "lease renewal failed")
        options = self.options
        interval = min(
            options.poll_interval, options.rescue_after / HEARTBEATS_PER_RESCUE
        )
        while True:
            await anyio.sleep(interval)
            try:
                for lease in self.leases:
                    if lease.taken and await take(self.connection, lease):
                        self.on_room(lease.settings.name)
            except Exception as exc:
                failures.failed(exc)
            else:
                failures.succeeded()

    async def release(self) -> None:
        """Give every lease back (the worker has stopped: none of its jobs runs)."""
        try:
            await self.connection.store.release(
                self.connection,
                self.worker,
                [lease.settings.name for lease in self.leases],
            )
        except Exception as exc:
            # Its leases run out on their own.
            log_failure(self.logger, "giving leases back failed", exc, 1, **self.fields)
