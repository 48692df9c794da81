"""Actions on many jobs from the listing: the rows selected, or every job its filter matches.

``/bulk/VERB`` (retry, cancel, delete, redrive, move) asks first (GET or
HEAD): the confirmation page states how many jobs the action changes (a dry
run of it, for a filter) and the filter or the ids, and its form carries a
token bound to them: the filter's terms (`pgqueue.web._where`) or the ids,
the count stated and the queue to move to. Only a POST with that token acts,
on at most the count stated; one whose filter, ids, count or queue differ
from the page's is refused (403) and changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, RedirectResponse, Response

from pgqueue._extension import check_queue_name
from pgqueue.web import _html
from pgqueue.web._html import Value
from pgqueue.web._request import base_of
from pgqueue.web._where import Where, parse_text, where_of

if TYPE_CHECKING:
    from collections.abc import Mapping

    from starlette.requests import Request

    from pgqueue import Admin
    from pgqueue.web._request import Dashboard

__all__ = ["MAX_SELECTED", "VERBS", "Bulk", "acted_message", "jobs_text"]

MAX_SELECTED = 500
"""The most rows one action takes by id (a listing's page holds fewer)."""

BOUND = ("filter", "ids", "limit", "to_queue")
"""The form's fields its token is bound to."""

COUNT_SHOWN = 10_000
"""The most matches ``/api/count`` counts exactly."""

FORM_BYTES = 32_768
"""The largest action form accepted: the filter's terms, or the ids, and a token."""


@dataclass(frozen=True, slots=True)
class Verb:
    """One action on many jobs: its name, its words, what it changes."""

    name: str
    label: str
    explanation: str
    done: str
    changed: frozenset[str] = frozenset()
    """The per-id answers that count as changed."""
    by_id: bool = False
    """Whether it also acts on rows by id (`pgqueue.Admin` has ``VERB(*ids)``)."""
    to_queue: bool = False
    queue_required: bool = False
    danger: bool = False


VERBS = {
    verb.name: verb
    for verb in (
        Verb(
            "retry",
            "Retry",
            "Only dead and cancelled jobs are retried: each goes back to pending, "
            "due now, with as many more attempts as its max attempts.",
            "Retried",
            changed=frozenset({"retried"}),
            by_id=True,
        ),
        Verb(
            "cancel",
            "Cancel",
            "Pending and waiting jobs are cancelled at once; running ones are asked "
            "to stop (their workers cancel the handlers). Finished jobs are left.",
            "Cancelled",
            changed=frozenset({"cancelled", "requested"}),  # not a status: answers
            by_id=True,
            danger=True,
        ),
        Verb(
            "delete",
            "Delete",
            "The jobs' rows are deleted, for good. Running jobs are never deleted.",
            "Deleted",
            danger=True,
        ),
        Verb(
            "redrive",
            "Redrive",
            "Dead and cancelled jobs go back to pending, due now, into the queue "
            "given (else their own), in batches.",
            "Redrove",
            to_queue=True,
        ),
        Verb(
            "move",
            "Move",
            "Jobs that are not running move to the queue given; running ones stay.",
            "Moved",
            to_queue=True,
            queue_required=True,
        ),
    )
}


@dataclass(frozen=True, slots=True)
class Selection:
    """What an action acts on: every job of a filter, or rows by id."""

    where: Where | None = None
    ids: tuple[int, ...] = ()

    @property
    def ids_text(self) -> str:
        return ",".join(map(str, self.ids))


def _ids(values: list[str]) -> tuple[int, ...]:
    """Sorted distinct job ids from a form's values (one id each, or comma-separated)."""
    found: set[int] = set()
    for value in values:
        for text in value.split(","):
            text = text.strip()
            if not text:
                continue
            if not (text.isascii() and text.isdigit()) or len(text) > 19:
                raise HTTPException(400, "an id must be a job id")
            job_id = int(text)
            if not 0 < job_id < 2**63:
                raise HTTPException(400, "an id must be a job id")
            found.add(job_id)
            if len(found) > MAX_SELECTED:
                raise HTTPException(
                    400, f"select at most {MAX_SELECTED} jobs, or all that match"
                )
    return tuple(sorted(found))


def _by_id(verb: Verb, values: list[str]) -> tuple[int, ...]:
    """The selected rows' ids, for a verb that acts by id; 400 otherwise or for none."""
    if not verb.by_id:
        raise HTTPException(
            400,
            f"{verb.label} acts on the jobs a filter matches: check "
            "All ... matching (narrow the filter to the jobs you mean)",
        )
    ids = _ids(values)
    if not ids:
        raise HTTPException(400, "select some jobs, or all that match")
    return ids


def _to_queue(verb: Verb, text: str) -> str | None:
    if not verb.to_queue or not text:
        if verb.queue_required:
            raise HTTPException(400, "give the queue to move the jobs to")
        return None
    try:
        return check_queue_name(text)
    except ValueError as exc:
        raise HTTPException(400, str(exc)) from None


def acted_message(params: Mapping[str, str]) -> str | None:
    """What a bulk action did, from the listing's ``?acted=VERB&changed=N``."""
    verb = VERBS.get(params.get("acted", ""))
    text = params.get("changed", "")
    if verb is None or not (text.isascii() and text.isdigit() and len(text) < 19):
        return None
    count = int(text)
    return f"{verb.done} {count:,} {'job' if count == 1 else 'jobs'}."


class Bulk:
    """The handler of ``/bulk/{verb}``: confirmation page (GET, HEAD), action (POST)."""

    def __init__(self, dashboard: Dashboard) -> None:
        self._dashboard = dashboard

    async def handle(self, request: Request) -> Response:
        verb = VERBS.get(request.path_params["verb"])
        if verb is None:
            raise HTTPException(404, "no such action")
        guard = self._dashboard.guard
        asks = guard.asks(request)
        action = f"/bulk/{verb.name}"
        if asks:
            return await self._ask(request, verb, action)
        form = await guard.form(request, action, BOUND, max_bytes=FORM_BYTES)
        return await self._act(request, verb, form)

    async def count(self, request: Request) -> Response:
        """``/api/count?where=...``: how many jobs the filter matches, for "All N matching".

        Asked by the listing's script when "All matching" is checked, not
        with every page: a filter no index serves is counted by a scan.
        Counted up to `COUNT_SHOWN` (and one more: ``10,000+``).
        """
        where = where_of(request.query_params)
        admin = await self._dashboard.reader()
        count = await admin.count(filter=where.filter, limit=COUNT_SHOWN + 1)
        more = count > COUNT_SHOWN
        shown = min(count, COUNT_SHOWN)
        return JSONResponse(
            {"count": shown, "more": more, "text": jobs_text(shown, more=more)},
            headers={"cache-control": "no-store"},
        )

    async def _ask(self, request: Request, verb: Verb, action: str) -> Response:
        params = request.query_params
        to_queue = _to_queue(verb, params.get("to_queue", "").strip())
        if params.get("all"):
            selection = Selection(where=where_of(params))
        else:
            selection = Selection(ids=_by_id(verb, params.getlist("id")))
        admin = await self._dashboard.admin()
        base = base_of(request)
        refused = None
        if selection.where is not None:
            try:
                count = await _run(
                    admin, verb, selection.where, None, to_queue, dry_run=True
                )
            except HTTPException as exc:  # a status the action never acts on
                count, refused = 0, exc.detail
        else:
            count = len(selection.ids)
        fields = {
            "filter": "" if selection.where is None else selection.where.text,
            "ids": selection.ids_text,
            "limit": str(count),
            "to_queue": to_queue or "",
        }
        back = _html.url(
            base,
            "/jobs",
            None if selection.where is None else selection.where.params,
        )
        return self._dashboard.page(
            request,
            "bulk.html",
            title=f"{verb.label} jobs",
            current="/jobs",
            verb=verb,
            count=count,
            terms=() if selection.where is None else selection.where.terms,
            ids=selection.ids,
            to_queue=to_queue,
            question=_question(verb, count, selection, to_queue),
            refused=refused,
            action_url=base + action,
            token=self._dashboard.guard.token(action, fields),
            fields={k: v for k, v in fields.items() if v},
            back_url=back,
        )

    async def _act(
        self, request: Request, verb: Verb, form: Mapping[str, str]
    ) -> Response:
        to_queue = _to_queue(verb, form.get("to_queue", ""))
        limit_text = form.get("limit", "")
        if not (limit_text.isascii() and limit_text.isdigit() and len(limit_text) < 19):
            raise HTTPException(400, "the form's count cannot be read")
        admin = await self._dashboard.admin()
        where: Where | None = None
        if form.get("filter"):
            where = parse_text(form["filter"])
            changed = await _run(admin, verb, where, int(limit_text), to_queue)
        else:
            ids = _by_id(verb, [form.get("ids", "")])
            done = await getattr(admin, verb.name)(*ids)
            changed = sum(1 for answer in done.values() if answer in verb.changed)
        params: dict[str, Any] = {} if where is None else where.params
        target = _html.url(
            base_of(request),
            "/jobs",
            {**params, "acted": verb.name, "changed": changed},
        )
        return RedirectResponse(target, status_code=303)


def _question(
    verb: Verb, count: int, selection: Selection, to_queue: str | None
) -> list[str | Value]:
    noun = "job" if count == 1 else "jobs"
    if selection.where is None:
        question: list[str | Value] = [f"{verb.label} {count:,} selected {noun}"]
    elif selection.where.terms:
        question = [f"{verb.label} {count:,} {noun} matching the filter"]
    else:
        question = [f"{verb.label} {count:,} {noun}: every job, no filter"]
    if to_queue is not None:
        question += [" to queue ", Value(to_queue)]
    return [*question, "?"]


async def _run(
    admin: Admin,
    verb: Verb,
    where: Where,
    limit: int | None,
    to_queue: str | None,
    *,
    dry_run: bool = False,
) -> int:
    """``Admin.VERB(filter=...)``: the count it changed, or with ``dry_run``, would change."""
    options: dict[str, Any] = {"filter": where.filter, "dry_run": dry_run}
    if limit is not None:
        options["limit"] = limit
    if verb.to_queue:
        options["to_queue"] = to_queue
    try:
        changed: int = await getattr(admin, verb.name)(**options)
    except (TypeError, ValueError) as exc:  # a filter on jobs it never acts on
        raise HTTPException(400, str(exc)) from None
    return changed


def jobs_text(count: int, *, more: bool = False) -> str:
    """``1 job``, ``58 jobs``, ``10,000+ jobs``."""
    return (
        f"{count:,}{'+' if more else ''} {'job' if count == 1 and not more else 'jobs'}"
    )
