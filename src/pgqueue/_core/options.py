"""`WorkerOptions`: every option of a `Worker`, checked once where it is made.

A field's metadata also says how ``pgqueue worker`` takes it (a `Flag`), or
why it has no flag (``NO_FLAG``): the command line builds its flags from
these fields, so a new option is written here once (and in `Worker`'s
signature, which a test holds in step with these fields).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import (
    TYPE_CHECKING,
    Any,
    Literal,
    Protocol,
    TypeAlias,
    cast,
    runtime_checkable,
)

from pgqueue._core.backoff import Backoff, default_backoff
from pgqueue._core.checks import (
    check_bool,
    check_callable,
    check_duration,
    check_int,
    check_queue_name,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pgqueue._core.handler import Handler
    from pgqueue._core.hooks import Observer
    from pgqueue._core.log import Logger

    # As pgqueue.Middleware (defined in _worker, which these options sit below).
    Middleware: TypeAlias = Callable[[Handler], Handler]

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_QUEUE",
    "FLAG",
    "NO_FLAG",
    "Flag",
    "FlagKind",
    "LaneSettings",
    "RateLimit",
    "SharedConnections",
    "WorkerOptions",
    "check_global_limit",
    "check_queues",
    "check_rate_limit",
    "lane_settings",
    "option_flags",
    "queue_specs",
]


@runtime_checkable
class SharedConnections(Protocol):
    """What a worker uses of a `pgqueue.Connections` (the options sit below that module).

    Its claim, write and upkeep connections, and LISTEN routes.
    """

    claims: Any
    writes: Any
    upkeep: Any

    def route(self, *args: Any, **kwargs: Any) -> Any:
        """A LISTEN route on the shared connection."""
        ...


DEFAULT_QUEUE = "default"
"""The queue of a worker given neither ``queue`` nor ``queues``."""
DEFAULT_CONCURRENCY = 2
"""The concurrency of a worker's one queue given none."""


FlagKind: TypeAlias = Literal[
    "int",  # a whole number
    "int|none",  # a whole number, or none
    "seconds",  # a duration: 30s, 10m, 2h, 7d, 1h30m or seconds
    "seconds|none",  # a duration, or none
    "choice",  # one of Flag.choices
    "callable",  # MODULE:ATTR, a callable
    "callables",  # MODULE:ATTR, repeated; added to the worker's own
    "logger",  # a logger's name, or MODULE:ATTR
    "listen",  # --listen[=DSN] or --no-listen
    "queue",  # --queue NAME, or --queue NAME=N repeated (which gives queues)
    "queues",  # given by the queue field's flag
    "limit",  # N, none, or NAME=N repeated
    "rate",  # N/DURATION[:per-group], none, or NAME=N/DURATION repeated
]
"""What a flag's value is; the command line turns each kind into an argparse argument."""


@dataclass(frozen=True, slots=True)
class Flag:
    """How ``pgqueue worker`` takes an option: its flag, the kind of its value, its help."""

    name: str
    kind: FlagKind
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] = ()


FLAG = "pgqueue.flag"
"""The metadata key of a field's `Flag`."""
NO_FLAG = "pgqueue.no_flag"
"""The metadata key of the reason a field has no flag."""


