"""Hostile input: every value round-trips exactly, or is refused before any SQL.

Payloads, job types, queue names, channel names and NOTIFY payloads come
from hypothesis, built to hurt: quotes, backslashes, SQL, emoji and other
astral characters, combining marks, NUL, lone surrogates, very long
strings, huge ints, NaN, infinities, -0.0, floats that print with an
exponent, dict keys that are not strings, tuples, sets, deep nesting. For
each value an oracle written here (independently of ``pgqueue._core.checks``)
says whether it must be stored or refused:

- refused: a ``TypeError`` or ``ValueError`` of the kind the oracle names;
  the same error comes from a queue whose pool has no server at all (so it
  was raised before any SQL), ``enqueue_many`` refuses the whole batch, and
  the table has as many rows as before;
- stored: it comes back *exactly* as `encode_payload` documents it. For a
  payload: ``json.loads`` of the stored row (what a worker hands its
  handler) equals the value with the same type at every level, floats
  compared bit for bit, save the documented normalisations: tuples come
  back as lists, ``-0.0`` as ``0.0``, and dict key order is not kept. For
  a name: the same string, down to the last combining mark.

Hypothesis runs sync test functions; each example runs its coroutine on a
module-wide event loop in a thread (`Db.run`) that owns one pool.
"""

from __future__ import annotations

import json
import math
import random
import re
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import anyio.from_thread
import asyncpg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import pgqueue
from pgqueue._core.checks import (
    MAX_IDENTIFIER_BYTES,
    MAX_NAME_CHARS,
    MAX_QUEUE_NAME_BYTES,
    NOTIFY_LIMIT,
)
from pgqueue._core.codec import (
    MAX_PAYLOAD_DEPTH,
    encode_each,
    encode_payload,
    encode_payloads,
    payload_encoder,
)
from pgqueue._pubsub import Subscriber, publish
from tests.helpers import listening, queue_count, row, rows

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from hypothesis.strategies import SearchStrategy

T = TypeVar("T")

# --- running async code from hypothesis' sync tests --------------------------


class Db:
    """A pool on an event loop of its own, for sync (hypothesis) tests."""

    def __init__(
        self, portal: anyio.from_thread.BlockingPortal, pool: asyncpg.Pool, dsn: str
    ) -> None:
        self.portal = portal
        self.pool = pool
        self.dsn = dsn
        # A pool never started, for a port nothing listens on: SQL through it
        # fails with asyncpg's InterfaceError, never a TypeError or a
        # ValueError, so those it raises were raised before any SQL.
        self.no_server: asyncpg.Pool = portal.call(_pool_without_server)

    def run(self, fn: Callable[[Db, T], Awaitable[None]], value: T) -> None:
        self.portal.call(fn, self, value)


async def _create_pool(dsn: str) -> asyncpg.Pool:
    return await asyncpg.create_pool(dsn, min_size=1, max_size=4)


async def _pool_without_server() -> asyncpg.Pool:
    return asyncpg.create_pool("postgresql://nobody@127.0.0.1:1/none")


@pytest.fixture(scope="module")
def db(dsn: str) -> Iterator[Db]:
    with anyio.from_thread.start_blocking_portal() as portal:
        pool = portal.call(_create_pool, dsn)
        try:
            yield Db(portal, pool, dsn)
        finally:
            portal.call(pool.close)


