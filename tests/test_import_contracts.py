"""The import contracts of ``pyproject.toml`` hold, and an import against them breaks them.

``lint-imports`` (import-linter, in the dev extra) runs on the real tree,
then on copies of the package, each with one import added where the layers
forbid it (skipped where import-linter is not installed). And what the
contracts say of the extras holds in a running interpreter too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LINT_IMPORTS = shutil.which(
    "lint-imports",
    path=os.pathsep.join(
        [str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    ),
)

needs_lint_imports = pytest.mark.skipif(
    LINT_IMPORTS is None, reason="import-linter is not installed (the dev extra)"
)


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the package under ``root/src``, with ``root/pyproject.toml``."""
    assert LINT_IMPORTS is not None
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", "--no-logo"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root / "src")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def broken_contracts(output: str) -> str:
    """The part of ``lint-imports``'s report that lists the broken contracts."""
    _, found, broken = output.partition("Broken contracts")
    assert found, output
    return broken


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the package and of ``pyproject.toml``, to break."""
    shutil.copytree(
        ROOT / "src" / "pgqueue",
        tmp_path / "src" / "pgqueue",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


@needs_lint_imports
def test_the_contracts_hold_on_the_real_tree() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 broken" in result.stdout


@needs_lint_imports
def test_a_copy_of_the_tree_holds_them_too(tree: Path) -> None:
    result = lint_imports(tree)
    assert result.returncode == 0, result.stdout + result.stderr


UPWARD_IMPORTS = [
    # The statements importing the dashboard; the lifecycle, the lowest
    # floor, importing the job.
    ("_sql/claims.py", "import pgqueue.web", "Layers"),
    # A floor importing the worker's engine: the circle checks -> typed ->
    # runner -> checks that Handler and the codec moved out of.
    ("_core/typed.py", "from pgqueue._engine.runner import JobRunner", "Layers"),
    ("_core/codec.py", "from pgqueue._core.typed import payload_type", "No circle"),
    ("_core/lifecycle.py", "from pgqueue._core.job import Job", "The floors"),
    # A statement of one concept importing the schema they make up; the
    # store importing the worker's connections, the engine the store's
    # statements' layer is below.
    ("_sql/tables.py", "from pgqueue._sql.schema import SCHEMA", "The statements"),
    ("_store/postgres.py", "from pgqueue._wire.dedicated import Mode", "Layers"),
    # The engine importing the worker it makes up; the wire, the engine.
    ("_engine/lanes.py", "from pgqueue._worker import Worker", "Layers"),
    ("_wire/listener.py", "from pgqueue._engine.ledger import Claims", "Layers"),
    (
        "_wire/dedicated.py",
        "from pgqueue._wire.connections import Connections",
        "The wire",
    ),
    (
        "web/_html.py",
        "from pgqueue.cli._common import printable",
        "never imports the CLI",
    ),
    (
        "prometheus.py",
        "from pgqueue._engine.claimer import Claimer",
        "never import the worker's engine",
    ),
    (
        "cli/top.py",
        "from pgqueue._sql.admin import DEAD_COUNT",
        "only through pgqueue._extension",
    ),
    ("otel.py", "import pgqueue.web", "Layers"),
]


@needs_lint_imports
@pytest.mark.parametrize(("module", "line", "contract"), UPWARD_IMPORTS)
def test_an_import_against_the_layers_breaks_a_contract(
    tree: Path, module: str, line: str, contract: str
) -> None:
    path = tree / "src" / "pgqueue" / module
    path.write_text(f"{path.read_text()}\n{line}\n")
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout
    broken = broken_contracts(result.stdout)
    assert contract in broken
    assert module.removesuffix(".py").rsplit("/", 1)[-1] in broken


@needs_lint_imports
@pytest.mark.parametrize(
    ("folder", "contract"),
    [("", "Layers"), ("_core", "The floors"), ("_wire", "The wire")],
)
def test_a_module_without_a_place_in_the_layers_breaks_them(
    tree: Path, folder: str, contract: str
) -> None:
    name = "_newcomer" if not folder else "newcomer"
    (tree / "src" / "pgqueue" / folder / f"{name}.py").write_text(
        '"""Not placed yet."""\n'
    )
    result = lint_imports(tree)
    assert result.returncode != 0, result.stdout
    broken = broken_contracts(result.stdout)
    assert contract in broken
    assert "newcomer" in broken


@pytest.mark.parametrize("extra", ["pgqueue.web", "pgqueue.prometheus", "pgqueue.otel"])
def test_an_extra_loads_neither_the_cli_nor_another_extra(extra: str) -> None:
    others = ("pgqueue.cli", "pgqueue.web", "pgqueue.prometheus", "pgqueue.otel")
    code = (
        f"import sys, {extra}\n"
        f"others = {tuple(m for m in others if m != extra)!r}\n"
        "print(sorted(m for m in sys.modules if m.startswith(others)))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    assert loaded == "[]"
