"""The claim loop's fast Job constructor builds exactly what Job(...) builds."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

from pgqueue._job import Job, claimed_job

FIELDS: dict[str, Any] = {
    "id": 7,
    "queue": "q",
    "type": "t",
    "payload": {"a": [1]},
    "attempts": 2,
    "max_attempts": 5,
    "run_at": datetime(2026, 1, 1, tzinfo=UTC),
    "created_at": datetime(2025, 1, 1, tzinfo=UTC),
    "last_error": "boom",
    "priority": -3,
    "unique_key": "k",
    "snoozes": 4,
    "trace_context": '{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}',
}


def test_claimed_job_sets_every_field_by_its_name() -> None:
    assert [field.name for field in dataclasses.fields(Job)] == list(FIELDS)
    built = claimed_job(*FIELDS.values())
    assert type(built) is Job
    assert built == Job(**FIELDS)
    assert {name: getattr(built, name) for name in FIELDS} == FIELDS


def test_a_claimed_job_is_as_frozen_as_any() -> None:
    built = claimed_job(*FIELDS.values())
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.attempts = 3  # type: ignore[misc]
