"""The web dashboard over HTTP (httpx's ASGI transport), against a real server.

Every page, the filters and keyset pages of the listing, the actions behind
their confirmation and CSRF guards, read-only mode, hidden payloads, bad input
(400/404, never 500) and mounting under a prefix. The browser drives the same
app in test_web_browser.py.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
from html import unescape
from typing import TYPE_CHECKING, Any

import anyio
import asyncpg
import httpx
import pytest
from asgi_lifespan import LifespanManager
from starlette.applications import Starlette
from starlette.routing import Mount

import pgqueue
from pgqueue import _admin
from pgqueue._sql.leases import SEED_LIMIT
from pgqueue.web import create_app
from tests.helpers import row

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from starlette.types import ASGIApp

BASE = "http://localhost"  # a name the dashboard answers to by default


@contextlib.asynccontextmanager
async def client(app: ASGIApp) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=BASE) as c:
        yield c


async def seed(pool: asyncpg.Pool, queue: str) -> dict[str, list[int]]:
    """Jobs of ``queue`` in every status: 3 ready, 1 scheduled, 1 running, 2 completed, 2 dead, 1 cancelled."""
    q = pgqueue.Queue(pool, name=queue)
    later = await pool.fetchval("SELECT now() + interval '1 hour'")
    ids: dict[str, list[int]] = {
        "ready": [await q.enqueue("mail", {"n": n}) for n in range(3)],
        "scheduled": [await q.enqueue("mail", {"n": 9}, run_at=later)],
    }
    for status, n, kind in (
        ("running", 1, "report"),
        ("completed", 2, "mail"),
        ("dead", 2, "report"),
        ("cancelled", 1, "mail"),
    ):
        made = [await q.enqueue(kind, {"n": i}) for i in range(n)]
        await pool.execute(
            "UPDATE pgqueue_jobs SET status = $2, attempts = 3, max_attempts = 3,"
            " last_error = CASE WHEN $2 = 'dead' THEN 'ValueError: boom\n  at line 2' END,"
            " result = CASE WHEN $2 = 'completed' THEN '{\"ok\": true}'::jsonb END"
            " WHERE id = ANY($1::bigint[])",
            made,
            status,
        )
        ids[status] = made
    return ids


def cells(page: str, queue: str) -> dict[str, str]:
    """The queues table's row of ``queue``: field -> shown text."""
    found = re.search(rf'<tr data-queue="{re.escape(queue)}">(.*?)</tr>', page, re.S)
    assert found, f"no row for {queue}"
    return {
        field: unescape(re.sub(r"<[^>]+>", "", text)).strip()
        for field, text in re.findall(
            r'data-field="([a-z_]+)"[^>]*>(.*?)</t[dh]>', found[1], re.S
        )
    }


def words(page: str) -> str:
    """The page's text, tags dropped and white space collapsed."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", page)).split())


def listed_ids(page: str) -> list[int]:
    return [int(i) for i in re.findall(r'<tr data-id="(\d+)">', page)]


def token_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert found, "no token on the page"
    return found[1]


def buttons(page: str) -> list[str]:
    return [unescape(b) for b in re.findall(r"<button[^>]*>([^<]*)</button>", page)]


# --- pages -----------------------------------------------------------------------------


@pytest.fixture
def exact_completed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Count completed jobs exactly, however large the session's shared table has grown.

    Past 10 MB the queues page estimates them (tested in test_admin_plans);
    these tests read their own queue's exact counts.
    """
    monkeypatch.setattr(_admin, "EXACT_COMPLETED_PAGES", 2**62)


