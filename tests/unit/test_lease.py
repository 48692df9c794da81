"""A worker's lease of a limited queue's slots, as the claimer reads it (no database)."""

from __future__ import annotations

import pgqueue
from pgqueue._core.options import LaneSettings
from pgqueue._engine.lease import Lease
from pgqueue._engine.ledger import Claims
from tests.unit.test_ledger import job


def lease(claims: Claims, ttl: float = 10.0) -> Lease:
    settings = LaneSettings(
        index=0,
        name="q",
        concurrency=4,
        global_limit=5,
        group_limit=None,
        rate_limit=None,
    )
    options = pgqueue.WorkerOptions(queue="q", global_limit=5, rescue_after=ttl)
    return Lease(settings, options, worker="w", wanted=4, claims=claims)


def test_a_lease_allows_nothing_until_it_is_granted() -> None:
    held = lease(Claims(capacity=4, write_allowance=4))
    before = held.taken
    assert held.free(0.0) == 0
    assert held.renewed(3, sent_at=1.0)
    assert (before, held.taken) == (False, True)
    assert held.free(1.5) == 3


def test_jobs_ready_or_running_fill_the_lease_and_ended_ones_free_it() -> None:
    claims = Claims(capacity=4, write_allowance=4)
    held = lease(claims)
    held.renewed(3, sent_at=0.0)
    claims.add([job(1), job(2)])
    assert held.free(1.0) == 1
    claims.start()
    assert held.free(1.0) == 1  # running still fills its slot
    claims.ended()  # its outcome waits for the writer: the slot is free
    assert held.free(1.0) == 2


def test_a_lease_runs_out_ttl_after_its_renewal_was_sent() -> None:
    held = lease(Claims(capacity=4, write_allowance=4), ttl=10.0)
    held.renewed(3, sent_at=5.0)
    assert held.free(14.9) == 3
    assert held.free(15.0) == 0
    # A renewal that gets through grants room again, even the same slots.
    assert held.renewed(3, sent_at=16.0)
    assert held.free(16.0) == 3
    assert not held.renewed(3, sent_at=17.0)
    assert not held.renewed(2, sent_at=18.0)
    assert held.renewed(4, sent_at=19.0)


def test_a_renewal_records_every_slot_the_worker_may_fill_while_it_runs() -> None:
    claims = Claims(capacity=4, write_allowance=4)
    held = lease(claims)
    assert held.held() == 0
    held.renewed(3, sent_at=0.0)
    assert held.held() == 3  # a claim may fill the lease meanwhile
    held.renewed(1, sent_at=1.0)  # shrunk to a fair share
    claims.add([job(1), job(2), job(3)])
    assert held.free(1.5) == 0
    assert held.held() == 3  # its jobs keep their slots until they end
    held.claiming = 2
    assert held.held() == 5
