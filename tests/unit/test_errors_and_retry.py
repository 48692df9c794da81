"""Error text made storable, and the retry-delay rule of every loop (no database)."""

from __future__ import annotations

import pytest

from pgqueue._errors import MAX_ERROR_LENGTH, describe, storable
from pgqueue._retry import FIRST_RETRY_DELAY, retry_delay


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
