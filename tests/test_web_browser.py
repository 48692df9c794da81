"""The web dashboard in a real browser: Playwright driving the system's Chromium.

The app is served by uvicorn in the test's own event loop (on a socket bound
before the browser starts, so nothing waits for the server to come up); a
`pgqueue.Worker` drains jobs in the same loop. Waits are Playwright's
assertions (they retry until their timeout), never sleeps.

With ``PGQUEUE_SCREENSHOTS=1`` the pages are saved to docs/screenshots/ (the
README shows them). Skipped when Playwright or Chromium is missing
(``apt-get install chromium``; never ``playwright install``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

import anyio
import asyncpg
import httpx
import pytest

import pgqueue
from pgqueue.web import create_app
from tests.helpers import row, running, wait_for_row

playwright_api = pytest.importorskip(
    "playwright.async_api", reason="the browser tests need playwright"
)
uvicorn = pytest.importorskip("uvicorn", reason="the browser tests need uvicorn")

CHROMIUM = next(
    (
        path
        for path in ("/usr/bin/chromium", shutil.which("chromium"))
        if path and Path(path).exists()
    ),
    None,
)
if CHROMIUM is None:
    pytest.skip(
        "no Chromium at /usr/bin/chromium (apt-get install chromium)",
        allow_module_level=True,
    )

expect = playwright_api.expect
SCREENSHOTS = (
    Path(__file__).resolve().parent.parent / "docs" / "screenshots"
    if os.environ.get("PGQUEUE_SCREENSHOTS") == "1"
    else None
)
WAIT_MS = 10_000
"""How long an expectation may take to come true (they are usually met in under a second)."""

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from playwright.async_api import Browser, Page
    from starlette.types import ASGIApp


@contextlib.asynccontextmanager
async def serving(app: ASGIApp) -> AsyncIterator[str]:
    """Serve ``app`` on a free port of 127.0.0.1 until the block ends; yield its URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    with listener:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(server.serve, [listener])
            try:
                yield f"http://127.0.0.1:{port}"
            finally:
                server.should_exit = True


@contextlib.asynccontextmanager
async def browser() -> AsyncIterator[Browser]:
    async with playwright_api.async_playwright() as pw:
        chromium = await pw.chromium.launch(executable_path=CHROMIUM)
        try:
            yield chromium
        finally:
            await chromium.close()


async def shot(page: Page, name: str) -> None:
    if SCREENSHOTS is not None:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        await page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


async def seed(pool: asyncpg.Pool) -> dict[str, list[int]]:
    """A few queues that look like a real service's."""
    emails = pgqueue.Queue(pool, name="emails")
    reports = pgqueue.Queue(pool, name="reports")
    ids = {
        "emails": await emails.enqueue_many(
            [("send_welcome_email", {"user_id": n}) for n in range(40)]
        ),
        "reports": await reports.enqueue_many(
            [("build_report", {"month": f"2026-{m:02d}"}) for m in range(1, 13)]
        ),
    }
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed', attempts = 1, completed_at = now(),"
        " result = '{\"sent\": true}' WHERE id = ANY($1::bigint[])",
        ids["emails"][:25],
    )
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'dead', attempts = 5, max_attempts = 5,"
        " last_error = 'smtplib.SMTPRecipientsRefused: {''bad@example'': (550, ''no such user'')}'"
        "  || E'\\nTraceback (most recent call last):\\n  File \"app/mail.py\", line 12'"
        " WHERE id = ANY($1::bigint[])",
        ids["emails"][25:28],
    )
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'running', attempts = 1 WHERE id = ANY($1::bigint[])",
        ids["reports"][:2],
    )
    await pool.execute(
        "UPDATE pgqueue_jobs SET run_at = now() + interval '6 hours' WHERE id = ANY($1::bigint[])",
        ids["reports"][8:],
    )
    await pool.execute(
        "INSERT INTO pgqueue_periodic (name, schedule, queue, job_type, last_tick, next_tick)"
        " VALUES ('monthly-report', '0 6 1 * *', 'reports', 'build_report',"
        "         date_trunc('month', now()) + interval '6 hours',"
        "         date_trunc('month', now()) + interval '1 month 6 hours'),"
        "        ('digest', '@every 3600s', 'emails', 'send_digest',"
        "         date_trunc('hour', now()), date_trunc('hour', now()) + interval '1 hour')"
    )
    return ids