def examples(count: int) -> settings:
    return settings(
        max_examples=count,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# --- the oracle -----------------------------------------------------------------


def bad_text(text: str) -> bool:
    """PostgreSQL text cannot hold a NUL, nor a lone surrogate (not UTF-8)."""
    return "\x00" in text or any("\ud800" <= c <= "\udfff" for c in text)


def payload_refusals(value: Any) -> set[type[Exception]]:
    """The errors `encode_payload` may raise for ``value``; empty: it must store it."""
    found: set[type[Exception]] = set()
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple) and depth >= MAX_PAYLOAD_DEPTH:
            found.add(ValueError)  # nested too deeply
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str):
                    stack.append((key, depth))
                else:
                    found.add(TypeError)  # JSON keys are strings
                stack.append((child, depth + 1))
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item)
        elif isinstance(item, str):
            if bad_text(item):
                found.add(ValueError)
        elif item is None or isinstance(item, bool):
            pass
        elif isinstance(item, int):
            if abs(item) >= 10**4300:  # Python's int-to-text limit
                found.add(ValueError)
        elif isinstance(item, float):
            if not math.isfinite(item):  # JSON has no NaN or infinity
                found.add(ValueError)
        else:
            found.add(TypeError)
    return found


def stored_form(value: Any) -> Any:
    """``value`` as `encode_payload` documents it comes back."""
    if isinstance(value, dict):
        return {key: stored_form(child) for key, child in value.items()}
    if isinstance(value, list | tuple):
        return [stored_form(child) for child in value]
    if isinstance(value, float) and value == 0.0:
        return 0.0  # jsonb has no negative zero
    return value


def same(got: Any, want: Any) -> bool:
    """Equal, with the same type at every level (True is not 1, 1.0 is not 1)."""
    if type(got) is not type(want):
        return False
    if isinstance(want, float):
        return got == want and math.copysign(1.0, got) == math.copysign(1.0, want)
    if isinstance(want, list):
        return len(got) == len(want) and all(map(same, got, want))
    if isinstance(want, dict):
        return got.keys() == want.keys() and all(same(got[k], want[k]) for k in want)
    return bool(got == want)


CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def name_refusals(
    value: object,
    max_bytes: int | None = None,
    *,
    max_chars: int | None = None,
    controls: bool = False,
) -> set[type[Exception]]:
    """The error a job type, queue or channel name must get; empty: it must work.

    ``max_chars``: the most characters; ``controls``: whether a C0 or C1
    control character is refused (in job types, queues, groups and keys;
    a channel is quoted, and takes them).
    """
    if not isinstance(value, str):
        return {TypeError}
    if not value or bad_text(value):
        return {ValueError}
    if max_bytes is not None and len(value.encode("utf-8")) > max_bytes:
        return {ValueError}
    if max_chars is not None and len(value) > max_chars:
        return {ValueError}
    if controls and CONTROL.search(value):
        return {ValueError}
    return set()


def notify_payload_refusals(value: object) -> set[type[Exception]]:
    """The error a NOTIFY payload must get; empty: it must be delivered."""
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            return {ValueError}
    if not isinstance(value, str):
        return {TypeError}
    if bad_text(value) or len(value.encode("utf-8")) >= NOTIFY_LIMIT:
        return {ValueError}
    return set()


def assert_refused(exc: BaseException, allowed: set[type[Exception]]) -> None:
    assert allowed, f"refused a value that should be accepted: {exc!r}"
    assert isinstance(exc, tuple(allowed)), f"{exc!r} is not one of {allowed}"
    assert str(exc), "the error says nothing"


# --- strategies ---------------------------------------------------------------

CRAB = "\N{CRAB}"  # four bytes of UTF-8
COMBINING = "e\u0301\u0308\u20dd"  # e with three combining marks
NASTY = [
    "Robert'); DROP TABLE pgqueue_jobs;--",
    "' OR 1=1 --",
    '"',
    "'",
    '\\"',
    "\\",
    "\\\\",
    "\\u0000",  # six characters, not a NUL
    "\\\\u0000",
    "$1",
    "%s",
    "{}",
    "NULL",
    "null",
    "true",
    "SELECT",
    "pgqueue_jobs",
    "1e+16",
    "-0.0",
    "NaN",
    "Infinity",
    CRAB,
    COMBINING,
    "\U0001f468\u200d\U0001f469\u200d\U0001f467",  # a ZWJ family
    "\ufeffbom",
    "\u202eright-to-left",
    "\u2028\u2029",
    "\r\n\t\x0b\x0c\x1b",
    "\x7f\x80\x9f",
    "\uffff\ufffe",
    "\U0010ffff",
    " ",
    "",
    "\x00",
    "a\x00b",
    "\ud800",
    "\udfff",
    "lone \udc00 low",
]
CLEAN_NASTY = [s for s in NASTY if not bad_text(s)]
# Characters PostgreSQL text can hold; and every code point there is.
TEXT_CHARS = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
ANY_CHAR = st.characters(exclude_categories=())
# UTF-8 of every width (1 to 4 bytes), a combining mark, a zero-width joiner.
ALPHABET = "aZ9_-'\" \\\u00e9\u0301\u00df\u6f22\u5b57\u200d" + CRAB + "\U0010ffff"
POISON = "\x00\ud800"


