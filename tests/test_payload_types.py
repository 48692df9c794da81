"""Payloads users have: UUID, datetime, date, time, Decimal and Enum fields.

A dataclass payload encodes them as JSON strings (an Enum as its value) and
a typed handler gets them back, decoded by the field's annotation, nested
dataclasses, optionals, lists and dicts included. The untyped API takes
``Queue(..., json_encoder=...)``, a hook like ``json.dumps``'s ``default``;
without one, an error names the field and suggests the fix. Everything runs
through the real queue and worker against a real server.
"""

from __future__ import annotations

import enum
import functools
import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Optional

import pytest

import pgqueue
from tests.helpers import queue_count, row, rows

if TYPE_CHECKING:
    import asyncpg


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Size(enum.IntEnum):
    SMALL = 1
    LARGE = 2


class Channel(enum.StrEnum):
    EMAIL = "email"
    SMS = "sms"


@dataclass(frozen=True)
class Line:
    sku: uuid.UUID
    price: Decimal
    color: Color = Color.RED


@dataclass(frozen=True)
class Order:
    id: uuid.UUID
    placed_at: datetime
    ship_on: date
    total: Decimal
    size: Size
    channel: Channel
    lines: list[Line]
    opens_at: time = time(9, 30)
    paid_at: datetime | None = None
    refunded_at: Optional[datetime] = None  # noqa: UP045 - the spelling under test
    by_day: dict[str, date] = field(default_factory=dict)
    previous: list[uuid.UUID] = field(default_factory=list)


ORDER = Order(
    id=uuid.UUID("0b6f9c54-3c52-4b5c-9a8e-1f2d3c4b5a69"),
    placed_at=datetime(2026, 12, 4, 10, 30, 15, 123456, tzinfo=UTC),
    ship_on=date(2026, 12, 24),
    total=Decimal("1234567890.1234567890"),
    size=Size.LARGE,
    channel=Channel.SMS,
    lines=[
        Line(uuid.UUID(int=1), Decimal("0.10")),
        Line(uuid.UUID(int=2), Decimal("-3E+2"), Color.GREEN),
    ],
    paid_at=datetime(2026, 12, 4, 12, 0, tzinfo=timezone(timedelta(hours=-5))),
    by_day={"mon": date(2026, 12, 7)},
    previous=[uuid.UUID(int=3)],
)

STORED_ORDER = {
    "id": "0b6f9c54-3c52-4b5c-9a8e-1f2d3c4b5a69",
    "placed_at": "2026-12-04T10:30:15.123456+00:00",
    "ship_on": "2026-12-24",
    "total": "1234567890.1234567890",
    "size": 2,
    "channel": "sms",
    "lines": [
        {
            "sku": "00000000-0000-0000-0000-000000000001",
            "price": "0.10",
            "color": "red",
        },
        {
            "sku": "00000000-0000-0000-0000-000000000002",
            "price": "-3E+2",
            "color": "green",
        },
    ],
    "opens_at": "09:30:00",
    "paid_at": "2026-12-04T12:00:00-05:00",
    "refunded_at": None,
    "by_day": {"mon": "2026-12-07"},
    "previous": ["00000000-0000-0000-0000-000000000003"],
}


def _same(left: Any, right: Any) -> None:
    """Equal, with the same types all the way down (Decimal('0.10') == 0.1 is not enough)."""
    assert type(left) is type(right), (left, right)
    if isinstance(left, dict):
        assert left.keys() == right.keys()
        for key in left:
            _same(left[key], right[key])
    elif isinstance(left, list):
        assert len(left) == len(right)
        for a, b in zip(left, right, strict=True):
            _same(a, b)
    elif hasattr(left, "__dataclass_fields__"):
        for name in left.__dataclass_fields__:
            _same(getattr(left, name), getattr(right, name))
    elif isinstance(left, Decimal):
        assert str(left) == str(right)  # the same digits, not just the same value
    else:
        assert left == right
        if isinstance(left, datetime):
            assert left.utcoffset() == right.utcoffset()