def cell(page: Page, queue: str, field: str) -> Any:
    return page.locator(f'tr[data-queue="{queue}"] [data-field="{field}"]')


async def test_queues_page_shows_the_counts_and_follows_a_worker_live(
    fresh_dsn: str,
) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=6) as pool:
        await seed(pool)
        app = create_app(pool, poll_interval=0.3)
        async with serving(app) as url, browser() as chromium:
            page = await chromium.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(f"{url}/")
            await expect(page.get_by_role("heading", name="Queues")).to_be_visible()
            counts = {
                field: await cell(page, "emails", field).inner_text()
                for field in ("ready", "completed", "dead")
            }
            assert counts == {"ready": "12", "completed": "25", "dead": "3"}
            assert await cell(page, "reports", "running").inner_text() == "2"
            assert await cell(page, "reports", "scheduled").inner_text() == "4"
            await shot(page, "queues")
            phone = await chromium.new_page(
                viewport={"width": 390, "height": 844}, device_scale_factor=2
            )
            await phone.goto(f"{url}/")
            await shot(phone, "queues-phone")
            await phone.close()

            # A marker the page keeps only if it is never reloaded.
            await page.evaluate("window.notReloaded = true")
            worker = pgqueue.Worker(pool, queue="emails", concurrency=4)

            @worker.handler("send_welcome_email")
            async def send(job: pgqueue.Job) -> None:
                return None

            with anyio.fail_after(20):
                await worker.run(until_empty=True)
            await expect(cell(page, "emails", "ready")).to_have_text(
                "0", timeout=WAIT_MS
            )
            await expect(cell(page, "emails", "completed")).to_have_text(
                "37", timeout=WAIT_MS
            )
            await expect(cell(page, "emails", "finished_per_second")).not_to_have_text(
                "-", timeout=WAIT_MS
            )
            assert await page.evaluate("window.notReloaded") is True
            await expect(page.locator("#live-status")).to_contain_text("Updated")


async def test_retry_a_dead_job_from_the_browser(fresh_dsn: str) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool:
        ids = await seed(pool)
        dead = ids["emails"][25]
        app = create_app(pool, read_only=False)
        async with serving(app) as url, browser() as chromium:
            page = await chromium.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(f"{url}/")
            await cell(page, "emails", "dead").get_by_role("link").click()
            await expect(page.get_by_role("heading", name="Jobs")).to_be_visible()
            await expect(page.locator("#jobs tbody tr")).to_have_count(3)
            await expect(page.get_by_role("button", name="Retry all")).to_be_visible()
            await shot(page, "jobs")
            await page.get_by_role("link", name=str(dead), exact=True).click()
            await expect(
                page.get_by_role("heading", name=f"Job {dead}")
            ).to_be_visible()
            await expect(page.get_by_role("button", name="Cancel")).to_have_count(0)
            await shot(page, "job")
            await page.get_by_role("button", name="Retry", exact=True).click()
            await expect(
                page.get_by_role("heading", name=f"Retry job {dead}")
            ).to_be_visible()
            assert (await row(pool, dead))["status"] == "dead"  # nothing done yet
            await shot(page, "confirm")
            await page.get_by_role("button", name="Retry", exact=True).click()
            await expect(page.get_by_role("status")).to_contain_text("Retried")
            await expect(page.get_by_role("button", name="Cancel")).to_be_visible()
        retried = await row(pool, dead)
        assert retried["status"] == "pending"
        assert retried["attempts"] == 5  # never reset
        assert retried["max_attempts"] == 10


