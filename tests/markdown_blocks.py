"""The ```python blocks of Markdown files, as test parameters, and how one runs.

Each block runs as a script in a subprocess (``-W error``) with
``PGQUEUE_DSN`` pointing at a database that has the schema, and must exit
0. A block that cannot run alone (a fragment, a file of another tool) is
marked in the Markdown by a MyST comment on the line right before its
fence, ``% no-run: <reason>``: its parameter is skipped with that reason
(and the block's id), so the run lists every block it did not run. Other
fences (``sh``, ``text``...) are not run here; `tests.test_docs` parses every
``pgqueue`` command line of the site's shell blocks with the real parser and
runs the read-only ones.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING

import anyio
import pytest

if TYPE_CHECKING:
    from pathlib import Path

    from _pytest.mark.structures import ParameterSet

__all__ = ["NO_RUN", "python_blocks", "run_block"]

FENCE = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)
NO_RUN = re.compile(r"^% no-run:(.*)$")
"""The marker of a block that is not run, and the reason it gives."""


def python_blocks(text: str, prefix: str = "") -> list[ParameterSet]:
    """One parameter per ```python block of ``text``, named after the heading above it.

    ``prefix`` starts each id (a file's name, when blocks of several files
    are parameters of one test).

    Raises:
        ValueError: a ``% no-run:`` marker gives no reason.
    """
    blocks = []
    for index, block in enumerate(FENCE.finditer(text), start=1):
        headings = HEADING.findall(text, 0, block.start())
        title = headings[-1] if headings else "top"
        slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
        block_id = f"{prefix}{index}-{slug}"
        before = text[: block.start()].rstrip("\n").rpartition("\n")[2]
        marks = []
        if (marker := NO_RUN.match(before)) is not None:
            reason = marker[1].strip()
            if not reason:
                msg = f"{block_id}: '% no-run:' needs a reason"
                raise ValueError(msg)
            marks.append(pytest.mark.skip(reason=f"no-run ({block_id}): {reason}"))
        blocks.append(pytest.param(block[1], id=block_id, marks=marks))
    return blocks


async def run_block(code: str, dsn: str, directory: Path) -> None:
    """Run ``code`` as a script in ``directory`` with ``PGQUEUE_DSN=dsn``; fail unless it exits 0.

    The script has 30 seconds.
    """
    script = directory / "snippet.py"
    script.write_text(code, encoding="utf-8")
    env = {**os.environ, "PGQUEUE_DSN": dsn}
    with anyio.fail_after(30):
        result = await anyio.run_process(
            [sys.executable, "-W", "error", str(script)],
            env=env,
            cwd=directory,
            check=False,
        )
    assert result.returncode == 0, (
        f"block exited {result.returncode}:\n{code}\n"
        f"stdout:\n{result.stdout.decode()}\nstderr:\n{result.stderr.decode()}"
    )
