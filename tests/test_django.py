"""pgqueue.django, proven in a Python 3.12+ virtualenv with Django 6 on the real server.

Django 6 needs Python 3.12, the main suite runs on 3.11: this test makes
(once, then reuses) ``.venv-django/`` with ``pip install -e '.[django]'``
and pytest, and runs ``tests/django_suite/`` there against a new, empty
database of the server under test (the example project in
``examples/django_project/`` migrates it). The virtualenv is rebuilt when
``pyproject.toml`` or the interpreter changes. Skipped, loudly, only when
no Python 3.12 or newer is found: ``PGQUEUE_TEST_PYTHON312``, then
``python3.13``/``python3.12`` on PATH, then pyenv's versions.
"""

from __future__ import annotations

import ast
import asyncio
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest

from pgqueue.testing import with_database

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-django"
SUITE = ROOT / "tests" / "django_suite"
REQUIREMENTS = ["-e", f"{ROOT}[django]", "pytest>=8.3", "pytest-timeout>=2.3"]


def _is_312(python: str) -> bool:
    check = "import sys; sys.exit(sys.version_info < (3, 12))"
    try:
        return (
            subprocess.run([python, "-c", check], timeout=30, check=False).returncode
            == 0
        )
    except OSError:
        return False


def find_python312() -> str | None:
    """A Python 3.12 or newer, or None."""
    candidates = [os.environ.get("PGQUEUE_TEST_PYTHON312", "")]
    candidates += [shutil.which(name) or "" for name in ("python3.13", "python3.12")]
    pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(
        glob.glob(f"{pyenv_root}/versions/3.1[2-9]*/bin/python"), reverse=True
    )
    return next((c for c in candidates if c and _is_312(c)), None)


def django_venv(python: str) -> Path:
    """``.venv-django/``'s interpreter, the virtualenv made or remade as needed."""
    stamp = hashlib.sha256(
        f"{python}\n{REQUIREMENTS}\n".encode() + (ROOT / "pyproject.toml").read_bytes()
    ).hexdigest()
    marker = VENV / "pgqueue-stamp"
    interpreter = VENV / "bin" / "python"
    if marker.exists() and marker.read_text() == stamp and interpreter.exists():
        return interpreter
    shutil.rmtree(VENV, ignore_errors=True)
    subprocess.run([python, "-m", "venv", str(VENV)], check=True, timeout=120)
    subprocess.run(
        [str(interpreter), "-m", "pip", "install", "--quiet", *REQUIREMENTS],
        check=True,
        timeout=600,
    )
    marker.write_text(stamp)
    return interpreter


@pytest.fixture
def empty_database(admin_dsn: str):
    """The DSN of a new database without pgqueue's schema, dropped afterwards."""
    name = f"pgqueue_django_{os.getpid()}_{uuid.uuid4().hex[:8]}"

    async def run(statement: str) -> None:
        connection = await asyncpg.connect(admin_dsn)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()

    asyncio.run(run(f'CREATE DATABASE "{name}"'))
    try:
        yield with_database(admin_dsn, name)
    finally:
        asyncio.run(run(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.mark.slow
def test_the_django_suite_passes_in_a_python_312_virtualenv(
    empty_database: str,
) -> None:
    python = find_python312()
    if python is None:
        pytest.skip(
            "NO PYTHON 3.12+ FOUND: pgqueue.django (Django 6) is untested here; "
            "set PGQUEUE_TEST_PYTHON312 to an interpreter"
        )
    interpreter = django_venv(python)
    env = {**os.environ, "PGQUEUE_DSN": empty_database, "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    suite = subprocess.run(
        [str(interpreter), "-m", "pytest", "-c", str(SUITE / "pytest.ini"), str(SUITE)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert suite.returncode == 0, f"{suite.stdout}\n{suite.stderr}"
    sys.stdout.write(
        suite.stdout.splitlines()[-1] + "\n"
    )  # the suite's summary, with -s


def test_the_reference_lists_every_public_name() -> None:
    # Read without importing: Django 6 is not installable on this Python.
    tree = ast.parse((ROOT / "src" / "pgqueue" / "django" / "__init__.py").read_text())
    names = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and getattr(node.targets[0], "id", "") == "__all__"
    )
    page = (ROOT / "docs" / "reference" / "django.md").read_text()
    documented = set(re.findall(r"^\.\. py:(?!module)\w+:: (\w+)", page, re.MULTILINE))
    assert documented == set(names)
