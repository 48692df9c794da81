"""Send a signal to a durable handler's job from its page (`pgqueue.Admin.signal`).

``/jobs/ID/signal`` shows the form (GET or HEAD, which change nothing; its
token is bound to the job's signal): the signal's name (the one the job
waits for, when it does) and its payload as JSON. A POST with the token
sends it. A job that has ended takes no signal: the form says so, and a
POST that finds the job ended stores nothing and says so on the job's page.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from starlette.exceptions import HTTPException

from pgqueue import JobNotFoundError
from pgqueue.web._request import back_to_job, form_links, job_form

if TYPE_CHECKING:
    from collections.abc import Mapping

    from starlette.requests import Request
    from starlette.responses import Response

    from pgqueue import JobSummary
    from pgqueue.web._request import Dashboard

__all__ = ["DONE", "SendSignal"]

PAYLOAD_BYTES = 65_536
"""The largest payload a signal carries (bytes of JSON), as `pgqueue.Queue.signal` allows."""

FORM_BYTES = 9 * PAYLOAD_BYTES + 4096
"""The largest form accepted: the payload percent-encoded (up to 9 bytes a character), and the rest."""

DONE = {
    "signalled": "Signal sent: the job's wait for it returns its payload.",
    "not_signalled": "Signal not sent: the job had ended.",
}
"""What a signal did, as the job's page says it (``?done=``)."""


class SendSignal:
    """The handler of ``/jobs/{job_id}/signal``: the form (GET, HEAD), the signal (POST)."""

    def __init__(self, dashboard: Dashboard) -> None:
        self._dashboard = dashboard

    async def handle(self, request: Request) -> Response:
        dashboard = self._dashboard
        job_id, action, form = await job_form(
            dashboard, request, "signal", max_bytes=FORM_BYTES
        )
        admin = await dashboard.admin()
        job = await admin.job_summary(job_id)
        if job is None:
            raise HTTPException(404, f"no job has the id {job_id}")
        if form is None:
            awaited = await admin.job_preview(job_id, max_chars=1)
            wait = None if awaited is None else awaited.wait
            name = "" if wait is None or wait.signal is None else wait.signal
            return self._form(request, job, action, {"name": name, "payload": "null"})
        name, text = form.get("name", ""), form.get("payload", "").strip() or "null"
        try:
            payload = json.loads(text)
        except ValueError:
            refused = "the payload is not JSON"
        else:
            try:
                sent = await admin.signal(job_id, name, payload)
            except JobNotFoundError:
                raise HTTPException(404, f"no job has the id {job_id}") from None
            except (TypeError, ValueError) as exc:
                refused = str(exc)
            else:
                done = "signalled" if sent else "not_signalled"
                return back_to_job(request, job_id, done)
        typed = {"name": name, "payload": form.get("payload", "")}
        return self._form(request, job, action, typed, refused=refused, status_code=400)

    def _form(
        self,
        request: Request,
        job: JobSummary,
        action: str,
        values: Mapping[str, str],
        *,
        refused: str | None = None,
        status_code: int = 200,
    ) -> Response:
        dashboard = self._dashboard
        return dashboard.page(
            request,
            "signal.html",
            title=f"Send a signal to job {job.id}",
            current="/jobs",
            job=job,
            values=values,
            refused=refused,
            status_code=status_code,
            **form_links(dashboard, request, action, job.id),
        )
