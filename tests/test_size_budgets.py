"""Every operator surface stays within a size budget whatever the rows hold (issue 40).

The rows are written as any client could write them (a Go producer, SQL by
hand): 5,000 queues named with 1,000 characters (some holding markup and
control characters, a few past the 1,024 allowed) and three jobs whose
types are 5 MB, one running (with a checkpoint), one dead, one pending.
Each page, fragment and frame of ``pgqueue web``, each frame of ``pgqueue
top`` and a Prometheus scrape is measured in bytes sent and in bytes read
from the database (through a TCP proxy that counts them). Before the
budgets, the queues page weighed 70 MB, a scrape 52 MB, a ``top`` frame 21 MB
and every page listing a 5 MB type 5 MB or more.
"""

from __future__ import annotations

import json
import re

import asyncpg
import httpx
from prometheus_client import CollectorRegistry, generate_latest

from pgqueue.prometheus import QueueCollector
from tests.tcp_proxy import proxy_to, via
from tests.test_cli_top import pgqueue as pgqueue_cli
from tests.test_web import serving, words

PAGE = 256_000
"""Bytes: the most a page, a fragment or a frame of the dashboard may weigh, or read."""
TERMINAL = 128_000
"""Bytes: the most a frame of ``pgqueue top`` (text or JSON) may weigh."""
SCRAPE = 256_000
"""Bytes: the most a Prometheus scrape of the queues may weigh, or its refresh read."""

QUEUES = 5000
LONG = 2000
"""Characters of the few queue names past the 1,024 allowed (only SQL can write them)."""
BIG = 5 * 1024 * 1024
"""Characters of each of the three job types."""

SEED = rf"""
INSERT INTO pgqueue_jobs (queue, job_type)
SELECT pg_catalog.lpad(i::text, 5, '0')
       || CASE WHEN i % 1000 = 0 THEN E'\x1b[31m<b>&"' ELSE '' END
       || '-' || repeat('q', 994),
       'mail'
FROM generate_series(1, {QUEUES}) AS i, generate_series(1, 1 + i % 7) AS n;
INSERT INTO pgqueue_jobs (queue, job_type)
SELECT 'long-' || i || repeat('L', {LONG}), 'mail' FROM generate_series(1, 3) AS i;
INSERT INTO pgqueue_jobs (queue, job_type, status, attempts, claimed_at, last_error, checkpoint)
VALUES ('big', repeat('T', {BIG}), 'running', 1, now() - interval '1 minute', NULL,
        '{{"card": "4111-1111"}}'),
       ('big', repeat('U', {BIG}), 'dead', 1, NULL, 'ValueError: boom', NULL),
       ('big', repeat('V', {BIG}), 'pending', 0, NULL, NULL, NULL);
ANALYZE pgqueue_jobs;
"""


def queue_name(number: int) -> str:
    """The seeded queue ``number``'s name (without the control characters of every 1,000th)."""
    return f"{number:05d}-" + "q" * 994


async def test_every_surface_stays_within_its_budget(fresh_dsn: str) -> None:
    connection = await asyncpg.connect(fresh_dsn)
    try:
        await connection.execute(SEED)
        ids: dict[str, int] = {
            row["status"]: row["id"]
            for row in await connection.fetch(
                "SELECT status, id FROM pgqueue_jobs WHERE queue = 'big'"
            )
        }
    finally:
        await connection.close()
    shown = queue_name(4242)
    pages = [
        "/",
        "/fragments/queues",
        "/api/frame",
        "/?queue=04242",
        "/jobs",
        "/jobs?status=dead",
        f"/jobs?queue={shown}",
        f"/jobs/{ids['running']}",
        f"/jobs/{ids['dead']}/retry",
        f"/pause?queue={shown}",
    ]
    async with proxy_to(fresh_dsn) as proxy:
        dsn = via(fresh_dsn, proxy.port)
        async with (
            serving(dsn, "--allow-actions") as (url, _),
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            for path in pages:
                before = proxy.received
                answer = await client.get(path)
                assert answer.status_code == 200, path
                sent, read = answer.num_bytes_downloaded, proxy.received - before
                assert sent < PAGE, f"{path}: {sent:,} bytes sent"
                assert read < PAGE, f"{path}: {read:,} bytes read from the database"
            page = (await client.get("/")).text
            hostile = (await client.get("/", params={"queue": "01000"})).text
            frame = (await client.get("/api/frame")).json()
            found = (await client.get("/api/frame", params={"queue": "04242"})).json()

        # The 50 queues with the most jobs to do (8 each), and how many more.
        assert len(frame["queues"]) == 50
        assert frame["more_queues"] == QUEUES + 4 - 50
        assert {q["ready"] for q in frame["queues"]} == {7}
        assert f"And {QUEUES + 4 - 50:,} more queues" in words(page)
        # A queue beyond them, found by name.
        assert [q["queue"] for q in found["queues"]] == [shown]
        assert found["more_queues"] == 0
        # Names shown cut and marked, their control characters escaped; each
        # 5 MB type read as its first 256 characters.
        assert "cut: only the first 200 characters are shown" in page
        assert "U+001B" in hostile
        assert "\x1b" not in hostile
        assert frame["longest_running"][0]["job_type"] == "T" * 256
        assert frame["latest_dead"][0]["job_type"] == "U" * 256

        shown_by_top = {}
        for args in (
            ("top", "--once"),
            ("top", "--once", "--json"),
            ("top", "--once", "--match", "01000"),
        ):
            before = proxy.received
            code, out, err = await pgqueue_cli(dsn, *args)
            assert (code, err) == (0, ""), args
            read = proxy.received - before
            assert len(out.encode()) < TERMINAL, f"{args}: {len(out):,} characters"
            assert read < PAGE, f"{args}: {read:,} bytes read from the database"
            shown_by_top[args[-1]] = out
        assert f"and {QUEUES + 4 - 50} more (--match TEXT" in shown_by_top["--once"]
        assert "…(cut)" in shown_by_top["--once"]
        assert "\\x1b[31m<b>&" in shown_by_top["01000"]
        assert json.loads(shown_by_top["--json"])["more_queues"] == QUEUES + 4 - 50

        async with asyncpg.create_pool(dsn, min_size=1, max_size=1) as pool:
            registry = CollectorRegistry()
            collector = QueueCollector(pool, registry=registry)
            before = proxy.received
            await collector.refresh()
            read = proxy.received - before
        scrape = generate_latest(registry)
    assert len(scrape) < SCRAPE, f"{len(scrape):,} bytes scraped"
    assert read < SCRAPE, f"{read:,} bytes read from the database"
    text = scrape.decode()
    assert f"pgqueue_queue_series_omitted {QUEUES + 4 - 50}.0" in text
    assert len(re.findall(r"^pgqueue_queue_paused\{", text, re.MULTILINE)) == 50