async def test_cancel_a_pending_job_from_the_browser(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("t", {"n": 1})
    async with (
        serving(create_app(pool, read_only=False)) as url,
        browser() as chromium,
    ):
        page = await chromium.new_page()
        await page.goto(f"{url}/jobs/{job_id}")
        await expect(page.get_by_role("button", name="Retry")).to_have_count(0)
        await page.get_by_role("button", name="Cancel", exact=True).click()
        await expect(
            page.get_by_role("heading", name=f"Cancel job {job_id}")
        ).to_be_visible()
        await page.get_by_role("button", name="Cancel", exact=True).click()
        await expect(page.get_by_role("status")).to_have_text("Cancelled.")
    assert (await row(pool, job_id))["status"] == "cancelled"


async def test_read_only_has_no_action_buttons_and_refuses_a_forged_post(
    fresh_dsn: str,
) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool:
        ids = await seed(pool)
        dead, pending = ids["emails"][25], ids["emails"][30]
        async with serving(create_app(pool)) as url, browser() as chromium:
            page = await chromium.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(f"{url}/periodic")
            await expect(page.locator("#periodic tbody tr")).to_have_count(2)
            await shot(page, "periodic")
            for path in (
                f"/jobs/{dead}",
                f"/jobs/{pending}",
                "/jobs?queue=emails&status=dead",
            ):
                await page.goto(url + path)
                for verb in ("Retry", "Cancel", "Retry all"):
                    await expect(
                        page.get_by_role("button", name=verb, exact=True)
                    ).to_have_count(0)
            # A POST from the page itself (same origin), and one from outside.
            status = await page.evaluate(
                """path => fetch(path, {method: "POST", body: new URLSearchParams({csrf: "x"})})
                       .then(response => response.status)""",
                f"/jobs/{dead}/retry",
            )
            assert status == 403
            async with httpx.AsyncClient(base_url=url) as c:
                forged = await c.post(f"/jobs/{pending}/cancel", data={"csrf": "x"})
                assert forged.status_code == 403
        assert (await row(pool, dead))["status"] == "dead"
        assert (await row(pool, pending))["status"] == "pending"


# --- filter, bulk actions, edit --------------------------------------------------------


async def seed_customers(pool: asyncpg.Pool) -> dict[int, list[int]]:
    """Dead invoices of customers 7 (60 of them: more than a page) and 8 (10), and a pending one."""
    invoices = pgqueue.Queue(pool, name="invoices")
    ids = {
        customer: await invoices.enqueue_many(
            [("send_invoice", {"customer": customer, "n": n}) for n in range(count)]
        )
        for customer, count in ((7, 60), (8, 10))
    }
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'dead', attempts = 3, max_attempts = 3,"
        " last_error = 'httpx.ConnectTimeout: billing.internal timed out'"
        " WHERE queue = 'invoices'"
    )
    ids[0] = [await invoices.enqueue("send_invoice", {"customer": 9, "n": 0})]
    return ids


