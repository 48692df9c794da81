"""The dashboard's pages as HTML text: every value from the database is escaped here.

Pages are plain string templates. `esc` escapes text for an element or a
quoted attribute; a value is escaped once, where it is put into the page, and
nothing else ever reaches the page unescaped. Links are built from the
mount's root path (``base``), so the dashboard works under any prefix.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from html import escape
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from pgqueue._dashboard import first_line
from pgqueue._sql import JOB_STATUSES
from pgqueue.cli._common import seconds_text

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from pgqueue._admin import JobInfo, ScheduleInfo
    from pgqueue._dashboard import Frame, QueueLine

__all__ = [
    "confirm_page",
    "error_page",
    "esc",
    "job_page",
    "jobs_page",
    "live_part",
    "periodic_page",
    "queues_page",
]

COUNTS = ("ready", "scheduled", "running", "completed", "dead", "cancelled")
"""The counts of the queues table, in its order."""

PAYLOAD_LIMIT = 100_000
"""At most this many characters of a payload, result or error are shown."""


def esc(value: object) -> str:
    """``value`` as text, escaped for an element's content or a quoted attribute."""
    return escape(str(value), quote=True)


def link(
    base: str, path: str, params: Mapping[str, object | None] | None = None
) -> str:
    """The escaped URL of ``path`` under the mount, with the params that are not None."""
    url = base + path
    query = {k: str(v) for k, v in (params or {}).items() if v is not None}
    if query:
        url += "?" + urlencode(query)
    return esc(url)


def when(value: datetime | None) -> str:
    """A time element, in UTC to the second; "-" for None."""
    if value is None:
        return "-"
    if value.year in (1, 9999) and value.replace(tzinfo=None) in (
        datetime.min,
        datetime.max,
    ):
        return "-infinity" if value.year == 1 else "infinity"  # as asyncpg reads them
    utc = value.astimezone(UTC) if value.tzinfo is not None else value
    shown = utc.strftime("%Y-%m-%d %H:%M:%S UTC")
    return f'<time datetime="{esc(utc.isoformat())}">{esc(shown)}</time>'


def _clip(text: str) -> str:
    if len(text) <= PAYLOAD_LIMIT:
        return esc(text)
    cut = len(text) - PAYLOAD_LIMIT
    return esc(text[:PAYLOAD_LIMIT]) + f"\n… ({cut:,} more characters not shown)"


