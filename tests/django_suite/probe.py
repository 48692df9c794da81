"""A module outside the suite's task modules: importing it leaves a mark, which no worker may do."""

from __future__ import annotations

import os
from pathlib import Path

Path(os.environ["PGQUEUE_PROBE_MARK"]).touch()


def run() -> None:
    """What a forged job names."""