async def test_select_rows_or_all_matching_then_confirm_in_the_browser(
    fresh_dsn: str,
) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool:
        ids = await seed_customers(pool)
        where = urlencode(
            {"where": ["queue=invoices", "payload.customer=7"]}, doseq=True
        )
        async with (
            serving(create_app(pool, read_only=False)) as url,
            browser() as chromium,
        ):
            page = await chromium.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(f"{url}/jobs?{where}")
            boxes = page.locator('#jobs input[name="id"]')
            await expect(boxes).to_have_count(50)  # one page of 60
            # Past one page, the count waits for the box to be checked.
            await expect(page.locator("label.all")).to_have_text(
                "All jobs matching the filter, past this page"
            )

            # Two rows, by their boxes.
            await boxes.nth(0).check()
            await boxes.nth(1).check()
            await shot(page, "jobs-filter")
            await page.get_by_role("button", name="Retry…").click()
            await expect(page.locator("#bulk-question")).to_have_text(
                "Retry 2 selected jobs?"
            )
            newest = sorted(ids[7], reverse=True)[:2]
            await expect(page.locator("#bulk-ids")).to_have_text(
                ", ".join(map(str, sorted(newest)))
            )
            await page.get_by_role("button", name="Retry 2 jobs").click()
            await expect(page.get_by_role("status")).to_have_text("Retried 2 jobs.")
            assert {(await row(pool, i))["status"] for i in newest} == {"pending"}

            # The page's box selects its rows (JavaScript); "all" goes past the page.
            await page.goto(f"{url}/jobs?{where}&status=dead")
            await page.get_by_label("Select the jobs of this page").check()
            await expect(page.locator('#jobs input[name="id"]:checked')).to_have_count(
                50
            )
            await page.locator("#bulk-all").check()
            await expect(page.locator("label.all")).to_have_text(
                "All 58 jobs matching the filter, past this page"
            )
            await page.get_by_role("button", name="Retry…").click()
            await expect(page.locator("#bulk-question")).to_have_text(
                "Retry 58 jobs matching the filter?"
            )
            await expect(page.locator("#bulk-filter li")).to_have_text(
                ["queue=invoices", "status=dead", "payload.customer=7"]
            )
            await shot(page, "bulk-confirm")
            confirm_url = page.url

            # The form's filter changed in the page: refused, nothing done.
            await page.locator('input[name="filter"]').evaluate(
                "input => input.value = '[\"queue=invoices\"]'"
            )
            await page.get_by_role("button", name="Retry 58 jobs").click()
            await expect(page.get_by_role("heading", name="Forbidden")).to_be_visible()
            dead = await pool.fetchval(
                "SELECT count(*) FROM pgqueue_jobs WHERE queue = 'invoices'"
                " AND status = 'dead'"
            )
            assert dead == 68
            # Its token gone: refused too.
            await page.goto(confirm_url)
            await page.locator('input[name="csrf"]').evaluate("input => input.remove()")
            await page.get_by_role("button", name="Retry 58 jobs").click()
            await expect(page.get_by_role("heading", name="Forbidden")).to_be_visible()

            await page.goto(confirm_url)
            await page.get_by_role("button", name="Retry 58 jobs").click()
            await expect(page.get_by_role("status")).to_have_text("Retried 58 jobs.")
        statuses = {
            r["id"]: r["status"]
            for r in await pool.fetch(
                "SELECT id, status FROM pgqueue_jobs WHERE queue = 'invoices'"
            )
        }
        assert {statuses[i] for i in ids[7]} == {"pending"}
        assert {statuses[i] for i in ids[8]} == {"dead"}


async def test_edit_a_pending_job_and_see_a_refusal_in_the_browser(
    fresh_dsn: str,
) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool:
        ids = await seed_customers(pool)
        [pending] = ids[0]
        async with (
            serving(create_app(pool, read_only=False)) as url,
            browser() as chromium,
        ):
            page = await chromium.new_page(viewport={"width": 1280, "height": 800})
            await page.goto(f"{url}/jobs/{pending}")
            await page.get_by_role("button", name="Edit", exact=True).click()
            await expect(
                page.get_by_role("heading", name=f"Edit job {pending}")
            ).to_be_visible()
            await page.get_by_label("Payload (JSON)").fill(
                '{"customer": 9, "n": 0, "resend": true}'
            )
            await page.get_by_label("Priority").fill("2")
            await page.get_by_label("Group (empty: unchanged)").fill("customer-9")
            await shot(page, "edit")
            await page.get_by_role("button", name="Save").click()
            await expect(page.get_by_role("status")).to_contain_text("Saved")
            saved = await row(pool, pending)
            assert json.loads(saved["payload"]) == {
                "customer": 9,
                "n": 0,
                "resend": True,
            }
            assert (saved["priority"], saved["group_key"]) == (2, "customer-9")

            # A worker claims it while the form is open: the save is refused.
            await page.get_by_role("button", name="Edit", exact=True).click()
            await page.get_by_label("Priority").fill("-1")
            await pool.execute(
                "UPDATE pgqueue_jobs SET status = 'running', attempts = 1 WHERE id = $1",
                pending,
            )
            await page.get_by_role("button", name="Save").click()
            await expect(page.get_by_role("alert")).to_contain_text("running")
            await expect(page.get_by_label("Priority")).to_have_value("-1")
            assert (await row(pool, pending))["priority"] == 2


