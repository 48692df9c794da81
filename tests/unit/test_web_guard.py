"""The dashboard's host allow-list and action tokens, with explicit clocks (no database).

The same guards are tried against a real ``pgqueue web`` process in
tests/test_web_security.py; these pin the edge cases of their rules.
"""

from __future__ import annotations

import pytest

from pgqueue.cli.web import allowed_hosts
from pgqueue.web._guard import (
    TOKEN_LIFETIME,
    ActionTokens,
    check_allowed_hosts,
)

SECRET = b"sixteen bytes ok"


def test_a_name_alone_allows_any_port_and_a_port_only_itself() -> None:
    hosts = check_allowed_hosts(["ops.example.com", "10.0.0.5:8080", "[::1]:9000"])
    assert hosts.allows("ops.example.com", "https")
    assert hosts.allows("OPS.example.com:8443", "http")
    assert hosts.allows("10.0.0.5:8080", "http")
    assert not hosts.allows("10.0.0.5", "http")  # port 80
    assert not hosts.allows("10.0.0.5:8081", "http")
    assert hosts.allows("[::1]:9000", "http")
    assert not hosts.allows("[::1]", "http")
    for forged in ("", "ops.example.com.", "x.ops.example.com", "ops.example.com:0"):
        assert not hosts.allows(forged, "http"), forged
    for forged in ("ops.example.com:", "ops.example.com:x", "[::1]x", "[::1"):
        assert not hosts.allows(forged, "http"), forged


def test_a_port_given_matches_a_host_header_without_one_by_its_scheme() -> None:
    hosts = check_allowed_hosts(["localhost:80", "ops.example.com:443"])
    assert hosts.allows("localhost", "http")
    assert not hosts.allows("localhost", "https")
    assert hosts.allows("ops.example.com", "https")


def test_the_default_is_this_machine_s_names() -> None:
    hosts = check_allowed_hosts(None)
    for host in ("127.0.0.1:8080", "localhost", "[::1]:1", "LOCALHOST:5"):
        assert hosts.allows(host, "http"), host
    for host in ("127.0.0.2", "[::2]", "localhost.example", "0.0.0.0:8080"):
        assert not hosts.allows(host, "http"), host


def test_pgqueue_web_allows_the_address_it_listens_on_with_its_port() -> None:
    assert allowed_hosts("127.0.0.1", 8080, []) == [
        "127.0.0.1:8080",
        "localhost:8080",
        "[::1]:8080",
    ]
    assert allowed_hosts("::1", 8080, ["ops.example.com"]) == [
        "127.0.0.1:8080",
        "localhost:8080",
        "[::1]:8080",
        "ops.example.com",
    ]
    assert allowed_hosts("10.0.0.5", 9000, []) == ["10.0.0.5:9000"]
    assert allowed_hosts("fd00::5", 9000, []) == ["[fd00::5]:9000"]


def test_a_token_is_good_for_its_action_and_fields_for_an_hour() -> None:
    tokens = ActionTokens(SECRET)
    now = 1_800_000_000.0
    token = tokens.issue("/retry-all", {"queue": "a", "type": ""}, now=now)
    assert tokens.valid(token, "/retry-all", {"type": "", "queue": "a"}, now=now)
    later = now + TOKEN_LIFETIME
    assert tokens.valid(token, "/retry-all", {"queue": "a", "type": ""}, now=later)
    assert not tokens.valid(
        token, "/retry-all", {"queue": "a", "type": ""}, now=later + 1
    )
    assert not tokens.valid(token, "/retry-all", {"queue": "b", "type": ""}, now=now)
    assert not tokens.valid(token, "/retry-all", {"queue": "a"}, now=now)
    assert not tokens.valid(token, "/jobs/1/retry", now=now)
    assert not ActionTokens(SECRET + b"!").valid(
        token, "/retry-all", {"queue": "a", "type": ""}, now=now
    )
    assert not tokens.valid(token.upper(), "/retry-all", {"queue": "a"}, now=now)
    assert not tokens.valid("", "/retry-all", now=now)


def test_a_secret_is_at_least_sixteen_bytes() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        ActionTokens(SECRET[:-1])
    with pytest.raises(ValueError, match="16 bytes"):
        ActionTokens("é" * 7)  # 14 bytes in UTF-8
    ActionTokens("é" * 8)
    ActionTokens(None)
