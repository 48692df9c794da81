"""Prometheus metrics for workers, producers and queues (the ``prometheus`` extra).

Install with ``pip install 'pgqueue-asyncio[prometheus]'``. ``import pgqueue``
never imports this module (nor prometheus_client).

Usage::

    from pgqueue.prometheus import ProducerMetrics, QueueCollector, WorkerMetrics, serve

    metrics = WorkerMetrics()
    worker = pgqueue.Worker(
        pool, middleware=[metrics.middleware], observers=[metrics.observer]
    )
    queue = pgqueue.Queue(pool, hooks=[ProducerMetrics()])
    serve(9191)  # /metrics on 127.0.0.1:9191, from a thread

Metrics (the ``pgqueue`` prefix is ``namespace``):

- ``pgqueue_jobs_finished_total{queue, job_type, outcome}``: outcomes the
  worker wrote: ``completed``, ``retried``, ``dead``, ``cancelled``,
  ``snoozed``, ``released`` (claimed, never started, given back on stop),
  and ``stale`` (fenced off: the run had been rescued, nothing was written).
  A job type the worker has no handler for is counted as
  ``job_type="(unknown)"`` (`UNKNOWN_JOB_TYPE`): whatever types a producer
  writes, the worker's series stay as many as its handlers.
- ``pgqueue_job_duration_seconds{queue, job_type}``: handler run time.
- ``pgqueue_job_wait_seconds{queue, job_type}``: from the job's ``run_at``
  to its handler's start (the worker's clock against the database's).
- ``pgqueue_jobs_in_flight{queue, job_type}``: handlers running now.
- ``pgqueue_jobs_rescued_total{queue, status}``: orphans the rescue sweep
  found, by what they became (``pending``, ``dead``, ``cancelled``).
- ``pgqueue_jobs_enqueued_total{queue, job_type}``: new jobs.
- ``pgqueue_enqueue_duplicates_total{queue, job_type}``: enqueues whose
  unique key gave an existing job's id.
- ``pgqueue_enqueue_failures_total{queue}``: enqueue calls that raised
  before the database answered.
- From `QueueCollector`: ``pgqueue_queue_jobs{queue, status}`` (``waiting``, ``ready``,
  ``scheduled``, ``running``, ``completed``, ``dead``, ``cancelled``),
  ``pgqueue_queue_lag_seconds{queue}``,
  ``pgqueue_queue_longest_running_seconds{queue}``,
  ``pgqueue_queue_paused{queue}``, of at most ``max_queues`` queues (those
  with the most jobs to do), ``pgqueue_queue_series_omitted`` (the queues
  left out) and ``pgqueue_queue_stats_age_seconds``.
"""

from __future__ import annotations

import functools
import hashlib
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import anyio
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pgqueue import Admin, EnqueueEvent, EnqueueHook, Logger, Observer
from pgqueue._extension import (
    QUEUE_COUNTS,
    QUEUES_SHOWN,
    OutcomeKind,
    check_int,
    check_queue_name,
    clipped,
    default_logger,
    printable,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from prometheus_client.metrics_core import Metric

    from pgqueue import Executor, Handler, Job, Outcome, TopQueues

__all__ = [
    "DURATION_BUCKETS",
    "UNKNOWN_JOB_TYPE",
    "ProducerMetrics",
    "QueueCollector",
    "WorkerMetrics",
    "serve",
]

DURATION_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    300.0, 900.0, 3600.0,
)  # fmt: skip
"""Buckets (seconds) of the duration and wait histograms; jobs last from
milliseconds to an hour, and wait as long."""

UNKNOWN_JOB_TYPE = "(unknown)"
"""The ``job_type`` label of outcomes of job types with no handler in the worker."""

# What each written outcome is counted as: its kind, a failure to retry as
# "retried".
_OUTCOMES: dict[OutcomeKind, str] = {kind: kind.value for kind in OutcomeKind} | {
    OutcomeKind.PENDING: "retried"
}