async def test_a_dataclass_with_uuid_datetime_date_decimal_and_enum_fields_round_trips(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    seen: list[Order] = []
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("ship")
    async def ship(job: pgqueue.Job[Order]) -> None:
        seen.append(job.payload)

    job_id = await queue.enqueue("ship", ORDER)
    await queue.enqueue_many([pgqueue.NewJob("ship", ORDER), ("ship", ORDER)])
    await worker.run(until_empty=True)

    assert len(seen) == 3
    for payload in seen:
        _same(payload, ORDER)
    assert json.loads((await row(pool, job_id))["payload"]) == STORED_ORDER
    assert [r["status"] for r in await rows(pool, queue.name)] == ["completed"] * 3


async def test_values_another_producer_wrote_are_decoded_by_the_annotation(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    # What a Go producer or a hand-written row may hold: a "Z" offset, JSON
    # numbers for a Decimal, upper-case hex for a UUID.
    seen: list[Order] = []
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("ship")
    async def ship(job: pgqueue.Job[Order]) -> None:
        seen.append(job.payload)

    written = {
        **STORED_ORDER,
        "id": STORED_ORDER["id"].upper(),  # type: ignore[attr-defined]
        "placed_at": "2026-12-04T10:30:15.123456Z",
        "total": 12,
        "lines": [{"sku": str(uuid.UUID(int=9)), "price": 0.25}],
    }
    del written["opens_at"], written["refunded_at"]
    await queue.enqueue("ship", written)
    await worker.run(until_empty=True)

    [order] = seen
    assert order.id == ORDER.id
    assert order.placed_at == ORDER.placed_at
    assert order.placed_at.tzinfo is not None
    _same(order.total, Decimal(12))
    _same(order.lines, [Line(uuid.UUID(int=9), Decimal("0.25"))])
    assert (order.opens_at, order.refunded_at) == (time(9, 30), None)


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"id": "not-a-uuid"}, "field 'id': expected UUID, got str 'not-a-uuid'"),
        ({"id": 7}, "field 'id': expected UUID, got int"),
        (
            {"placed_at": "yesterday"},
            "field 'placed_at': expected an ISO 8601 datetime, got str 'yesterday'",
        ),
        ({"ship_on": "2026-13-01"}, "field 'ship_on': expected an ISO 8601 date"),
        ({"total": "lots"}, "field 'total': expected Decimal, got str 'lots'"),
        ({"total": True}, "field 'total': expected Decimal, got bool"),
        ({"size": 3}, "field 'size': expected a Size value (1, 2), got int 3"),
        ({"size": "1"}, "field 'size': expected a Size value (1, 2), got str '1'"),
        (
            {"lines": [{"sku": str(uuid.UUID(int=1)), "price": "1", "color": "blue"}]},
            "field 'lines[0].color': expected a Color value ('red', 'green'), got str 'blue'",
        ),
        (
            {"paid_at": 5},
            "field 'paid_at': expected datetime | None, got int",
        ),
    ],
)
async def test_a_value_that_does_not_fit_its_annotation_dead_letters_the_job(
    pool: asyncpg.Pool, queue: pgqueue.Queue, changes: dict[str, Any], error: str
) -> None:
    called: list[object] = []
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("ship")
    async def ship(job: pgqueue.Job[Order]) -> None:
        called.append(job.payload)

    job_id = await queue.enqueue("ship", {**STORED_ORDER, **changes}, max_attempts=5)
    await worker.run(until_empty=True)
    stored = await row(pool, job_id)
    assert (stored["status"], stored["attempts"]) == ("dead", 1)
    assert stored["last_error"].startswith(
        f"Permanent: payload does not match Order: {error}"
    ), stored["last_error"]
    assert called == []


@dataclass
class Report:
    when: datetime
    rows: int


