"""``python -m pgqueue``: the command line (needs the ``cli`` extra)."""

from __future__ import annotations

import sys

from pgqueue.cli import main

sys.exit(main())
