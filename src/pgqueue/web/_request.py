"""What every handler reads from a request: the mount's path, a job id of a path."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.exceptions import HTTPException

if TYPE_CHECKING:
    from starlette.requests import Request

__all__ = ["base_of", "job_id_of"]


def base_of(request: Request) -> str:
    """The mount's path: every link starts with it."""
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


def job_id_of(text: str) -> int:
    """A job id from a path; 404 for anything that cannot be one."""
    if not (text.isascii() and text.isdigit()) or len(text) > 19:
        raise HTTPException(404, f"no job has the id {text[:40]!r}")
    value = int(text)
    if not 0 < value < 2**63:
        raise HTTPException(404, f"no job has the id {value}")
    return value
