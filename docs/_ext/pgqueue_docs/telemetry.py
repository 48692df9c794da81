"""The metrics and spans reference, from the objects that make them.

``pgqueue-metrics`` creates `pgqueue.prometheus.WorkerMetrics`,
``ProducerMetrics`` and ``QueueCollector`` on a registry of its own and
tables every metric they register: its name as scraped, type, labels and
help. ``pgqueue-spans`` runs `pgqueue.otel.Tracing` against an in-memory
exporter (OpenTelemetry's SDK): an enqueue, a batch, and job runs that
return, snooze and raise, and tables each span it ended: name, kind,
attributes, links and status.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sphinx.util.docutils import SphinxDirective

from pgqueue_docs._rst import list_table, parse

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from docutils.nodes import Node
    from prometheus_client.metrics_core import Metric

__all__ = ["MetricsDirective", "SpansDirective", "metrics", "spans"]

QUEUE = "{queue}"
"""The queue name the spans are made with, so that their names show the pattern."""


def metrics() -> list[tuple[str, str, dict[str, list[str]], str, str]]:
    """``(name as scraped, type, labels, help, made by)`` of every metric.

    ``labels`` maps each label to the values a worker's observer gives it
    when told of every kind of outcome (empty for the others).
    """
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics import MetricWrapperBase

    from pgqueue.prometheus import ProducerMetrics, QueueCollector, WorkerMetrics

    registry = CollectorRegistry()
    found: list[tuple[Metric, Sequence[str], str]] = []
    for maker in (WorkerMetrics, ProducerMetrics):
        made = maker(registry)
        for wrapper in vars(made).values():
            if isinstance(wrapper, MetricWrapperBase):
                found.extend(
                    (family, wrapper._labelnames, maker.__name__)
                    for family in wrapper.describe()
                )
        if isinstance(made, WorkerMetrics):
            _every_outcome(made)
    # No query runs: the collector reads the database only in refresh().
    collector = QueueCollector(None, registry=registry)  # type: ignore[arg-type]
    found.extend(
        (family, getattr(family, "_labelnames", ()), "QueueCollector")
        for family in collector.describe()
    )
    values: dict[tuple[str, str], set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            for label, value in sample.labels.items():
                values.setdefault((family.name, label), set()).add(value)
    suffix = {"counter": "_total"}
    return [
        (
            family.name + suffix.get(family.type, ""),
            family.type,
            {
                label: sorted(values.get((family.name, label), ()))
                if label not in ("queue", "job_type")
                else []
                for label in labels
            },
            family.documentation,
            maker,
        )
        for family, labels, maker in found
    ]


def _every_outcome(metrics: Any) -> None:
    """Tell a `WorkerMetrics` observer of one outcome of each kind, and one fenced off."""
    from pgqueue import Job, Outcome
    from pgqueue._core.lifecycle import OutcomeKind

    now = datetime.now(UTC)
    job: Job[Any] = Job(
        id=1,
        queue="q",
        type="t",
        payload={},
        attempts=1,
        max_attempts=5,
        run_at=now,
        created_at=now,
    )
    metrics.observer.on_written(
        [Outcome(job, kind) for kind in OutcomeKind],
        [Outcome(job, OutcomeKind.COMPLETED)],
    )


class MetricsDirective(SphinxDirective):
    """``.. pgqueue-metrics::``: every metric of `pgqueue.prometheus`."""

    def run(self) -> list[Node]:
        """The table: metric, type, labels, help, what makes it."""
        rows = [
            (
                f"``{name}``",
                kind,
                ", ".join(
                    f"``{label}``"
                    + (f" ({', '.join(f'``{v}``' for v in values)})" if values else "")
                    for label, values in labels.items()
                ),
                help_,
                f":py:class:`~pgqueue.prometheus.{maker}`",
            )
            for name, kind, labels, help_, maker in metrics()
        ]
        return parse(
            self,
            list_table(
                ("metric", "type", "labels", "help", "from"),
                rows,
                widths="25 10 15 35 15",
            ),
        )


def spans() -> list[tuple[str, str, str, list[str], bool, str]]:
    """``(case, name, kind, attributes, linked, status)`` of each span ``Tracing`` ends."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        InMemorySpanExporter,
    )
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator,
    )

    from pgqueue import EnqueueEvent, Job, NewJob, Snooze
    from pgqueue.otel import Tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(provider, propagator=TraceContextTextMapPropagator())

    def enqueue(batch: bool) -> str | None:
        jobs = [NewJob("send_email", {})] * (2 if batch else 1)
        event = EnqueueEvent(queue=QUEUE, jobs=jobs, batch=batch)
        state = tracing.before_enqueue(event)
        event.ids = list(range(1, len(jobs) + 1))
        event.duplicates = [False, True] if batch else [False]
        tracing.after_enqueue(event, state, None)
        return event.trace_context

    def run(outcome: BaseException | None, trace_context: str | None) -> None:
        async def handler(job: Job) -> None:
            if outcome is not None:
                raise outcome

        now = datetime.now(UTC)
        job: Job[Any] = Job(
            id=1,
            queue=QUEUE,
            type="send_email",
            payload={},
            attempts=1,
            max_attempts=5,
            run_at=now,
            created_at=now,
            trace_context=trace_context,
        )

        async def traced() -> None:
            await tracing.middleware(handler)(job)

        with contextlib.suppress(Snooze, RuntimeError):  # what the handler raised
            asyncio.run(traced())

    context = enqueue(batch=False)  # its span is the first case's
    cases: list[tuple[str, Callable[[], Any]]] = [
        ("``Queue.enqueue``", lambda: None),
        (
            "``Queue.enqueue_many`` (one with a duplicate key)",
            lambda: enqueue(batch=True),
        ),
        ("a job run whose handler returns", lambda: run(None, context)),
        ("a job run whose handler snoozes", lambda: run(Snooze(1), context)),
        ("a job run whose handler raises", lambda: run(RuntimeError("boom"), None)),
    ]
    found: list[tuple[str, str, str, list[str], bool, str]] = []
    for case, act in cases:
        act()
        found.extend(
            (
                case,
                span.name,
                span.kind.name,
                sorted(span.attributes or {}),
                bool(span.links),
                span.status.status_code.name,
            )
            for span in exporter.get_finished_spans()
        )
        exporter.clear()
    provider.shutdown()
    return found


class SpansDirective(SphinxDirective):
    """``.. pgqueue-spans::``: the spans of `pgqueue.otel.Tracing`, as it makes them."""

    def run(self) -> list[Node]:
        """The table: what happened, span, kind, attributes, link, status."""
        rows = [
            (
                case,
                f"``{name}``",
                kind,
                ", ".join(f"``{attribute}``" for attribute in attributes),
                "to the producer span" if linked else "",
                status,
            )
            for case, name, kind, attributes, linked, status in spans()
        ]
        return parse(
            self,
            list_table(
                ("when", "span", "kind", "attributes", "link", "status"),
                rows,
                widths="20 12 10 38 10 10",
            ),
        )
