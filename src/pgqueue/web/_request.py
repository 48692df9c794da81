"""What every handler needs: the mount's path, a job id of a path, the dashboard it serves."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from starlette.exceptions import HTTPException

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import HTMLResponse

    from pgqueue import Admin
    from pgqueue.web._guard import ActionGuard

__all__ = ["Dashboard", "base_of", "job_id_of"]


class Dashboard(Protocol):
    """What a handler of its own module uses of the app's dashboard (`pgqueue.web._app`)."""

    guard: ActionGuard
    show_payloads: bool

    async def admin(self) -> Admin:
        """An Admin on the main pool: actions."""

    async def reader(self) -> Admin:
        """An Admin on the read pool: listings and counts."""

    def page(
        self,
        request: Request,
        template: str,
        *,
        title: str,
        current: str = "",
        status_code: int = 200,
        script: bool = False,
        **context: Any,
    ) -> HTMLResponse:
        """A whole page: ``template`` with ``context``."""


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
