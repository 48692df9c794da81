"""The trend page and a job's workflow graph in Chromium (and their screenshots, with ``PGQUEUE_SCREENSHOTS=1``)."""

from __future__ import annotations

import anyio
import asyncpg

import pgqueue
from pgqueue.web import create_app
from tests.test_web_browser import WAIT_MS, browser, expect, serving, shot


async def an_hour_of_work(pool: asyncpg.Pool) -> None:
    """Real workers' runs, their minutes moved back five at a time: a chart of the last hour."""
    queue = pgqueue.Queue(pool, name="emails")
    for round_ in range(11):
        jobs = 8 + (round_ * 7) % 13
        attempts = 1 if round_ % 4 == 0 else 5
        await queue.enqueue_many(
            [
                pgqueue.NewJob(
                    "send_welcome_email",
                    {"n": n, "fail": n % 9 == round_ % 9},
                    max_attempts=attempts,
                )
                for n in range(jobs)
            ]
        )
        worker = pgqueue.Worker(
            pool, queue="emails", concurrency=8, backoff=lambda _: 0.0
        )

        @worker.handler("send_welcome_email")
        async def send(job: pgqueue.Job) -> None:
            await anyio.sleep(0.002 * (1 + job.payload["n"] % 5))
            if job.payload["fail"] and job.attempts == 1:
                raise RuntimeError("smtp: 421 try again later")

        await worker.run(until_empty=True)
        # Through a century away: moved in one statement, a row could land on
        # the minute of another not yet moved (the key is checked row by row).
        for shift in (
            "- interval '100 years'",
            "+ interval '100 years' - interval '5 minutes'",
        ):
            await pool.execute(
                f"UPDATE pgqueue_trend SET bucket = bucket {shift} WHERE queue = 'emails'"
            )


async def test_the_trend_page_in_a_browser(fresh_dsn: str) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=6) as pool:
        await an_hour_of_work(pool)
        rows = await pgqueue.Admin(pool).trend(queue="emails")
        async with serving(create_app(pool)) as url, browser() as chromium:
            page = await chromium.new_page(viewport={"width": 1100, "height": 800})
            await page.goto(f"{url}/trend?queue=emails")
            chart = page.locator("#trend-counts")
            await expect(chart).to_be_visible(timeout=WAIT_MS)
            steps = page.locator("#trend-counts g.step")
            await expect(steps).to_have_count(11, timeout=WAIT_MS)
            drawn = [
                await steps.nth(i).get_attribute("data-completed") for i in range(11)
            ]
            assert sum(int(n or 0) for n in drawn) == sum(r.completed for r in rows)
            await expect(page.locator("#trend-run-times circle")).to_have_count(11)
            await expect(page.locator("#trend tbody tr")).to_have_count(1)
            await shot(page, "trend")
            # The type's page, from the table's link.
            await page.get_by_role("link", name="send_welcome_email").click()
            await expect(page).to_have_url(
                f"{url}/trend?queue=emails&type=send_welcome_email&since=1h"
            )
            await expect(steps).to_have_count(11)


async def test_a_workflow_in_a_browser(fresh_dsn: str) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=6) as pool:
        queue = pgqueue.Queue(pool, name="reports")
        parts = [await queue.enqueue("build_part", {"part": n}) for n in range(14)]
        statuses = ["completed"] * 10 + ["running"] * 2 + ["pending"] * 2
        for job_id, status in zip(parts, statuses, strict=True):
            await pool.execute(
                "UPDATE pgqueue_jobs SET status = $2 WHERE id = $1", job_id, status
            )
        join = await queue.enqueue("merge_report", {}, after=parts)
        await queue.enqueue_many(
            [pgqueue.NewJob("email_report", {"to": n}, after=[join]) for n in range(3)]
        )
        async with serving(create_app(pool)) as url, browser() as chromium:
            page = await chromium.new_page(viewport={"width": 1100, "height": 800})
            await page.goto(f"{url}/jobs/{join}")
            graph = page.locator("#workflow")
            await expect(graph).to_be_visible(timeout=WAIT_MS)
            await expect(graph.locator("g[data-role=parent]")).to_have_count(14)
            await expect(graph.locator("g[data-role=child]")).to_have_count(3)
            running = graph.locator("g[data-role=parent][data-status=running]")
            await expect(running).to_have_count(2)
            job = graph.locator("g[data-role=job][data-status=waiting]")
            await expect(job).to_have_count(1)
            await graph.scroll_into_view_if_needed()
            await shot(page, "workflow")
            await graph.locator(f"g[data-job-id='{parts[11]}']").click()
            await expect(page).to_have_url(f"{url}/jobs/{parts[11]}")
