"""Every ```python block of README.md runs, as is, against a real server.

Each block runs as a script in a subprocess (``-W error``) with
``PGQUEUE_DSN`` pointing at a fresh database that has the schema, and must
exit 0 (`tests.markdown_blocks`, which the documentation's blocks share).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.markdown_blocks import python_blocks, run_block

README = Path(__file__).resolve().parent.parent / "README.md"

BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def test_readme_has_python_blocks() -> None:
    # The front page: a first job, and one enqueued in a transaction (the
    # rest of the examples live in docs/, run by tests/test_docs.py).
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("code", BLOCKS)
async def test_readme_block_runs(code: str, fresh_dsn: str, tmp_path: Path) -> None:
    await run_block(code, fresh_dsn, tmp_path)


def test_readme_stays_a_front_page() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= 220, f"README.md has {lines} lines; move the detail into docs/"


def test_readme_links_resolve() -> None:
    """Every relative link of the front page names a file of the repository."""
    text = README.read_text(encoding="utf-8")
    targets = re.findall(r"\]\((?!https?://|#)([^)#]+)(?:#[^)]*)?\)", text)
    assert targets
    missing = [t for t in targets if not (README.parent / t).exists()]
    assert missing == []