def _flag(
    name: str,
    kind: FlagKind,
    help: str,
    metavar: str | None = None,
    choices: tuple[str, ...] = (),
) -> dict[str, Flag]:
    return {FLAG: Flag(name, kind, help, metavar, choices)}


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``limit`` job starts of a queue in any ``per`` seconds, across the fleet.

    Give it to `Worker` as ``rate_limit``. A start is a claim: the instant a
    job becomes running in the database. The window slides: no span of
    ``per`` seconds ever holds more than ``limit`` starts, whatever the
    number of workers and processes (their claims of the queue take turns,
    each counting the starts recorded in ``pgqueue_starts``). Jobs beyond it
    wait, pending; a worker whose window is full sleeps until its oldest
    start leaves it, claiming nothing meanwhile.

    Args:
        limit: the most starts in a window.
        per: the window's length in seconds.
        per_group: the limit holds for each group (``enqueue(group=...)``)
            on its own instead of the whole queue; jobs without a group are
            not limited.

    Raises:
        TypeError, ValueError: a bad value.

    .. versionadded:: 0.1
    """

    limit: int
    per: float = 1.0
    per_group: bool = False

    def __post_init__(self) -> None:
        check_int("rate limit", self.limit)
        object.__setattr__(
            self, "per", check_duration("rate limit's per", self.per, positive=True)
        )
        object.__setattr__(self, "per_group", check_bool("per_group", self.per_group))

    def __str__(self) -> str:
        """As ``pgqueue worker --rate-limit`` takes it: ``100/60s``, ``5/1s:per-group``."""
        text = repr(self.per)
        per = format(Decimal(text), "f") if "e" in text else text
        return f"{self.limit}/{per}s" + (":per-group" if self.per_group else "")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerOptions:
    """Every option of a `Worker`, checked: what `Worker.options` returns.

    Each field is the `Worker` argument of the same name (see `Worker` for
    what it does); making one checks every field, raising the `TypeError`
    or `ValueError` `Worker` raises, before any I/O. Fields hold the checked
    values: durations as floats, ``middleware`` and ``observers`` as tuples.
    ``queue`` and ``concurrency`` left ``None`` are ``"default"`` and 2; in
    the several-queues form they are ``None``.
    `Worker.with_options` copies a worker with some of them changed.

    .. versionadded:: 0.1
    """

    queue: str | None = field(
        default=None,
        metadata=_flag(
            "--queue",
            "queue",
            "the queue to consume; or, repeated as NAME=N, several queues, "
            "each with its concurrency (--queue default=10 --queue emails=2)",
            "NAME|NAME=N",
        ),
    )
    concurrency: int | None = field(
        default=None,
        metadata=_flag("--concurrency", "int", "most handlers running at once", "N"),
    )
    queues: Mapping[str, int] | None = field(
        default=None,
        metadata=_flag("--queue", "queues", "(--queue NAME=N, repeated)"),
    )
    max_concurrency: int | None = field(
        default=None,
        metadata=_flag(
            "--max-concurrency",
            "int|none",
            "most jobs running (or prefetched) across every queue",
            "N|none",
        ),
    )
    global_limit: int | Mapping[str, int] | None = field(
        default=None,
        metadata=_flag(
            "--global-limit",
            "limit",
            "most jobs of the queue running at once across every worker and "
            "process; or, repeated as NAME=N, of each queue named "
            "(--global-limit emails=3); 'none' for no limit",
            "N|NAME=N",
        ),
    )
    group_limit: int | Mapping[str, int] | None = field(
        default=None,
        metadata=_flag(
            "--group-limit",
            "limit",
            "most jobs of one group (enqueue(group=...)) of the queue running at "
            "once across every worker and process, groups taken round-robin; or, "
            "repeated as NAME=N, of each queue named; 'none' for no limit",
            "N|NAME=N",
        ),
    )
    rate_limit: RateLimit | Mapping[str, RateLimit] | None = field(
        default=None,
        metadata=_flag(
            "--rate-limit",
            "rate",
            "most job starts of the queue in any window of the given length, "
            "across every worker and process (100/60s; 5/1s:per-group for each "
            "group on its own); or, repeated as NAME=N/DURATION, of each queue "
            "named; 'none' for no limit",
            "N/DURATION|NAME=N/DURATION",
        ),
    )
    prefetch: int | None = field(
        default=None,
        metadata=_flag(
            "--prefetch",
            "int",
            "jobs claimed beyond --concurrency (default: up to --concurrency "
            "more while a backlog of short jobs lasts; 0: none)",
            "N",
        ),
    )
    poll_interval: float = field(
        default=5.0,
        metadata=_flag(
            "--poll-interval",
            "seconds",
            "time between claims when nothing wakes the worker",
            "DURATION",
        ),
    )
    listen: bool | str = field(
        default=True,
        metadata=_flag(
            "--listen",
            "listen",
            "wake on NOTIFY (the default), optionally over --listen=DSN",
            "DSN",
        ),
    )
    connections: SharedConnections | None = field(
        default=None,
        metadata={
            NO_FLAG: "an object your code makes (a worker built with it keeps it)"
        },
    )
    backoff: Backoff = field(
        default=default_backoff,
        metadata=_flag(
            "--backoff",
            "callable",
            "seconds before a retry, from the attempt number (a function)",
            "MODULE:ATTR",
        ),
    )
    rescue_after: float = field(
        default=300.0,
        metadata=_flag(
            "--rescue-after",
            "seconds",
            "time without a heartbeat before a running job is rescued",
            "DURATION",
        ),
    )
    job_timeout: float | None = field(
        default=None,
        metadata=_flag(
            "--job-timeout",
            "seconds|none",
            "how long a handler may run",
            "DURATION|none",
        ),
    )
    block_warning: float | None = field(
        default=0.5,
        metadata=_flag(
            "--block-warning",
            "seconds|none",
            "warn, naming the job, when a handler holds the event loop this long",
            "DURATION|none",
        ),
    )
    unknown_types: Literal["dead", "wait"] = field(
        default="wait",
        metadata=_flag(
            "--unknown-types",
            "choice",
            "a job whose type has no handler: left pending for a worker that "
            "has one (the default: another application's job, a rolling "
            "deploy), or dead at once",
            choices=("dead", "wait"),  # not a status
        ),
    )
    retain: float | None = field(
        default=None,
        metadata=_flag(
            "--retain",
            "seconds|none",
            "prune finished jobs older than this",
            "DURATION|none",
        ),
    )
    shutdown_grace: float | None = field(
        default=30.0,
        metadata=_flag(
            "--shutdown-grace",
            "seconds|none",
            "drain bound when run() is cancelled",
            "DURATION|none",
        ),
    )
    middleware: Sequence[Middleware] = field(
        default=(),
        metadata=_flag(
            "--middleware",
            "callables",
            "wrap every handler (repeatable; added after the worker's own)",
            "MODULE:ATTR",
        ),
    )
    observers: Sequence[Observer] = field(
        default=(),
        metadata=_flag(
            "--observer",
            "callables",
            "observe the worker (repeatable; added after the worker's own)",
            "MODULE:ATTR",
        ),
    )
    logger: Logger | None = field(
        default=None,
        metadata=_flag(
            "--logger",
            "logger",
            "a logging logger name, or a logger object",
            "NAME|MODULE:ATTR",
        ),
    )

    def __post_init__(self) -> None:
        """Check every field; keep the checked values."""
        check_callable("backoff", self.backoff)
        for wrap in self.middleware:
            check_callable("middleware", wrap)
        listen, connections = self.listen, self.connections
        if not isinstance(cast("object", listen), bool | str):
            msg = f"listen must be a bool or a DSN string, not {type(listen).__name__}"
            raise TypeError(msg)
        if connections is not None:
            if not isinstance(cast("object", connections), SharedConnections):
                msg = f"connections must be a pgqueue.Connections, not {type(connections).__name__}"
                raise TypeError(msg)
            if isinstance(listen, str):
                msg = (
                    "with connections=, give the LISTEN DSN to Connections(listen=...)"
                )
                raise TypeError(msg)
        set_ = _setter(self)
        if self.queues is None:
            queue = check_queue_name(
                DEFAULT_QUEUE if self.queue is None else self.queue
            )
            concurrency = check_int(
                "concurrency",
                DEFAULT_CONCURRENCY if self.concurrency is None else self.concurrency,
            )
            set_(queue=queue, concurrency=concurrency)
            specs = {queue: concurrency}
        else:
            if self.queue is not None or self.concurrency is not None:
                msg = (
                    "give either queues= or queue= and concurrency=, not both "
                    "(queues= gives each queue its concurrency)"
                )
                raise TypeError(msg)
            specs = check_queues(self.queues)
            set_(queue=None, concurrency=None, queues=specs)
        if self.max_concurrency is not None:
            check_int("max_concurrency", self.max_concurrency)
        check_global_limit(self.global_limit, self.queue, specs)
        if isinstance(self.global_limit, Mapping):
            set_(global_limit=dict(self.global_limit))
        check_global_limit(self.group_limit, self.queue, specs, name="group_limit")
        if isinstance(self.group_limit, Mapping):
            set_(group_limit=dict(self.group_limit))
        check_rate_limit(self.rate_limit, self.queue, specs)
        if isinstance(self.rate_limit, Mapping):
            set_(rate_limit=dict(self.rate_limit))
        set_(
            prefetch=None
            if self.prefetch is None
            else check_int("prefetch", self.prefetch, minimum=0),
            poll_interval=check_duration(
                "poll_interval", self.poll_interval, positive=True
            ),
            rescue_after=check_duration(
                "rescue_after", self.rescue_after, positive=True
            ),
            job_timeout=_optional_duration("job_timeout", self.job_timeout),
            block_warning=_optional_duration("block_warning", self.block_warning),
            unknown_types=_check_unknown_types(self.unknown_types),
            retain=None
            if self.retain is None
            else check_duration("retain", self.retain),
            shutdown_grace=_optional_duration("shutdown_grace", self.shutdown_grace),
            middleware=tuple(self.middleware),
            observers=tuple(self.observers),
        )
        for observer in self.observers:
            for name in ("on_written", "on_rescued"):
                method = getattr(observer, name, None)
                if method is not None:
                    check_callable(f"observer {name}", method)

    def limits(self) -> dict[str, int]:
        """Each queue's ``global_limit``, for the queues that have one."""
        return check_global_limit(self.global_limit, self.queue, queue_specs(self))

    def group_limits(self) -> dict[str, int]:
        """Each queue's ``group_limit``, for the queues that have one."""
        return check_global_limit(
            self.group_limit, self.queue, queue_specs(self), name="group_limit"
        )

    def rate_limits(self) -> dict[str, RateLimit]:
        """Each queue's ``rate_limit``, for the queues that have one."""
        return check_rate_limit(self.rate_limit, self.queue, queue_specs(self))

    def changed(self, **changes: Any) -> WorkerOptions:
        """These options with ``changes``, checked as new ones are.

        ``queues`` replaces ``queue`` and ``concurrency``, and ``queue``
        replaces ``queues`` (that one queue, with its ``concurrency`` if
        given); ``concurrency`` alone on options of several queues is
        refused, as `Worker` refuses it.

        Raises:
            TypeError: an option `Worker` does not take, or a bad value.
            ValueError: a bad value.
        """
        names = {f.name for f in dataclasses.fields(self)}
        if unknown := sorted(set(changes) - names):
            msg = f"Worker takes no option {', '.join(unknown)}"
            raise TypeError(msg)
        kept: dict[str, Any] = {}
        if "queues" in changes or (self.queues is not None and "queue" not in changes):
            kept["queue"] = kept["concurrency"] = None
        else:
            kept["queues"] = None
            if self.queues is not None:
                kept["concurrency"] = None
        return dataclasses.replace(self, **{**kept, **changes})


