"""Handlers' checkpoints: written at once, fenced on the attempt their run claimed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio

from pgqueue._core.codec import encode_payload

if TYPE_CHECKING:
    from pgqueue._core.job import Job
    from pgqueue._wire.dedicated import DedicatedConnection

__all__ = ["Checkpoints"]


class Checkpoints:
    """Write the checkpoints of the jobs a worker runs (`pgqueue.Job.checkpoint`).

    Each is one statement on ``connection`` (the worker's upkeep
    connection: a checkpoint is as rare as a heartbeat, and the claim and
    outcome connections stay on the hot path), fenced on the job's id and
    the attempt its run claimed, so a stale run's checkpoint never lands.
    The statement is shielded from the handler's cancellation: cancelling
    it in flight would drop the connection the heartbeats share; it is
    bounded by the connection's statement deadline instead.
    """

    def __init__(self, connection: DedicatedConnection) -> None:
        self._connection = connection

    async def __call__(self, job: Job[Any], value: Any) -> bool:
        """Store ``value`` as ``job``'s checkpoint; whether the run still held its attempt."""
        text = encode_payload(value)  # TypeError, ValueError: before any SQL
        store = self._connection.store
        with anyio.CancelScope(shield=True):
            return await store.checkpoint(
                self._connection, job.id, job.attempts, job.queue, text
            )
        raise AssertionError  # a shielded scope is never cancelled