@pytest.mark.usefixtures("exact_completed")
async def test_queues_page_counts_each_status_and_lag(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await seed(pool, queue_name)
    await pgqueue.Queue(pool, name=queue_name).enqueue("mail", {}, after=ids["running"])
    limited = f"{queue_name}-limited"
    await pgqueue.Queue(pool, name=limited).enqueue("t", {})
    await pool.execute(SEED_LIMIT, limited, 4)
    # One worker's lease holds a slot; an expired one counts for nothing.
    await pool.execute(
        "INSERT INTO pgqueue_leases (queue, worker, slots, wanted, expires_at)"
        " VALUES ($1, 'a', 1, 3, now() + interval '1 minute'),"
        " ($1, 'b', 2, 3, now() - interval '1 second')",
        limited,
    )
    async with client(create_app(pool)) as c:
        # The queues whose name holds ours: the table holds other tests' too.
        page = await c.get("/", params={"queue": queue_name})
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        row_ = cells(page.text, queue_name)
        assert {k: row_[k] for k in ("ready", "scheduled", "running", "completed")} == {
            "ready": "3",
            "scheduled": "1",
            "running": "1",
            "completed": "2",
        }
        assert (row_["dead"], row_["cancelled"], row_["slots"]) == ("2", "1", "-")
        assert (row_["waiting"], cells(page.text, limited)["waiting"]) == ("1", "0")
        assert row_["lag"].endswith("s")
        assert cells(page.text, limited)["slots"] == "1 of 4"
        # Each count links to the listing it counts.
        assert f'href="/jobs?queue={queue_name}&amp;status=dead"' in page.text
        assert 'src="/static/pgqueue.js?v=' in page.text

        assert f'data-src="/fragments/queues?queue={queue_name}"' in page.text
        fragment = await c.get("/fragments/queues", params={"queue": queue_name})
        assert fragment.status_code == 200
        assert cells(fragment.text, queue_name)["ready"] == "3"
        # The job tables: each job's link, queue and type, then its own columns.
        running, dead = fragment.text.split("<h2>Latest dead</h2>")
        assert "<h2>Longest running</h2>" in running
        for job_id in ids["running"]:
            assert f'<a href="/jobs/{job_id}">{job_id}</a>' in running
        assert "Running for</th>" in running
        assert " ago</td>" in running
        assert f'<a href="/jobs/{ids["dead"][-1]}">' in dead
        assert "Last error</th>" in dead
        assert '<td class="error">' in dead
        frame = (await c.get("/api/frame", params={"queue": queue_name})).json()
        [ours] = [q for q in frame["queues"] if q["queue"] == queue_name]
        assert (ours["ready"], ours["dead"], ours["global_limit"]) == (3, 2, None)

        for name in ("pgqueue.js", "pgqueue.css"):
            asset = await c.get(f"/static/{name}")
            assert asset.status_code == 200
            assert "charset=utf-8" in asset.headers["content-type"]


@pytest.mark.usefixtures("exact_completed")
async def test_the_finished_rate_appears_once_jobs_finish(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    ids = await queue.enqueue_many([("t", {})] * 4)
    app = create_app(pool)
    async with client(app) as c:
        mine = {"queue": queue.name}
        first = cells((await c.get("/", params=mine)).text, queue.name)
        assert first["finished_per_second"] == "-"  # no earlier frame to compare with
        await pool.execute(
            "UPDATE pgqueue_jobs SET status = 'completed' WHERE id = ANY($1::bigint[])",
            ids,
        )
        with anyio.fail_after(10):
            while True:  # frames are shared for a second: wait for a fresh one
                fragment = await c.get("/fragments/queues", params=mine)
                later = cells(fragment.text, queue.name)
                if later["ready"] == "0":
                    break
        assert float(later["finished_per_second"]) > 0


async def test_jobs_listing_filters_newest_first(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await seed(pool, queue_name)
    async with client(create_app(pool)) as c:
        everything = await c.get("/jobs", params={"queue": queue_name})
        assert everything.status_code == 200
        all_ids = sorted((i for group in ids.values() for i in group), reverse=True)
        assert listed_ids(everything.text) == all_ids

        dead = await c.get("/jobs", params={"queue": queue_name, "status": "dead"})
        assert listed_ids(dead.text) == sorted(ids["dead"], reverse=True)
        # Each row: id link, type, status, attempts/max, run_at, first line of the error.
        assert f'href="/jobs/{ids["dead"][0]}"' in dead.text
        assert "3/3" in dead.text
        assert "ValueError: boom" in dead.text
        assert "at line 2" not in dead.text
        assert "<time datetime=" in dead.text

        typed = await c.get(
            "/jobs", params={"queue": queue_name, "type": "report", "status": ""}
        )
        assert listed_ids(typed.text) == sorted(
            ids["running"] + ids["dead"], reverse=True
        )
        ready = await c.get("/jobs", params={"queue": queue_name, "status": "ready"})
        assert listed_ids(ready.text) == sorted(ids["ready"], reverse=True)
        none = await c.get("/jobs", params={"queue": f"{queue_name}-none"})
        assert "No jobs match." in none.text


async def test_jobs_listing_pages_by_keyset(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await pgqueue.Queue(pool, name=queue_name).enqueue_many([("t", {})] * 7)
    seen: list[int] = []
    async with client(create_app(pool, page_size=3)) as c:
        url: str | None = f"/jobs?queue={queue_name}"
        pages = 0
        while url is not None:
            page = await c.get(url)
            assert page.status_code == 200
            seen += listed_ids(page.text)
            pages += 1
            older = re.search(r'<a href="([^"]+)" rel="next">Older</a>', page.text)
            url = unescape(older[1]) if older else None
            if url is not None:
                assert f"before={seen[-1]}" in url  # a keyset cursor, never an offset
                assert f"queue={queue_name}" in url
        assert pages == 3
        assert seen == sorted(ids, reverse=True)
        last = await c.get(f"/jobs?queue={queue_name}&before={seen[-1]}")
        assert "No jobs match." in last.text
        assert ">Newest</a>" in last.text


def page_link(page: str, label: str) -> str | None:
    """The href of the listing's ``label`` link (Newest, Newer, Older), if shown."""
    found = re.search(rf'<a href="([^"]+)"[^>]*>{label}</a>', page)
    return unescape(found[1]) if found else None


async def test_jobs_listing_goes_back_newer_by_keyset(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await pgqueue.Queue(pool, name=queue_name).enqueue_many([("t", {})] * 8)
    newest_first = sorted(ids, reverse=True)
    async with client(create_app(pool, page_size=3)) as c:
        first = (await c.get(f"/jobs?queue={queue_name}")).text
        assert listed_ids(first) == newest_first[:3]
        assert page_link(first, "Newer") is None
        assert page_link(first, "Newest") is None
        older = page_link(first, "Older")
        assert older is not None
        middle = (await c.get(older)).text
        assert listed_ids(middle) == newest_first[3:6]
        older = page_link(middle, "Older")
        assert older is not None
        last = (await c.get(older)).text
        assert listed_ids(last) == newest_first[6:]
        assert page_link(last, "Older") is None

        newer = page_link(last, "Newer")
        assert newer is not None
        assert f"after={newest_first[6]}" in newer  # a keyset cursor, never an offset
        assert f"queue={queue_name}" in newer
        again = (await c.get(newer)).text
        assert listed_ids(again) == listed_ids(middle)
        assert page_link(again, "Older") == page_link(middle, "Older")
        assert page_link(again, "Newest") == f"/jobs?queue={queue_name}"
        # Up once more: the first page's jobs, with nothing newer.
        newer = page_link(again, "Newer")
        assert newer is not None
        top = (await c.get(newer)).text
        assert listed_ids(top) == listed_ids(first)
        assert page_link(top, "Newer") is None
        assert page_link(top, "Older") == page_link(first, "Older")


async def test_job_page_shows_every_field(pool: asyncpg.Pool, queue_name: str) -> None:
    ids = await seed(pool, queue_name)
    dead, done = ids["dead"][0], ids["completed"][0]
    await pool.execute(
        "UPDATE pgqueue_jobs SET priority = 2, unique_key = 'k-1' WHERE id = $1", dead
    )
    async with client(create_app(pool)) as c:
        page = (await c.get(f"/jobs/{dead}")).text
        assert f"<h1>Job {dead}</h1>" in page
        text = unescape(re.sub(r"<[^>]+>", " ", page))
        for fact in ("Attempts", "3 of 3", "Priority", "Unique key", "k-1", "report"):
            assert fact in text, fact
        for stamp in ("Run at", "Created", "Updated", "Completed"):
            assert stamp in text
        assert "ValueError: boom\n  at line 2" in text  # the whole error
        assert '"n": 0' in text  # the payload
        result = unescape((await c.get(f"/jobs/{done}")).text)
        assert '"ok": true' in result


async def test_a_periodic_job_shows_its_schedule_and_tick(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    name = f"nightly-{queue_name}"
    await pool.execute(
        "INSERT INTO pgqueue_periodic (name, schedule, queue, job_type, last_tick, next_tick)"
        " VALUES ($1, '0 3 * * *', $2, 'report', '2026-01-01 03:00+00', '2026-01-02 03:00+00')",
        name,
        queue_name,
    )
    job_id = await pgqueue.Queue(pool, name=queue_name).enqueue("report", {})
    await pool.execute(
        "UPDATE pgqueue_jobs SET unique_key = $2 WHERE id = $1",
        job_id,
        f"periodic:{name}@2026-01-01T03:00:00+00:00",
    )
    async with client(create_app(pool)) as c:
        text = words((await c.get(f"/jobs/{job_id}")).text)
        assert f"Periodic schedule {name} (0 3 * * *)" in text
        assert "Tick 2026-01-01 03:00:00 UTC" in text
        periodic = await c.get("/periodic")
        assert periodic.status_code == 200
        shown = words(periodic.text)
        assert name in shown
        assert "0 3 * * *" in shown
        assert "2026-01-01 03:00:00 UTC" in shown  # last tick
        assert "2026-01-02 03:00:00 UTC" in shown  # next tick


async def test_values_are_escaped(pool: asyncpg.Pool, queue_name: str) -> None:
    evil = "<script>alert(1)</script>"
    job_id = await pgqueue.Queue(pool, name=queue_name).enqueue(evil, {"x": evil})
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'dead', last_error = $2 WHERE id = $1",
        job_id,
        evil,
    )
    async with client(create_app(pool)) as c:
        for path in (
            f"/jobs/{job_id}",
            f"/jobs?queue={queue_name}",
            f"/jobs?type={evil}",
            "/",
        ):
            page = (await c.get(path)).text
            assert "<script>alert" not in page, path
        assert (
            "&lt;script&gt;alert(1)&lt;/script&gt;"
            in (await c.get(f"/jobs/{job_id}")).text
        )


async def test_a_time_python_cannot_represent_is_shown_not_a_500(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    bc = await pool.fetchval(
        "INSERT INTO pgqueue_jobs (queue, job_type, status, run_at, created_at)"
        " VALUES ($1, 't', 'dead', '0044-03-15 BC', '12000-01-01') RETURNING id",
        queue_name,
    )
    async with client(create_app(pool)) as c:
        for path in ("/", f"/jobs?queue={queue_name}&status=dead", f"/jobs/{bc}"):
            answer = await c.get(path)
            assert answer.status_code == 200, path
        text = words((await c.get(f"/jobs/{bc}")).text)
        assert "Run at -infinity" in text
        assert "Created infinity" in text


async def test_bad_ids_and_filters_are_404_and_400(pool: asyncpg.Pool) -> None:
    async with client(create_app(pool, read_only=False)) as c:
        for path in (
            "/jobs/abc",
            "/jobs/0",
            "/jobs/-1",
            "/jobs/1.5",
            "/jobs/99999999999999999999999",
            "/jobs/9223372036854775807",
            "/jobs/%C2%B2",  # a superscript two: a digit to str.isdigit, not to int()
            "/jobs/abc/retry",
            "/jobs/9223372036854775806/cancel",
            "/static/nope.css",
            "/nowhere",
        ):
            answer = await c.get(path)
            assert answer.status_code == 404, path
            assert "<h1>Not found</h1>" in answer.text
        for query in (
            "status=bogus",
            "queue=a%00b",
            "type=%00",
            "before=abc",
            "before=0",
            "before=-5",
            "after=abc",
            "after=0",
            "before=5&after=3",
            f"queue={'x' * 2000}",
        ):
            answer = await c.get(f"/jobs?{query}")
            assert answer.status_code == 400, query
        answer = await c.get("/retry-all?queue=a%00")
        assert answer.status_code == 400
        for path in ("/", "/fragments/queues", "/api/frame"):
            for query in ("queue=a%00b", "queue=%1B", f"queue={'x' * 2000}"):
                answer = await c.get(f"{path}?{query}")
                assert answer.status_code == 400, (path, query)


# --- actions ---------------------------------------------------------------------------


async def test_read_only_shows_no_actions_and_refuses_them(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await seed(pool, queue_name)
    dead, ready = ids["dead"][0], ids["ready"][0]
    before = await row(pool, dead)
    async with client(create_app(pool)) as c:
        for path in (
            f"/jobs/{dead}",
            f"/jobs/{ready}",
            f"/jobs?queue={queue_name}&status=dead",
        ):
            page = (await c.get(path)).text
            assert set(buttons(page)) <= {"Filter"}, path
            assert "read-only" in page
        for path in (f"/jobs/{dead}/retry", f"/jobs/{ready}/cancel", "/retry-all"):
            assert (await c.get(path)).status_code == 403
            forged = await c.post(
                path,
                data={"csrf": "0" * 64},
                headers={"origin": BASE, "sec-fetch-site": "same-origin"},
            )
            assert forged.status_code == 403, path
    assert await row(pool, dead) == before
    assert (await row(pool, ready))["status"] == "pending"


async def test_retry_asks_then_keeps_attempts_and_raises_max_attempts(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await seed(pool, queue_name)
    dead = ids["dead"][0]
    async with client(create_app(pool, read_only=False)) as c:
        page = (await c.get(f"/jobs/{dead}")).text
        assert buttons(page) == ["Retry"]
        confirm = await c.get(f"/jobs/{dead}/retry")
        assert confirm.status_code == 200
        assert buttons(confirm.text) == ["Retry"]
        assert (await row(pool, dead))["status"] == "dead"  # asking changes nothing
        done = await c.post(
            f"/jobs/{dead}/retry",
            data={"csrf": token_of(confirm.text)},
            headers={"origin": BASE, "sec-fetch-site": "same-origin"},
        )
        assert done.status_code == 303
        assert done.headers["location"] == f"/jobs/{dead}?done=retried"
        after = await c.get(done.headers["location"])
        assert "Retried: the job is pending again" in after.text
    retried = await row(pool, dead)
    assert (retried["status"], retried["attempts"], retried["max_attempts"]) == (
        "pending",
        3,
        6,
    )


async def test_cancel_asks_then_cancels_a_pending_job_and_requests_a_running_one(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await seed(pool, queue_name)
    pending, running = ids["ready"][0], ids["running"][0]
    async with client(create_app(pool, read_only=False)) as c:
        for job_id, said, shown in (
            (pending, "cancelled", ["Edit", "Cancel"]),
            (running, "requested", ["Cancel"]),
        ):
            assert buttons((await c.get(f"/jobs/{job_id}")).text) == shown
            confirm = await c.get(f"/jobs/{job_id}/cancel")
            assert buttons(confirm.text) == ["Cancel"]
            done = await c.post(
                f"/jobs/{job_id}/cancel", data={"csrf": token_of(confirm.text)}
            )
            assert done.status_code == 303
            assert done.headers["location"] == f"/jobs/{job_id}?done={said}"
        # A job that finished has no Cancel button.
        assert buttons((await c.get(f"/jobs/{ids['completed'][0]}")).text) == []
    assert (await row(pool, pending))["status"] == "cancelled"
    assert (await row(pool, running))["cancel_requested"] is True


async def test_retry_all_retries_the_dead_jobs_of_the_filter(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await seed(pool, queue_name)
    other = f"{queue_name}-other"
    elsewhere = await pgqueue.Queue(pool, name=other).enqueue("report", {})
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'dead' WHERE id = $1", elsewhere
    )
    async with client(create_app(pool, read_only=False)) as c:
        listing = await c.get(f"/jobs?queue={queue_name}&status=dead")
        bulk = ["Retry…", "Cancel…", "Delete…", "Redrive…", "Move…"]
        assert buttons(listing.text) == ["Filter", *bulk, "Retry all"]
        assert buttons((await c.get(f"/jobs?queue={queue_name}")).text) == [
            "Filter",
            *bulk,
        ]
        confirm = await c.get(f"/retry-all?queue={queue_name}&type=report")
        assert "Retry all 2 dead jobs of queue" in unescape(confirm.text)
        assert buttons(confirm.text) == ["Retry all"]
        done = await c.post(
            "/retry-all",
            data={
                "csrf": token_of(confirm.text),
                "queue": queue_name,
                "type": "report",
            },
        )
        assert done.status_code == 303
        location = done.headers["location"]
        assert location.startswith("/jobs?")
        assert "retried=2" in location
        assert "Retried 2 dead jobs." in (await c.get(location)).text
    for job_id in ids["dead"]:
        assert (await row(pool, job_id))["status"] == "pending"
    assert (await row(pool, elsewhere))["status"] == "dead"


async def test_actions_refuse_forged_requests(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await seed(pool, queue_name)
    dead = ids["dead"][0]
    app = create_app(pool, read_only=False, secret="s3cret-of-16-bytes")
    async with client(app) as c:
        token = token_of((await c.get(f"/jobs/{dead}/retry")).text)
        path = f"/jobs/{dead}/retry"
        refused: list[dict[str, Any]] = [
            {"data": {}},
            {"data": {"csrf": "0" * 64}},
            {"data": {"csrf": token}, "headers": {"sec-fetch-site": "cross-site"}},
            {"data": {"csrf": token}, "headers": {"sec-fetch-site": "same-site"}},
            {"data": {"csrf": token}, "headers": {"origin": "https://evil.example"}},
            {"data": {"csrf": token}, "headers": {"origin": "null"}},
        ]
        for request in refused:
            answer = await c.post(path, **request)
            assert answer.status_code == 403, request
        as_json = await c.post(path, json={"csrf": token})
        assert as_json.status_code == 403
        assert (await row(pool, dead))["status"] == "dead"
        # Another app with the same secret accepts the token: processes agree.
        twin = create_app(pool, read_only=False, secret="s3cret-of-16-bytes")
    async with client(twin) as c:
        done = await c.post(path, data={"csrf": token})
        assert done.status_code == 303
    assert (await row(pool, dead))["status"] == "pending"


async def test_a_trusted_origin_may_act_with_the_token(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await seed(pool, queue_name)
    dead = ids["dead"][0]
    path = f"/jobs/{dead}/retry"
    proxied = {"origin": "https://ops.example.com", "sec-fetch-site": "same-origin"}
    async with client(create_app(pool, read_only=False)) as c:
        token = token_of((await c.get(path)).text)
        # Behind a proxy that rewrites Host, the Origin is foreign to the app.
        answer = await c.post(path, data={"csrf": token}, headers=proxied)
        assert answer.status_code == 403
    assert (await row(pool, dead))["status"] == "dead"
    app = create_app(
        pool,
        read_only=False,
        trusted_origins=["https://OPS.example.com:443", "http://10.0.0.5:8080"],
    )
    async with client(app) as c:
        token = token_of((await c.get(path)).text)
        refused: list[dict[str, Any]] = [
            {"data": {}, "headers": proxied},
            {"data": {"csrf": "0" * 64}, "headers": proxied},
            {"data": {"csrf": token}, "headers": {"origin": "https://evil.example"}},
            {"data": {"csrf": token}, "headers": {"origin": "http://ops.example.com"}},
        ]
        for request in refused:
            answer = await c.post(path, **request)
            assert answer.status_code == 403, request
        assert (await row(pool, dead))["status"] == "dead"
        done = await c.post(path, data={"csrf": token}, headers=proxied)
        assert done.status_code == 303
        assert done.headers["location"] == f"/jobs/{dead}?done=retried"
    assert (await row(pool, dead))["status"] == "pending"


async def test_show_payloads_false_hides_payloads_results_and_checkpoints(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    q = pgqueue.Queue(pool, name=queue_name)
    done, running_id = await q.enqueue_many(
        [("t", {"email": "someone@example.com"}), ("t", {})]
    )
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed', result = '{\"card\": \"4111\"}'"
        " WHERE id = $1",
        done,
    )
    # A running job's checkpoint, which the live frames carry as its progress.
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'running', attempts = 1, claimed_at = now(),"
        ' checkpoint = \'{"card": "4112"}\' WHERE id = $1',
        running_id,
    )
    mine = {"queue": queue_name}
    async with client(create_app(pool, show_payloads=False)) as c:
        page = await c.get(f"/jobs/{done}")
        assert page.status_code == 200
        assert "someone@example.com" not in page.text
        assert "4111" not in page.text
        assert "Hidden" in page.text
        frame = (await c.get("/api/frame", params=mine)).json()
        [running_job] = frame["longest_running"]
        assert (running_job["id"], running_job["progress"]) == (running_id, None)
        for path in ("/", "/fragments/queues", "/api/frame", f"/jobs/{running_id}"):
            answer = await c.get(path, params=mine)
            assert answer.status_code == 200, path
            assert "4112" not in answer.text, path
    async with client(create_app(pool)) as c:  # shown unless hidden
        assert "someone@example.com" in (await c.get(f"/jobs/{done}")).text
        frame = (await c.get("/api/frame", params=mine)).json()
        assert "4112" in frame["longest_running"][0]["progress"]
        assert "4112" in (await c.get(f"/jobs/{running_id}")).text


async def test_mounted_under_a_prefix_every_link_keeps_it(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await seed(pool, queue_name)
    dead = ids["dead"][0]
    outer = Starlette(routes=[Mount("/ops/pgqueue", create_app(pool, read_only=False))])
    async with client(outer) as c:
        page = await c.get("/ops/pgqueue/")
        assert page.status_code == 200
        links = re.findall(r'(?:href|src|action|data-src)="([^"]+)"', page.text)
        local = [link for link in links if link.startswith("/")]
        assert local
        assert all(link.startswith("/ops/pgqueue/") for link in local), local
        for link in local:  # every page and file it links to is there
            assert (await c.get(unescape(link))).status_code == 200, link
        listing = await c.get(f"/ops/pgqueue/jobs?queue={queue_name}&status=dead")
        assert f'href="/ops/pgqueue/jobs/{dead}"' in listing.text
        assert 'action="/ops/pgqueue/retry-all"' in listing.text
        confirm = await c.get(f"/ops/pgqueue/jobs/{dead}/retry")
        assert f'action="/ops/pgqueue/jobs/{dead}/retry"' in confirm.text
        done = await c.post(
            f"/ops/pgqueue/jobs/{dead}/retry", data={"csrf": token_of(confirm.text)}
        )
        assert done.headers["location"] == f"/ops/pgqueue/jobs/{dead}?done=retried"
        assert (await c.get("/ops/pgqueue/jobs/abc")).status_code == 404


async def test_a_dsn_app_opens_its_own_pool_and_closes_it(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    await queue.enqueue("t", {})
    app = create_app(dsn)
    async with LifespanManager(app), client(app) as c:
        page = await c.get("/", params={"queue": queue.name})
        assert cells(page.text, queue.name)["ready"] == "1"
        backends = await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        )
    after = await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    )
    assert after < backends


def test_create_app_checks_its_arguments(pool: asyncpg.Pool) -> None:
    with pytest.raises(TypeError):
        create_app(42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dsn"):
        create_app("")
    with pytest.raises(ValueError, match="poll_interval"):
        create_app(pool, poll_interval=0)
    with pytest.raises(ValueError, match="page_size"):
        create_app(pool, page_size=0)
    with pytest.raises(ValueError, match="secret"):
        create_app(pool, secret=b"")
    for origin in ("ops.example.com", "https://ops.example.com/", "null", ""):
        with pytest.raises(ValueError, match="trusted_origins"):
            create_app("postgresql://nowhere.invalid/db", trusted_origins=[origin])
    with pytest.raises(TypeError, match="trusted_origins"):
        create_app(pool, trusted_origins="https://ops.example.com")


async def test_a_missing_schema_is_a_503_naming_the_fix(fresh_dsn: str) -> None:
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=2) as pool:
        await pgqueue.uninstall(pool)
        async with client(create_app(pool)) as c:
            for path in ("/", "/jobs", "/jobs/1"):
                answer = await c.get(path)
                assert answer.status_code == 503, path
                assert "pgqueue.SCHEMA" in answer.text


# --- pgqueue web -----------------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(dsn: str, *options: str) -> AsyncIterator[tuple[str, str]]:
    """``pgqueue web`` on a free port: its address and the line it printed."""
    command = [sys.executable, "-m", "pgqueue", "web", "--dsn", dsn, "--port", "0"]
    process = await anyio.open_process([*command, *options], stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        with anyio.fail_after(20):
            line = b""
            while not line.endswith(b"\n"):
                line += await process.stdout.receive(1)
        found = re.search(r"http://127\.0\.0\.1:(\d+)/", line.decode())
        assert found, line
        yield f"http://127.0.0.1:{found[1]}", line.decode()
    finally:
        process.send_signal(signal.SIGINT)
        with anyio.fail_after(10):
            await process.wait()


async def test_pgqueue_web_serves_read_only_on_localhost(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("t", {})
    async with serving(dsn) as (url, line):
        assert "(read-only)" in line
        async with httpx.AsyncClient(base_url=url) as c:
            page = await c.get("/", params={"queue": queue.name})
            assert page.status_code == 200
            assert queue.name in page.text
            assert (await c.post(f"/jobs/{job_id}/cancel")).status_code == 403
    assert (await row(pool, job_id))["status"] == "pending"


async def test_pgqueue_web_accepts_actions_from_a_trusted_origin(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("t", {})
    options = ["--allow-actions", "--trusted-origin", "https://ops.example.com"]
    async with serving(dsn, *options) as (url, line):
        assert "(actions enabled)" in line
        path = f"/jobs/{job_id}/cancel"
        async with httpx.AsyncClient(base_url=url) as c:
            form = {"csrf": token_of((await c.get(path)).text)}
            evil = {"origin": "https://evil.example"}
            assert (await c.post(path, data=form, headers=evil)).status_code == 403
            ops = {"origin": "https://ops.example.com"}
            assert (await c.post(path, data=form, headers=ops)).status_code == 303
    assert (await row(pool, job_id))["status"] == "cancelled"


def test_pgqueue_web_says_why_it_cannot_listen() -> None:
    taken = subprocess.run(
        [sys.executable, "-m", "pgqueue", "web", "--port", "70000"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert taken.returncode == 2
    assert "--port must be from 0 to 65535" in taken.stderr
    untrusted = subprocess.run(
        [sys.executable, "-m", "pgqueue", "web", "--trusted-origin", "ops.example.com"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert untrusted.returncode == 2
    assert "'ops.example.com' is not an origin" in untrusted.stderr


async def test_job_page_links_parents_and_children(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    queue = pgqueue.Queue(pool, name=queue_name)
    parent, gone = [await queue.enqueue("t", {}) for _ in range(2)]
    children = await queue.enqueue_many(
        [pgqueue.NewJob("t", {}, after=[parent, gone]) for _ in range(53)]
    )
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed' WHERE id = $1", gone
    )
    await pool.execute("DELETE FROM pgqueue_jobs WHERE id = $1", gone)
    async with client(create_app(pool)) as c:
        page = (await c.get(f"/jobs/{parent}")).text
        assert "<h2>Dependencies</h2>" in page
        linked = re.findall(r'<a href="/jobs/(\d+)">\1</a>', page)
        assert [int(i) for i in linked] == sorted(children)[:50]
        assert "And 3 more (the first 50 by id are shown)." in page
        assert 'id="parents"' not in page
        page = (await c.get(f"/jobs/{children[0]}")).text
        parents = page[page.index('<ul id="parents"') :]
        parents = parents[: parents.index("</ul>")]
        assert re.findall(r'<a href="/jobs/(\d+)">', parents) == [str(parent)]
        assert "status-pending" in parents
        assert f"<li>{gone} (deleted)</li>" in parents  # no link to a deleted job
        assert 'id="children"' not in page
    # Mounted under a prefix, the links keep it.
    app = Starlette(routes=[Mount("/admin/queues", app=create_app(pool))])
    async with client(app) as c:
        page = (await c.get(f"/admin/queues/jobs/{children[0]}")).text
        assert f'<a href="/admin/queues/jobs/{parent}">{parent}</a>' in page
