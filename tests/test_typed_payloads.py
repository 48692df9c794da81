"""Typed payloads: a handler annotated ``Job[X]`` gets an ``X``, and ``enqueue`` takes one.

The unit tests need no database: the generic `Job`, `typed_handler` and
`payload_type` (which handlers are typed), the dataclass validator, the
pydantic path and `to_json_value`. The integration tests go through the
public API against a real server.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import pickle
import subprocess
import sys
import typing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, NewType, Optional

import pydantic
import pytest

import pgqueue
from pgqueue._core.codec import encode_payload, to_json_value
from pgqueue._core.typed import payload_converter, payload_type, typed_handler
from tests.helpers import row, rows

if typing.TYPE_CHECKING:
    import asyncpg

NOW = datetime(2026, 1, 1, tzinfo=UTC)
UserId = NewType("UserId", str)


@dataclass(frozen=True)
class Address:
    zip: str
    city: str | None = None


@dataclass(frozen=True)
class SendWelcome:
    user_id: str
    name: str = ""


@dataclass
class Everything:
    """A field of every annotation the validator checks, and one it does not."""

    text: str
    count: int
    ratio: float
    flag: bool
    nothing: None
    maybe: int | None
    legacy: Optional[str]  # noqa: UP045 - the spelling under test
    anything: Any
    channel: Literal["email", "sms"]
    tags: list[str]
    scores: dict[str, int]
    address: Address
    addresses: list[Address]
    user: UserId
    either: int | str
    when: datetime  # from ISO 8601 text
    pair: tuple[int, int] | None = None  # not checked
    retries: int = 3
    labels: list[str] = field(default_factory=list)


EVERYTHING = {
    "text": "hi",
    "count": 2,
    "ratio": 0.5,
    "flag": True,
    "nothing": None,
    "maybe": None,
    "legacy": "old",
    "anything": {"x": [1]},
    "channel": "sms",
    "tags": ["a", "b"],
    "scores": {"a": 1},
    "address": {"zip": "75001"},
    "addresses": [{"zip": "1", "city": "Paris"}, {"zip": "2"}],
    "user": "01J5",
    "either": "x",
    "when": "2026-01-01T00:00:00+00:00",
}

REMOVE = object()


class Leaf:
    """An object that asdict would deep-copy."""


LEAF = Leaf()


@dataclass
class Tree:
    label: str
    children: list[Tree] = field(default_factory=list)


@dataclass
class Checked:
    size: int

    def __post_init__(self) -> None:
        if self.size < 0:
            msg = "size must not be negative"
            raise ValueError(msg)


@dataclass
class WithComputed:
    width: int
    area: int = field(init=False, default=0)


@dataclass
class Unresolvable:
    when: Nowhere  # type: ignore[name-defined]  # noqa: F821


class Signup(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    user_id: str
    email: str = pydantic.Field(alias="emailAddress")
    signed_up_at: datetime
    tags: list[str] = []


class Loose(pydantic.BaseModel):
    user_id: str


@dataclass
class HoldsModel:
    signup: Loose


def job(payload: Any, **fields: Any) -> pgqueue.Job:
    return pgqueue.Job(
        id=7,
        queue="q",
        type="t",
        payload=payload,
        attempts=1,
        max_attempts=5,
        run_at=NOW,
        created_at=NOW,
        **fields,
    )


def mismatch(payload: Any, cls: type) -> str:
    """The message of the `Permanent` error ``payload`` raises as a ``cls``."""
    with pytest.raises(pgqueue.Permanent) as raised:
        payload_converter(cls)(payload)
    return str(raised.value)


# The generic Job.


def test_a_bare_job_keeps_its_fields_and_defaults() -> None:
    plain = job({"a": 1})
    assert [f.name for f in dataclasses.fields(pgqueue.Job)] == [
        "id",
        "queue",
        "type",
        "payload",
        "attempts",
        "max_attempts",
        "run_at",
        "created_at",
        "last_error",
        "priority",
        "unique_key",
        "snoozes",
        "trace_context",
        "last_checkpoint",
        "parent_results",
        "steps",
    ]
    assert (
        plain.last_error,
        plain.priority,
        plain.unique_key,
        plain.snoozes,
        plain.trace_context,
        plain.last_checkpoint,
        dict(plain.parent_results),
    ) == (None, 0, None, 0, None, None, {})
    assert not hasattr(plain, "__dict__")  # slotted


def test_job_is_generic_and_a_parameterized_job_can_be_built() -> None:
    alias = pgqueue.Job[SendWelcome]
    assert typing.get_origin(alias) is pgqueue.Job
    assert typing.get_args(alias) == (SendWelcome,)
    built = alias(
        id=1,
        queue="q",
        type="t",
        payload=SendWelcome("u"),
        attempts=1,
        max_attempts=1,
        run_at=NOW,
        created_at=NOW,
    )
    assert type(built) is pgqueue.Job
    assert built.payload == SendWelcome("u")


def test_job_stays_frozen_for_fields_and_other_names() -> None:
    plain = job({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        plain.id = 8  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plain.extra = 1  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del plain.extra  # type: ignore[attr-defined]


def test_job_pickles_compares_and_is_replaced() -> None:
    plain = job({"a": [1]}, priority=3, unique_key="k", snoozes=2)
    assert pickle.loads(pickle.dumps(plain)) == plain
    moved = dataclasses.replace(plain, payload=SendWelcome("u"))
    assert moved.payload == SendWelcome("u")
    assert (moved.priority, moved.unique_key, moved.snoozes) == (3, "k", 2)
    assert hash(job(1)) == hash(job(1))


# Which handlers are typed.


async def typed_one(job: pgqueue.Job[SendWelcome]) -> None:
    """A typed handler at module level."""


async def typed_model(job: pgqueue.Job[Loose]) -> None: ...


async def plain_one(job: pgqueue.Job) -> None: ...


async def any_one(job: pgqueue.Job[Any]) -> None: ...


async def dict_one(job: pgqueue.Job[dict[str, Any]]) -> None: ...


async def list_one(job: pgqueue.Job[list[SendWelcome]]) -> None: ...


async def optional_one(job: pgqueue.Job[SendWelcome | None]) -> None: ...


async def unannotated(job):
    pass


async def no_parameter() -> None: ...


async def variadic(*jobs: pgqueue.Job[SendWelcome]) -> None: ...


async def two_parameters(job: pgqueue.Job[SendWelcome], extra: int) -> None: ...


class CallableHandler:
    async def __call__(self, job: pgqueue.Job[SendWelcome]) -> None: ...

    async def method(self, job: pgqueue.Job[SendWelcome]) -> None: ...


def evaluated(annotation: Any) -> Any:
    """A handler whose annotation is an object, as without ``from __future__ import annotations``."""

    async def handler(job):
        pass

    handler.__annotations__ = {"job": annotation, "return": None}
    return handler


@pytest.mark.parametrize(
    ("handler", "expected"),
    [
        pytest.param(typed_one, SendWelcome, id="dataclass"),
        pytest.param(typed_model, Loose, id="pydantic"),
        pytest.param(two_parameters, SendWelcome, id="first-of-two"),
        pytest.param(CallableHandler(), SendWelcome, id="callable-object"),
        pytest.param(CallableHandler().method, SendWelcome, id="bound-method"),
        pytest.param(functools.partial(typed_one), SendWelcome, id="partial"),
        pytest.param(evaluated(pgqueue.Job[SendWelcome]), SendWelcome, id="evaluated"),
        pytest.param(
            evaluated(pgqueue.Job["SendWelcome"]), SendWelcome, id="forward-ref"
        ),
        pytest.param(evaluated("pgqueue.Job[Address]"), Address, id="string"),
        pytest.param(evaluated("Job[Address]"), Address, id="job-not-imported"),
        pytest.param(
            evaluated("never_imported.Job[Address]"), Address, id="module-not-imported"
        ),
        pytest.param(evaluated(pgqueue.Job[Tree]), Tree, id="recursive"),
        pytest.param(plain_one, None, id="bare-job"),
        pytest.param(any_one, None, id="job-any"),
        pytest.param(dict_one, None, id="job-dict"),
        pytest.param(list_one, None, id="job-list-of-dataclass"),
        pytest.param(optional_one, None, id="job-optional-dataclass"),
        pytest.param(unannotated, None, id="unannotated"),
        pytest.param(no_parameter, None, id="no-parameter"),
        pytest.param(variadic, None, id="variadic"),
        pytest.param(evaluated("Unknown"), None, id="unresolvable-not-job"),
        pytest.param(evaluated("list[Unknown]"), None, id="unresolvable-other"),
        pytest.param(evaluated("Job[dict[str, Any]]"), None, id="job-dict-unimported"),
        pytest.param(evaluated(SendWelcome), None, id="not-job"),
        pytest.param(print, None, id="builtin"),
    ],
)
def test_payload_type(handler: Any, expected: type | None) -> None:
    assert payload_type(handler) is expected


def test_untyped_handlers_are_returned_unchanged() -> None:
    for handler in (plain_one, any_one, dict_one, list_one, unannotated):
        assert typed_handler(handler) is handler


def test_a_typed_handler_is_wrapped_once_under_its_own_name() -> None:
    wrapped = typed_handler(typed_one)
    assert wrapped is not typed_one
    assert wrapped.__name__ == "typed_one"
    assert wrapped.__doc__ == typed_one.__doc__
    assert typed_handler(wrapped) is wrapped


async def test_the_wrapper_hands_over_a_job_with_the_payload_converted() -> None:
    seen: list[pgqueue.Job[SendWelcome]] = []

    async def handle(job: pgqueue.Job[SendWelcome]) -> None:
        seen.append(job)

    original = job({"user_id": "u"}, priority=2, snoozes=1, last_error="boom")
    await typed_handler(handle)(original)
    [converted] = seen
    assert converted.payload == SendWelcome("u")
    assert converted == dataclasses.replace(original, payload=SendWelcome("u"))
    with pytest.raises(pgqueue.Permanent, match="missing field 'user_id'"):
        await typed_handler(handle)(job({}))
    assert len(seen) == 1


async def test_a_local_payload_type_the_handler_closes_over_is_found() -> None:
    @dataclass
    class Local:
        n: int

    async def handle(job: pgqueue.Job[Local]) -> None:
        assert isinstance(job.payload, Local)

    assert payload_type(handle) is Local
    await typed_handler(handle)(job({"n": 1}))


def test_an_unresolvable_payload_type_raises_at_registration() -> None:
    @dataclass
    class Local:
        n: int

    async def handle(job: pgqueue.Job[Local]) -> None: ...

    with pytest.raises(TypeError) as raised:
        typed_handler(handle)
    message = str(raised.value)
    assert "cannot resolve the annotation 'pgqueue.Job[Local]'" in message
    assert "of parameter 'job' of handler" in message
    assert "name 'Local' is not defined" in message
    assert "define it at module level" in message


@pytest.mark.parametrize(
    "annotation",
    ["pgqueue.Job[Nowhere]", "Job[Nowhere]", "pgqueue.Job[dict[str, Nowhere]]"],
)
def test_an_unresolvable_job_argument_raises(annotation: str) -> None:
    with pytest.raises(TypeError, match="name 'Nowhere' is not defined"):
        typed_handler(evaluated(annotation))


def test_a_dataclass_whose_hints_cannot_be_resolved_raises_at_registration() -> None:
    with pytest.raises(TypeError, match="type hints of dataclass Unresolvable"):
        typed_handler(evaluated(pgqueue.Job[Unresolvable]))


def test_payload_converter_refuses_other_types() -> None:
    with pytest.raises(TypeError, match="dataclass or a pydantic model"):
        payload_converter(dict)


# The dataclass validator.


def everything(**changes: Any) -> dict[str, Any]:
    payload = {**EVERYTHING, **changes}
    return {k: v for k, v in payload.items() if v is not REMOVE}


def test_a_valid_payload_becomes_an_instance() -> None:
    converted = payload_converter(Everything)(everything())
    assert converted == Everything(
        text="hi",
        count=2,
        ratio=0.5,
        flag=True,
        nothing=None,
        maybe=None,
        legacy="old",
        anything={"x": [1]},
        channel="sms",
        tags=["a", "b"],
        scores={"a": 1},
        address=Address("75001"),
        addresses=[Address("1", "Paris"), Address("2")],
        user=UserId("01J5"),
        either="x",
        when=NOW,
    )


@pytest.mark.parametrize(
    ("changes", "field_name", "expected"),
    [
        ({"ratio": 2}, "ratio", 2.0),
        ({"ratio": -1e300}, "ratio", -1e300),
        ({"maybe": 4}, "maybe", 4),
        ({"legacy": None}, "legacy", None),
        ({"either": 5}, "either", 5),
        ({"anything": None}, "anything", None),
        ({"tags": []}, "tags", []),
        ({"scores": {}}, "scores", {}),
        ({"retries": 9}, "retries", 9),
        ({"labels": ["x"]}, "labels", ["x"]),
        ({"when": "2026-01-01T00:00:00Z"}, "when", NOW),
        ({"pair": {"not": "checked"}}, "pair", {"not": "checked"}),
        ({"addresses": []}, "addresses", []),
        ({"address": {"zip": "1", "city": None}}, "address", Address("1")),
    ],
)
def test_valid_values(changes: dict[str, Any], field_name: str, expected: Any) -> None:
    converted = payload_converter(Everything)(everything(**changes))
    value = getattr(converted, field_name)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"text": 1}, "field 'text': expected str, got int"),
        ({"text": None}, "field 'text': expected str, got None"),
        ({"count": "2"}, "field 'count': expected int, got str"),
        ({"count": 2.0}, "field 'count': expected int, got float"),
        ({"count": True}, "field 'count': expected int, got bool"),
        ({"ratio": "0.5"}, "field 'ratio': expected float, got str"),
        ({"ratio": False}, "field 'ratio': expected float, got bool"),
        (
            {"ratio": 10**400},
            "field 'ratio': expected float, got an int too large for one",
        ),
        ({"flag": 1}, "field 'flag': expected bool, got int"),
        ({"nothing": 0}, "field 'nothing': expected None, got int"),
        ({"maybe": "4"}, "field 'maybe': expected int | None, got str"),
        ({"maybe": False}, "field 'maybe': expected int | None, got bool"),
        ({"legacy": 1}, "field 'legacy': expected str | None, got int"),
        (
            {"channel": "fax"},
            "field 'channel': expected Literal['email', 'sms'], got 'fax'",
        ),
        (
            {"channel": ["sms"]},
            "field 'channel': expected Literal['email', 'sms'], got list",
        ),
        ({"tags": "a"}, "field 'tags': expected list, got str"),
        ({"tags": ["a", 2]}, "field 'tags[1]': expected str, got int"),
        ({"scores": []}, "field 'scores': expected dict, got list"),
        (
            {"scores": {"a": 1, "b c": "2"}},
            """field 'scores["b c"]': expected int, got str""",
        ),
        ({"address": "Paris"}, "field 'address': expected an object, got str"),
        ({"address": None}, "field 'address': expected an object, got None"),
        ({"address": {}}, "missing field 'address.zip'"),
        ({"address": {"zip": 75001}}, "field 'address.zip': expected str, got int"),
        (
            {"address": {"zip": "1", "country": "FR"}},
            "unexpected field 'address.country'",
        ),
        (
            {"addresses": [{"zip": "1"}, {"zip": 2}]},
            "field 'addresses[1].zip': expected str, got int",
        ),
        ({"addresses": [{"zip": "1"}, {}]}, "missing field 'addresses[1].zip'"),
        ({"user": 5}, "field 'user': expected str, got int"),
        ({"either": 1.5}, "field 'either': expected int | str, got float"),
        ({"either": None}, "field 'either': expected int | str, got None"),
        ({"retries": "3"}, "field 'retries': expected int, got str"),
        ({"text": REMOVE}, "missing field 'text'"),
        ({"anything": REMOVE}, "missing field 'anything'"),
        ({"nothing": REMOVE}, "missing field 'nothing'"),
        ({"surprise": 1}, "unexpected field 'surprise'"),
    ],
)
def test_invalid_values(changes: dict[str, Any], error: str) -> None:
    assert mismatch(everything(**changes), Everything) == (
        f"payload does not match Everything: {error}"
    )


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ([], "expected an object, got list"),
        ("user", "expected an object, got str"),
        (None, "expected an object, got None"),
        ({}, "missing field 'user_id'"),
        ({"user_id": 1}, "field 'user_id': expected str, got int"),
        ({"user_id": "u", "x": 1}, "unexpected field 'x'"),
        ({"user": "u"}, "missing field 'user_id'"),
    ],
)
def test_invalid_payloads(payload: Any, error: str) -> None:
    assert (
        mismatch(payload, SendWelcome) == f"payload does not match SendWelcome: {error}"
    )


def test_a_literal_true_is_not_the_literal_one() -> None:
    @dataclass
    class Flags:
        level: Literal[1, "1"]

    convert = payload_converter(Flags)
    assert convert({"level": 1}) == Flags(1)
    assert convert({"level": "1"}) == Flags("1")
    assert "expected Literal[1, '1'], got True" in mismatch({"level": True}, Flags)


def test_a_long_literal_value_is_shortened() -> None:
    @dataclass
    class Channel:
        name: Literal["email"]

    message = mismatch({"name": "x" * 100}, Channel)
    assert message.endswith(", got '" + "x" * 36 + "...")


def test_recursive_dataclasses_are_checked_all_the_way_down() -> None:
    payload = {"label": "a", "children": [{"label": "b", "children": [{"label": "c"}]}]}
    assert payload_converter(Tree)(payload) == Tree("a", [Tree("b", [Tree("c")])])
    payload["children"][0]["children"].append({"label": 3})  # type: ignore[index]
    assert mismatch(payload, Tree) == (
        "payload does not match Tree: field 'children[0].children[1].label': "
        "expected str, got int"
    )


def test_a_payload_nested_too_deeply_to_check_is_permanent() -> None:
    payload: dict[str, Any] = {"label": "leaf"}
    for _ in range(sys.getrecursionlimit()):
        payload = {"label": "node", "children": [payload]}
    assert mismatch(payload, Tree) == (
        "payload does not match Tree: it is nested too deeply to check"
    )


def test_a_field_with_init_false_is_ignored_not_unexpected() -> None:
    convert = payload_converter(WithComputed)
    assert convert({"width": 2, "area": 99}) == WithComputed(2)
    assert convert(to_json_value(WithComputed(3))) == WithComputed(3)


def test_an_error_from_the_dataclass_itself_is_permanent_and_chained() -> None:
    with pytest.raises(pgqueue.Permanent) as raised:
        payload_converter(Checked)({"size": -1})
    assert str(raised.value) == (
        "payload does not match Checked: Checked() raised ValueError: "
        "size must not be negative"
    )
    assert isinstance(raised.value.__cause__, ValueError)


def test_a_plain_mismatch_has_no_chained_cause() -> None:
    with pytest.raises(pgqueue.Permanent) as raised:
        payload_converter(SendWelcome)({})
    assert raised.value.__cause__ is None
    assert raised.value.__suppress_context__


# Pydantic models.


def signup(**changes: Any) -> dict[str, Any]:
    payload = {
        "user_id": "u",
        "emailAddress": "u@example.com",
        "signed_up_at": "2026-01-01T00:00:00Z",
        **changes,
    }
    return {k: v for k, v in payload.items() if v is not REMOVE}


def test_a_valid_payload_becomes_a_model() -> None:
    converted = payload_converter(Signup)(signup(tags=["x"]))
    assert converted == Signup(
        user_id="u", emailAddress="u@example.com", signed_up_at=NOW, tags=["x"]
    )


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (signup(user_id=1), "field 'user_id': expected a valid string, got int"),
        (signup(user_id=REMOVE), "missing field 'user_id'"),
        (signup(extra=1), "unexpected field 'extra'"),
        (signup(tags=["a", 2]), "field 'tags[1]': expected a valid string, got int"),
        (
            signup(signed_up_at="soon"),
            "field 'signed_up_at': expected a valid datetime or date, got str (",
        ),
        ([], "expected a valid dictionary or instance of Signup, got list"),
        (
            signup(user_id=REMOVE, emailAddress=REMOVE),
            "missing field 'user_id' (and 1 more error)",
        ),
    ],
)
def test_invalid_model_payloads(payload: Any, error: str) -> None:
    message = mismatch(payload, Signup)
    assert message.startswith(f"payload does not match Signup: {error}")


def test_a_model_error_is_chained() -> None:
    with pytest.raises(pgqueue.Permanent) as raised:
        payload_converter(Signup)({})
    assert isinstance(raised.value.__cause__, pydantic.ValidationError)


def test_a_model_inside_a_dataclass_names_its_path() -> None:
    convert = payload_converter(HoldsModel)
    assert convert({"signup": {"user_id": "u"}}) == HoldsModel(Loose(user_id="u"))
    assert mismatch({"signup": {}}, HoldsModel) == (
        "payload does not match HoldsModel: missing field 'signup.user_id'"
    )


# Encoding: to_json_value.


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (SendWelcome("u"), {"user_id": "u", "name": ""}),
        (
            Tree("a", [Tree("b")]),
            {"label": "a", "children": [{"label": "b", "children": []}]},
        ),
        (WithComputed(2), {"width": 2, "area": 0}),
        (Loose(user_id="u"), {"user_id": "u"}),
        (
            Signup(user_id="u", emailAddress="e", signed_up_at=NOW),
            {
                "user_id": "u",
                "emailAddress": "e",
                "signed_up_at": "2026-01-01T00:00:00Z",
                "tags": [],
            },
        ),
    ],
)
def test_to_json_value_converts_typed_payloads(value: Any, expected: Any) -> None:
    assert to_json_value(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        SendWelcome("u"),
        Tree("a", [Tree("b", [Tree("c")])]),
        WithComputed(2),
        dataclasses.replace(payload_converter(Everything)(everything()), anything=LEAF),
    ],
)
def test_to_json_value_of_a_dataclass_is_asdict_without_copies(value: Any) -> None:
    converted = to_json_value(value)
    expected = dataclasses.asdict(value)
    if isinstance(value, Everything):
        assert converted["anything"] is LEAF  # asdict would deep-copy it
        expected.update(anything=LEAF, when="2026-01-01T00:00:00+00:00")
    assert converted == expected


@pytest.mark.parametrize(
    "value",
    [
        {"a": SendWelcome("u")},
        [SendWelcome("u")],
        "text",
        b"{}",
        None,
        3,
        1.5,
        True,
        (1, 2),
        SendWelcome,
        Loose,
        NOW,
    ],
)
def test_to_json_value_returns_anything_else_itself(value: Any) -> None:
    assert to_json_value(value) is value


@pytest.mark.parametrize(
    ("cls", "value"),
    [
        (SendWelcome, SendWelcome("u", "Ada")),
        (Tree, Tree("a", [Tree("b"), Tree("c")])),
        (Signup, Signup(user_id="u", emailAddress="e", signed_up_at=NOW, tags=["t"])),
        (HoldsModel, HoldsModel(Loose(user_id="u"))),
    ],
)
def test_a_payload_survives_encoding_and_decoding(cls: type, value: Any) -> None:
    stored = json.loads(encode_payload(to_json_value(value)))
    assert payload_converter(cls)(stored) == value


def test_pgqueue_never_imports_pydantic() -> None:
    code = (
        "import sys, dataclasses, pgqueue\n"
        "from pgqueue._core.codec import to_json_value\n"
        "from pgqueue._core.typed import payload_type, typed_handler\n"
        "@dataclasses.dataclass\n"
        "class P:\n"
        "    x: int\n"
        "async def h(job: pgqueue.Job[P]) -> None: ...\n"
        "assert typed_handler(h) is not h\n"
        "assert to_json_value(P(1)) == {'x': 1}\n"
        "assert to_json_value(object) is object\n"
        "assert 'pydantic' not in sys.modules, 'pydantic was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# Through the public API, against a real server.


async def test_a_dataclass_handler_gets_instances(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    seen: list[Any] = []
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("send_welcome")
    async def send_welcome(job: pgqueue.Job[SendWelcome]) -> None:
        seen.append(job.payload)

    await queue.enqueue("send_welcome", {"user_id": "01J5"})
    await queue.enqueue("send_welcome", SendWelcome("01J6", "Ada"))
    await queue.enqueue_many(
        [
            ("send_welcome", SendWelcome("01J7")),
            pgqueue.NewJob("send_welcome", SendWelcome("01J8")),
        ]
    )
    await worker.run(until_empty=True)
    assert sorted(seen, key=lambda p: p.user_id) == [
        SendWelcome("01J5"),
        SendWelcome("01J6", "Ada"),
        SendWelcome("01J7"),
        SendWelcome("01J8"),
    ]
    assert all(type(p) is SendWelcome for p in seen)
    stored = await rows(pool, queue.name)
    assert [r["status"] for r in stored] == ["completed"] * 4
    assert json.loads(stored[1]["payload"]) == {"user_id": "01J6", "name": "Ada"}


async def test_a_typed_handlers_return_value_is_its_result(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("send_welcome")
    async def send_welcome(job: pgqueue.Job[SendWelcome]) -> SendWelcome:
        return dataclasses.replace(job.payload, name="sent")

    job_id = await queue.enqueue("send_welcome", SendWelcome("01J9"))
    await worker.run(until_empty=True)
    stored = await row(pool, job_id)
    assert stored["status"] == "completed"
    assert json.loads(stored["result"]) == {"user_id": "01J9", "name": "sent"}


async def test_a_pydantic_handler_gets_models(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    seen: list[Any] = []
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("signup")
    async def on_signup(job: pgqueue.Job[Signup]) -> None:
        seen.append(job.payload)

    model = Signup(user_id="b", emailAddress="b@example.com", signed_up_at=NOW)
    await queue.enqueue("signup", signup())
    await queue.enqueue("signup", model)
    await worker.run(until_empty=True)
    assert sorted(seen, key=lambda m: m.user_id) == [
        model,
        Signup(user_id="u", emailAddress="u@example.com", signed_up_at=NOW),
    ]
    assert all(type(m) is Signup for m in seen)
    assert [r["status"] for r in await rows(pool, queue.name)] == ["completed"] * 2


@pytest.mark.parametrize(
    ("job_type", "payload", "last_error"),
    [
        (
            "send_welcome",
            {"user_id": 42},
            (
                "Permanent: payload does not match SendWelcome: field 'user_id': "
                "expected str, got int"
            ),
        ),
        (
            "send_welcome",
            {"user_id": "u", "x": 1},
            "Permanent: payload does not match SendWelcome: unexpected field 'x'",
        ),
        (
            "signup",
            signup(user_id=REMOVE),
            "Permanent: payload does not match Signup: missing field 'user_id'",
        ),
    ],
)
async def test_a_payload_that_does_not_match_is_dead_after_one_attempt(
    pool: asyncpg.Pool,
    queue: pgqueue.Queue,
    job_type: str,
    payload: Any,
    last_error: str,
) -> None:
    called: list[pgqueue.Job] = []
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("send_welcome")
    async def send_welcome(job: pgqueue.Job[SendWelcome]) -> None:
        called.append(job)

    @worker.handler("signup")
    async def on_signup(job: pgqueue.Job[Signup]) -> None:
        called.append(job)

    job_id = await queue.enqueue(job_type, payload, max_attempts=5)
    await worker.run(until_empty=True)
    [stored] = await rows(pool, queue.name)
    assert stored["id"] == job_id
    assert stored["status"] == "dead"
    assert stored["attempts"] == 1
    assert stored["last_error"] == last_error
    assert called == []


async def test_an_untyped_handler_sees_plain_json(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    seen: list[tuple[str, Any]] = []
    worker = pgqueue.Worker(pool, queue=queue.name)

    @worker.handler("plain")
    async def plain(job: pgqueue.Job) -> None:
        seen.append(("plain", job.payload))

    @worker.handler("dict")
    async def as_dict(job: pgqueue.Job[dict[str, Any]]) -> None:
        seen.append(("dict", job.payload))

    await queue.enqueue("plain", {"user_id": 42, "x": [1.5]})
    await queue.enqueue("dict", SendWelcome("u"))
    await worker.run(until_empty=True)
    assert sorted(seen) == [
        ("dict", {"user_id": "u", "name": ""}),
        ("plain", {"user_id": 42, "x": [1.5]}),
    ]


async def test_middleware_sees_the_stored_payload_and_the_handler_the_typed_one(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    seen: list[str] = []

    def record(handler: pgqueue.Handler) -> pgqueue.Handler:
        async def wrapped(job: pgqueue.Job) -> None:
            seen.append(f"middleware {type(job.payload).__name__}")
            try:
                await handler(job)
            except pgqueue.Permanent:
                seen.append("middleware saw Permanent")
                raise

        return wrapped

    # One at a time, in the order enqueued.
    worker = pgqueue.Worker(pool, queue=queue.name, concurrency=1, middleware=[record])

    @worker.handler("send_welcome")
    async def send_welcome(job: pgqueue.Job[SendWelcome]) -> None:
        seen.append(f"handler {type(job.payload).__name__}")

    await queue.enqueue("send_welcome", SendWelcome("u"))
    await queue.enqueue("send_welcome", {})
    await worker.run(until_empty=True)
    assert seen == [
        "middleware dict",
        "handler SendWelcome",
        "middleware dict",
        "middleware saw Permanent",
    ]


async def test_registering_a_handler_whose_payload_type_cannot_be_found_raises(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    @dataclass
    class Local:
        n: int

    worker = pgqueue.Worker(pool, queue=queue_name)

    async def handle(job: pgqueue.Job[Local]) -> None: ...

    with pytest.raises(TypeError, match="name 'Local' is not defined"):
        worker.register("t", handle)
    with pytest.raises(TypeError, match="name 'Local' is not defined"):
        worker.handler("t")(handle)
