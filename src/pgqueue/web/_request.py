"""What every handler needs: the mount's path, a job id of a path, the dashboard it serves, a job's form."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypedDict

from starlette.exceptions import HTTPException
from starlette.responses import RedirectResponse

if TYPE_CHECKING:
    from collections.abc import Mapping

    from starlette.requests import Request
    from starlette.responses import HTMLResponse

    from pgqueue import Admin
    from pgqueue.web._guard import ActionGuard

__all__ = [
    "Dashboard",
    "FormLinks",
    "JobForm",
    "back_to_job",
    "base_of",
    "form_links",
    "job_form",
    "job_id_of",
]


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


class JobForm(NamedTuple):
    """What a request to a job's form (``/jobs/ID/VERB``) asks."""

    job_id: int
    action: str  # the form's path below the mount: its token is bound to it
    posted: (
        Mapping[str, str] | None
    )  # the POSTed fields, token checked; None for GET or HEAD


async def job_form(
    dashboard: Dashboard, request: Request, verb: str, *, max_bytes: int
) -> JobForm:
    """The job, path and POSTed fields of ``request`` to ``/jobs/ID/{verb}``.

    Raises:
        HTTPException: 403 when read-only, 405 for a method other than GET,
            HEAD or POST, 404 for a path that holds no job id, and as
            `pgqueue.web._guard.ActionGuard.form` for a POST.
    """
    asks = dashboard.guard.asks(request)
    job_id = job_id_of(request.path_params["job_id"])
    action = f"/jobs/{job_id}/{verb}"
    if asks:
        return JobForm(job_id, action, None)
    form = await dashboard.guard.form(request, action, max_bytes=max_bytes)
    return JobForm(job_id, action, form)


class FormLinks(TypedDict):
    """A job's form page's links (`form_links`)."""

    action_url: str
    token: str
    back_url: str


def form_links(
    dashboard: Dashboard, request: Request, action: str, job_id: int
) -> FormLinks:
    """A job's form page's links: where it posts, its token, and back to the job."""
    base = base_of(request)
    return {
        "action_url": base + action,
        "token": dashboard.guard.token(action),
        "back_url": f"{base}/jobs/{job_id}",
    }


def back_to_job(request: Request, job_id: int, done: str) -> RedirectResponse:
    """Back to job ``job_id``'s page after a POST, saying what was ``done`` (``?done=``)."""
    return RedirectResponse(
        f"{base_of(request)}/jobs/{job_id}?done={done}", status_code=303
    )
