"""Error text made storable, and the retry-delay rule of every loop (no database)."""

from __future__ import annotations

import asyncpg
import pytest

from pgqueue._core.errors import (
    MAX_ERROR_LENGTH,
    describe,
    ends_session,
    is_outage,
    is_transient,
    storable,
)
from pgqueue._core.log import QUIET_FAILURES
from pgqueue._core.retry import FIRST_RETRY_DELAY, Failures, Outage, retry_delay
from tests.helpers import RecordingLogger


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain", "plain"),
        ("nul\x00here", "nul\\x00here"),
        ("lone \ud800 surrogate", "lone \\ud800 surrogate"),
        ("snow \u2603 fine", "snow \u2603 fine"),
    ],
)
def test_storable(text: str, expected: str) -> None:
    assert storable(text) == expected


def test_storable_caps_and_says_how_much_was_cut() -> None:
    text = storable("y" * (MAX_ERROR_LENGTH * 3))
    assert len(text) <= MAX_ERROR_LENGTH
    assert text.endswith(
        f"({MAX_ERROR_LENGTH * 3 - (MAX_ERROR_LENGTH - 40)} more characters)"
    )


def test_describe_never_raises() -> None:
    class Broken(Exception):
        def __str__(self) -> str:
            raise ValueError

    assert describe(Broken()) == "Broken: (its message could not be read)"
    assert describe(KeyError()) == "KeyError"
    assert describe(ValueError("x\x00")) == "ValueError: x\\x00"


def test_retry_delay_doubles_from_the_first_delay_with_jitter() -> None:
    for failures in range(1, 6):
        base = FIRST_RETRY_DELAY * 2 ** (failures - 1)
        for _ in range(20):
            assert base / 2 <= retry_delay(failures, cap=100) <= base


@pytest.mark.parametrize("failures", [1_024, 1_025, 10**6, 10**18])
def test_retry_delay_never_overflows_and_stays_capped(failures: int) -> None:
    # 0.05 * 2**1024 raised OverflowError: after about 17 minutes of outage
    # at poll_interval=1 the old claim loop died of it.
    for cap in (0.001, 1.0, 5.0):
        assert cap / 2 <= retry_delay(failures, cap) <= cap


async def test_failures_count_log_and_wait_by_the_retry_rule() -> None:
    logger = RecordingLogger()
    failures = Failures(
        logger, "claim failed; retrying", cap=1.0, fields={"queue": "q"}
    )
    waits = [failures.failed(ConnectionResetError("gone"), jobs=i) for i in range(7)]
    assert failures.count == 7
    for n, wait in enumerate(waits, 1):
        base = min(1.0, FIRST_RETRY_DELAY * 2 ** (n - 1))
        assert base / 2 <= wait <= base
    # WARNING while it may pass, ERROR once it persists.
    levels = [level for level, _, _ in logger.records]
    assert levels == ["warning"] * QUIET_FAILURES + ["error"] * (7 - QUIET_FAILURES)
    _, msg, extra = logger.records[-1]
    assert msg == "claim failed; retrying"
    assert extra == {
        "error": "ConnectionResetError('gone')",
        "failures": 7,
        "queue": "q",
        "jobs": 6,
    }
    failures.failed(OSError(), "claim lost; retrying")
    assert logger.records[-1][1] == "claim lost; retrying"


async def test_failures_start_again_after_a_success() -> None:
    logger = RecordingLogger()
    failures = Failures(logger, "heartbeat failed")
    for _ in range(QUIET_FAILURES + 1):
        failures.failed(OSError())
    failures.succeeded()
    assert failures.count == 0
    assert failures.failed(OSError()) <= FIRST_RETRY_DELAY
    assert logger.records[-1][0] == "warning"
    # counted(): a failure its caller logs itself.
    assert failures.counted() <= 2 * FIRST_RETRY_DELAY
    assert failures.count == 2
    assert len(logger.records) == QUIET_FAILURES + 2


async def test_a_periodic_loop_pauses_its_interval_or_less_after_failures() -> None:
    failures = Failures(RecordingLogger(), "rescue sweep failed")
    assert failures.pause(30.0) == 30.0
    for _ in range(40):
        failures.failed(OSError())
        assert failures.pause(0.2) <= 0.2
    failures.succeeded()
    assert failures.pause(0.2) == 0.2


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.ReadOnlySQLTransactionError(
            "cannot execute UPDATE in a read-only transaction"
        ),
        asyncpg.AdminShutdownError(
            "terminating connection due to administrator command"
        ),
        asyncpg.CrashShutdownError("terminating connection because of crash"),
        asyncpg.CannotConnectNowError("the database system is shutting down"),
        asyncpg.ConnectionFailureError("connection failure"),  # 08006
        asyncpg.ClientCannotConnectError("cannot connect"),  # 08001
        asyncpg.TargetServerAttributeNotMatched("no host is read-write"),
        ConnectionResetError("reset"),
        TimeoutError(),
    ],
)
def test_a_server_that_is_gone_shutting_down_or_read_only_is_an_outage(
    exc: Exception,
) -> None:
    # An outage: retried on a new connection (a multi-host DSN then finds
    # the primary), never a refused outcome nor a failed job.
    assert is_outage(exc)
    assert is_transient(exc)
    assert ends_session(exc)


def test_busy_is_transient_but_no_outage_and_refused_is_neither() -> None:
    deadlock = asyncpg.DeadlockDetectedError("deadlock detected")
    assert is_transient(deadlock)
    assert not is_outage(deadlock)
    assert not ends_session(deadlock)
    refused = asyncpg.RaiseError("this completion is refused")
    assert not is_transient(refused)
    assert not is_outage(refused)
    assert not ends_session(refused)


def test_an_outage_is_said_once_and_ends_when_every_part_that_failed_is_back() -> None:
    logger = RecordingLogger()
    now = [100.0]
    outage = Outage(logger, fields={"queue": "q"}, clock=lambda: now[0])
    claims, listen = object(), object()
    lost = ConnectionResetError("reset")
    outage.up(claims, "u@h:1/d")  # up while nothing was down: nothing to say
    outage.down(claims, lost, "u@h:1/d")
    outage.down(listen, lost, "u@h:1/d")
    outage.down(claims, lost, "u@h:1/d")
    ongoing = [outage.ongoing]
    now[0] = 102.5
    outage.up(claims, "u@h:2/d")
    ongoing.append(outage.ongoing)  # LISTEN is still down
    now[0] = 103.25
    outage.up(listen, "u@h:2/d")
    ongoing.append(outage.ongoing)
    assert ongoing == [True, True, False]
    assert logger.records == [
        (
            "warning",
            "database %s unavailable (%s); retrying until it is back",
            {
                "database": "u@h:1/d",
                "error": "ConnectionResetError: reset",
                "queue": "q",
            },
        ),
        (
            "info",
            "database %s available again after %.1f s",
            {"database": "u@h:2/d", "seconds": 3.25, "queue": "q"},
        ),
    ]
    # The next outage is said again.
    outage.down(listen, lost, "u@h:2/d")
    assert logger.messages("warning")[1:] == [logger.records[0][1]]


async def test_quiet_failures_log_an_outage_at_debug_and_the_rest_as_before() -> None:
    logger = RecordingLogger()
    failures = Failures(logger, "claim failed; retrying", quiet=True)
    failures.failed(asyncpg.ReadOnlySQLTransactionError("read-only"))
    failures.failed(asyncpg.DeadlockDetectedError("deadlock detected"))
    assert [level for level, _, _ in logger.records] == ["debug", "warning"]
