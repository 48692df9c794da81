"""The dashboard's rendering: pages stay small whatever the jobs hold, and say what they show.

Against ``pgqueue web`` as a process, over HTTP, reading the database through
a TCP proxy that counts the bytes it sends: a listing, the queues page and
its live refresh read no payload or result and only the head of an error; a
job's page reads a bounded head of each. Hostile values in a real browser
are in test_web_browser.py.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path

import anyio
import asyncpg
import httpx
import pytest

import pgqueue
import pgqueue.web
from pgqueue._sql.listings import ERROR_LINE_CHARS
from tests.tcp_proxy import proxy_to, via
from tests.test_web import serving, words

SMALL = 300_000
"""Bytes: the most a listing, the queues page or its refresh may weigh."""
JOB_PAGE = 1_500_000
"""Bytes: the most a job's page may weigh."""
SECONDS = 10
"""The most a page may take, on a shared test machine."""

# 5,000,000 characters (6.25 MB of UTF-8) that escaping makes longer still:
# the JSON text writes each quote as \", and HTML each of < " & as an entity.
_BIG = "jsonb_build_object('blob', repeat('<\"&é', 1250000))"
# A one-line error of 1,050,000 characters, then a traceback.
_ERROR = "repeat('E<\"', 350000) || E'\\n  File \"app.py\", line 1'"


async def _seed_big(pool: asyncpg.Pool, queue: str) -> dict[str, list[int]]:
    rows = await pool.fetch(
        "INSERT INTO pgqueue_jobs (queue, job_type, status, attempts, max_attempts,"
        "                          payload, result, last_error)"
        f" SELECT $1, 'report', s, 3, 3, {_BIG}, {_BIG}, {_ERROR}"
        " FROM unnest($2::text[]) AS s RETURNING id, status",
        queue,
        ["dead"] * 6 + ["completed", "pending", "running"],
    )
    found: dict[str, list[int]] = {}
    for row in rows:
        found.setdefault(row["status"], []).append(row["id"])
    return found


@pytest.mark.slow
async def test_pages_stay_small_however_large_the_jobs(fresh_dsn: str) -> None:
    queue = "big"
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=2) as pool:
        ids = await _seed_big(pool, queue)
    dead, done = ids["dead"][0], ids["completed"][0]
    pages = [
        ("/", SMALL),
        ("/fragments/queues", SMALL),
        ("/api/frame", SMALL),
        (f"/jobs?queue={queue}", SMALL),
        (f"/jobs?queue={queue}&status=dead", SMALL),
        (f"/jobs?queue={queue}&status=completed", SMALL),
        (f"/jobs/{dead}/retry", SMALL),
        (f"/retry-all?queue={queue}", SMALL),
        (f"/jobs/{dead}", JOB_PAGE),
        (f"/jobs/{done}", JOB_PAGE),
    ]
    async with (
        proxy_to(fresh_dsn) as proxy,
        serving(via(fresh_dsn, proxy.port), "--allow-actions") as (url, _),
        httpx.AsyncClient(base_url=url, timeout=SECONDS) as client,
    ):
        for path, limit in pages:
            before = proxy.received
            started = anyio.current_time()
            with anyio.fail_after(SECONDS):
                answer = await client.get(path)
            took = anyio.current_time() - started
            assert answer.status_code == 200, path
            sent = answer.num_bytes_downloaded
            read = proxy.received - before
            assert sent < limit, f"{path}: {sent:,} bytes sent"
            assert read < limit, f"{path}: {read:,} bytes read from the database"
            assert took < SECONDS, path
        page = words((await client.get(f"/jobs/{dead}")).text)
        assert page.count("cut: only the first 50,000 characters are shown") == 3
        listing = (await client.get(f"/jobs?queue={queue}&status=dead")).text
        # The first line of each error, cut to 300 characters; not its traceback.
        assert f"<bdi>{'E&lt;&#34;' * 100}</bdi>" in listing
        assert "app.py" not in listing


async def test_a_completed_job_does_not_show_an_earlier_attempts_error_as_its_own(
    dsn: str, pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    done, dead = await queue.enqueue_many([("t", {}), ("t", {})])
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed', attempts = 2,"
        " last_error = 'TimeoutError: first attempt' WHERE id = $1",
        done,
    )
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'dead', last_error = 'KeyError: gone'"
        " WHERE id = $1",
        dead,
    )
    async with serving(dsn) as (url, _), httpx.AsyncClient(base_url=url) as client:
        listing = (await client.get(f"/jobs?queue={queue.name}")).text
        assert "TimeoutError" not in listing  # a completed job has no last error
        assert "KeyError: gone" in listing
        completed = words((await client.get(f"/jobs/{done}")).text)
        assert "Last error" not in completed
        assert "Error of an earlier attempt" in completed
        assert "TimeoutError: first attempt" in completed
        failed = words((await client.get(f"/jobs/{dead}")).text)
        assert "Last error KeyError: gone" in failed
        assert "earlier attempt" not in failed


async def test_admin_summaries_and_previews_are_cut_in_the_database(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("t", {"s": "x" * 1000})
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed', result = '[1, 2, 3]',"
        " last_error = $2 WHERE id = $1",
        job_id,
        " \n\t" + "E" * 500 + "\r\nsecond line",
    )
    payload = await pool.fetchval(
        "SELECT payload::text FROM pgqueue_jobs WHERE id = $1", job_id
    )
    admin = pgqueue.Admin(pool)
    [summary] = await admin.job_summaries(queue=queue.name)
    assert summary == await admin.job_summary(job_id)
    assert summary.error_line == "E" * ERROR_LINE_CHARS
    assert (summary.id, summary.status, summary.attempts) == (job_id, "completed", 0)
    assert not hasattr(summary, "payload")
    assert json.loads(json.dumps(summary.to_json()))["error_line"] == summary.error_line

    cut = await admin.job_preview(job_id, max_chars=100)
    assert cut is not None
    assert (cut.payload, cut.payload_truncated) == (payload[:100], True)
    assert (cut.result, cut.result_truncated) == ("[1, 2, 3]", False)
    assert cut.last_error is not None
    assert cut.last_error_truncated
    assert len(cut.last_error) == 100
    whole = await admin.job_preview(job_id)
    assert whole is not None
    assert (whole.payload, whole.payload_truncated) == (payload, False)
    assert whole.last_error == " \n\t" + "E" * 500 + "\r\nsecond line"
    assert not whole.last_error_truncated

    assert await admin.job_preview(2**62) is None
    assert await admin.job_summary(2**62) is None
    for bad in (0, -1, 2**31):
        with pytest.raises(ValueError, match="max_chars"):
            await admin.job_preview(job_id, max_chars=bad)
    with pytest.raises(ValueError, match="status"):
        await admin.job_summaries(status="finished")


def test_nothing_opts_out_of_escaping() -> None:
    """Escaping is by construction: no template marks a value safe, no module builds HTML."""
    folder = resources.files("pgqueue.web") / "templates"
    templates = [item for item in folder.iterdir() if item.name.endswith(".html")]
    assert len(templates) >= 8
    for template in templates:
        text = template.read_text(encoding="utf-8")
        assert not re.search(r"\|\s*safe\b", text), template.name
        assert not re.search(r"{%-?\s*autoescape", text), template.name
    web = Path(pgqueue.web.__file__).parent
    for module in web.glob("*.py"):
        source = module.read_text(encoding="utf-8")
        for opening in (
            "Markup",
            "from html import",
            "html.escape",
            "autoescape=False",
        ):
            assert opening not in source, (module.name, opening)