def layout(
    *,
    base: str,
    title: str,
    body: str,
    current: str,
    read_only: bool,
    assets: Mapping[str, str],
    script: bool = False,
) -> str:
    """A whole page: head, navigation, ``body`` under an h1 of ``title``."""
    nav = []
    for path, label in (("/", "Queues"), ("/jobs", "Jobs"), ("/periodic", "Periodic")):
        here = ' aria-current="page"' if path == current else ""
        nav.append(f'<a href="{link(base, path)}"{here}>{label}</a>')
    mode = (
        '<span class="mode">read-only</span>'
        if read_only
        else '<span class="mode mode-actions">actions enabled</span>'
    )
    js = (
        f'<script src="{link(base, "/static/pgqueue.js", {"v": assets["pgqueue.js"]})}" defer></script>'
        if script
        else ""
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="same-origin">
<title>{esc(title)} · pgqueue</title>
<link rel="stylesheet" href="{link(base, "/static/pgqueue.css", {"v": assets["pgqueue.css"]})}">
{js}
</head>
<body>
<a class="skip" href="#main">Skip to content</a>
<header class="top">
<nav aria-label="Dashboard">
<span class="brand">pgqueue</span>
{"".join(nav)}
</nav>
{mode}
</header>
<main id="main">
<h1>{esc(title)}</h1>
{body}
</main>
</body>
</html>
"""


def notice(text: str | None) -> str:
    """A message about what an action did, announced to screen readers."""
    if not text:
        return ""
    return f'<p class="notice" role="status">{esc(text)}</p>'


# --- Queues ----------------------------------------------------------------------------


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _queue_row(base: str, q: QueueLine) -> str:
    cells = [
        f'<th scope="row" data-field="queue"><a href="{link(base, "/jobs", {"queue": q.queue})}">{esc(q.queue)}</a></th>'
    ]
    for name in COUNTS:
        count: int = getattr(q, name)
        shown = (
            f"~{count:,}"
            if name == "completed" and q.completed_estimated
            else f"{count:,}"
        )
        target = link(base, "/jobs", {"queue": q.queue, "status": name})
        alert = ' class="alert"' if name == "dead" and count else ""
        cells.append(
            f'<td data-field="{name}" data-value="{count}"{alert}><a href="{target}">{shown}</a></td>'
        )
    cells.append(f'<td data-field="lag">{esc(seconds_text(q.lag))}</td>')
    cells.append(
        f'<td data-field="enqueued_per_second">{_rate(q.enqueued_per_second)}</td>'
    )
    cells.append(
        f'<td data-field="finished_per_second">{_rate(q.finished_per_second)}</td>'
    )
    slots = "-" if q.global_limit is None else f"{q.slots_in_use} of {q.global_limit}"
    cells.append(f'<td data-field="slots">{esc(slots)}</td>')
    return f'<tr data-queue="{esc(q.queue)}">{"".join(cells)}</tr>'


def live_part(base: str, frame: Frame) -> str:
    """What the queues page redraws every few seconds: queues, longest running, latest dead."""
    heads = "".join(
        f'<th scope="col" class="num">{label}</th>'
        for label in (
            "Ready",
            "Scheduled",
            "Running",
            "Completed",
            "Dead",
            "Cancelled",
            '<abbr title="age of the oldest ready job">Lag</abbr>',
            '<abbr title="jobs enqueued per second, last 10 s">In/s</abbr>',
            '<abbr title="jobs finished per second, last 10 s">Done/s</abbr>',
            '<abbr title="slots of the fleet-wide limit leased by workers">Slots</abbr>',
        )
    )
    rows = "".join(_queue_row(base, q) for q in frame.queues) or (
        '<tr><td colspan="11" class="empty">No jobs yet.</td></tr>'
    )
    running = (
        "".join(
            f'<tr><td class="num"><a href="{link(base, f"/jobs/{r.id}")}">{r.id}</a></td>'
            f"<td>{esc(r.queue)}</td><td>{esc(r.job_type)}</td>"
            f'<td class="num">{esc(seconds_text(r.running_for))}</td>'
            f'<td class="num">{esc(seconds_text(r.heard_from))} ago</td></tr>'
            for r in frame.longest_running
        )
        or '<tr><td colspan="5" class="empty">None.</td></tr>'
    )
    dead = (
        "".join(
            f'<tr><td class="num"><a href="{link(base, f"/jobs/{d.id}")}">{d.id}</a></td>'
            f"<td>{esc(d.queue)}</td><td>{esc(d.job_type)}</td><td>{when(d.died_at)}</td>"
            f'<td class="error">{esc(d.error or "")}</td></tr>'
            for d in frame.latest_dead
        )
        or '<tr><td colspan="5" class="empty">None.</td></tr>'
    )
    return f"""<p class="meta">Jobs per queue and status (a count of completed jobs marked ~ is an estimate).</p>
<div class="scroll">
<table id="queues" class="queues">
<thead><tr><th scope="col">Queue</th>{heads}</tr></thead>
<tbody>{rows}</tbody>
</table>
</div>
<p class="meta">Read at {when(frame.at)}</p>
<h2>Longest running</h2>
<div class="scroll">
<table>
<thead><tr><th scope="col" class="num">ID</th><th scope="col">Queue</th><th scope="col">Type</th>
<th scope="col" class="num">Running for</th><th scope="col" class="num">Heartbeat</th></tr></thead>
<tbody>{running}</tbody>
</table>
</div>
<h2>Latest dead</h2>
<div class="scroll">
<table>
<thead><tr><th scope="col" class="num">ID</th><th scope="col">Queue</th><th scope="col">Type</th>
<th scope="col">Died</th><th scope="col">Last error</th></tr></thead>
<tbody>{dead}</tbody>
</table>
</div>
"""


def queues_page(base: str, frame: Frame, *, interval: float) -> str:
    """The queues page's body: the live part, and where the script finds its fragment."""
    return f"""<div id="live" data-src="{link(base, "/fragments/queues")}" data-interval="{interval:g}">
{live_part(base, frame)}
</div>
<p class="meta" id="live-status">Updated every {interval:g} s while this page is open.</p>
"""


# --- Jobs ------------------------------------------------------------------------------


def _status(status: str) -> str:
    return f'<span class="status status-{esc(status)}">{esc(status)}</span>'


def jobs_page(
    base: str,
    jobs: Iterable[JobInfo],
    *,
    queue: str | None,
    status: str | None,
    job_type: str | None,
    first: bool,
    newer: int | None,
    older: int | None,
    actions: bool,
    message: str | None,
) -> str:
    """The listing's body: the filter form, the jobs, the pages.

    ``newer`` and ``older`` are the cursors of the pages either side
    (``after`` and ``before``), None where there is none.
    """
    options = ['<option value="">any</option>'] + [
        f'<option value="{s}"{" selected" if s == status else ""}>{s}</option>'
        for s in JOB_STATUSES
    ]
    form = f"""<form class="filters" method="get" action="{link(base, "/jobs")}">
<label>Queue <input name="queue" value="{esc(queue or "")}" autocomplete="off"></label>
<label>Status <select name="status">{"".join(options)}</select></label>
<label>Type <input name="type" value="{esc(job_type or "")}" autocomplete="off"></label>
<button type="submit">Filter</button>
</form>"""
    retry_all = ""
    if actions and status == "dead":
        hidden = "".join(
            f'<input type="hidden" name="{name}" value="{esc(value)}">'
            for name, value in (("queue", queue), ("type", job_type))
            if value is not None
        )
        retry_all = f"""<form class="actions" method="get" action="{link(base, "/retry-all")}">
{hidden}<button type="submit">Retry all</button>
</form>"""
    rows = []
    for job in jobs:
        error = first_line(job.last_error) or ""
        rows.append(
            f'<tr data-id="{job.id}"><td class="num"><a href="{link(base, f"/jobs/{job.id}")}">{job.id}</a></td>'
            f"<td>{esc(job.queue)}</td><td>{esc(job.job_type)}</td><td>{_status(job.status)}</td>"
            f'<td class="num">{job.attempts}/{job.max_attempts}</td><td>{when(job.run_at)}</td>'
            f'<td class="error" title="{esc(error)}">{esc(error)}</td></tr>'
        )
    table = (
        f"""<div class="scroll">
<table id="jobs">
<caption>Newest first</caption>
<thead><tr><th scope="col" class="num">ID</th><th scope="col">Queue</th><th scope="col">Type</th>
<th scope="col">Status</th><th scope="col" class="num">Attempts</th><th scope="col">Run at</th>
<th scope="col">Last error</th></tr></thead>
<tbody>{"".join(rows)}</tbody>
</table>
</div>"""
        if rows
        else '<p class="empty">No jobs match.</p>'
    )
    filters = {"queue": queue, "status": status, "type": job_type}
    pages = []
    if not first:
        pages.append(f'<a href="{link(base, "/jobs", filters)}">Newest</a>')
    if newer is not None:
        pages.append(
            f'<a href="{link(base, "/jobs", {**filters, "after": newer})}" rel="prev">Newer</a>'
        )
    if older is not None:
        pages.append(
            f'<a href="{link(base, "/jobs", {**filters, "before": older})}" rel="next">Older</a>'
        )
    nav = (
        f'<nav class="pages" aria-label="Pages">{" ".join(pages)}</nav>'
        if pages
        else ""
    )
    return notice(message) + form + retry_all + table + nav


def _pre(value: Any) -> str:
    text = (
        value
        if isinstance(value, str)
        else json.dumps(value, indent=2, ensure_ascii=False)
    )
    return f"<pre>{_clip(text)}</pre>"


def job_page(
    base: str,
    job: JobInfo,
    *,
    schedule: ScheduleInfo | None,
    tick: datetime | None,
    show_payloads: bool,
    actions: bool,
    message: str | None,
) -> str:
    """One job: its fields, actions, payload, result and last error."""
    facts: list[tuple[str, str]] = [
        (
            "Queue",
            f'<a href="{link(base, "/jobs", {"queue": job.queue})}">{esc(job.queue)}</a>',
        ),
        ("Type", esc(job.job_type)),
        (
            "Status",
            _status(job.status)
            + (" (cancel requested)" if job.cancel_requested else ""),
        ),
        ("Attempts", f"{job.attempts} of {job.max_attempts}"),
        ("Priority", str(job.priority)),
        ("Unique key", esc(job.unique_key) if job.unique_key is not None else "-"),
        ("Snoozes", str(job.snoozes)),
        ("Run at", when(job.run_at)),
        ("Created", when(job.created_at)),
        ("Updated", when(job.updated_at)),
        ("Completed", when(job.completed_at)),
    ]
    if tick is not None:
        name = (
            job.unique_key[len("periodic:") :].rpartition("@")[0]
            if job.unique_key
            else ""
        )
        spelled = (
            f" ({esc(schedule.schedule)}{'' if schedule.timezone == 'UTC' else ', ' + esc(schedule.timezone)})"
            if schedule is not None
            else " (no longer registered)"
        )
        facts.append(
            (
                "Periodic schedule",
                f'<a href="{link(base, "/periodic")}">{esc(name)}</a>{spelled}',
            )
        )
        facts.append(("Tick", when(tick)))
    dl = "".join(f"<dt>{term}</dt><dd>{value}</dd>" for term, value in facts)
    buttons = []
    if actions and job.status in ("dead", "cancelled"):
        buttons.append(
            f'<form method="get" action="{link(base, f"/jobs/{job.id}/retry")}"><button type="submit">Retry</button></form>'
        )
    if actions and job.status in ("pending", "running") and not job.cancel_requested:
        buttons.append(
            f'<form method="get" action="{link(base, f"/jobs/{job.id}/cancel")}"><button type="submit" class="danger">Cancel</button></form>'
        )
    action_bar = f'<div class="actions">{"".join(buttons)}</div>' if buttons else ""
    if show_payloads:
        payload = _pre(job.payload)
        result = (
            _pre(job.result) if job.result is not None else '<p class="empty">None.</p>'
        )
    else:
        payload = result = (
            '<p class="empty">Hidden (the dashboard shows no payloads).</p>'
        )
    error = (
        f'<pre class="error-text">{_clip(job.last_error)}</pre>'
        if job.last_error is not None
        else '<p class="empty">None.</p>'
    )
    return f"""{notice(message)}{action_bar}
<dl class="facts">{dl}</dl>
<h2>Payload</h2>
{payload}
<h2>Result</h2>
{result}
<h2>Last error</h2>
{error}
"""


def confirm_page(
    *,
    action_url: str,
    question: str,
    explanation: str,
    verb: str,
    token: str,
    fields: Mapping[str, str],
    back_url: str,
    back_label: str,
    danger: bool = False,
) -> str:
    """Ask before an action: a POST form with the CSRF token and the verb's button."""
    hidden = "".join(
        f'<input type="hidden" name="{esc(name)}" value="{esc(value)}">'
        for name, value in fields.items()
    )
    return f"""<p class="question"><strong>{esc(question)}</strong></p>
<p>{esc(explanation)}</p>
<form class="actions" method="post" action="{esc(action_url)}">
<input type="hidden" name="csrf" value="{esc(token)}">{hidden}
<button type="submit"{' class="danger"' if danger else ""}>{esc(verb)}</button>
<a href="{esc(back_url)}">{esc(back_label)}</a>
</form>
"""


def periodic_page(base: str, schedules: Iterable[ScheduleInfo]) -> str:
    """Every schedule: name, expression, queue, type, last and next tick."""
    rows = "".join(
        f'<tr id="schedule-{esc(s.name)}"><th scope="row">{esc(s.name)}</th>'
        f"<td><code>{esc(s.schedule)}</code>{'' if s.timezone == 'UTC' else ' (' + esc(s.timezone) + ')'}</td>"
        f'<td><a href="{link(base, "/jobs", {"queue": s.queue, "type": s.job_type})}">{esc(s.queue)}</a></td>'
        f"<td>{esc(s.job_type)}</td><td>{when(s.last_tick)}</td><td>{when(s.next_tick)}</td></tr>"
        for s in schedules
    )
    if not rows:
        return (
            '<p class="empty">No periodic schedules: no worker has registered one.</p>'
        )
    return f"""<div class="scroll">
<table id="periodic">
<thead><tr><th scope="col">Name</th><th scope="col">Schedule</th><th scope="col">Queue</th>
<th scope="col">Type</th><th scope="col">Last tick</th><th scope="col">Next tick</th></tr></thead>
<tbody>{rows}</tbody>
</table>
</div>
<p class="meta">The next tick is as the worker that last ran or registered the schedule computed it.</p>
"""


def error_page(base: str, detail: str) -> str:
    """The body of an error page."""
    return f'<p role="alert">{esc(detail)}</p><p><a href="{link(base, "/")}">Back to the queues</a></p>'