# --- hostile values --------------------------------------------------------------------

HOSTILE_QUEUE = "q\"'><img src=x onerror=window.__pwned=1>"
HOSTILE_TYPE = "</script><script>window.__pwned=2</script>"
HOSTILE_KEY = 'javascript:window.__pwned=3//" onmouseover="window.__pwned=4'
HOSTILE_ERROR = (
    '<svg onload=window.__pwned=5>\'"><iframe srcdoc="<script>parent.__pwned=6</script>">'
    "\n</pre><a href=javascript:window.__pwned=7>click</a>"
)
HOSTILE_SCHEDULE = "<b onmouseover=window.__pwned=8>nightly</b>"
HOSTILE_PAYLOAD = {
    "html": "<img src=x onerror=window.__pwned=9>",
    "link": "javascript:window.__pwned=10",
    "quote": "\"'><script>window.__pwned=11</script>",
}
HOSTILE_RESULT = ["</pre><script>window.__pwned=12</script>", "</textarea>&amp;"]

# Whatever the page holds: no script but the dashboard's own, no element a
# value could have smuggled in, no event handler attribute, and no link or
# form that leaves the dashboard's paths.
INJECTED = """() => {
    const found = [];
    for (const el of document.querySelectorAll("*")) {
        for (const attr of el.attributes) {
            if (attr.name.startsWith("on")) found.push(el.tagName + " " + attr.name);
        }
    }
    for (const el of document.querySelectorAll("img, svg, iframe, object, embed, b")) {
        found.push(el.tagName);
    }
    for (const script of document.scripts) {
        if (!script.getAttribute("src")?.startsWith("/static/pgqueue.js")) found.push("script");
    }
    for (const a of document.querySelectorAll("a[href]")) {
        const href = a.getAttribute("href");
        if (!href.startsWith("/") && href !== "#main") found.push("a " + href);
    }
    for (const form of document.querySelectorAll("form")) {
        if (!form.getAttribute("action").startsWith("/")) found.push("form");
    }
    if (window.__pwned !== undefined) found.push("pwned " + window.__pwned);
    return found;
}"""


