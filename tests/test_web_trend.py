"""The dashboard's drawings: the trend page's charts equal the rows' counts; a job's workflow graph shows its parents and children."""

from __future__ import annotations

import re
from html import unescape
from typing import TYPE_CHECKING

from pgqueue.web import create_app
from tests.test_trend import HOSTILE, counts_from_rows, run_mix
from tests.test_web import client

if TYPE_CHECKING:
    import asyncpg

    import pgqueue


def steps(page: str, chart: str = "trend-counts") -> list[dict[str, str]]:
    """The data attributes of each step of a chart."""
    svg = page[page.index(f'<svg id="{chart}"') :]
    svg = svg[: svg.index("</svg>")]
    return [
        dict(re.findall(r'data-([a-z-]+)="([^"]*)"', tag))
        for tag in re.findall(r'<g class="step"[^>]*>', svg)
    ]


def summed(page: str) -> tuple[int, int, int]:
    found = steps(page)
    return (
        sum(int(s["completed"]) for s in found),
        sum(int(s["failed"]) for s in found),
        sum(int(s["dead"]) for s in found),
    )


async def test_the_charts_equal_the_rows(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    await run_mix(pool, queue)
    expected = await counts_from_rows(pool, queue.name)
    async with client(create_app(pool)) as c:
        for since in ("1h", "1d"):
            response = await c.get(
                "/trend", params={"queue": queue.name, "since": since}
            )
            assert response.status_code == 200
            page = response.text
            totals = tuple(sum(v[i] for v in expected.values()) for i in range(3))
            assert summed(page) == totals
            # The table: one row a type, its counts the rows'.
            for job_type, (completed, failed, dead) in expected.items():
                shown = re.escape(
                    job_type.replace("\u202e", "U+202E")
                    .replace("&", "&amp;")
                    .replace("<", "&lt;")
                    .replace(">", "&gt;")
                    .replace('"', "&#34;")
                )
                found = re.search(
                    rf'<tr data-queue="[^"]*" data-type="{shown}">(.*?)</tr>',
                    page,
                    re.S,
                )
                assert found, job_type
                numbers = re.findall(r'<td class="num">([^<]*)</td>', found[1])
                assert numbers[:3] == [str(completed), str(failed), str(dead)]
        # A job type's page: only its attempts.
        page = (
            await c.get("/trend", params={"queue": queue.name, "type": HOSTILE})
        ).text
        assert summed(page) == expected[HOSTILE]
        page = (
            await c.get("/trend", params={"queue": queue.name, "type": "flaky"})
        ).text
        assert summed(page) == expected["flaky"]
        times = steps(page, "trend-run-times")
        assert times == []  # no <g> steps: its points are circles
        assert 'class="dot-run-time"' in page


async def test_hostile_names_are_escaped(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    await run_mix(pool, queue)
    async with client(create_app(pool)) as c:
        for params in ({"queue": queue.name}, {"queue": queue.name, "type": HOSTILE}):
            page = (await c.get("/trend", params=params)).text
            assert "<b onmouseover" not in page
            assert "\u202e" not in page
            assert "U+202E" in page


async def test_bad_trend_input_is_400(pool: asyncpg.Pool) -> None:
    async with client(create_app(pool)) as c:
        assert (await c.get("/trend", params={"since": "2h"})).status_code == 400
        assert (await c.get("/trend", params={"queue": "a\x00b"})).status_code == 400
        page = await c.get("/trend")
        assert page.status_code == 200
        assert 'aria-current="page"' in page.text


def nodes(page: str) -> list[dict[str, str]]:
    svg = page[page.index('<svg id="workflow"') :]
    svg = svg[: svg.index("</svg>")]
    return [
        dict(re.findall(r'data-([a-z-]+)="([^"]*)"', tag))
        for tag in re.findall(r'<g class="node[^"]*"[^>]*>', svg)
    ]


async def test_the_workflow_of_a_fan_in_of_50(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    parents = [await queue.enqueue("part", {"n": n}) for n in range(50)]
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'completed' WHERE id = ANY($1::bigint[])",
        parents[:30],
    )
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = 'running' WHERE id = ANY($1::bigint[])",
        parents[30:40],
    )
    join = await queue.enqueue("join", {}, after=parents)
    statuses = {
        r["id"]: r["status"]
        for r in await pool.fetch(
            "SELECT id, status FROM pgqueue_jobs WHERE id = ANY($1::bigint[])",
            [*parents, join],
        )
    }
    async with client(create_app(pool)) as c:
        page = (await c.get(f"/jobs/{join}")).text
        drawn = nodes(page)
        drawn_parents = [n for n in drawn if n["role"] == "parent"]
        assert [int(n["job-id"]) for n in drawn_parents] == parents
        assert {int(n["job-id"]): n["status"] for n in drawn_parents} == {
            p: statuses[p] for p in parents
        }
        (me,) = [n for n in drawn if n["role"] == "job"]
        assert (int(me["job-id"]), me["status"]) == (join, "waiting")
        assert not [n for n in drawn if n["role"].startswith("more")]
        svg = page[page.index('<svg id="workflow"') :]
        assert svg[: svg.index("</svg>")].count('<line class="edge"') == 50
        assert f'<a href="/jobs/{parents[0]}">' in svg
        # A parent's page: the join below it.
        page = (await c.get(f"/jobs/{parents[0]}")).text
        assert [(n["role"], n.get("job-id")) for n in nodes(page)] == [
            ("job", str(parents[0])),
            ("child", str(join)),
        ]


async def test_the_workflow_stops_at_its_bound(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    parents = [await queue.enqueue("part", {"n": n}) for n in range(53)]
    join = await queue.enqueue("join", {}, after=parents)
    async with client(create_app(pool)) as c:
        page = (await c.get(f"/jobs/{join}")).text
        drawn = nodes(page)
        assert len([n for n in drawn if n["role"] == "parent"]) == 50
        (more,) = [n for n in drawn if n["role"] == "more-parents"]
        assert more["more"] == "3"
        assert "and 3 more" in unescape(page)
        # A job with neither parents nor children has no graph.
        lone = await queue.enqueue("lone", {})
        assert 'id="workflow"' not in (await c.get(f"/jobs/{lone}")).text