class WorkerMetrics:
    """A worker's job metrics: give it `middleware` and `observer`.

    One instance may serve any number of workers (every metric has a
    ``queue`` label); create it once per registry, as prometheus_client
    refuses a metric name registered twice.

    Args:
        registry: where to register; prometheus_client's default ``REGISTRY``
            if None.
        namespace: the prefix of every metric name.
        buckets: the duration and wait histograms' buckets, in seconds.
        job_types: job types labelled by name from the start; a type is
            labelled by name too once one of its jobs ran through
            `middleware` (it has a handler). Outcomes of any other type
            count as `UNKNOWN_JOB_TYPE`.

    Usage::

        metrics = WorkerMetrics()
        worker = pgqueue.Worker(
            pool, middleware=[metrics.middleware], observers=[metrics.observer]
        )
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        namespace: str = "pgqueue",
        buckets: Sequence[float] = DURATION_BUCKETS,
        job_types: Iterable[str] = (),
    ) -> None:
        where: dict[str, Any] = {
            "namespace": namespace,
            "registry": REGISTRY if registry is None else registry,
        }
        self.job_types: set[str] = set(job_types)
        """The job types labelled by name (see ``job_types``); add to it freely."""
        job = ("queue", "job_type")
        self.finished = Counter(
            "jobs_finished",
            "Job runs whose outcome the worker wrote, by outcome "
            "(stale: fenced off, the run had been rescued).",
            [*job, "outcome"],
            **where,
        )
        self.duration = Histogram(
            "job_duration_seconds",
            "How long handlers ran.",
            job,
            **where,
            buckets=buckets,
        )
        self.wait = Histogram(
            "job_wait_seconds",
            "From a job's run_at to its handler's start.",
            job,
            **where,
            buckets=buckets,
        )
        self.in_flight = Gauge("jobs_in_flight", "Handlers running now.", job, **where)
        self.rescued = Counter(
            "jobs_rescued",
            "Orphaned running jobs the rescue sweep found, by what they became.",
            ["queue", "status"],
            **where,
        )
        self.observer: Observer = _WorkerObserver(
            self.finished, self.rescued, self.job_types
        )
        """Give it to `pgqueue.Worker` ``observers``."""

    def middleware(self, handler: Handler) -> Handler:
        """Wrap ``handler``: time it, count it in flight, measure its job's wait."""
        wait, duration, in_flight = self.wait, self.duration, self.in_flight
        handled = self.job_types

        @functools.wraps(handler)
        async def measured(job: Job) -> Any:
            handled.add(job.type)  # a type with a handler: bounded by the code
            labels = (job.queue, job.type)
            try:
                waited = (datetime.now(UTC) - job.run_at).total_seconds()
            except OverflowError:  # run_at at -infinity: no wait to speak of
                waited = 0.0
            wait.labels(*labels).observe(max(waited, 0.0))
            gauge = in_flight.labels(*labels)
            gauge.inc()
            start = time.perf_counter()
            try:
                return await handler(job)
            finally:
                duration.labels(*labels).observe(time.perf_counter() - start)
                gauge.dec()

        return measured


class _WorkerObserver(Observer):
    def __init__(self, finished: Counter, rescued: Counter, known: set[str]) -> None:
        self._finished = finished
        self._rescued = rescued
        self._known = known

    def on_written(self, written: Sequence[Outcome], fenced: Sequence[Outcome]) -> None:
        finished, known = self._finished, self._known
        for outcome in written:
            job = outcome.job
            status = _OUTCOMES.get(outcome.status, outcome.status)
            job_type = job.type if job.type in known else UNKNOWN_JOB_TYPE
            finished.labels(job.queue, job_type, status).inc()
        for outcome in fenced:
            job = outcome.job
            job_type = job.type if job.type in known else UNKNOWN_JOB_TYPE
            finished.labels(job.queue, job_type, "stale").inc()

    def on_rescued(self, queue: str, statuses: Mapping[str, int]) -> None:
        for status, count in statuses.items():
            self._rescued.labels(queue, status).inc(count)