def _random_text(rnd: random.Random, size: int, poisoned: bool) -> str:
    chars = ALPHABET + POISON if poisoned else ALPHABET
    return "".join(rnd.choice(chars) for _ in range(size))


def random_text(max_size: int, *, poisoned: bool = True) -> SearchStrategy[str]:
    """Long strings that do not repeat themselves (so they do not compress)."""
    return st.builds(
        _random_text,
        st.randoms(use_true_random=False),
        st.integers(1, max_size),
        st.booleans() if poisoned else st.just(False),
    )


def names(max_size: int) -> SearchStrategy[object]:
    """Candidates for a job type, queue name or channel: str or not."""
    return st.one_of(
        st.sampled_from(NASTY),
        st.text(ANY_CHAR, max_size=20),
        st.text(TEXT_CHARS, min_size=1, max_size=20),
        random_text(max_size),
        st.sampled_from([None, 7, 1.5, b"bytes", ["list"], ("t",)]),
    )


SPECIAL_FLOATS = [
    0.0,
    -0.0,
    0.1,
    1e-7,
    5e-324,  # the smallest subnormal
    2.2250738585072014e-308,
    9999999999999998.0,  # the largest float repr() writes without an exponent
    1e16,
    -1e16,
    1.5e16,
    1e22,
    1e300,
    1.7976931348623157e308,
    -1.7976931348623157e308,
]
FINITE_FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(SPECIAL_FLOATS)
)
ALL_FLOATS = st.one_of(st.floats(), st.sampled_from(SPECIAL_FLOATS))


def _big_int(digits: int, sign: int, offset: int) -> int:
    power: int = 10**digits
    return sign * (power + offset)


BIG_INTS = st.builds(
    _big_int, st.integers(0, 4400), st.sampled_from([1, -1]), st.integers(-5, 5)
)
CLEAN_TEXT = st.one_of(
    st.text(TEXT_CHARS, max_size=30),
    st.sampled_from(CLEAN_NASTY),
    random_text(300, poisoned=False),
)
HOSTILE_TEXT = st.one_of(st.text(ANY_CHAR, max_size=30), st.sampled_from(NASTY))

CLEAN_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(-(10**4299), 10**4299),
    FINITE_FLOATS,
    CLEAN_TEXT,
)
HOSTILE_LEAVES = st.one_of(
    CLEAN_LEAVES,
    ALL_FLOATS,
    BIG_INTS,
    HOSTILE_TEXT,
    st.sets(st.integers(), max_size=2),
    st.binary(max_size=4),
    st.just(datetime(2024, 1, 1, tzinfo=UTC)),
    st.just(Decimal("1.5")),
    st.complex_numbers(max_magnitude=10),
    st.builds(object),
)
HOSTILE_KEYS = st.one_of(
    CLEAN_TEXT,
    HOSTILE_TEXT,
    st.integers(),
    st.floats(),
    st.booleans(),
    st.none(),
    st.tuples(st.integers()),
)


def _containers(
    keys: SearchStrategy[Any],
) -> Callable[[SearchStrategy[Any]], SearchStrategy[Any]]:
    def extend(children: SearchStrategy[Any]) -> SearchStrategy[Any]:
        return st.one_of(
            st.lists(children, max_size=4),
            st.tuples(children, children),
            st.dictionaries(keys, children, max_size=4),
        )

    return extend


