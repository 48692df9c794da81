"""pgqueue.otel against a real server: span names, kinds, attributes, links."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode, format_span_id, format_trace_id

import pgqueue
from pgqueue.otel import Tracing
from tests.go_module import GO_ENQUEUE
from tests.helpers import drain, row

if TYPE_CHECKING:
    from collections.abc import Iterator

    import asyncpg
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.shutdown()


@pytest.fixture
def tracing(exporter: InMemorySpanExporter) -> Tracing:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider)


async def run_noops(
    pool: asyncpg.Pool, queue: str, tracing: Tracing, exporter: InMemorySpanExporter
) -> list[ReadableSpan]:
    """Run the queue's jobs of type ``t`` (doing nothing) under tracing; their spans."""
    worker = pgqueue.Worker(pool, queue=queue, middleware=[tracing.middleware])

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        return None

    await drain(worker)
    return spans(exporter, f"process {queue}")


def spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


def identity(context: SpanContext | None) -> tuple[int, int]:
    """A span's identity (a context read back from a job is remote: not equal)."""
    assert context is not None
    return context.trace_id, context.span_id


def message_id(span: ReadableSpan) -> str:
    return str((span.attributes or {})["messaging.message.id"])


def traceparent(span: ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None
    trace_id, span_id = (
        format_trace_id(context.trace_id),
        format_span_id(context.span_id),
    )
    return f"00-{trace_id}-{span_id}-{context.trace_flags:02x}"


async def test_enqueue_then_run_links_the_consumer_span_to_the_producer(
    pool: asyncpg.Pool,
    queue_name: str,
    tracing: Tracing,
    exporter: InMemorySpanExporter,
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name, hooks=[tracing])
    job_id = await queue.enqueue("send_email", {"to": "a@example.com"})
    [send] = exporter.get_finished_spans()
    assert send.name == f"send {queue_name}"
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is None
    assert dict(send.attributes or {}) == {
        "messaging.system": "pgqueue",
        "messaging.destination.name": queue_name,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.message.id": str(job_id),
        "pgqueue.job.type": "send_email",
    }
    assert send.status.status_code is StatusCode.UNSET
    stored = (await row(pool, job_id))["trace_context"]
    assert json.loads(stored) == {"traceparent": traceparent(send)}

    seen: list[pgqueue.Job] = []
    worker = pgqueue.Worker(pool, queue=queue_name, middleware=[tracing.middleware])

    @worker.handler("send_email")
    async def handle(job: pgqueue.Job) -> None:
        seen.append(job)

    await drain(worker)
    assert seen[0].trace_context == stored
    [process] = spans(exporter, f"process {queue_name}")
    assert process.kind is SpanKind.CONSUMER
    assert process.parent is None
    assert dict(process.attributes or {}) == {
        "messaging.system": "pgqueue",
        "messaging.destination.name": queue_name,
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.message.id": str(job_id),
        "pgqueue.job.type": "send_email",
        "pgqueue.job.attempt": 1,
    }
    [link] = process.links
    assert identity(link.context) == identity(send.get_span_context())
    assert process.status.status_code is StatusCode.UNSET
    assert process.context is not None
    assert send.context is not None
    assert process.context.trace_id != send.context.trace_id  # a trace of its own


async def test_one_producer_span_for_a_batch_linked_from_every_run(
    pool: asyncpg.Pool,
    queue_name: str,
    tracing: Tracing,
    exporter: InMemorySpanExporter,
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name, hooks=[tracing])
    ids = await queue.enqueue_many([("t", {"n": n}) for n in range(3)])
    [send] = exporter.get_finished_spans()
    assert send.name == f"send {queue_name}"
    assert send.kind is SpanKind.PRODUCER
    assert dict(send.attributes or {}) == {
        "messaging.system": "pgqueue",
        "messaging.destination.name": queue_name,
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.batch.message_count": 3,
    }
    contexts = {(await row(pool, job_id))["trace_context"] for job_id in ids}
    assert contexts == {
        json.dumps({"traceparent": traceparent(send)}, separators=(",", ":"))
    }

    processed = await run_noops(pool, queue_name, tracing, exporter)
    assert sorted(message_id(span) for span in processed) == sorted(
        str(job_id) for job_id in ids
    )
    for span in processed:
        [link] = span.links
        assert identity(link.context) == identity(send.get_span_context())


async def test_a_failing_job_sets_the_error_status(
    pool: asyncpg.Pool,
    queue_name: str,
    tracing: Tracing,
    exporter: InMemorySpanExporter,
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name, hooks=[tracing])
    await queue.enqueue("t", {}, max_attempts=1)
    await queue.enqueue("snooze", {})
    worker = pgqueue.Worker(pool, queue=queue_name, middleware=[tracing.middleware])

    @worker.handler("t")
    async def handle(_job: pgqueue.Job) -> None:
        raise ValueError("boom")

    @worker.handler("snooze")
    async def snooze(job: pgqueue.Job) -> None:
        if job.snoozes == 0:
            raise pgqueue.Snooze(0)

    await drain(worker)
    processed = spans(exporter, f"process {queue_name}")
    by_type: dict[Any, list[ReadableSpan]] = {}
    for span in processed:
        by_type.setdefault((span.attributes or {})["pgqueue.job.type"], []).append(span)
    [failed] = by_type["t"]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "ValueError: boom"
    [event] = failed.events
    assert event.name == "exception"
    assert (event.attributes or {})["exception.type"] == "ValueError"
    snoozed, completed = by_type["snooze"]
    assert snoozed.status.status_code is StatusCode.UNSET
    assert (snoozed.attributes or {})["pgqueue.job.snoozed"] is True
    assert "pgqueue.job.snoozed" not in (completed.attributes or {})
    assert len(spans(exporter, f"send {queue_name}")) == 2


async def test_a_go_producers_job_gets_a_span_without_a_link(
    pool: asyncpg.Pool,
    queue_name: str,
    tracing: Tracing,
    exporter: InMemorySpanExporter,
) -> None:
    job_id = await pool.fetchval(GO_ENQUEUE, queue_name, "t", "{}", 5)
    assert (await row(pool, job_id))["trace_context"] is None
    not_ours = await pool.fetchval(
        "INSERT INTO pgqueue_jobs (queue, job_type, trace_context)"
        " VALUES ($1, 't', 'not json') RETURNING id",
        queue_name,
    )
    processed = await run_noops(pool, queue_name, tracing, exporter)
    assert sorted(message_id(span) for span in processed) == sorted(
        [str(job_id), str(not_ours)]
    )
    for span in processed:
        assert span.links == ()
        assert span.parent is None
        assert span.kind is SpanKind.CONSUMER
    assert (await row(pool, not_ours))["status"] == "completed"


async def test_a_failed_enqueue_ends_its_span_in_error(
    pool: asyncpg.Pool,
    queue_name: str,
    tracing: Tracing,
    exporter: InMemorySpanExporter,
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name, hooks=[tracing])
    key = f"{queue_name}-k"
    first = await queue.enqueue("t", {}, unique_key=key)
    with pytest.raises(pgqueue.DuplicateJobError):
        await queue.enqueue("t", {}, unique_key=key, on_conflict="raise")
    ok, duplicate = exporter.get_finished_spans()
    assert ok.status.status_code is StatusCode.UNSET
    assert duplicate.status.status_code is StatusCode.ERROR
    assert (duplicate.attributes or {})["messaging.message.id"] == str(first)
    assert (duplicate.attributes or {})["pgqueue.duplicates"] == 1


async def test_the_producer_span_is_current_during_the_enqueue(
    pool: asyncpg.Pool,
    queue_name: str,
    tracing: Tracing,
    exporter: InMemorySpanExporter,
) -> None:
    """A span started while the statement runs (asyncpg instrumentation) is its child."""
    from opentelemetry import trace

    class Child(pgqueue.EnqueueHook):
        def before_enqueue(self, event: pgqueue.EnqueueEvent) -> Any:
            self.parent = trace.get_current_span().get_span_context()

    child = Child()
    queue = pgqueue.Queue(pool, name=queue_name, hooks=[tracing, child])
    await queue.enqueue("t", {})
    [send] = exporter.get_finished_spans()
    assert child.parent == send.get_span_context()
    assert not trace.get_current_span().get_span_context().is_valid  # reset after


async def test_without_an_sdk_nothing_is_stored(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    """The global tracer provider, never configured: no spans, no context stored."""
    queue = pgqueue.Queue(pool, name=queue_name, hooks=[Tracing()])
    job_id = await queue.enqueue("t", {})
    assert (await row(pool, job_id))["trace_context"] is None