async def test_a_typed_handlers_result_may_hold_these_types_too(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("ship")
    async def ship(job: pgqueue.Job[Order]) -> Report:
        return Report(when=job.payload.placed_at, rows=len(job.payload.lines))

    job_id = await queue.enqueue("ship", ORDER)
    await worker.run(until_empty=True)
    stored = await row(pool, job_id)
    assert stored["status"] == "completed", stored["last_error"]
    assert json.loads(stored["result"]) == {
        "when": "2026-12-04T10:30:15.123456+00:00",
        "rows": 2,
    }


# The untyped API: plain dicts and lists.


class Opaque:
    def __repr__(self) -> str:
        return "Opaque()"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            {"when": datetime(2026, 1, 1, tzinfo=UTC)},
            (
                "payload field 'when' (datetime) is not JSON-serializable; pass "
                "Queue(json_encoder=...) to encode it, or enqueue a dataclass or a "
                "pydantic model"
            ),
        ),
        (
            {"order": {"lines": [{"sku": uuid.UUID(int=1)}]}},
            "payload field 'order.lines[0].sku' (UUID) is not JSON-serializable",
        ),
        ([1, Decimal("2")], "payload field '[1]' (Decimal) is not JSON"),
        (uuid.UUID(int=1), "payload (UUID) is not JSON-serializable; pass Queue("),
        # In a dataclass, a type it does not encode: the hint is the same.
        (
            Report(when=Opaque(), rows=1),  # type: ignore[arg-type]
            "payload field 'when' (Opaque) is not JSON-serializable; pass Queue",
        ),
    ],
)
async def test_an_untyped_payload_that_json_cannot_hold_names_its_field_and_the_fix(
    pool: asyncpg.Pool, queue: pgqueue.Queue, payload: Any, message: str
) -> None:
    with pytest.raises(TypeError, match=re.escape(message)):
        await queue.enqueue("t", payload)
    with pytest.raises(TypeError, match=re.escape(f"job 1: {message}")):
        await queue.enqueue_many([("t", {}), ("t", payload)])
    assert await queue_count(pool, queue.name) == 0


async def test_json_encoder_encodes_what_json_cannot(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name, json_encoder=str)
    seen: list[Any] = []
    worker = pgqueue.Worker(pool, queue=queue_name)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        seen.append(job.payload)

    when = datetime(2026, 1, 1, 8, tzinfo=UTC)
    await queue.enqueue("t", {"id": uuid.UUID(int=1), "when": when})
    await queue.enqueue_many([("t", [Decimal("1.10"), {"day": date(2026, 1, 2)}])])
    await worker.run(until_empty=True)
    assert sorted(seen, key=str) == [
        ["1.10", {"day": "2026-01-02"}],
        {"id": str(uuid.UUID(int=1)), "when": "2026-01-01 08:00:00+00:00"},
    ]


def _returns(result: object, _value: object) -> object:
    return result


def _encode(value: object) -> object:
    """A json_encoder as json.dumps's default: a value JSON can hold, or TypeError."""
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, set):
        return sorted(value)
    msg = f"cannot encode {type(value).__name__}"
    raise TypeError(msg)


async def test_json_encoder_may_return_containers_and_refuse_values(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name, json_encoder=_encode)
    job_id = await queue.enqueue(
        "t", {"at": datetime(2026, 1, 1, tzinfo=UTC), "tags": {"b", "a"}}
    )
    assert json.loads((await row(pool, job_id))["payload"]) == {
        "at": {"$datetime": "2026-01-01T00:00:00+00:00"},
        "tags": ["a", "b"],
    }
    with pytest.raises(
        TypeError,
        match=(
            r"payload field 'x\[0\]' \(Opaque\) is not JSON-serializable: "
            r"json_encoder raised TypeError: cannot encode Opaque"
        ),
    ):
        await queue.enqueue("t", {"at": datetime.now(UTC), "x": [Opaque()]})
    # What the encoder returns is held to the same rules as any payload.
    bad_results: list[tuple[object, type[Exception], str]] = [
        ({1: "a"}, TypeError, "dict keys must be str"),
        (float("nan"), ValueError, "NaN"),
        ("a\x00b", ValueError, "NUL"),
    ]
    for bad, error, message in bad_results:
        refusing = pgqueue.Queue(
            pool, name=queue_name, json_encoder=functools.partial(_returns, bad)
        )
        with pytest.raises(error, match=message):
            await refusing.enqueue("t", {"x": Opaque()})
    assert await queue_count(pool, queue_name) == 1


async def test_json_encoder_must_be_callable(pool: asyncpg.Pool) -> None:
    with pytest.raises(TypeError, match="json_encoder must be callable"):
        pgqueue.Queue(pool, json_encoder="str")  # type: ignore[arg-type]