def _nest(depth: int, leaf: Any, as_dict: bool) -> Any:
    value = leaf
    for _ in range(depth - 1):
        value = {"k": value} if as_dict else [value]
    return value


CLEAN_PAYLOADS = st.recursive(CLEAN_LEAVES, _containers(CLEAN_TEXT), max_leaves=25)
HOSTILE_PAYLOADS = st.recursive(
    HOSTILE_LEAVES, _containers(HOSTILE_KEYS), max_leaves=25
)
# Lists or dicts nested just inside and just past MAX_PAYLOAD_DEPTH levels.
DEEP_PAYLOADS = st.builds(
    _nest,
    st.integers(MAX_PAYLOAD_DEPTH - 2, MAX_PAYLOAD_DEPTH + 2),
    st.sampled_from([[], [1], {}, "x"]),
    st.booleans(),
)
PAYLOADS = st.one_of(CLEAN_PAYLOADS, HOSTILE_PAYLOADS, DEEP_PAYLOADS)


def _json_bytes(value: Any, ascii_only: bool) -> bytes:
    try:
        text = json.dumps(value, ensure_ascii=ascii_only)
    except (TypeError, ValueError):
        text = "{not json"
    return text.encode("utf-8", "surrogatepass")


RAW_PAYLOADS = st.one_of(
    st.binary(max_size=40),
    st.builds(_json_bytes, st.one_of(CLEAN_PAYLOADS, HOSTILE_PAYLOADS), st.booleans()),
    st.sampled_from(
        [
            b"NaN",
            b"[Infinity]",
            b"-Infinity",
            b"1e400",
            b"1e16",
            b"-0.0",
            b'"\\ud800"',
            b'"\\u0000"',
            b'"\\\\u0000"',
            b'{"a": 1, "a": 2}',
            b"\xef\xbb\xbf{}",
            b"1" + b"0" * 5000,
            b"[" * 600 + b"]" * 600,
            b"[" * 5000 + b"]" * 5000,
        ]
    ),
)

NOTIFY_PAYLOADS = st.one_of(
    st.text(ANY_CHAR, max_size=30),
    st.sampled_from(NASTY),
    random_text(2100),  # up to 8400 bytes: both sides of the limit
    st.binary(max_size=20),
    st.sampled_from([None, 1, ["x"]]),
)


def _fit_channel(text: str) -> str:
    """Cut ``text`` to at most 63 bytes of UTF-8, at a character boundary."""
    while len(text.encode("utf-8")) > MAX_IDENTIFIER_BYTES:
        text = text[:-1]
    return text or "x"


VALID_CHANNELS = st.one_of(
    st.text(TEXT_CHARS, min_size=1, max_size=15),
    st.sampled_from([s for s in CLEAN_NASTY if s]),
    random_text(70, poisoned=False).map(_fit_channel),
)


# --- payloads -------------------------------------------------------------------


async def _check_payload(db: Db, payload: Any) -> None:
    if isinstance(payload, bytes):  # a whole payload of bytes is JSON text
        await _check_raw_payload(db, payload)
        return
    expected = payload_refusals(payload)
    queue = pgqueue.Queue(db.pool, name=unique("payload"))
    before = await queue_count(db.pool, queue.name)
    try:
        job_id = await queue.enqueue("t", payload)
    except (TypeError, ValueError) as exc:
        assert_refused(exc, expected)
        kind = type(exc)
        with pytest.raises(kind):
            await pgqueue.Queue(db.no_server, name=queue.name).enqueue("t", payload)
        with pytest.raises(kind, match=r"^job 1: "):
            await queue.enqueue_many([("t", {}), ("t", payload)])
        assert await queue_count(db.pool, queue.name) == before
        return
    try:
        assert not expected, f"stored a payload that must be refused ({expected})"
        # enqueue_many encodes a batch's payloads as one JSON array.
        _, many_id = await queue.enqueue_many([("t", {}), ("t", payload)])
        want = {} if payload is None else stored_form(payload)
        for stored_id in (job_id, many_id):
            stored = await row(db.pool, stored_id)
            assert same(json.loads(stored["payload"]), want)
    finally:
        await db.pool.execute("DELETE FROM pgqueue_jobs WHERE queue = $1", queue.name)


