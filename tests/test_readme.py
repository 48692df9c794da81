"""Every ```python block of README.md runs, as is, against a real server.

Each block runs as a script in a subprocess (``-W error``) with
``PGQUEUE_DSN`` pointing at a fresh database that has the schema, and must
exit 0 (`tests.markdown_blocks`, which the documentation's blocks share).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.markdown_blocks import python_blocks, run_block

README = Path(__file__).resolve().parent.parent / "README.md"

BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def test_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("code", BLOCKS)
async def test_readme_block_runs(code: str, fresh_dsn: str, tmp_path: Path) -> None:
    await run_block(code, fresh_dsn, tmp_path)
