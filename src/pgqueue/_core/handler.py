"""The types of a job's handler, shared by the worker, job types and the extras."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from pgqueue._core.job import Job

__all__ = ["Handler", "SyncHandler"]

Handler: TypeAlias = Callable[[Job], Awaitable[Any]]
"""Runs one job; returning completes it (a value other than None is stored as
its result), raising fails the attempt."""

SyncHandler: TypeAlias = Callable[[Job], Any]
"""A handler that is a plain ``def`` (or any callable that is not async): it
runs in a worker thread."""