@examples(150)
@given(payload=PAYLOADS)
@example(payload=[1e16, -1e16, 1e300, 1.7976931348623157e308, 5e-324, 0.1])
@example(payload={"neg_zero": -0.0, "pair": (1, (2.5, "x")), "nested": [[[]]]})
@example(
    payload={"s": ",1e+16,", '"q\\': [1e16, ":1e+16]", "\\", 2e17], "1e+16": -1e16}
)
@example(payload={1: "int key"})
@example(payload={"1": "a", 1: "b"})  # JSON would merge these keys
@example(payload={"x": float("nan")})
@example(payload=[float("-inf")])
@example(payload={"\x00": 1})
@example(payload=["\udfff"])
@example(payload=10**4300)
@example(payload=-(10**4300 - 1))
@example(payload={"when": datetime(2024, 1, 1, tzinfo=UTC)})
@example(payload="1e+16 -0.0 \\u0000 \\\\u0000")
@example(payload=None)
@example(payload=b"")
def test_payload_round_trips_exactly_or_is_refused_before_any_sql(
    db: Db, payload: Any
) -> None:
    db.run(_check_payload, payload)


async def _check_raw_payload(db: Db, raw: bytes) -> None:
    try:
        value = json.loads(raw, parse_constant=_no_constants)
    except (ValueError, RecursionError):
        expected: set[type[Exception]] = {ValueError}
    else:
        expected = payload_refusals(value)
    queue = pgqueue.Queue(db.pool, name=unique("raw"))
    before = await queue_count(db.pool, queue.name)
    try:
        job_id = await queue.enqueue("t", raw)
    except (TypeError, ValueError) as exc:
        assert_refused(exc, expected)
        with pytest.raises(type(exc)):
            await pgqueue.Queue(db.no_server, name=queue.name).enqueue("t", raw)
        assert await queue_count(db.pool, queue.name) == before
        return
    try:
        assert not expected, f"stored bytes that must be refused ({expected})"
        stored = await row(db.pool, job_id)
        assert same(json.loads(stored["payload"]), stored_form(value))
    finally:
        await db.pool.execute("DELETE FROM pgqueue_jobs WHERE id = $1", job_id)


def _no_constants(name: str) -> Any:
    msg = f"{name} is not JSON"
    raise ValueError(msg)


@examples(75)
@given(raw=RAW_PAYLOADS)
def test_payload_bytes_round_trip_as_their_json_or_are_refused(
    db: Db, raw: bytes
) -> None:
    db.run(_check_raw_payload, raw)


async def _through_worker(db: Db, batch: list[Any]) -> None:
    for payload in batch:
        assert not payload_refusals(payload)
    queue = pgqueue.Queue(db.pool, name=unique("worker"))
    ids = await queue.enqueue_many([("t", payload) for payload in batch])
    delivered: dict[int, Any] = {}
    worker = pgqueue.Worker(db.pool, queue=queue.name, concurrency=4)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        delivered[job.id] = job.payload

    try:
        with anyio.fail_after(15):
            await worker.run(until_empty=True)
        for job_id, payload in zip(ids, batch, strict=True):
            want = {} if payload is None else stored_form(payload)
            assert same(delivered[job_id], want)
        assert {r["status"] for r in await rows(db.pool, queue.name)} == {"completed"}
    finally:
        await db.pool.execute("DELETE FROM pgqueue_jobs WHERE queue = $1", queue.name)