async def test_hostile_values_show_as_text_and_run_nothing(fresh_dsn: str) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=4) as pool:
        dead, running = [
            await pool.fetchval(
                "INSERT INTO pgqueue_jobs (queue, job_type, status, attempts, unique_key,"
                "                          payload, result, last_error)"
                " VALUES ($1, $2, $3, 1, $4, $5::jsonb, $6::jsonb, $7) RETURNING id",
                HOSTILE_QUEUE,
                HOSTILE_TYPE,
                status,
                HOSTILE_KEY if status == "dead" else None,
                json.dumps(HOSTILE_PAYLOAD),
                json.dumps(HOSTILE_RESULT),
                HOSTILE_ERROR,
            )
            for status in ("dead", "running")
        ]
        await pool.execute(
            "INSERT INTO pgqueue_periodic (name, schedule, queue, job_type, last_tick, next_tick)"
            " VALUES ($1, '0 3 * * *', $2, $3, now(), now() + interval '1 day')",
            HOSTILE_SCHEDULE,
            HOSTILE_QUEUE,
            HOSTILE_TYPE,
        )
        pending = await pool.fetchval(
            "INSERT INTO pgqueue_jobs (queue, job_type, payload)"
            " VALUES ($1, $2, $3::jsonb) RETURNING id",
            HOSTILE_QUEUE,
            HOSTILE_TYPE,
            json.dumps(HOSTILE_PAYLOAD),
        )
        filters = urlencode({"queue": HOSTILE_QUEUE, "type": HOSTILE_TYPE})
        where = urlencode(
            {
                "where": [
                    f"queue={HOSTILE_QUEUE}",
                    f"payload.html={HOSTILE_PAYLOAD['html']}",
                    f"error_contains={HOSTILE_ERROR[:40]}",
                ]
            },
            doseq=True,
        )
        paths = [
            f"/jobs?{where}",
            f"/bulk/retry?all=1&{where}",
            f"/bulk/cancel?id={dead}&id={running}",
            f"/jobs/{pending}",
            f"/jobs/{pending}/edit",
            "/",
            "/jobs",
            f"/jobs?{filters}&status=dead",
            f"/jobs/{dead}",
            f"/jobs/{dead}/retry",
            f"/jobs/{running}",
            f"/jobs/{running}/cancel",
            f"/retry-all?{filters}",
            "/periodic",
        ]
        app = create_app(pool, read_only=False, poll_interval=0.3)
        async with serving(app) as url, browser() as chromium:
            page = await chromium.new_page(viewport={"width": 1280, "height": 800})
            dialogs: list[str] = []
            page.on("dialog", lambda dialog: dialogs.append(dialog.message))
            for path in paths:
                await page.goto(url + path)
                await expect(page.locator("h1")).to_be_visible()
                assert await page.evaluate(INJECTED) == [], path
                await page.hover("main")
            assert dialogs == []

            # The live part of the queues page, redrawn from the fragment.
            await page.goto(f"{url}/")
            await expect(page.locator("#live")).to_have_attribute(
                "data-updated", re.compile(r"\d+"), timeout=WAIT_MS
            )
            assert await page.evaluate(INJECTED) == []
            queue_cell = page.locator("#queues tbody th[data-field=queue]")
            await expect(queue_cell).to_have_text(HOSTILE_QUEUE)
            running_row = page.get_by_role("row").filter(has_text=str(running))
            await expect(running_row.locator("td").nth(2)).to_have_text(HOSTILE_TYPE)

            # Every field of the job, as text.
            await page.goto(f"{url}/jobs/{dead}")
            facts = page.locator("dl.facts dd")
            await expect(facts.nth(0)).to_have_text(HOSTILE_QUEUE)
            # The type, then a link to its trend.
            await expect(facts.nth(1)).to_have_text(f"{HOSTILE_TYPE} (trend)")
            await expect(facts.nth(5)).to_have_text(HOSTILE_KEY)
            shown = page.locator("main pre")
            payload = json.loads(await shown.nth(0).inner_text())
            assert payload == HOSTILE_PAYLOAD
            assert json.loads(await shown.nth(1).inner_text()) == HOSTILE_RESULT
            await expect(shown.nth(2)).to_have_text(HOSTILE_ERROR)

            # The listing and the periodic schedules.
            await page.goto(f"{url}/jobs?{filters}&status=dead")
            # With actions on, the first cell is the row's box.
            cells = page.locator(f'#jobs tr[data-id="{dead}"] td')
            await expect(cells.nth(2)).to_have_text(HOSTILE_QUEUE)
            await expect(cells.nth(3)).to_have_text(HOSTILE_TYPE)
            await expect(cells.nth(7)).to_have_text(HOSTILE_ERROR.splitlines()[0])
            await expect(
                page.get_by_role("textbox", name="Queue", exact=True)
            ).to_have_value(HOSTILE_QUEUE)
            await page.goto(f"{url}/periodic")
            await expect(page.locator("#periodic tbody th")).to_have_text(
                HOSTILE_SCHEDULE
            )
            await page.goto(f"{url}/retry-all?{filters}")
            await expect(page.locator("p.question")).to_have_text(
                f"Retry all 1 dead jobs of queue {HOSTILE_QUEUE} and of type {HOSTILE_TYPE}?"
            )
            # The edit form holds the payload as text, and the filter's terms too.
            await page.goto(f"{url}/jobs/{pending}/edit")
            edited = await page.get_by_label("Payload (JSON)").input_value()
            assert json.loads(edited) == HOSTILE_PAYLOAD
            await page.goto(f"{url}/bulk/retry?all=1&{where}")
            await expect(page.locator("#bulk-filter li").nth(0)).to_have_text(
                f"queue={HOSTILE_QUEUE}"
            )
            assert await page.evaluate("window.__pwned") is None
        assert (await row(pool, dead))["status"] == "dead"


