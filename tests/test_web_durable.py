"""The dashboard's view of durable handlers (httpx's ASGI transport), against a real server.

A parked job's page shows its steps (name, when, size), the signals it
received, what it waits for and its progress, hostile names shown, not
acted on; "Send signal" asks (GET) and only a POST with its token sends,
waking the job; read-only refuses it; a finished job's form says why; a
bad payload or name keeps what was typed.
"""

from __future__ import annotations

import json
import re
from html import unescape
from typing import TYPE_CHECKING, Any

import pgqueue
from pgqueue.web import create_app
from tests.helpers import row, running, wait_for_row
from tests.test_web import client, token_of

if TYPE_CHECKING:
    import asyncpg

SAME_ORIGIN = {"origin": "http://localhost", "sec-fetch-site": "same-origin"}


def _table(page: str, table_id: str) -> list[list[str]]:
    found = re.search(rf'<table id="{table_id}">(.*?)</table>', page, re.S)
    assert found, f"no table {table_id}"
    return [
        [unescape(re.sub(r"<[^>]+>", "", cell)).strip() for cell in cells]
        for cells in (
            re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)
            for body in re.findall(r"<tr>(.*?)</tr>", found[1], re.S)
        )
        if cells
    ]


def _text(page: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}">(.*?)</dd>', page, re.S)
    assert found, f"no {element_id}"
    return unescape(re.sub(r"<[^>]+>", "", found[1])).strip()


async def test_the_job_page_shows_steps_signals_wait_and_progress_and_sends_a_signal(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    got: list[Any] = []
    worker = pgqueue.Worker(pool, queue=queue.name, poll_interval=60)

    @worker.handler("order")
    async def order(job: pgqueue.Job) -> Any:
        await job.step("charge", lambda: {"id": "ch_1"})
        await job.step("a<b>&", lambda: 1)
        await job.progress(0.25, "waiting <b>for</b> ops")
        decision = await job.wait_for("approve")
        got.append(decision)
        return decision

    job_id = await queue.enqueue("order", {})
    async with running(worker):
        await wait_for_row(pool, job_id, status="parked")
        await queue.signal(job_id, "note\u202e", {"x": 1})
        async with client(create_app(pool, read_only=False)) as c:
            page = (await c.get(f"/jobs/{job_id}")).text
            assert _table(page, "steps") == [
                ["charge", _table(page, "steps")[0][1], "14 B"],
                ["a<b>&", _table(page, "steps")[1][1], "1 B"],
            ]
            assert "<b>&" not in page  # escaped, not markup
            [[signal_name, _, size]] = _table(page, "signals")
            assert (signal_name, size) == ("noteU+202E", "8 B")
            assert 'class="ctl"' in page  # the bidi control is shown, not acted on
            assert _text(page, "wait") == "signal approve (no timeout)"
            assert _text(page, "progress").startswith(
                "25% 25% waiting <b>for</b> ops (at"
            )
            assert f'action="/jobs/{job_id}/signal"' in page
            # It asks first: the form offers the awaited name.
            form = await c.get(f"/jobs/{job_id}/signal")
            assert form.status_code == 200
            assert 'name="name" value="approve"' in form.text
            token = token_of(form.text)
            # A bad payload or name: 400, what was typed kept, nothing sent.
            bad = await c.post(
                f"/jobs/{job_id}/signal",
                data={"csrf": token, "name": "approve", "payload": "{oops"},
                headers=SAME_ORIGIN,
            )
            assert bad.status_code == 400
            assert "Not sent: the payload is not JSON" in bad.text
            assert "{oops" in bad.text
            bad = await c.post(
                f"/jobs/{job_id}/signal",
                data={"csrf": token, "name": "", "payload": "1"},
                headers=SAME_ORIGIN,
            )
            assert bad.status_code == 400
            assert "signal name" in bad.text
            assert len(json.loads((await row(pool, job_id))["signals"])) == 1
            # Without the token, nothing is sent.
            refused = await c.post(
                f"/jobs/{job_id}/signal",
                data={"name": "approve", "payload": "1"},
                headers=SAME_ORIGIN,
            )
            assert refused.status_code == 403
            sent = await c.post(
                f"/jobs/{job_id}/signal",
                data={"csrf": token, "name": "approve", "payload": '{"by": "web"}'},
                headers=SAME_ORIGIN,
            )
            assert sent.status_code == 303
            assert sent.headers["location"] == f"/jobs/{job_id}?done=signalled"
            await wait_for_row(pool, job_id, status="completed")
            assert got == [{"by": "web"}]
            done = (await c.get(f"/jobs/{job_id}?done=signalled")).text
            assert "Signal sent" in done
            assert 'id="wait"' not in done  # it waits for nothing any more
            assert "Send signal" not in done  # nor takes signals
            # A finished job's form says why; a POST stores nothing.
            closed = await c.get(f"/jobs/{job_id}/signal")
            assert 'id="signal-closed"' in closed.text
            late = await c.post(
                f"/jobs/{job_id}/signal",
                data={"csrf": token, "name": "approve"},  # the form's earlier token
                headers=SAME_ORIGIN,
            )
            assert late.headers["location"] == f"/jobs/{job_id}?done=not_signalled"
            assert (
                len(json.loads((await row(pool, job_id))["signals"])) == 2
            )  # note, approve
            missing = await c.get("/jobs/999999999/signal")
            assert missing.status_code == 404
            # A plain job's page offers no signal; its form is still there.
            plain = await queue.enqueue("plain", {})
            assert "Send signal" not in (await c.get(f"/jobs/{plain}")).text
            form = await c.get(f"/jobs/{plain}/signal")
            assert 'name="name" value=""' in form.text


async def test_read_only_shows_no_send_signal_and_refuses_it(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("order", {})
    async with client(create_app(pool)) as c:
        page = (await c.get(f"/jobs/{job_id}")).text
        assert "Send signal" not in page
        assert (await c.get(f"/jobs/{job_id}/signal")).status_code == 403
        posted = await c.post(
            f"/jobs/{job_id}/signal",
            data={"csrf": "0" * 64, "name": "go"},
            headers=SAME_ORIGIN,
        )
        assert posted.status_code == 403
    assert (await row(pool, job_id))["signals"] is None