@examples(15)
@given(
    batch=st.lists(
        st.one_of(
            CLEAN_PAYLOADS, DEEP_PAYLOADS.filter(lambda p: not payload_refusals(p))
        ),
        min_size=1,
        max_size=6,
    )
)
def test_payloads_reach_a_real_worker_unchanged(db: Db, batch: list[Any]) -> None:
    db.run(_through_worker, batch)


def big_payload(size: int) -> dict[str, Any]:
    """A little over ``size`` bytes of JSON: nested records, unicode, odd floats."""
    rnd = random.Random(7)

    def record(number: int) -> dict[str, Any]:
        return {
            "id": number,
            "name": _random_text(rnd, 40, poisoned=False),
            "note": COMBINING + CRAB + "\\u0000 \"quoted\" 'single'",
            "values": [rnd.random(), 1e16 * rnd.random() + 1e16, -0.0, 5e-324, 10**40],
            "flags": (True, False, None),
            "nested": {
                "deeper": [{"level": i, "text": "\u202e\u2028"} for i in range(3)]
            },
        }

    blob = _random_text(rnd, 100_000, poisoned=False)
    record_size = len(encode_payload(record(0)).encode("utf-8"))
    count = (size - len(blob.encode("utf-8"))) // record_size + 1
    return {"records": [record(i) for i in range(count)], "blob": blob}