def _setter(options: WorkerOptions) -> Any:
    """Set checked values on frozen ``options`` (only while it is being made)."""

    def set_(**values: object) -> None:
        for name, value in values.items():
            object.__setattr__(options, name, value)

    return set_


def _check_unknown_types(value: object) -> Literal["dead", "wait"]:
    if isinstance(value, str) and value in ("dead", "wait"):  # not a status
        return cast('Literal["dead", "wait"]', value)
    msg = f"unknown_types must be 'dead' or 'wait', not {value!r}"  # not a status
    raise (ValueError if isinstance(value, str) else TypeError)(msg)


def _optional_duration(what: str, value: float | None) -> float | None:
    return None if value is None else check_duration(what, value, positive=True)


def queue_specs(options: WorkerOptions) -> dict[str, int]:
    """Every queue of ``options`` with its concurrency (one entry in the one-queue form)."""
    if options.queues is None:
        return {cast("str", options.queue): cast("int", options.concurrency)}
    return dict(options.queues)


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneSettings:
    """What one queue of a worker has of its own; the rest is the worker's `WorkerOptions`.

    Args:
        index: the queue's place in the worker's queues.
        name: the queue.
        concurrency: its most handlers running at once.
        global_limit: its fleet-wide limit, if any.
        group_limit: its per-group limit, if any.
        rate_limit: its rate limit, if any.
    """

    index: int
    name: str
    concurrency: int
    global_limit: int | None
    group_limit: int | None
    rate_limit: RateLimit | None