# The left edge of each character of the first "dead" after the value in a
# confirmation's question: left to right unless something reordered them.
EDGES = """question => {
    const walker = document.createTreeWalker(question, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        const at = node.data.indexOf("dead");
        if (at < 0) continue;
        const edges = [];
        for (let i = 0; i < 4; i++) {
            const range = document.createRange();
            range.setStart(node, at + i);
            range.setEnd(node, at + i + 1);
            edges.push(range.getBoundingClientRect().left);
        }
        return edges;
    }
    return null;
}"""


async def test_a_right_to_left_override_in_a_type_reorders_nothing_around_it(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("invoice\u202efdp.exe", {})
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'dead', last_error = $2 WHERE id = $1",
        job_id,
        "\u202eerror",
    )
    async with (
        serving(create_app(pool, read_only=False)) as url,
        browser() as chromium,
    ):
        page = await chromium.new_page()
        await page.goto(f"{url}/jobs/{job_id}/retry")
        question = page.locator("p.question")
        await expect(question).to_contain_text("Retry job")
        edges = await question.evaluate(EDGES)
        assert edges is not None
        assert edges == sorted(edges), edges  # "dead" reads left to right
        assert len(set(edges)) == 4
        # The override is shown, not obeyed, wherever the type appears.
        for path in (f"/jobs/{job_id}", f"/jobs?queue={queue.name}", "/"):
            await page.goto(url + path)
            text = await page.locator("main").inner_text()
            assert "\u202e" not in text, path
            assert "invoiceU+202Efdp.exe" in text, path


# --- durable handlers ------------------------------------------------------------------


async def test_a_durable_jobs_page_and_send_signal_in_the_browser(
    fresh_dsn: str,
) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=6) as pool:
        queue = pgqueue.Queue(pool, name="orders")
        worker = pgqueue.Worker(pool, queue="orders", poll_interval=60)

        @worker.handler("order")
        async def order(job: pgqueue.Job) -> Any:
            await job.step("charge", lambda: {"charge": "ch_42", "amount": 1999})
            await job.step(HOSTILE_TYPE, lambda: True)
            await job.progress(0.5, HOSTILE_ERROR)
            return await job.wait_for("approval")

        job_id = await queue.enqueue("order", {"order": 42})
        async with (
            running(worker),
            serving(create_app(pool, read_only=False)) as url,
            browser() as chromium,
        ):
            await wait_for_row(pool, job_id, status="parked")
            page = await chromium.new_page(viewport={"width": 1280, "height": 900})
            await page.goto(f"{url}/jobs/{job_id}")
            await expect(page.locator("#wait")).to_have_text(
                "signal approval (no timeout)", timeout=WAIT_MS
            )
            await expect(page.locator("#progress")).to_contain_text("50%")
            await expect(page.locator("#steps tbody tr")).to_have_count(2)
            await expect(page.locator("#steps")).to_contain_text(HOSTILE_TYPE)
            assert await page.evaluate(INJECTED) == []
            await page.get_by_role("button", name="Send signal").click()
            await expect(page.get_by_label("Signal name")).to_have_value("approval")
            await page.get_by_label("Payload (JSON; empty: null)").fill(
                '{"approved": true, "by": "ops"}'
            )
            await page.get_by_role("button", name="Send signal").click()
            await expect(page.get_by_role("status")).to_contain_text("Signal sent")
            done = await wait_for_row(pool, job_id, status="completed")
            assert json.loads(done["result"]) == {"approved": True, "by": "ops"}
            await page.reload()
            await expect(page.locator("#signals tbody tr")).to_have_count(1)
            await expect(page.locator("#wait")).to_have_count(0)
