"""The claim loop's fast Job constructor builds exactly what Job(...) builds."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from pgqueue._core.job import Job, PeriodicKey, Step, claimed_job
from pgqueue._engine.claimer import jobs_from_rows
from pgqueue._sql.claims import CLAIM, CLAIM_COLUMNS

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
    "last_checkpoint": {"step": [3]},
    "parent_results": {3: {"rows": 2}, 4: None},
    "steps": {
        "charge": Step("charge", {"id": "ch_1"}, datetime(2026, 1, 1, 0, 1, tzinfo=UTC))
    },
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


def test_a_periodic_key_is_written_and_read_in_one_place() -> None:
    tick = datetime(2026, 3, 1, 9, 30, tzinfo=UTC)
    key = str(PeriodicKey("report@eu", tick.astimezone(timezone(timedelta(hours=2)))))
    assert key == "periodic:report@eu@2026-03-01T09:30:00+00:00"
    assert PeriodicKey.parse(key) == ("report@eu", tick)
    assert Job(**{**FIELDS, "unique_key": key}).tick == tick


@pytest.mark.parametrize(
    "key",
    [
        None,
        "k",
        "periodic:no-tick",
        "periodic:n@not a time",
        "periodic:n@2026-03-01T09:30:00",  # naive: not ours
        "other:n@2026-03-01T09:30:00+00:00",
    ],
)
def test_other_keys_hold_no_periodic_tick(key: str | None) -> None:
    assert PeriodicKey.parse(key) is None
    assert Job(**{**FIELDS, "unique_key": key}).tick is None


def test_a_claimed_row_is_read_by_the_claim_columns() -> None:
    # Every column a distinct value: a decoder reading the wrong column fails.
    columns = {
        "id": 7,
        "queue": "q",
        "job_type": "t",
        "payload": '{"a": [1]}',
        "attempts": 2,
        "max_attempts": 5,
        "run_at": FIELDS["run_at"],
        "created_at": FIELDS["created_at"],
        "last_error": "boom",
        "unrepresentable": None,
        "priority": -3,
        "unique_key": "k",
        "snoozes": 4,
        "claimed_at": 1_700_000_000_000_000,
        "trace_context": FIELDS["trace_context"],
        "checkpoint": '{"step": [3]}',
        "has_parents": True,
        "steps": '{"charge": {"at": "2026-01-01T00:01:00+00:00", "result": {"id": "ch_1"}}}',
    }
    assert set(columns) == set(CLAIM_COLUMNS)
    row = tuple(columns[name] for name in CLAIM_COLUMNS)
    # Read by the claimer, for the claimed jobs with parents alone (PARENT_RESULTS).
    parents = {FIELDS["id"]: '{"3": {"rows": 2}, "4": null}'}
    claimed = jobs_from_rows([row], parents)
    assert claimed.jobs == [Job(**FIELDS)]
    assert claimed.claimed_at == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
    # The claim returns them in that order.
    returning = CLAIM[CLAIM.index("RETURNING") :]
    ends = [returning.index(f"{name},") for name in CLAIM_COLUMNS[:-1]]
    assert ends == sorted(ends)
    assert returning.rstrip().endswith(CLAIM_COLUMNS[-1])


def test_a_checkpoint_python_cannot_decode_dead_letters_the_job() -> None:
    # Written by hand or by another library: 5000 digits is past Python's
    # int limit. The job cannot resume from it, so it does not run.
    columns: dict[str, Any] = dict.fromkeys(CLAIM_COLUMNS)
    columns.update(
        id=7,
        queue="q",
        job_type="t",
        payload="{}",
        attempts=1,
        max_attempts=5,
        run_at=FIELDS["run_at"],
        created_at=FIELDS["created_at"],
        priority=0,
        snoozes=0,
        claimed_at=1_700_000_000_000_000,
        checkpoint="9" * 5000,
    )
    claimed = jobs_from_rows([tuple(columns[name] for name in CLAIM_COLUMNS)])
    assert claimed.jobs == []
    [dead] = claimed.dead
    assert dead.error is not None
    assert dead.error.startswith("checkpoint could not be decoded: ValueError")
