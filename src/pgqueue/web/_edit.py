"""Edit a pending or waiting job from its page: payload, priority, run_at, group, max attempts.

``/jobs/ID/edit`` shows the form (GET or HEAD, which change nothing; its
token is bound to the job's edit) and a POST with the token saves the
fields that differ from the job's, through `pgqueue.Admin.update`, which
changes a job only while it is pending or waiting. A job claimed meanwhile
is refused (`pgqueue.JobStateError`), and the form says why, keeping what
was typed.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException

from pgqueue import JobNotFoundError, JobStateError, Status
from pgqueue.web._request import back_to_job, form_links, job_form

if TYPE_CHECKING:
    from collections.abc import Mapping

    from starlette.requests import Request
    from starlette.responses import Response

    from pgqueue import JobPreview
    from pgqueue.web._request import Dashboard

__all__ = ["EDITABLE", "Edit"]

EDITABLE = (Status.PENDING, Status.WAITING)
"""The statuses `pgqueue.Admin.update` changes a job in."""

PAYLOAD_CHARS = 65_536
"""The longest payload (JSON text) the form edits; a longer one is left as it is."""

FORM_BYTES = 9 * PAYLOAD_CHARS + 4096
"""The largest edit form accepted: the payload percent-encoded (up to 9 bytes a character), and the rest."""

_FIELDS = ("payload", "priority", "run_at", "group", "max_attempts")


def _canonical(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _moment_text(value: datetime) -> str:
    return value.astimezone(UTC).isoformat()


def _shown(job: JobPreview, editable_payload: bool) -> dict[str, str]:
    """The form's values for ``job``: what it holds now."""
    shown = {
        "priority": str(job.priority),
        "run_at": _moment_text(job.run_at),
        "group": "",  # a job's group is not read back: the box sets one
        "max_attempts": str(job.max_attempts),
    }
    if editable_payload:
        shown["payload"] = json.dumps(
            json.loads(job.payload), indent=2, ensure_ascii=False
        )
    return shown


def _changes(
    job: JobPreview, form: Mapping[str, str], editable_payload: bool
) -> dict[str, Any]:
    """The fields of ``form`` that differ from ``job``'s, as `pgqueue.Admin.update` takes them.

    Raises:
        ValueError: a field that cannot be read (its message names it).
    """
    changes: dict[str, Any] = {}
    if editable_payload and "payload" in form:
        try:
            payload = json.loads(form["payload"])
        except ValueError:
            msg = "the payload is not JSON"
            raise ValueError(msg) from None
        if _canonical(payload) != _canonical(json.loads(job.payload)):
            changes["payload"] = payload  # compared as JSON: 1 is not true
    for name in ("priority", "max_attempts"):
        text = form.get(name, "").strip()
        try:
            value = int(text)
        except ValueError:
            msg = f"{name} must be a whole number, not {text[:40]!r}"
            raise ValueError(msg) from None
        if value != getattr(job, name):
            changes[name] = value
    text = form.get("run_at", "").strip()
    try:
        run_at = datetime.fromisoformat(text)
    except ValueError:
        msg = f"run_at must be an ISO 8601 time (2026-12-05T10:00:00+00:00), not {text[:40]!r}"
        raise ValueError(msg) from None
    if run_at.tzinfo is None:
        run_at = run_at.replace(tzinfo=UTC)
    if run_at != job.run_at:
        changes["run_at"] = run_at
    group = form.get("group", "")
    if group:
        changes["group"] = group
    return changes


class Edit:
    """The handler of ``/jobs/{job_id}/edit``: the form (GET, HEAD), the update (POST)."""

    def __init__(self, dashboard: Dashboard) -> None:
        self._dashboard = dashboard

    async def handle(self, request: Request) -> Response:
        dashboard = self._dashboard
        job_id, action, form = await job_form(
            dashboard, request, "edit", max_bytes=FORM_BYTES
        )
        admin = await dashboard.admin()
        job = await admin.job_preview(job_id, max_chars=PAYLOAD_CHARS)
        if job is None:
            raise HTTPException(404, f"no job has the id {job_id}")
        editable_payload = dashboard.show_payloads and not job.payload_truncated
        values = _shown(job, editable_payload)
        if form is None:
            return self._form(request, job, action, values, editable_payload)
        try:
            changes = _changes(job, form, editable_payload)
            if changes:
                await admin.update(job_id, **changes)
        except JobNotFoundError:
            raise HTTPException(404, f"no job has the id {job_id}") from None
        except JobStateError as exc:
            refused, status_code = str(exc), 409
        except (TypeError, ValueError) as exc:
            refused, status_code = str(exc), 400
        else:
            return back_to_job(request, job_id, "updated" if changes else "unchanged")
        typed = {name: form.get(name, values.get(name, "")) for name in _FIELDS}
        if not editable_payload:
            typed.pop("payload")
        return self._form(
            request,
            job,
            action,
            typed,
            editable_payload,
            refused=refused,
            status_code=status_code,
        )

    def _form(
        self,
        request: Request,
        job: JobPreview,
        action: str,
        values: Mapping[str, str],
        editable_payload: bool,
        *,
        refused: str | None = None,
        status_code: int = 200,
    ) -> Response:
        dashboard = self._dashboard
        return dashboard.page(
            request,
            "edit.html",
            title=f"Edit job {job.id}",
            current="/jobs",
            job=job,
            # Refused, the form keeps what was typed, even for a job claimed meanwhile.
            editable=job.status in EDITABLE or refused is not None,
            editable_payload=editable_payload,
            show_payloads=dashboard.show_payloads,
            payload_chars=PAYLOAD_CHARS,
            values=values,
            refused=refused,
            status_code=status_code,
            **form_links(dashboard, request, action, job.id),
        )
