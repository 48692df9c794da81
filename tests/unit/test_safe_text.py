"""What pgqueue writes about DSNs and shows of job fields, without a server.

`check_dsn` refuses what asyncpg would misread, quoting none of it;
`target` names ``user@host:port/database`` without a password; `printable`
escapes what a terminal would act on; `print_json` stays exact.
"""

from __future__ import annotations

import json
import logging

import pytest

from pgqueue._core.dsn import DSN_HINT, check_dsn, target
from pgqueue.cli._common import PrintableFormatter, print_json, printable

SECRET = "Zq9sEcReT"

REFUSED = [
    f"postgresql://u:{SECRET}@x@127.0.0.1:5432/db",
    f"postgresql://u:{SECRET}/x@127.0.0.1:5432/db",
    f"postgresql://u:{SECRET}?x@127.0.0.1:5432/db",
    f"postgresql://u:{SECRET}#x@127.0.0.1:5432/db",
    f"postgresql://u:12/{SECRET}@host/db",
    f"postgres://u:{SECRET}@h1:5432,h2:x{SECRET}/db",
]

ACCEPTED = [
    "postgresql://postgres@127.0.0.1:5432/test",
    "postgresql://u:p%40ss%2Fw@127.0.0.1/db",
    "postgresql://h1:5432,h2:5433/db?target_session_attrs=read-write",
    "postgresql://[::1]:5432/db",
    "postgresql:///db?host=/run/postgresql",
    "postgresql://host/db?user=me@srv",
    "host=127.0.0.1 user=u",  # not a URL: asyncpg refuses it, quoting nothing
]


@pytest.mark.parametrize("dsn", REFUSED)
def test_a_dsn_asyncpg_would_misread_is_refused_quoting_nothing(dsn: str) -> None:
    with pytest.raises(ValueError, match="percent-encode") as caught:
        check_dsn(dsn)
    assert str(caught.value) == DSN_HINT
    assert caught.value.__cause__ is None
    assert SECRET not in target(dsn)


@pytest.mark.parametrize("dsn", ACCEPTED)
def test_a_dsn_asyncpg_reads_as_meant_is_accepted(dsn: str) -> None:
    check_dsn(dsn)


@pytest.mark.parametrize(
    ("dsn", "named"),
    [
        (f"postgresql://app:{SECRET}@db.internal:6432/orders", "app@db.internal:6432/orders"),
        ("postgresql://u:p%40ss@127.0.0.1/db", "u@127.0.0.1:5432/db"),
        ("postgresql://u@h1:5432,h2:5433/db", "u@h1:5432,h2:5433/db"),
        ("postgresql://u@[::1]:5432/db", "u@[::1]:5432/db"),
        ("postgresql://u@/db?host=/run/postgresql&port=5433", "u@/run/postgresql:5433/db"),
    ],
)  # fmt: skip
def test_target_names_user_host_port_and_database(dsn: str, named: str) -> None:
    assert target(dsn) == named


def test_target_without_a_dsn_reads_the_pg_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {
        "PGHOST": "pg.example",
        "PGPORT": "5999",
        "PGUSER": "ops",
        "PGDATABASE": "jobs",
        "PGPASSWORD": SECRET,
    }.items():
        monkeypatch.setenv(name, value)
    assert target() == "ops@pg.example:5999/jobs"


def test_printable_escapes_what_a_terminal_acts_on() -> None:
    hostile = "a\x1b[2J\tb\nc\r\x07\x7f\x9b\x85\u202e[/]é"
    assert printable(hostile) == "a\\x1b[2J\tb\\nc\\r\\x07\\x7f\\x9b\\x85\\u202e[/]é"
    assert printable("one\ntwo\x1b", newlines=True) == "one\ntwo\\x1b"


def test_print_json_is_exact_and_holds_no_control_character(
    capsys: pytest.CaptureFixture[str],
) -> None:
    value = {"k\x9b": ["v\x7f\x1b\u202e\n", "é", 1]}
    print_json(value)
    out = capsys.readouterr().out
    assert json.loads(out) == value
    assert out.endswith("}\n")
    assert not [c for c in out[:-1] if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0]
    assert "\u202e" not in out


def test_printable_formatter_keeps_one_line_per_message() -> None:
    formatter = PrintableFormatter("%(levelname)s %(message)s")
    record = logging.LogRecord(
        "app", logging.ERROR, __file__, 1, "got %s", ("x\nFAKE\x1b]0;t\x07",), None
    )
    try:
        raise ValueError("bad\x1b[2J")
    except ValueError as exc:
        record.exc_info = (type(exc), exc, exc.__traceback__)
    first, *rest = formatter.format(record).split("\n")
    assert first == "ERROR got x\\nFAKE\\x1b]0;t\\x07"
    assert rest[-1] == "ValueError: bad\\x1b[2J"
