"""`WorkerOptions`: every `Worker` option as one checked, frozen value; `Worker.with_options`."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from typing import Any

import pytest

import pgqueue
from tests.helpers import noop


def tag(handler: Any) -> Any:
    return handler


class Seen(pgqueue.Observer):
    """An observer with the no-op methods."""


# A value other than the default for every option (the one-queue form).
SAMPLES: dict[str, Any] = {
    "queue": "q",
    "concurrency": 7,
    "queues": None,  # the other form; see test_several_queues_form
    "max_concurrency": 6,
    "global_limit": 4,
    "group_limit": 2,
    "rate_limit": pgqueue.RateLimit(100, per=60.0, per_group=True),
    "prefetch": 3,
    "poll_interval": 0.25,
    "listen": False,
    "connections": pgqueue.Connections("postgresql://h/db"),
    "backoff": lambda attempt: 1.0,
    "rescue_after": 60.0,
    "job_timeout": 9.0,
    "block_warning": 2.0,
    "unknown_types": "dead",
    "retain": 3600.0,
    "shutdown_grace": None,
    "middleware": (tag,),
    "observers": (Seen(),),
    "logger": logging.getLogger("my.app"),
}


def test_worker_takes_exactly_the_options_fields() -> None:
    parameters = list(inspect.signature(pgqueue.Worker).parameters.values())
    assert parameters[0].name == "pool"
    fields = dataclasses.fields(pgqueue.WorkerOptions)
    assert [p.name for p in parameters[1:]] == [f.name for f in fields]
    for parameter, field in zip(parameters[1:], fields, strict=True):
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
        assert parameter.default == field.default, field.name
        assert type(parameter.default) is type(field.default), field.name
        # queue and concurrency are None in the several-queues form; the
        # options take what a worker uses of a Connections.
        annotation = parameter.annotation.replace("Connections", "SharedConnections")
        assert field.type in (annotation, f"{annotation} | None"), field.name


def test_the_worker_passes_every_option_on() -> None:
    assert set(SAMPLES) == {f.name for f in dataclasses.fields(pgqueue.WorkerOptions)}
    worker = pgqueue.Worker(None, **SAMPLES)  # type: ignore[arg-type]
    assert worker.options == pgqueue.WorkerOptions(**SAMPLES)
    for name, value in SAMPLES.items():
        assert getattr(worker.options, name) == value, name
    assert worker.pool is None


def test_options_are_frozen_checked_and_normalised() -> None:
    options = pgqueue.WorkerOptions(poll_interval=2, middleware=[tag])
    assert options.poll_interval == 2.0
    assert isinstance(options.poll_interval, float)
    assert options.middleware == (tag,)
    assert (options.queue, options.concurrency) == ("default", 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.prefetch = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        pgqueue.WorkerOptions("q")  # type: ignore[call-arg]  # keyword-only


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"concurrency": 0}, ValueError, "concurrency must be at least 1"),
        ({"queue": ""}, ValueError, "queue name"),
        ({"queues": {"a": 1}, "queue": "b"}, TypeError, "either queues"),
        ({"queues": {"a": 1}, "concurrency": 2}, TypeError, "either queues"),
        ({"queues": {}}, ValueError, "at least one queue"),
        ({"listen": 1}, TypeError, "listen must be a bool or a DSN"),
        ({"backoff": 3}, TypeError, "backoff"),
        ({"middleware": [3]}, TypeError, "middleware"),
        ({"poll_interval": 0}, ValueError, "poll_interval"),
        ({"retain": -1}, ValueError, "retain"),
        ({"job_timeout": "5"}, TypeError, "job_timeout"),
        ({"unknown_types": "skip"}, ValueError, "unknown_types"),
        ({"global_limit": 0}, ValueError, "at least 1"),
    ],
)
def test_options_and_worker_refuse_the_same(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        pgqueue.WorkerOptions(**options)
    with pytest.raises(error, match=message):
        pgqueue.Worker(None, **options)  # type: ignore[arg-type]


def test_connections_are_checked() -> None:
    with pytest.raises(TypeError, match=r"must be a pgqueue.Connections, not str"):
        pgqueue.WorkerOptions(connections="postgresql://h/db")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="give the LISTEN DSN to Connections"):
        pgqueue.WorkerOptions(
            connections=pgqueue.Connections("postgresql://h/db"), listen="postgresql:"
        )


def test_several_queues_form() -> None:
    options = pgqueue.WorkerOptions(queues={"a": 1, "b": 2}, global_limit={"b": 3})
    assert (options.queue, options.concurrency) == (None, None)
    assert options.queues == {"a": 1, "b": 2}
    # dataclasses.replace passes the None of queue and concurrency back in.
    assert dataclasses.replace(options, prefetch=1).queues == {"a": 1, "b": 2}


def test_with_options_copies_the_handlers_and_schedules() -> None:
    wrapped: list[str] = []

    def mark(handler: Any) -> Any:
        wrapped.append("mark")
        return handler

    worker = pgqueue.Worker(None, queue="q", concurrency=3, job_timeout=4.0)  # type: ignore[arg-type]
    worker.register("a", noop)
    worker.periodic("tick", every=60, job_type="a")
    copy = worker.with_options(concurrency=5, middleware=[mark])
    assert copy is not worker
    assert copy.state == "new"
    assert copy.options == dataclasses.replace(
        worker.options, concurrency=5, middleware=(mark,)
    )
    assert copy.job_types == ("a",)
    assert [schedule.name for schedule in copy._schedules] == ["tick"]
    assert wrapped == ["mark"]  # the handler was registered again, wrapped
    assert worker.options.concurrency == 3  # the original is untouched
    with pytest.raises(TypeError, match="no option colour"):
        worker.with_options(colour="red")
    with pytest.raises(ValueError, match="concurrency"):
        worker.with_options(concurrency=0)
