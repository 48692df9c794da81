"""A module that fails to import (``pgqueue worker`` must say so on one line)."""

from __future__ import annotations

raise RuntimeError("this module is broken on purpose")
