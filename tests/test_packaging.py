"""What ``import pgqueue`` brings in, and what the package declares."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def test_import_pgqueue_loads_no_extra() -> None:
    code = (
        "import sys, pgqueue\n"
        "extras = ('rich', 'prometheus_client', 'opentelemetry', 'pgqueue.cli',"
        " 'pgqueue.prometheus', 'pgqueue.otel', 'pytest', 'testcontainers',"
        " 'pgqueue.web', 'starlette', 'uvicorn', 'pgqueue.sync', 'psycopg',"
        " 'pgqueue.sqlalchemy', 'sqlalchemy', 'django', 'pgqueue.django')\n"
        "print(sorted(m for m in sys.modules if m.startswith(extras)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()
    assert loaded == "[]"


def test_the_core_needs_only_asyncpg_and_anyio_and_extras_name_the_new_distribution() -> (
    None
):
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    assert project["name"] == "pgqueue-asyncio"
    assert sorted(d.split(">")[0] for d in project["dependencies"]) == [
        "anyio",
        "asyncpg",
    ]
    assert project["scripts"] == {"pgqueue": "pgqueue.cli:main"}
    for extra, requirements in project["optional-dependencies"].items():
        for requirement in requirements:
            name = requirement.split("[")[0].split(">")[0].split(";")[0].strip()
            # pip would fetch the unrelated project that owns the old name.
            assert name != "pgqueue", (extra, requirement)
