"""The dashboard's ASGI application: routes, input checks, pages, actions.

Every read and action goes through `pgqueue.Admin` (and the frames of
`pgqueue._dashboard`, shared with ``pgqueue top``); this module only checks
input, renders pages (templates, through `pgqueue.web._html`) and wires in
the guards of `pgqueue.web._guard` (allowed hosts, security headers, action
tokens).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
from collections import OrderedDict
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from pgqueue import Admin, JobSummary, SchemaError, Status
from pgqueue._extension import (
    DATABASE_ERRORS,
    JOB_STATUSES,
    PREVIEW_CHARS,
    SCHEMA_ERRORS,
    Frame,
    PeriodicKey,
    Sampler,
    check_dsn_or_pool,
    check_duration,
    check_int,
    check_name,
    check_queue_name,
    check_schema,
    describe,
)
from pgqueue.web import _html
from pgqueue.web._bulk import VERBS, Bulk, acted_message, jobs_text
from pgqueue.web._edit import EDITABLE, Edit
from pgqueue.web._guard import (
    ActionGuard,
    GuardedStarlette,
    HostGuard,
    check_allowed_hosts,
)
from pgqueue.web._html import Value
from pgqueue.web._request import back_to_job, base_of, job_id_of
from pgqueue.web._signal import DONE as SIGNAL_DONE
from pgqueue.web._signal import SendSignal
from pgqueue.web._trend import graph_of, trend_context
from pgqueue.web._where import where_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence

    from starlette.applications import Starlette
    from starlette.requests import Request

__all__ = ["create_app"]

FRAME_EVERY = 1.0
"""Seconds: polls of the queues page closer together than this share one frame."""

FILTERS_KEPT = 16
"""How many filters of the queues page keep their frames (and rates); the least recent goes."""

_ASSETS = ("pgqueue.css", "pgqueue.js")
_TYPES = {"css": "text/css; charset=utf-8", "js": "text/javascript; charset=utf-8"}

_DONE = {
    "retried": "Retried: the job is pending again, due now.",
    "duplicate": "Not retried: another job with its unique key is pending or running.",
    "not_retryable": "Not retried: only dead and cancelled jobs can be retried.",
    "cancelled": "Cancelled.",  # not a status: a cancel's result
    "requested": "Cancel requested: its worker cancels the handler.",
    "finished": "Not cancelled: the job had finished already.",
    "updated": "Saved: the job holds the new values.",
    "unchanged": "Nothing to save: no field differed from the job's.",
    **SIGNAL_DONE,
}
"""What an action did, as the page it redirects to says it (``?done=``)."""

_FAILURES: tuple[type[Exception], ...] = (asyncpg.PostgresError, *DATABASE_ERRORS)

logger = logging.getLogger("pgqueue.web")

_UNREACHABLE = (
    "The database cannot be reached, or refused the dashboard's query. "
    "The server's log says why."
)


def create_app(
    dsn_or_pool: str | asyncpg.Pool[Any],
    *,
    read: str | asyncpg.Pool[Any] | None = None,
    read_only: bool = True,
    show_payloads: bool = True,
    secret: str | bytes | None = None,
    poll_interval: float = 2.0,
    page_size: int = 50,
    trusted_origins: Sequence[str] = (),
    allowed_hosts: Sequence[str] | None = None,
) -> Starlette:
    """Make the dashboard: an ASGI app (Starlette) to mount under a path of yours.

    Pages: ``/`` (queues, live), ``/jobs`` (filters, ``?where=TERM`` as
    `pgqueue.JobFilter.parse` reads it, keyset pages), ``/jobs/ID`` (with
    its workflow drawn), ``/periodic``, ``/trend`` (charts of the attempts
    over the last hour or day: every queue, ``?queue=``, ``&type=``). It
    has no authentication of its own: mount
    it behind yours. The queues page (and its fragment and ``/api/frame``)
    shows the 50 queues with the most jobs to do, says how many more there
    are, and takes ``?queue=TEXT`` for those whose name holds ``TEXT``.
    Names are shown cut at 200 characters.

    Args:
        dsn_or_pool: an asyncpg pool (borrowed, never closed), or a DSN: the
            app then opens a small pool of its own at its first request and
            closes it when its lifespan ends (an app mounted in another
            gets no lifespan of its own: pass a pool there).
        read: where the pages read their listings and counts instead (a
            standby, so that a busy dashboard does not load the primary): a
            pool or a DSN, as ``dsn_or_pool``. Actions (and the confirmation
            page of one, which reads the job acted on) still go to
            ``dsn_or_pool``. None reads from ``dsn_or_pool``.
        read_only: show no action buttons, and refuse every action with 403.
            With False, a dead or cancelled job can be retried (its attempts
            are kept and ``max_attempts`` raised, as `pgqueue.Admin.retry` does),
            every dead job of a listing retried, a pending or running job
            cancelled, a queue paused or resumed (`pgqueue.Admin.pause`),
            a listing's selected rows or all its matches retried,
            cancelled, deleted, redriven or moved (``/bulk/VERB``), a
            pending or waiting job edited (`pgqueue.Admin.update`), a
            signal sent to a job that has not ended
            (`pgqueue.Admin.signal`); each
            asks for confirmation (GET or HEAD, which change nothing) and
            only a POST acts, carrying the confirmation page's token (a
            bulk action's bound to its filter, ids, count and queue), from
            the same origin (scheme, host and port) or a trusted one.
        show_payloads: False hides jobs' payloads, results and checkpoints
            (personal data): on a job's page, and in the live frames
            (``/api/frame``), which then read no checkpoint at all.
        secret: the key of the actions' CSRF tokens, at least 16 bytes; give
            the same one to every process serving the dashboard behind one
            address. By default a random one of this app. A token is good
            for one action (its job, or its listing's filters) for an hour.
        poll_interval: seconds between the queues page's refreshes.
        page_size: jobs per page of a listing.
        trusted_origins: origins (``scheme://host[:port]``) whose pages may
            also send actions, for a proxy that rewrites the ``Host``
            header: a POST whose ``Origin`` differs from its ``Host`` is
            refused unless its origin is one of these. The token is still
            required.
        allowed_hosts: the ``Host`` headers answered (others get 400, against
            DNS rebinding): names or addresses, each with a port or for
            any port, as ``["ops.example.com", "10.0.0.5:8080"]``. None:
            this machine's names only (``127.0.0.1``, ``localhost``,
            ``[::1]``); mounted in a service, pass its names. ``["*"]``
            answers any host (say, behind a proxy that checks it) and logs
            a warning.

    Raises:
        TypeError, ValueError: a bad argument (nothing is connected).

    .. versionadded:: 0.1

    .. versionchanged:: 0.1
       ``allowed_hosts`` (loopback names by default); tokens bound to their
       action and an hour; ``secret`` of at least 16 bytes; only a POST acts.
       ``read``: listings and counts from a standby. ``/jobs?where=``,
       bulk actions and a job's Edit form. A job's Send signal form.
    """
    _check_source(dsn_or_pool)
    if read is not None:
        _check_source(read)
    interval = check_duration("poll_interval", poll_interval, positive=True)
    check_int("page_size", page_size)
    hosts = check_allowed_hosts(allowed_hosts)
    guard = ActionGuard(
        read_only=bool(read_only), secret=secret, trusted_origins=trusted_origins
    )
    dashboard = _Dashboard(
        _Source(dsn_or_pool),
        None if read is None else _Source(read),
        show_payloads=bool(show_payloads),
        guard=guard,
        poll_interval=interval,
        page_size=page_size,
    )
    bulk = Bulk(dashboard)
    routes = [
        Route("/", dashboard.queues),
        Route("/fragments/queues", dashboard.queues_fragment),
        Route("/api/frame", dashboard.frame_json),
        Route("/jobs", dashboard.jobs),
        Route("/jobs/{job_id}", dashboard.job),
        Route("/jobs/{job_id}/retry", dashboard.retry, methods=["GET", "POST"]),
        Route("/jobs/{job_id}/cancel", dashboard.cancel, methods=["GET", "POST"]),
        Route("/jobs/{job_id}/edit", Edit(dashboard).handle, methods=["GET", "POST"]),
        Route(
            "/jobs/{job_id}/signal",
            SendSignal(dashboard).handle,
            methods=["GET", "POST"],
        ),
        Route("/retry-all", dashboard.retry_all, methods=["GET", "POST"]),
        Route("/bulk/{verb}", bulk.handle, methods=["GET", "POST"]),
        Route("/api/count", bulk.count),
        Route("/pause", dashboard.pause, methods=["GET", "POST"]),
        Route("/resume", dashboard.resume, methods=["GET", "POST"]),
        Route("/periodic", dashboard.periodic),
        Route("/trend", dashboard.trend),
        Route("/static/{name}", dashboard.static),
    ]
    return GuardedStarlette(
        routes=routes,
        middleware=[Middleware(HostGuard, hosts=hosts)],
        lifespan=dashboard.lifespan,
        exception_handlers={
            HTTPException: dashboard.http_error,
            SchemaError: dashboard.unavailable,
            **dict.fromkeys(_FAILURES, dashboard.unavailable),
        },
    )


def _acted(request: Request, job_id: int, done: str) -> Response:
    """Back to the job after an action on it, saying what was done; 404 if it is gone."""
    if done == "not_found":
        raise HTTPException(404, f"no job has the id {job_id}")
    return back_to_job(request, job_id, done)


def _check_source(value: object) -> None:
    check_dsn_or_pool(value)
    if isinstance(value, str):
        check_name("dsn", value)


def _optional(params: Mapping[str, str], name: str) -> str | None:
    value = params.get(name, "")
    return value or None


def _cursor(params: Mapping[str, str], name: str) -> int | None:
    """A listing's ``before`` or ``after``: a job id, or None; 400 otherwise."""
    text = _optional(params, name)
    if text is None:
        return None
    try:
        return job_id_of(text)
    except HTTPException:
        raise HTTPException(400, f"{name} must be a job id") from None


class _Source:
    """A pool given, or one opened from a DSN at first use and closed with the app."""

    def __init__(self, source: str | asyncpg.Pool[Any]) -> None:
        self._dsn = source if isinstance(source, str) else None
        self._pool = None if isinstance(source, str) else source
        self._owned: asyncpg.Pool[Any] | None = None
        self._opening = anyio.Lock()

    async def pool(self) -> asyncpg.Pool[Any]:
        """The pool: the one given, or the app's own (opened at first use)."""
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._pool is None:
                self._owned = self._pool = await asyncpg.create_pool(
                    self._dsn, min_size=1, max_size=4
                )
        return self._pool

    async def aclose(self) -> None:
        """Close the pool this opened (a borrowed pool is left open)."""
        owned, self._owned = self._owned, None
        if owned is not None:
            self._pool = None
            await owned.close()


@dataclass(slots=True)
class _Live:
    """The frames of one filter of the queues page: their sampler and the latest."""

    sampler: Sampler | None = None
    frame: Frame | None = None
    framed_at: float = -math.inf


class _Dashboard:
    """One app's state and handlers: its pools, its frames, its action guard."""

    def __init__(
        self,
        source: _Source,
        reads: _Source | None,
        *,
        show_payloads: bool,
        guard: ActionGuard,
        poll_interval: float,
        page_size: int,
    ) -> None:
        self._source = source
        self._reads = reads or source
        self.read_only = guard.read_only
        self.show_payloads = show_payloads
        self.guard = self._guard = guard
        self._interval = poll_interval
        self._page_size = page_size
        self._framing = anyio.Lock()
        self._live: OrderedDict[str | None, _Live] = OrderedDict()
        self._assets: dict[str, bytes] = {}
        self._versions: dict[str, str] = {}
        folder = resources.files("pgqueue.web") / "static"
        for name in _ASSETS:
            data = (folder / name).read_bytes()
            self._assets[name] = data
            self._versions[name] = hashlib.sha256(data).hexdigest()[:12]

    # --- plumbing ----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: Starlette) -> AsyncIterator[None]:
        """Close the pools the app opened (a borrowed pool is left open)."""
        try:
            yield
        finally:
            try:
                await self._reads.aclose()
            finally:
                await self._source.aclose()

    async def pool(self) -> asyncpg.Pool[Any]:
        """The pool the pages read from (the read pool, else the main one)."""
        return await self._reads.pool()

    async def reader(self) -> Admin:
        """An Admin on the read pool: listings and counts."""
        return Admin(await self._reads.pool())

    async def admin(self) -> Admin:
        """An Admin on the main pool: actions."""
        return Admin(await self._source.pool())

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
        """A whole page: ``template`` (which extends base.html) with ``context``."""
        html = _html.render(
            template,
            base=base_of(request),
            title=title,
            current=current,
            read_only=self.read_only,
            assets=self._versions,
            script=script,
            **context,
        )
        return HTMLResponse(
            html, status_code=status_code, headers={"cache-control": "no-store"}
        )

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        titles = {
            400: "Bad request",
            403: "Forbidden",
            404: "Not found",
            405: "Method not allowed",
        }
        title = titles.get(exc.status_code, "Error")
        response = self.page(
            request,
            "error.html",
            title=title,
            detail=exc.detail,
            status_code=exc.status_code,
        )
        response.headers.update(exc.headers or {})  # a 405's Allow
        return response

    async def unavailable(self, request: Request, exc: Exception) -> Response:
        """A missing schema or an unreachable database: 503, the detail in the log.

        Viewers see no host, port or database name, only what to do.
        """
        logger.warning(
            "dashboard: %s %s: database unavailable: %s",
            request.method,
            request.url.path,
            describe(exc),
        )
        detail = exc.summary if isinstance(exc, SchemaError) else _UNREACHABLE
        return self.page(
            request,
            "error.html",
            title="Database unavailable",
            detail=detail,
            status_code=503,
        )

    async def static(self, request: Request) -> Response:
        name = request.path_params["name"]
        data = self._assets.get(name)
        if data is None:
            raise HTTPException(404, "no such file")
        return Response(
            data,
            media_type=_TYPES[name.rpartition(".")[2]],
            headers={"cache-control": "public, max-age=86400"},
        )

    # --- the queues --------------------------------------------------------------------

    async def frame(self, contains: str | None) -> Frame:
        """The latest frame of the queues whose name holds ``contains`` (any, with None).

        Read again unless one was read under `FRAME_EVERY` ago: frames are
        read one at a time (the rates come from their differences), and
        every open page of one filter shares them. The `FILTERS_KEPT` most
        recent filters keep theirs.
        """
        async with self._framing:
            live = self._live.pop(contains, None) or _Live()
            self._live[contains] = live
            while len(self._live) > FILTERS_KEPT:
                self._live.popitem(last=False)
            if (
                live.frame is not None
                and anyio.current_time() - live.framed_at < FRAME_EVERY
            ):
                return live.frame
            pool = await self.pool()
            try:
                async with pool.acquire() as conn:
                    if live.sampler is None:
                        live.sampler = Sampler(
                            conn, contains=contains, progress=self.show_payloads
                        )
                    else:
                        live.sampler.use(conn)
                    live.frame = await live.sampler.frame()
            except SCHEMA_ERRORS:
                await check_schema(pool)  # a SchemaError naming what is missing
                raise
            live.framed_at = anyio.current_time()
            return live.frame

    def _contains(self, request: Request) -> str | None:
        """The queues page's filter (``?queue=``); 400 for one no queue can match."""
        contains = _optional(request.query_params, "queue")
        if contains is not None:
            try:
                check_queue_name(contains)
            except ValueError as exc:
                raise HTTPException(400, str(exc)) from None
        return contains

    async def queues(self, request: Request) -> Response:
        contains = self._contains(request)
        frame = await self.frame(contains)
        return self.page(
            request,
            "queues.html",
            title="Queues",
            current="/",
            script=True,
            frame=frame,
            contains=contains,
            interval=self._interval,
            actions=not self.read_only,
        )

    async def queues_fragment(self, request: Request) -> Response:
        contains = self._contains(request)
        frame = await self.frame(contains)
        return HTMLResponse(
            _html.render(
                "live.html",
                base=base_of(request),
                frame=frame,
                contains=contains,
                actions=not self.read_only,
            ),
            headers={"cache-control": "no-store"},
        )

    async def frame_json(self, request: Request) -> Response:
        frame = await self.frame(self._contains(request))
        return JSONResponse(
            _json(frame.to_json()), headers={"cache-control": "no-store"}
        )

    # --- jobs --------------------------------------------------------------------------

    async def jobs(self, request: Request) -> Response:
        params = request.query_params
        queue, status, job_type = self._filters(params)
        where = where_of(params)
        before, after = _cursor(params, "before"), _cursor(params, "after")
        if before is not None and after is not None:
            raise HTTPException(400, "give before or after, not both")
        admin = await self.reader()
        size = self._page_size
        found = await admin.job_summaries(
            filter=where.filter,
            before_id=before,
            after_id=after,
            limit=size + 1,
        )
        more = len(found) > size  # one more row, past the page's far end
        if after is None:
            shown = found[:size]
            newer = shown[0].id if before is not None and shown else None
            older = shown[-1].id if more else None
        else:
            shown = found[-size:]
            newer = shown[0].id if more else None
            older = shown[-1].id if shown else None
        return self.page(
            request,
            "jobs.html",
            title="Jobs",
            current="/jobs",
            jobs=shown,
            statuses=JOB_STATUSES,
            queue=queue,
            status=status,
            job_type=job_type,
            first=before is None and after is None,
            newer=newer,
            older=older,
            actions=not self.read_only,
            script=not self.read_only,
            where=where,
            where_given=[term for term in params.getlist("where") if term.strip()],
            # Every match is on this page: "All N matching" needs no count.
            matching=(
                jobs_text(len(shown))
                if before is None and after is None and older is None
                else None
            ),
            verbs=VERBS.values(),
            message=_DONE.get(params.get("done", ""))
            or _retried_all(params)
            or acted_message(params),
        )

    def _filters(
        self, params: Mapping[str, str]
    ) -> tuple[str | None, str | None, str | None]:
        """Queue, status and type of a listing; 400 for one no job can have."""
        queue, status, job_type = (
            _optional(params, "queue"),
            _optional(params, "status"),
            _optional(params, "type"),
        )
        try:
            if queue is not None:
                check_queue_name(queue)
            if job_type is not None:
                check_name("type", job_type)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        if status is not None and status not in JOB_STATUSES:
            raise HTTPException(400, f"status must be one of {', '.join(JOB_STATUSES)}")
        return queue, status, job_type

    async def _job_or_404(self, text: str) -> tuple[Admin, JobSummary]:
        """The job of a path (no payload, result or whole error read); 404 if none."""
        admin = await self.admin()
        job_id = job_id_of(text)
        job = await admin.job_summary(job_id)
        if job is None:
            raise HTTPException(404, f"no job has the id {job_id}")
        return admin, job

    async def job(self, request: Request) -> Response:
        admin = await self.reader()
        job_id = job_id_of(request.path_params["job_id"])
        # Payload, result and error are cut in the database: a page of any
        # job stays small.
        job = await admin.job_preview(job_id, max_chars=PREVIEW_CHARS)
        if job is None:
            raise HTTPException(404, f"no job has the id {job_id}")
        # The first parents and children, through pgqueue_dependencies' indexes.
        dependencies = await admin.dependencies(job_id)
        schedule = tick = name = None
        key = PeriodicKey.parse(job.unique_key)
        if key is not None:
            name, tick = key
            with contextlib.suppress(SchemaError):
                schedule = next(
                    (s for s in await admin.schedules() if s.name == name), None
                )
        return self.page(
            request,
            "job.html",
            title=f"Job {job.id}",
            current="/jobs",
            job=job,
            dependencies=dependencies,
            graph=graph_of(job.id, job.status, dependencies),
            limit=PREVIEW_CHARS,
            schedule=schedule,
            schedule_name=name,
            tick=tick,
            show_payloads=self.show_payloads,
            actions=not self.read_only,
            editable=job.status in EDITABLE,
            # Send signal: a live job a durable handler has run (or parked).
            durable=job.status.live
            and bool(job.steps_total or job.signals_total or job.wait or job.progress),
            message=_DONE.get(request.query_params.get("done", "")),
        )

    async def trend(self, request: Request) -> Response:
        context = await trend_context(await self.reader(), request.query_params)
        return self.page(
            request, "trend.html", title="Trend", current="/trend", **context
        )

    async def periodic(self, request: Request) -> Response:
        admin = await self.reader()
        try:
            schedules = await admin.schedules()
        except SchemaError:
            schedules = []
        return self.page(
            request,
            "periodic.html",
            title="Periodic jobs",
            current="/periodic",
            schedules=schedules,
        )

    # --- actions -----------------------------------------------------------------------

    def _confirm(
        self,
        request: Request,
        title: str,
        *,
        action: str,
        token: str,
        question: Sequence[str | Value],
        explanation: str,
        verb: str,
        fields: Mapping[str, str],
        back: str,
        back_label: str,
        danger: bool = False,
    ) -> Response:
        return self.page(
            request,
            "confirm.html",
            title=title,
            current="/jobs",
            action_url=action,
            question=question,
            explanation=explanation,
            verb=verb,
            token=token,
            fields=fields,
            back_url=back,
            back_label=back_label,
            danger=danger,
        )

    async def retry(self, request: Request) -> Response:
        return await self._job_action(
            request,
            "Retry",
            lambda job: (
                f"It goes back to pending, due now, with {job.max_attempts} more "
                f"attempts: its attempts stay at {job.attempts} and its max attempts "
                f"become {job.attempts + job.max_attempts}."
            ),
            Admin.retry,
            back_label="Back to job",
        )

    async def cancel(self, request: Request) -> Response:
        return await self._job_action(
            request,
            "Cancel",
            lambda _: (
                "A pending job is cancelled at once; a running one is asked to "
                "stop: its worker cancels the handler and the job ends cancelled."
            ),
            Admin.cancel,
            back_label="Keep job",
            danger=True,
        )

    async def _job_action(
        self,
        request: Request,
        verb: str,
        explanation: Callable[[JobSummary], str],
        act: Callable[[Admin, int], Awaitable[dict[int, str]]],
        *,
        back_label: str,
        danger: bool = False,
    ) -> Response:
        """Ask to confirm ``verb`` on the path's job (GET), or do it (POST)."""
        asks = self._guard.asks(request)
        admin, job = await self._job_or_404(request.path_params["job_id"])
        base = base_of(request)
        action = f"/jobs/{job.id}/{verb.lower()}"
        if asks:
            return self._confirm(
                request,
                f"{verb} job {job.id}",
                action=base + action,
                token=self._guard.token(action),
                question=(
                    f"{verb} job {job.id} (",
                    Value(job.job_type),
                    f", {job.status})?",
                ),
                explanation=explanation(job),
                verb=verb,
                fields={},
                back=f"{base}/jobs/{job.id}",
                back_label=f"{back_label} {job.id}",
                danger=danger,
            )
        await self._guard.form(request, action)
        return _acted(request, job.id, (await act(admin, job.id))[job.id])

    async def retry_all(self, request: Request) -> Response:
        asks = self._guard.asks(request)
        action, bound = "/retry-all", ("queue", "type")
        params: Mapping[str, str] = (
            request.query_params
            if asks
            else await self._guard.form(request, action, bound)
        )
        queue, _, job_type = self._filters(params)
        base = base_of(request)
        filters = {"queue": queue, "status": Status.DEAD, "type": job_type}
        listing = _html.url(base, "/jobs", filters)
        admin = await self.admin()
        if asks:
            count = await admin.dead_count(queue=queue, job_type=job_type)
            question: list[str | Value] = [f"Retry all {count:,} dead jobs"]
            if queue:
                question += [" of queue ", Value(queue)]
            if job_type:
                question += [" and" if queue else "", " of type ", Value(job_type)]
            return self._confirm(
                request,
                "Retry all dead jobs",
                action=base + action,
                token=self._guard.token(
                    action, {"queue": queue or "", "type": job_type or ""}
                ),
                question=[*question, "?"],
                explanation=(
                    "Each goes back to pending, due now, with as many more attempts as "
                    "its max attempts; attempts are kept."
                ),
                verb="Retry all",
                fields={k: v for k, v in (("queue", queue), ("type", job_type)) if v},
                back=listing,
                back_label="Back to the dead jobs",
            )
        done = await admin.retry_all(queue=queue, job_type=job_type)
        retried = sum(1 for outcome in done.values() if outcome == "retried")
        target = _html.url(base, "/jobs", {**filters, "retried": retried})
        return RedirectResponse(target, status_code=303)

    async def pause(self, request: Request) -> Response:
        return await self._pause_or_resume(request, pause=True)

    async def resume(self, request: Request) -> Response:
        return await self._pause_or_resume(request, pause=False)

    async def _pause_or_resume(self, request: Request, *, pause: bool) -> Response:
        asks = self._guard.asks(request)
        action, bound = ("/pause" if pause else "/resume"), ("queue",)
        params: Mapping[str, str] = (
            request.query_params
            if asks
            else await self._guard.form(request, action, bound)
        )
        queue, _, _ = self._filters(params)
        if queue is None:
            raise HTTPException(400, "give the queue to pause or resume")
        base = base_of(request)
        if asks:
            verb = "Pause" if pause else "Resume"
            return self._confirm(
                request,
                f"{verb} a queue",
                action=base + action,
                token=self._guard.token(action, {"queue": queue}),
                question=[f"{verb} queue ", Value(queue), "?"],
                explanation=(
                    "No worker starts another of its jobs until it is resumed; "
                    "running jobs finish and jobs are still enqueued."
                    if pause
                    else "Its workers are woken and start its jobs again at once."
                ),
                verb=verb,
                fields={"queue": queue},
                back=base + "/",
                back_label="Back to the queues",
                danger=pause,
            )
        admin = await self.admin()
        if pause:
            await admin.pause(queue)
        else:
            await admin.resume(queue)
        for live in self._live.values():  # the queues page shows the new state
            live.framed_at = -math.inf
        return RedirectResponse(base + "/", status_code=303)


def _retried_all(params: Mapping[str, str]) -> str | None:
    text = params.get("retried", "")
    if text.isascii() and text.isdigit() and len(text) < 19:
        return f"Retried {int(text):,} dead jobs."
    return None


def _json(value: Any) -> Any:
    """Times as ISO 8601 text, for a JSON response."""
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    isoformat = getattr(value, "isoformat", None)
    return isoformat() if callable(isoformat) else value