async def test_a_five_megabyte_payload_reaches_a_worker_intact(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    payload = big_payload(5_000_000)
    assert len(encode_payload(payload).encode("utf-8")) > 5_000_000
    delivered: list[Any] = []
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("big")
    async def handle(job: pgqueue.Job) -> None:
        delivered.append(job.payload)

    job_id = await queue.enqueue("big", payload)
    with anyio.fail_after(30):
        await worker.run(until_empty=True)
    [got] = delivered
    assert same(got, stored_form(payload))
    assert (await row(pool, job_id))["status"] == "completed"


def _iso(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(type(value).__name__)


@examples(300)
@given(
    batch=st.lists(st.one_of(PAYLOADS, RAW_PAYLOADS), max_size=6),
    hooked=st.booleans(),
)
@example(batch=[{"a": 1}, {"b": [1e16, "1e+16"]}, {"c": "\\u0000"}], hooked=False)
@example(batch=[{"a": 1}, {"b": "\x00"}, {"c": "\ud800"}], hooked=False)
@example(batch=[{"a": 1}, {"when": datetime(2024, 1, 1, tzinfo=UTC)}], hooked=True)
@example(batch=[{"when": datetime(2024, 1, 1, tzinfo=UTC)}], hooked=False)
def test_encode_each_writes_what_encode_payload_writes(
    batch: list[Any], hooked: bool
) -> None:
    # The COPY path's payloads (one text a job) and the INSERT path's (one
    # array) hold the same JSON, and are refused alike, naming the same job.
    encoder = payload_encoder(_iso if hooked else None)
    try:
        want = [encode_payload(payload, encoder) for payload in batch]
    except (TypeError, ValueError):
        with pytest.raises((TypeError, ValueError)) as each:
            encode_each(batch, encoder)
        with pytest.raises(type(each.value)) as array:
            encode_payloads(batch, encoder)
        assert str(each.value) == str(array.value)
        assert str(each.value).startswith("job ")
        return
    assert encode_each(batch, encoder) == want
    assert encode_payloads(batch, encoder) == "[" + ",".join(want) + "]"


def test_a_reference_cycle_is_refused() -> None:
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(ValueError, match="reference cycle"):
        encode_payload({"a": looped})


# --- job types and queue names -------------------------------------------------


async def _check_job_type(db: Db, job_type: object) -> None:
    expected = name_refusals(job_type, max_chars=MAX_NAME_CHARS, controls=True)
    queue = pgqueue.Queue(db.pool, name=unique("job-type"))
    worker = pgqueue.Worker(db.pool, queue=queue.name)
    ran: list[str] = []

    async def handle(job: pgqueue.Job) -> None:
        ran.append(job.type)

    before = await queue_count(db.pool, queue.name)
    try:
        job_id = await queue.enqueue(job_type, {})  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        assert_refused(exc, expected)
        with pytest.raises(type(exc)):
            await pgqueue.Queue(db.no_server, name=queue.name).enqueue(job_type, {})  # type: ignore[arg-type]
        with pytest.raises(type(exc)):
            worker.register(job_type, handle)  # type: ignore[arg-type]
        assert await queue_count(db.pool, queue.name) == before
        return
    try:
        assert not expected, f"accepted a job type that must be refused ({expected})"
        assert (await row(db.pool, job_id))["job_type"] == job_type
        worker.register(job_type, handle)  # type: ignore[arg-type]
        with anyio.fail_after(15):
            await worker.run(until_empty=True)
        assert ran == [job_type]
        assert (await row(db.pool, job_id))["status"] == "completed"
    finally:
        await db.pool.execute("DELETE FROM pgqueue_jobs WHERE queue = $1", queue.name)


@examples(40)
@given(job_type=names(3000))
@example(job_type="")
@example(job_type="\ud800")
@example(job_type=COMBINING * 1000)
def test_job_types_round_trip_or_are_refused_before_any_sql(
    db: Db, job_type: object
) -> None:
    db.run(_check_job_type, job_type)


async def _check_queue_name(db: Db, name: object) -> None:
    expected = name_refusals(name, MAX_QUEUE_NAME_BYTES, controls=True)
    try:
        queue = pgqueue.Queue(db.pool, name=name)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        assert_refused(exc, expected)
        if name is not None:  # a Worker's queue=None is its default queue
            with pytest.raises(type(exc)):
                pgqueue.Worker(db.pool, queue=name)  # type: ignore[arg-type]
        return
    assert not expected, f"accepted a queue name that must be refused ({expected})"
    assert isinstance(name, str)
    ran: list[str] = []
    worker = pgqueue.Worker(db.pool, queue=name)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        ran.append(job.queue)

    try:
        async with listening(db.dsn, pgqueue.JOBS_CHANNEL) as wakeups:
            job_id = await queue.enqueue("t", {})
            await wakeups.wait_for(name)  # the wakeup names the queue exactly
        assert (await row(db.pool, job_id))["queue"] == name
        with anyio.fail_after(15):
            await worker.run(until_empty=True)
        assert ran == [name]
    finally:
        await db.pool.execute("DELETE FROM pgqueue_jobs WHERE queue = $1", name)


# Random (incompressible) text of this many bytes overflowed the claim
# index's 2704-byte entries at INSERT, after the checks had let it through.
INDEX_BUSTER = _random_text(random.Random(1), 2700, poisoned=False)


@examples(40)
@given(name=names(1500))
@example(name="x" * MAX_QUEUE_NAME_BYTES)
@example(name="x" * (MAX_QUEUE_NAME_BYTES + 1))
@example(name=CRAB * (MAX_QUEUE_NAME_BYTES // 4))
@example(name=INDEX_BUSTER)
@example(name="default")
def test_queue_names_round_trip_or_are_refused_before_any_sql(
    db: Db, name: object
) -> None:
    db.run(_check_queue_name, name)


# --- channels and NOTIFY payloads ----------------------------------------------


async def _check_publish(db: Db, case: tuple[object, object]) -> None:
    channel, payload = case
    channel_errors = name_refusals(channel, MAX_IDENTIFIER_BYTES)
    expected = channel_errors | notify_payload_refusals(payload)
    if channel_errors:
        with pytest.raises(tuple(channel_errors)):
            Subscriber(db.dsn).handle(channel, _ignore)  # type: ignore[arg-type]
    received: list[tuple[str, str]] = []
    arrived = anyio.Event()

    def on_notify(_conn: object, _pid: int, got_channel: str, got: object) -> None:
        received.append((got_channel, str(got)))
        arrived.set()

    connection = await asyncpg.connect(db.dsn)
    try:
        if not channel_errors:
            assert isinstance(channel, str)
            await connection.add_listener(channel, on_notify)  # quoted by asyncpg
        try:
            await publish(db.pool, channel, payload)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            assert_refused(exc, expected)
            with pytest.raises(type(exc)):
                await publish(db.no_server, channel, payload)  # type: ignore[arg-type]
            return
        assert not expected, f"published what must be refused ({expected})"
        with anyio.fail_after(5):
            await arrived.wait()
        text = payload.decode("utf-8") if isinstance(payload, bytes) else payload
        assert received == [(channel, text)]
    finally:
        await connection.close()


async def _ignore(_payload: str) -> None:
    pass


@examples(100)
@given(case=st.tuples(names(80), NOTIFY_PAYLOADS))
@example(case=("x" * MAX_IDENTIFIER_BYTES, "ok"))
@example(case=("x" * (MAX_IDENTIFIER_BYTES + 1), "ok"))
@example(case=(CRAB * 15 + "abc", "63 bytes"))
@example(case=(CRAB * 16, "64 bytes"))
@example(case=("MixedCase", "x" * (NOTIFY_LIMIT - 1)))
@example(case=("c", "x" * NOTIFY_LIMIT))
@example(case=("c", CRAB * (NOTIFY_LIMIT // 4)))
@example(case=("c", b"\xff"))
def test_channels_and_notify_payloads_round_trip_or_are_refused(
    db: Db, case: tuple[object, object]
) -> None:
    db.run(_check_publish, case)


async def _through_subscriber(db: Db, channels: list[str]) -> None:
    received: dict[str, list[str]] = {channel: [] for channel in channels}
    everywhere = anyio.Event()

    def collector(channel: str) -> Callable[[str], Awaitable[None]]:
        async def collect(payload: str) -> None:
            received[channel].append(payload)
            if all(received.values()):
                everywhere.set()

        return collect

    sub = Subscriber(db.dsn)
    for channel in channels:
        sub.handle(channel, collector(channel))
    async with anyio.create_task_group() as tg:
        tg.start_soon(sub.run)
        with anyio.fail_after(10):
            await sub.wait_listening()
            for channel in channels:
                await publish(db.pool, channel, channel)
            await everywhere.wait()
        sub.stop()
    assert received == {channel: [channel] for channel in channels}


@examples(15)
@given(channels=st.lists(VALID_CHANNELS, min_size=1, max_size=4, unique=True))
@example(channels=["MixedCase", "mixedcase", '"quoted"', "Robert'); DROP TABLE x;--"])
def test_odd_channel_names_reach_a_real_subscriber(db: Db, channels: list[str]) -> None:
    db.run(_through_subscriber, channels)


# --- what other producers can write ----------------------------------------------

# Rows another producer (the Go module, psql) can write: jsonb takes them, but
# Python's json cannot decode them (an int over 4300 digits; nesting past the
# interpreter's recursion limit).
UNDECODABLE = ["1" + "0" * 5000, "[" * 2000 + "]" * 2000]


async def test_a_payload_the_worker_cannot_decode_is_dead_lettered(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    poison = [
        await pool.fetchval(
            "INSERT INTO pgqueue_jobs (queue, job_type, payload) VALUES ($1, 't', $2::jsonb)"
            " RETURNING id",
            queue.name,
            text,
        )
        for text in UNDECODABLE
    ]
    innocent = await queue.enqueue("t", {"fine": True})
    ran: list[int] = []
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=4)

    @worker.handler("t")
    async def handle(job: pgqueue.Job) -> None:
        ran.append(job.id)

    try:
        with anyio.fail_after(15):
            await worker.run(until_empty=True)
        assert ran == [innocent]
        for job_id in poison:
            dead = await row(pool, job_id)
            assert dead["status"] == "dead"
            assert "payload" in dead["last_error"]
    finally:
        await pool.execute("DELETE FROM pgqueue_jobs WHERE queue = $1", queue.name)