def lane_settings(options: WorkerOptions) -> tuple[LaneSettings, ...]:
    """Each queue's settings, in the order of the worker's queues."""
    limits = options.limits()
    group_limits = options.group_limits()
    rate_limits = options.rate_limits()
    return tuple(
        LaneSettings(
            index=index,
            name=name,
            concurrency=concurrency,
            global_limit=limits.get(name),
            group_limit=group_limits.get(name),
            rate_limit=rate_limits.get(name),
        )
        for index, (name, concurrency) in enumerate(queue_specs(options).items())
    )


def option_flags() -> dict[str, Flag]:
    """Each option's flag of ``pgqueue worker``, in the order of the fields."""
    return {
        field.name: field.metadata[FLAG]
        for field in dataclasses.fields(WorkerOptions)
        if FLAG in field.metadata
    }


def check_queues(queues: Mapping[str, int]) -> dict[str, int]:
    """``queues`` checked: a non-empty mapping of queue names to concurrencies."""
    if not isinstance(cast("object", queues), Mapping):
        msg = f"queues must be a mapping of queue names to concurrencies, not {type(queues).__name__}"
        raise TypeError(msg)
    if not queues:
        msg = "queues must name at least one queue"
        raise ValueError(msg)
    return {
        check_queue_name(name): check_int(f"concurrency of queue {name!r}", n)
        for name, n in queues.items()
    }