class ProducerMetrics(EnqueueHook):
    """Enqueue counts: give it to `pgqueue.Queue` ``hooks``.

    Args:
        registry: where to register; prometheus_client's default ``REGISTRY``
            if None.
        namespace: the prefix of every metric name.

    Usage::

        queue = pgqueue.Queue(pool, hooks=[ProducerMetrics()])
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, namespace: str = "pgqueue"
    ) -> None:
        where: dict[str, Any] = {
            "namespace": namespace,
            "registry": REGISTRY if registry is None else registry,
        }
        self.enqueued = Counter(
            "jobs_enqueued", "Jobs enqueued (new rows).", ["queue", "job_type"], **where
        )
        self.duplicates = Counter(
            "enqueue_duplicates",
            "Enqueues whose unique key gave an existing job's id instead of a new row.",
            ["queue", "job_type"],
            **where,
        )
        self.failures = Counter(
            "enqueue_failures",
            "Enqueue calls that raised before the database answered.",
            ["queue"],
            **where,
        )

    def after_enqueue(
        self, event: EnqueueEvent, state: Any, error: BaseException | None
    ) -> None:
        """Count the call's new jobs and duplicates (or its failure)."""
        if not event.ids:
            if error is not None:
                self.failures.labels(event.queue).inc()
            return
        for job, duplicate in zip(event.jobs, event.duplicates, strict=True):
            counter = self.duplicates if duplicate else self.enqueued
            counter.labels(event.queue, job.job_type).inc()


