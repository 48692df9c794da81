"""OpenTelemetry spans for enqueues and job runs (the ``otel`` extra).

Install with ``pip install 'pgqueue-asyncio[otel]'``. ``import pgqueue``
never imports this module (nor opentelemetry).

Spans follow OpenTelemetry's messaging semantic conventions:

- ``send {queue}``, kind PRODUCER: one per `pgqueue.Queue.enqueue` call, and
  one per `pgqueue.Queue.enqueue_many` call (with
  ``messaging.batch.message_count``). Its
  context (W3C ``traceparent``, through the configured propagator) is stored
  with the jobs (`pgqueue.Job.trace_context`).
- ``process {queue}``, kind CONSUMER: one per job run, a child of whatever
  span is current in the worker (usually none: a new trace), linked to the
  producer span when the job carries its context. Jobs from a Go producer, or
  enqueued without tracing, get no link.

Attributes: ``messaging.system`` (``"pgqueue"``),
``messaging.destination.name`` (the queue), ``messaging.operation.type`` and
``messaging.operation.name`` (``send`` or ``process``),
``messaging.message.id`` (the job id; not on a batch's span, which has
``messaging.batch.message_count`` instead), ``pgqueue.job.type`` (not on a
batch's span), ``pgqueue.job.attempt`` (on ``process`` spans), and
``pgqueue.duplicates`` (on ``send`` spans whose unique keys matched live
jobs: how many). A handler that raises sets the span's status to ERROR and
records the exception (a `pgqueue.Snooze` does not: it is no failure, and
sets ``pgqueue.job.snoozed``); an enqueue that raises does the same.

Why ``messaging.system = "pgqueue"`` and not ``"postgresql"``: the
attribute names the messaging system the application talks to, whose
semantics (queues, attempts, fencing) the spans describe; PostgreSQL is
where it keeps its rows, named by ``db.system`` on database spans.

Usage::

    tracing = pgqueue.otel.Tracing()
    queue = pgqueue.Queue(pool, hooks=[tracing])
    worker = pgqueue.Worker(pool, middleware=[tracing.middleware])
"""

from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any

from opentelemetry import context, propagate, trace
from opentelemetry.trace import Link, SpanKind, StatusCode

from pgqueue import EnqueueEvent, EnqueueHook, Snooze, __version__
from pgqueue._extension import describe

if TYPE_CHECKING:
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.trace import Span, TracerProvider
    from opentelemetry.util.types import Attributes

    from pgqueue import Handler, Job

__all__ = ["MESSAGING_SYSTEM", "Tracing"]

MESSAGING_SYSTEM = "pgqueue"
"""The ``messaging.system`` of every span."""


class Tracing(EnqueueHook):
    """Producer spans as a `pgqueue.Queue` hook, consumer spans as worker `middleware`.

    Args:
        tracer_provider: where spans go; the global tracer provider if None.
        propagator: how the producer's context is written with the job and
            read back; the global propagator (W3C trace context and baggage
            by default) if None.

    Usage::

        tracing = pgqueue.otel.Tracing()
        queue = pgqueue.Queue(pool, hooks=[tracing])
        worker = pgqueue.Worker(pool, middleware=[tracing.middleware])
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        *,
        propagator: TextMapPropagator | None = None,
    ) -> None:
        self._tracer = trace.get_tracer(
            "pgqueue", __version__, tracer_provider=tracer_provider
        )
        self._propagator = propagator

    def before_enqueue(self, event: EnqueueEvent) -> tuple[Span, object]:
        """Start the call's PRODUCER span, make it current, and store its context with the jobs."""
        attributes: dict[str, Any] = {
            "messaging.system": MESSAGING_SYSTEM,
            "messaging.destination.name": event.queue,
            "messaging.operation.type": "send",
            "messaging.operation.name": "send",
        }
        if event.batch:
            attributes["messaging.batch.message_count"] = len(event.jobs)
        else:
            attributes["pgqueue.job.type"] = event.jobs[0].job_type
        span = self._tracer.start_span(
            f"send {event.queue}", kind=SpanKind.PRODUCER, attributes=attributes
        )
        current = trace.set_span_in_context(span)
        carrier: dict[str, str] = {}
        if self._propagator is None:
            propagate.inject(carrier, context=current)
        else:
            self._propagator.inject(carrier, context=current)
        if carrier:
            event.trace_context = json.dumps(carrier, separators=(",", ":"))
        return span, context.attach(current)

    def after_enqueue(
        self,
        event: EnqueueEvent,
        state: tuple[Span, object],
        error: BaseException | None,
    ) -> None:
        """End the PRODUCER span, with the job's id or the error."""
        span, token = state
        context.detach(token)  # type: ignore[arg-type]
        if event.ids and not event.batch:
            span.set_attribute("messaging.message.id", str(event.ids[0]))
        if any(event.duplicates):
            span.set_attribute("pgqueue.duplicates", sum(event.duplicates))
        if error is not None:
            _failed(span, error)
        span.end()

    def middleware(self, handler: Handler) -> Handler:
        """Wrap ``handler`` in a CONSUMER span per run, linked to the job's producer."""
        tracer = self._tracer

        @functools.wraps(handler)
        async def traced(job: Job) -> Any:
            link = self._producer_link(job)
            attributes: Attributes = {
                "messaging.system": MESSAGING_SYSTEM,
                "messaging.destination.name": job.queue,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.message.id": str(job.id),
                "pgqueue.job.type": job.type,
                "pgqueue.job.attempt": job.attempts,
            }
            with tracer.start_as_current_span(
                f"process {job.queue}",
                kind=SpanKind.CONSUMER,
                links=None if link is None else [link],
                attributes=attributes,
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                try:
                    return await handler(job)
                except Snooze:
                    span.set_attribute("pgqueue.job.snoozed", True)
                    raise
                except BaseException as exc:
                    _failed(span, exc)
                    raise

        return traced

    def _producer_link(self, job: Job) -> Link | None:
        """A link to the span that enqueued ``job``, if its context came with it."""
        text = job.trace_context
        if not text:
            return None
        try:
            carrier = json.loads(text)
            if not isinstance(carrier, dict):
                return None
            if self._propagator is None:
                extracted = propagate.extract(carrier)
            else:
                extracted = self._propagator.extract(carrier)
        except Exception:  # another producer's text: no link, never a failed job
            return None
        span_context = trace.get_current_span(extracted).get_span_context()
        return Link(span_context) if span_context.is_valid else None


def _failed(span: Span, exc: BaseException) -> None:
    span.record_exception(exc)
    span.set_status(StatusCode.ERROR, describe(exc))
