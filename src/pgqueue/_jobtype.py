"""A typed handle for one job type, shared by the code that enqueues it and the worker that runs it."""

from __future__ import annotations

import dataclasses
import typing
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, Unpack

import asyncpg
from asyncpg.pool import PoolConnectionProxy

from pgqueue._core.checks import check_callable, check_job_type, check_queue_name
from pgqueue._core.codec import is_model_class
from pgqueue._core.typed import converting, payload_converter
from pgqueue._queue import Queue

if TYPE_CHECKING:
    from collections.abc import Callable, Collection

    from pgqueue._core.handler import Handler
    from pgqueue._core.job import EnqueueOptions, Job
    from pgqueue._queue import Connection

__all__ = ["HandlerDecorator", "JobType"]

P = TypeVar("P")
R = TypeVar("R")


class HandlerDecorator(Protocol[P]):
    """What ``worker.handler(job_type)`` returns for a `JobType` ``job_type``."""

    def __call__(self, handler: Callable[[Job[P]], R], /) -> Callable[[Job[P]], R]:
        """Register ``handler`` and return it unchanged."""
        ...


class JobType(Generic[P]):
    """A job type with its payload type and its queue, for type-checked enqueues and handlers.

    Define it once, next to the payload type, and import it where jobs are
    enqueued and where they run::

        @dataclass
        class SendEmail:
            to: str

        send_email = pgqueue.JobType("send_email", SendEmail, queue="emails")

        job_id = await send_email.enqueue(pool, SendEmail(to="a@example.com"), delay=60)

        @worker.handler(send_email)
        async def deliver(job: pgqueue.Job[SendEmail]) -> None: ...

    A type checker flags a payload of another type at the enqueue, and a
    handler that does not take a ``Job[SendEmail]`` at its registration.
    At run time, `enqueue` refuses a payload that is not a ``SendEmail``, and
    the handler gets ``job.payload`` as a ``SendEmail`` whatever its
    annotation says (a stored payload that does not fit dead-letters its job,
    as for any typed handler).

    Args:
        name: the job type, as stored in ``job_type``.
        payload_type: a dataclass or a pydantic model class.
        queue: the queue its jobs go to and are run from; ``None`` (the
            default) means the `Queue` given to `enqueue`, or ``"default"``
            when it is given a pool or a connection.

    Raises:
        TypeError: ``payload_type`` is not a dataclass or a pydantic model.
        ValueError: a bad name or queue name.
    """

    __slots__ = ("_convert", "name", "payload_type", "queue")

    name: str
    payload_type: type[P]
    queue: str | None

    def __init__(
        self, name: str, payload_type: type[P], *, queue: str | None = None
    ) -> None:
        self.name = check_job_type(name)
        cls = typing.get_origin(payload_type) or payload_type
        if not (
            isinstance(cls, type)
            and (dataclasses.is_dataclass(cls) or is_model_class(cls))
        ):
            msg = (
                "a JobType's payload type must be a dataclass or a pydantic "
                f"model class, not {payload_type!r:.80}"
            )
            raise TypeError(msg)
        self.payload_type = payload_type
        self.queue = None if queue is None else check_queue_name(queue)
        # Built at the first registration: by then every type it names exists.
        self._convert: Callable[[Any], Any] | None = None

    async def enqueue(
        self,
        target: Queue | asyncpg.Pool[Any] | Connection,
        payload: P,
        *,
        connection: Connection | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> int:
        """Enqueue a job of this type; return its id, as `Queue.enqueue`.

        ``target`` is a `Queue` (its name must be this type's queue, if it
        has one; its ``max_attempts``, hooks and ``json_encoder`` apply), an
        asyncpg pool, or a connection (the job rides its transaction, as
        with ``connection=``). The options are `Queue.enqueue`'s.

        Raises:
            TypeError: ``payload`` is not a ``payload_type``, or ``target``
                is none of the three; and as `Queue.enqueue`.
            ValueError: ``target`` is a `Queue` of another queue; and as
                `Queue.enqueue`.

        .. versionchanged:: 0.1
           ``after``, ``on_parent_failure`` and ``group``.
        """
        cls = typing.get_origin(self.payload_type) or self.payload_type
        if not isinstance(payload, cls):
            msg = (
                f"job type {self.name!r} takes a {cls.__name__} payload, "
                f"not {type(payload).__name__}"
            )
            raise TypeError(msg)
        queue = self._queue_for(target)
        if isinstance(target, asyncpg.Connection | PoolConnectionProxy):
            if connection is not None and connection is not target:
                msg = "connection= must be left out when the target is a connection"
                raise ValueError(msg)
            connection = target
        return await queue.enqueue(self.name, payload, connection=connection, **options)

    def _queue_for(self, target: object) -> Queue:
        """The `Queue` that ``target`` stands for."""
        if isinstance(target, Queue):
            if self.queue is not None and target.name != self.queue:
                msg = (
                    f"job type {self.name!r} goes to queue {self.queue!r}, "
                    f"but was given Queue(name={target.name!r})"
                )
                raise ValueError(msg)
            return target
        name = "default" if self.queue is None else self.queue
        if isinstance(target, asyncpg.Pool):
            return Queue(target, name=name)
        if isinstance(target, asyncpg.Connection | PoolConnectionProxy):
            return Queue._on(target, name)
        msg = (
            "enqueue needs a pgqueue.Queue, an asyncpg pool or a connection, "
            f"not {type(target).__name__}"
        )
        raise TypeError(msg)

    def _handler(
        self, handler: Callable[[Job[P]], Any], queues: Collection[str]
    ) -> Handler:
        """``handler``, wrapped to get ``job.payload`` as a ``payload_type``, for a worker of ``queues``.

        Raises:
            ValueError: this type has a queue that is not in ``queues``.
            TypeError: ``handler`` is not callable, or the payload type's
                hints cannot be resolved.
        """
        check_callable("handler", handler)
        if self.queue is not None and self.queue not in queues:
            msg = (
                f"job type {self.name!r} runs on queue {self.queue!r}, which this "
                f"worker does not consume ({', '.join(map(repr, queues))})"
            )
            raise ValueError(msg)
        if self._convert is None:
            self._convert = payload_converter(self.payload_type)
        cls = typing.get_origin(self.payload_type) or self.payload_type
        return converting(handler, cls, self._convert)

    def __repr__(self) -> str:
        name = getattr(self.payload_type, "__qualname__", repr(self.payload_type))
        return f"JobType({self.name!r}, {name}, queue={self.queue!r})"
