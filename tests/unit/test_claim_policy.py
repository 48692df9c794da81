"""The claim policy, with a clock the tests move by hand (no database)."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from pgqueue._engine.policy import LAST_ID, RETRY_WAKE_MARGIN, ClaimPolicy

POLL = 5.0
HEADS: dict[int, tuple[datetime, int]] = {}
PLACE = (datetime(2026, 1, 1, tzinfo=UTC), 42)
LATER = (datetime(2026, 1, 2, tzinfo=UTC), 7)
AT = datetime(2026, 1, 3, tzinfo=UTC)
ABOVE_ZERO = dict.fromkeys(range(1, 6), (AT, LAST_ID))


def policy(claim_at: int = 1) -> ClaimPolicy:
    return ClaimPolicy(claim_at=claim_at, poll_interval=POLL)


def test_claims_at_start_for_every_free_slot_from_the_heads() -> None:
    assert policy().next_claim(free=10, now=0.0) == (10, HEADS)


def test_a_short_claim_from_the_heads_stops_claiming_until_a_wakeup() -> None:
    p = policy()
    assert p.next_claim(free=10, now=0.0) == (10, HEADS)
    p.claimed(10, HEADS, got=3, last={0: PLACE}, now=0.0)
    assert p.next_claim(free=7, now=1.0) is None
    assert p.wait(now=1.0) == POLL - 1.0
    p.wake()
    assert p.next_claim(free=7, now=1.0) == (7, HEADS)


def test_a_full_claim_claims_again_past_the_last_job_taken() -> None:
    p = policy()
    p.next_claim(free=10, now=0.0)
    p.claimed(10, HEADS, got=10, last={0: PLACE}, now=0.0, claimed_at=AT)
    after = {**ABOVE_ZERO, 0: PLACE}
    assert p.next_claim(free=10, now=0.1) == (10, after)
    p.claimed(10, after, got=10, last={0: LATER}, now=0.1, claimed_at=AT)
    assert p.next_claim(free=10, now=0.2) == (10, {**ABOVE_ZERO, 0: LATER})


def test_priorities_a_full_claim_moved_past_start_at_its_time() -> None:
    # Priorities 5..1 had nothing due past their places at AT (the claim
    # went on to 0): the next claim starts their lines there, however many
    # jobs they had.
    p = policy()
    p.next_claim(free=10, now=0.0)
    p.claimed(10, HEADS, got=10, last={3: LATER, 0: PLACE}, now=0.0, claimed_at=AT)
    assert p.next_claim(free=10, now=0.1) == (10, {**ABOVE_ZERO, 0: PLACE})
    # Lines below the lowest priority taken keep their places.
    p.claimed(
        10, {**ABOVE_ZERO, -2: PLACE}, got=10, last={-1: LATER}, now=0.1, claimed_at=AT
    )
    assert p.next_claim(free=10, now=0.2) == (
        10,
        {**ABOVE_ZERO, 0: (AT, LAST_ID), -1: LATER, -2: PLACE},
    )


def test_a_short_claim_past_a_head_looks_behind_it_next() -> None:
    p = policy()
    p.next_claim(free=10, now=0.0)
    p.claimed(10, HEADS, got=10, last={0: PLACE}, now=0.0)
    assert p.next_claim(free=10, now=0.1) == (
        10,
        {0: PLACE},
    )  # no claim time: heads above
    p.claimed(10, {0: PLACE}, got=2, last={0: LATER}, now=0.1)
    assert p.next_claim(free=8, now=0.2) == (8, HEADS)


def test_claims_from_the_heads_at_least_every_poll_while_a_backlog_lasts() -> None:
    p = policy()
    assert p.next_claim(free=10, now=0.0) == (10, HEADS)
    p.claimed(10, HEADS, got=10, last={0: PLACE}, now=0.0)
    assert p.next_claim(free=10, now=POLL - 0.1) == (10, {0: PLACE})
    p.claimed(10, {0: PLACE}, got=10, last={0: LATER}, now=POLL - 0.1)
    assert p.next_claim(free=10, now=POLL) == (10, HEADS)


def test_a_wakeup_without_room_is_kept_until_there_is_room() -> None:
    # prefetch=2, concurrency=2: claims wait for 2 free slots.
    p = policy(claim_at=2)
    p.next_claim(free=4, now=0.0)
    p.claimed(4, HEADS, got=3, last={0: PLACE}, now=0.0)  # 3 jobs: 1 free slot
    p.wake()  # a NOTIFY for 500 more
    assert p.next_claim(free=1, now=0.1) is None
    assert p.more
    assert p.wait(now=0.1) == math.inf  # only room is worth waiting for now
    assert p.next_claim(free=2, now=0.2) == (2, HEADS)


def test_the_poll_falls_due_poll_interval_after_the_last_claim() -> None:
    p = policy()
    p.next_claim(free=1, now=0.0)
    p.claimed(1, HEADS, got=0, last={}, now=3.0)
    assert p.next_claim(free=1, now=3.0 + POLL - 0.01) is None
    assert p.next_claim(free=1, now=3.0 + POLL) == (1, HEADS)


def test_a_retry_due_before_the_poll_gets_a_timer_of_its_own() -> None:
    p = policy()
    p.next_claim(free=1, now=0.0)
    p.claimed(1, HEADS, got=0, last={}, now=0.0)
    assert p.retry_written(0.5, now=1.0)  # the earliest timer: wake the loop
    assert not p.retry_written(0.7, now=1.0)  # a later one: no need
    assert not p.retry_written(POLL, now=1.0)  # the poll covers it
    due = 1.0 + 0.5 + RETRY_WAKE_MARGIN
    assert p.wait(now=1.0) == due - 1.0
    assert p.next_claim(free=1, now=due - 0.001) is None
    assert p.next_claim(free=1, now=due) == (1, HEADS)
    p.claimed(1, HEADS, got=0, last={}, now=due)
    assert p.wait(now=due) == 1.0 + 0.7 + RETRY_WAKE_MARGIN - due


def test_a_failed_claim_claims_again_from_the_heads() -> None:
    p = policy()
    p.next_claim(free=10, now=0.0)
    p.claimed(10, HEADS, got=10, last={0: PLACE}, now=0.0)
    p.failed()
    assert p.next_claim(free=10, now=0.1) == (10, HEADS)


def test_a_full_claim_of_rows_without_a_place_claims_again_from_the_heads() -> None:
    p = policy()
    p.next_claim(free=2, now=0.0)
    p.claimed(2, HEADS, got=2, last={}, now=0.0)
    assert p.next_claim(free=2, now=0.1) == (2, HEADS)


def test_a_wakeup_sends_the_priorities_a_claim_moved_past_back_to_their_heads() -> None:
    # A job of priority 5 that committed after the claim at AT began may
    # have run_at before AT: its NOTIFY must make the next claim look again.
    p = policy()
    p.next_claim(free=10, now=0.0)
    p.claimed(10, HEADS, got=10, last={0: PLACE}, now=0.0, claimed_at=AT)
    p.wake()
    assert p.next_claim(free=10, now=0.1) == (10, {0: PLACE})


def test_a_wakeup_during_a_claim_keeps_the_priorities_at_their_heads() -> None:
    # The NOTIFY of a priority-5 job arrives while a claim runs that did not
    # see it; its run_at may be before that claim's time.
    p = policy()
    p.next_claim(free=10, now=0.0)
    p.wake()
    p.claimed(10, HEADS, got=10, last={0: PLACE}, now=0.0, claimed_at=AT)
    assert p.next_claim(free=10, now=0.1) == (10, {0: PLACE})
    p.claimed(10, {0: PLACE}, got=10, last={0: LATER}, now=0.1, claimed_at=AT)
    assert p.next_claim(free=10, now=0.2) == (10, {0: LATER} | ABOVE_ZERO)


def test_a_wakeup_during_a_short_claim_is_not_lost() -> None:
    # The claim's snapshot may predate the commit its NOTIFY announces.
    p = policy()
    assert p.next_claim(free=10, now=0.0) == (10, HEADS)
    p.wake()
    p.claimed(10, HEADS, got=0, last={}, now=0.0)
    assert p.next_claim(free=10, now=0.1) == (10, HEADS)
    p.claimed(10, HEADS, got=0, last={}, now=0.1)
    assert p.next_claim(free=10, now=0.2) is None


def test_the_queues_next_job_wakes_an_idle_lane_when_due() -> None:
    p = policy()
    p.next_claim(free=10, now=0.0)
    p.claimed(10, HEADS, got=0, last={}, now=0.0)
    # Asked after the short claim: due in 2 s, well before the poll.
    p.due_in(2.0, now=0.1)
    assert p.wait(now=0.1) == pytest.approx(2.0 + RETRY_WAKE_MARGIN)
    assert p.next_claim(free=10, now=2.0) is None
    assert p.next_claim(free=10, now=2.1 + RETRY_WAKE_MARGIN) == (10, HEADS)
    # Fired once: the next short claim asks again.
    p.claimed(10, HEADS, got=1, last={0: PLACE}, now=2.2)
    assert p.wait(now=2.2) == POLL


def test_the_latest_answer_about_the_next_job_replaces_the_one_before() -> None:
    p = policy()
    p.next_claim(free=10, now=0.0)
    p.claimed(10, HEADS, got=0, last={}, now=0.0)
    p.due_in(1.0, now=0.0)
    p.due_in(None, now=0.5)  # claimed by another worker meanwhile: none left
    assert p.wait(now=0.5) == POLL - 0.5
    p.due_in(-0.5, now=0.6)  # fell due while the answer came back
    assert p.wait(now=0.6) == pytest.approx(RETRY_WAKE_MARGIN)
    p.due_in(3 * POLL, now=0.7)  # after the poll: the poll comes first
    assert p.wait(now=0.7) == POLL - 0.7
    p.due_in(math.inf, now=0.8)  # run_at 'infinity'
    assert p.wait(now=0.8) == POLL - 0.8
