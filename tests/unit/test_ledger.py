"""The claims ledger: free capacity, back pressure, release, emptiness (no database)."""

from __future__ import annotations

from datetime import UTC, datetime

import anyio

from pgqueue._core.job import Job
from pgqueue._engine.ledger import Claims

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def job(job_id: int, attempts: int = 1) -> Job:
    return Job(
        id=job_id,
        queue="q",
        type="t",
        payload={},
        attempts=attempts,
        max_attempts=5,
        run_at=NOW,
        created_at=NOW,
    )


def test_a_claim_holds_its_slot_until_its_outcome_is_durable() -> None:
    claims = Claims(capacity=2, write_allowance=0)
    claims.add([job(1), job(2)])
    assert (claims.free, claims.held) == (0, 2)
    started = claims.start()
    claims.ended()  # its outcome is with the writer, not yet durable
    assert (claims.free, claims.writing, claims.keys()) == (0, 1, [(1, 1), (2, 1)])
    claims.settled([(started.id, started.attempts)])
    assert (claims.free, claims.held, claims.keys()) == (1, 1, [(2, 1)])


def test_outcomes_waiting_beyond_the_allowance_stop_claims() -> None:
    claims = Claims(capacity=2, write_allowance=2)
    for n in range(4):
        claims.add([job(n)])
        claims.start()
        claims.ended()
        assert claims.free == (2 if n < 2 else 2 - (n - 1))
    assert claims.free == 0  # 4 outcomes unwritten: claim nothing more
    claims.settled([(0, 1), (1, 1)])
    assert claims.free == 2


def test_give_back_takes_only_unstarted_jobs() -> None:
    claims = Claims(capacity=3, write_allowance=3)
    claims.add([job(1), job(2), job(3)])
    claims.start()
    assert [j.id for j in claims.give_back()] == [2, 3]
    assert (claims.running, claims.held, len(claims.ready)) == (1, 3, 0)


def test_a_stale_or_repeated_settle_changes_nothing() -> None:
    claims = Claims(capacity=1, write_allowance=1)
    claims.add([job(1, attempts=2)])
    claims.settled([(1, 1)])  # an older attempt of the same job
    assert claims.held == 1
    claims.settled([(1, 2), (1, 2)])
    assert (claims.held, claims.settled_count) == (0, 1)


async def test_wait_empty_returns_once_every_claim_settled() -> None:
    claims = Claims(capacity=1, write_allowance=1)
    with anyio.fail_after(1):
        await claims.wait_empty()
    claims.add([job(1)])
    async with anyio.create_task_group() as tg:
        done = anyio.Event()

        async def wait() -> None:
            await claims.wait_empty()
            done.set()

        tg.start_soon(wait)
        await anyio.wait_all_tasks_blocked()
        assert not done.is_set()
        claims.settled([(1, 1)])
        with anyio.fail_after(1):
            await done.wait()


def _ran_short(claims: Claims, jobs: list[Job]) -> None:
    """``jobs`` claimed in a full claim, each run in a millisecond, their outcomes with the writer."""
    claims.add(jobs)
    claims.backlog = True
    for _ in jobs:
        claims.start()
        claims.ran(0.001)
        claims.ended()


def test_a_full_claims_outcomes_being_written_leave_room_for_the_next_claim() -> None:
    """Claiming ahead, the next claim overlaps the write of the last one's outcomes."""
    claims = Claims(capacity=2, write_allowance=2, ahead=2)
    _ran_short(claims, [job(n) for n in range(4)])  # a claim of capacity + ahead
    assert (claims.writing, claims.claiming_ahead, claims.free) == (4, True, 4)
    assert claims.claim_at == 2
    _ran_short(claims, [job(n) for n in range(4, 8)])  # the writer fell behind
    assert (claims.writing, claims.claiming_ahead) == (8, False)
    assert claims.free <= 0
    assert claims.claim_at == 2  # once it catches up, claims resume in batches
    claims.settled([(n, 1) for n in range(6)])
    assert (claims.claiming_ahead, claims.free) == (True, 4)


def test_without_a_backlog_of_short_jobs_one_free_slot_is_worth_a_claim() -> None:
    claims = Claims(capacity=2, write_allowance=2, ahead=2)
    assert (claims.claim_at, claims.free) == (1, 2)
    claims.add([job(1)])
    claims.start()
    claims.ran(1.0)  # long jobs
    claims.ended()
    claims.backlog = True
    assert (claims.claiming_ahead, claims.claim_at) == (False, 1)