class QueueCollector(Collector):
    """Per-queue counts and lag from the database, cached, for a registry.

    A scrape never queries the database and never waits: `run` (a task of
    your event loop, next to the worker) refreshes the cache every ``ttl``
    seconds, and ``collect()`` (called from the HTTP server's thread)
    reads it. However many scrapers there are, the database sees one stats
    query per ``ttl``. The stats are `pgqueue.Admin.top_queues`'s:
    index-backed; ``completed`` is an estimate on a large table.

    A scrape stays small whatever producers write: series of at most
    ``max_queues`` queues, those with the most jobs to do (``queues``
    chooses them instead), and ``pgqueue_queue_series_omitted`` counts the
    queues left out. A ``queue`` label is the name as `pgqueue.Worker`'s
    metrics give it, but for a name of more than 200 characters (cut, and
    marked ``…(cut 1a2b3c4d)`` with a hash of the name, so that two long
    names stay two series) or holding control characters (escaped, as
    ``\x1b``), which only another client can write.

    Args:
        executor: the pool (or connection) to query.
        queue: one queue's stats only (as ``queues=[queue]``).
        queues: only these queues' stats, each whether it has jobs or not
            (the allow-list of a shared database); every queue if None.
        max_queues: series of at most this many queues.
        ttl: seconds between refreshes.
        registry: where to register; prometheus_client's default
            ``REGISTRY`` if None.
        namespace: the prefix of every metric name.
        logger: where to log a failed refresh (the cache then stays as it
            was, and ``pgqueue_queue_stats_age_seconds`` grows).

    Usage::

        collector = QueueCollector(pool)
        async with anyio.create_task_group() as tg:
            tg.start_soon(collector.run)
            await worker.run()
            tg.cancel_scope.cancel()
    """

    def __init__(
        self,
        executor: Executor,
        *,
        queue: str | None = None,
        queues: Iterable[str] | None = None,
        max_queues: int = QUEUES_SHOWN,
        ttl: float = 15.0,
        registry: CollectorRegistry | None = None,
        namespace: str = "pgqueue",
        logger: Logger | None = None,
    ) -> None:
        if not ttl > 0:
            msg = f"ttl must be a positive number of seconds, not {ttl!r}"
            raise ValueError(msg)
        if isinstance(queues, str):
            msg = "queues must be an iterable of queue names, not a str"
            raise TypeError(msg)
        if queue is not None and queues is not None:
            msg = "give queue or queues, not both"
            raise TypeError(msg)
        self._admin = Admin(executor, logger=logger)
        listed = [queue] if queue is not None else queues
        self._queues = None if listed is None else [check_queue_name(q) for q in listed]
        self._max_queues = check_int("max_queues", max_queues)
        self._ttl = float(ttl)
        self._prefix = f"{namespace}_queue" if namespace else "queue"
        self._logger = default_logger(logger)
        self._families: list[Metric] = self._build(None)
        self._refreshed_at: float | None = None
        (REGISTRY if registry is None else registry).register(self)

    @property
    def ttl(self) -> float:
        """Seconds between refreshes."""
        return self._ttl

    async def refresh(self) -> None:
        """Query the stats now and replace the cache.

        Raises:
            Exception: whatever the query raises (the cache is left as it
                was).
        """
        top = await self._admin.top_queues(self._max_queues, queues=self._queues)
        self._families = self._build(top)
        self._refreshed_at = time.monotonic()

    async def run(self) -> None:
        """Refresh the cache at once and then every ``ttl`` seconds, until cancelled.

        A refresh that fails is logged and tried again at the next tick.
        """
        while True:
            try:
                await self.refresh()
            except Exception as exc:
                self._logger.warning(
                    "refreshing queue stats for Prometheus failed",
                    extra={"error": f"{type(exc).__name__}: {exc}"},
                )
            await anyio.sleep(self._ttl)

    def describe(self) -> Iterable[Metric]:
        """The metric families, without samples (read at registration)."""
        return [*self._build(None), self._age()]

    def collect(self) -> Iterable[Metric]:
        """The cached families, and how old they are; never blocks."""
        age = self._age()
        refreshed = self._refreshed_at
        age.add_metric(
            [], float("nan") if refreshed is None else time.monotonic() - refreshed
        )
        return [*self._families, age]

    def _age(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            f"{self._prefix}_stats_age_seconds",
            "Seconds since the queue stats were read from the database "
            "(NaN before the first read).",
        )

    def _build(self, top: TopQueues | None) -> list[Metric]:
        prefix = self._prefix
        jobs = GaugeMetricFamily(
            f"{prefix}_jobs",
            "Jobs in each queue by status (ready: pending and due; scheduled: "
            "pending, not yet due; waiting: for their parents). completed is an "
            "estimate on a large table.",
            labels=["queue", "status"],
        )
        lag = GaugeMetricFamily(
            f"{prefix}_lag_seconds",
            "How long the oldest ready job of each queue has waited.",
            labels=["queue"],
        )
        longest = GaugeMetricFamily(
            f"{prefix}_longest_running_seconds",
            "How long the longest running job of each queue has run.",
            labels=["queue"],
        )
        paused = GaugeMetricFamily(
            f"{prefix}_paused",
            "1 while the queue is paused (pgqueue.Admin.pause), else 0.",
            labels=["queue"],
        )
        omitted = GaugeMetricFamily(
            f"{prefix}_series_omitted",
            "Queues left out of the per-queue series: beyond max_queues (those "
            "with the fewest jobs to do).",
        )
        if top is None:
            return [jobs, lag, longest, paused, omitted]
        left_out = top.more
        labelled: set[str] = set()
        for row in top.queues:
            queue = _label(row.queue)
            if queue in labelled:  # two names alike in their first 1,025 characters
                left_out += 1
                continue
            labelled.add(queue)
            for status in QUEUE_COUNTS:
                jobs.add_metric([queue, status], float(getattr(row, status) or 0))
            lag.add_metric([queue], float(row.lag or 0.0))
            longest.add_metric([queue], float(row.longest_running or 0.0))
            paused.add_metric([queue], 1.0 if row.paused else 0.0)
        omitted.add_metric([], float(left_out))
        return [jobs, lag, longest, paused, omitted]


def _label(name: str) -> str:
    """The ``queue`` label of ``name``: as it is, unless it is long or holds control characters.

    A name of more than 200 characters is cut, and marked with a hash of
    the name (``…(cut 1a2b3c4d)``); control characters are escaped as the
    command line shows them (``\x1b``).
    """
    head, cut = clipped(name)
    if not cut:
        return printable(name)
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=4)
    return f"{printable(head)}…(cut {digest.hexdigest()})"


def serve(
    port: int, addr: str = "127.0.0.1", registry: CollectorRegistry | None = None
) -> None:
    """Serve ``/metrics`` of ``registry`` (the default one if None) on ``addr:port``.

    ``addr`` is this machine only by default; ``"0.0.0.0"`` (or ``"::"``)
    serves every interface, to be scraped from elsewhere.

    The server runs in a daemon thread of its own and lives as long as the
    process; returns once it listens.

    Raises:
        OSError: the port is taken (or not allowed).
    """
    start_http_server(port, addr, registry=REGISTRY if registry is None else registry)
