"""Every ```python block of README.md runs, as is, against a real server.

Each block runs as a script in a subprocess (``-W error``) with
``PGQUEUE_DSN`` pointing at a fresh database that has the schema, and must
exit 0.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest

if TYPE_CHECKING:
    from _pytest.mark.structures import ParameterSet

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)


def python_blocks(text: str) -> list[ParameterSet]:
    """One parameter per block, named after the heading above it."""
    blocks = []
    for index, block in enumerate(FENCE.finditer(text), start=1):
        headings = HEADING.findall(text, 0, block.start())
        title = headings[-1] if headings else "top"
        slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
        blocks.append(pytest.param(block[1], id=f"{index}-{slug}"))
    return blocks


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def test_readme_has_python_blocks() -> None:
    assert len(BLOCKS) >= 3


@pytest.mark.parametrize("code", BLOCKS)
async def test_readme_block_runs(code: str, fresh_dsn: str, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "PGQUEUE_DSN": fresh_dsn}
    with anyio.fail_after(30):
        result = await anyio.run_process(
            [sys.executable, "-W", "error", str(script)],
            env=env,
            cwd=tmp_path,
            check=False,
        )
    assert result.returncode == 0, (
        f"README block exited {result.returncode}:\n{code}\n"
        f"stdout:\n{result.stdout.decode()}\nstderr:\n{result.stderr.decode()}"
    )
