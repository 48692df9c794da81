"""Durable asyncio job queue and NOTIFY/LISTEN pub/sub on PostgreSQL.

The Python sibling of the Go module ``github.com/pascalallen/pgqueue``:
same ``pgqueue_jobs`` table, same semantics, built on asyncpg and anyio.
"""

from __future__ import annotations

from pgqueue._admin import (
    Admin,
    FailedAttempt,
    JobDependencies,
    JobInfo,
    JobPreview,
    JobSummary,
    ProgressInfo,
    QueueStats,
    RelatedJob,
    ScheduleInfo,
    SchemaState,
    SignalInfo,
    SnoozedAttempt,
    StepInfo,
    TopQueues,
    WaitInfo,
)
from pgqueue._core.backoff import Backoff, default_backoff
from pgqueue._core.errors import (
    AlreadyStartedError,
    ChildFailed,
    DuplicateJobError,
    JobNotFoundError,
    JobStateError,
    PayloadTooLargeError,
    Permanent,
    PgQueueError,
    RetryAfter,
    RunSuperseded,
    SchemaError,
    Snooze,
    TrackerClosedError,
    WaitTimeout,
    is_permanent,
)
from pgqueue._core.filter import JobFilter
from pgqueue._core.handler import Handler, SyncHandler
from pgqueue._core.hooks import EnqueueEvent, EnqueueHook, Observer
from pgqueue._core.job import EnqueueOptions, Job, NewJob, Step
from pgqueue._core.lifecycle import OutcomeKind, Status
from pgqueue._core.log import Logger
from pgqueue._core.options import RateLimit, WorkerOptions
from pgqueue._core.outcome import Outcome
from pgqueue._jobtype import JobType
from pgqueue._pubsub import Callback, Subscriber, publish
from pgqueue._queue import Connection, Executor, Queue, install, uninstall
from pgqueue._sql.channels import JOBS_CHANNEL
from pgqueue._sql.grants import grants
from pgqueue._sql.schema import SCHEMA, SCHEMA_DISTRIBUTED, SCHEMA_DOWN, SCHEMA_UPGRADE
from pgqueue._tracker import JobOutcome, JobProgress, Tracker
from pgqueue._trend import TrendPoint, TrendRow
from pgqueue._wire.connections import Connections
from pgqueue._worker import Middleware, Worker

__all__ = [
    "JOBS_CHANNEL",
    "SCHEMA",
    "SCHEMA_DISTRIBUTED",
    "SCHEMA_DOWN",
    "SCHEMA_UPGRADE",
    "Admin",
    "AlreadyStartedError",
    "Backoff",
    "Callback",
    "ChildFailed",
    "Connection",
    "Connections",
    "DuplicateJobError",
    "EnqueueEvent",
    "EnqueueHook",
    "EnqueueOptions",
    "Executor",
    "FailedAttempt",
    "Handler",
    "Job",
    "JobDependencies",
    "JobFilter",
    "JobInfo",
    "JobNotFoundError",
    "JobOutcome",
    "JobPreview",
    "JobProgress",
    "JobStateError",
    "JobSummary",
    "JobType",
    "Logger",
    "Middleware",
    "NewJob",
    "Observer",
    "Outcome",
    "OutcomeKind",
    "PayloadTooLargeError",
    "Permanent",
    "PgQueueError",
    "ProgressInfo",
    "Queue",
    "QueueStats",
    "RateLimit",
    "RelatedJob",
    "RetryAfter",
    "RunSuperseded",
    "ScheduleInfo",
    "SchemaError",
    "SchemaState",
    "SignalInfo",
    "Snooze",
    "SnoozedAttempt",
    "Status",
    "Step",
    "StepInfo",
    "Subscriber",
    "SyncHandler",
    "TopQueues",
    "Tracker",
    "TrackerClosedError",
    "TrendPoint",
    "TrendRow",
    "WaitInfo",
    "WaitTimeout",
    "Worker",
    "WorkerOptions",
    "default_backoff",
    "grants",
    "install",
    "is_permanent",
    "publish",
    "uninstall",
]

__version__ = "0.1.0.dev0"

# Tracebacks name the errors where users import them from: pgqueue.SchemaError.
for _name in __all__:
    _public = globals()[_name]
    if isinstance(_public, type) and issubclass(_public, BaseException):
        _public.__module__ = __name__
del _name, _public


def __dir__() -> list[str]:
    """The public names: ``__all__``, ``__version__`` and public submodules once imported."""
    from pgqueue._core.public import public_names  # only when asked

    return public_names(globals(), [*__all__, "__version__"])