def check_global_limit(
    limit: int | Mapping[str, int] | None,
    queue: str | None,
    specs: Mapping[str, int],
    *,
    name: str = "global_limit",
) -> dict[str, int]:
    """``global_limit`` (or the option ``name`` of its shape) checked, as each limited queue's limit."""
    if limit is None:
        return {}
    if isinstance(limit, Mapping):
        given: Mapping[str, int] = limit
    elif queue is None:
        msg = (
            f"with queues=, give {name} as a mapping of queue names "
            'to limits ({"emails": 3})'
        )
        raise TypeError(msg)
    else:
        given = {queue: limit}
    limits = {}
    for queue_name, n in given.items():
        if queue_name not in specs:
            msg = (
                f"{name} names queue {queue_name!r}, which this worker does not consume"
            )
            raise ValueError(msg)
        limits[queue_name] = check_int(f"{name} of queue {queue_name!r}", n)
    return limits


def check_rate_limit(
    limit: RateLimit | Mapping[str, RateLimit] | None,
    queue: str | None,
    specs: Mapping[str, int],
) -> dict[str, RateLimit]:
    """``rate_limit`` checked, as each rate-limited queue's limit."""
    if limit is None:
        return {}
    if isinstance(limit, Mapping):
        given: Mapping[str, object] = limit
    elif queue is None:
        msg = (
            "with queues=, give rate_limit as a mapping of queue names to "
            'RateLimit ({"emails": RateLimit(10, per=1.0)})'
        )
        raise TypeError(msg)
    else:
        given = {queue: limit}
    limits = {}
    for queue_name, value in given.items():
        if queue_name not in specs:
            msg = f"rate_limit names queue {queue_name!r}, which this worker does not consume"
            raise ValueError(msg)
        if not isinstance(value, RateLimit):
            msg = f"rate_limit of queue {queue_name!r} must be a pgqueue.RateLimit, got {type(value).__name__}"
            raise TypeError(msg)
        limits[queue_name] = value
    return limits
