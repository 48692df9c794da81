"""The dashboard's filter, bulk actions and edit form over HTTP (httpx's ASGI transport), against a real server.

``/jobs?where=TERM`` lists exactly the jobs `pgqueue.JobFilter.parse` of the
terms matches; ``/bulk/VERB`` states the count and the filter (or the ids)
and acts only on a POST whose token was issued for that very filter, count
and queue; ``/jobs/ID/edit`` saves a pending job's fields and says why it
refuses a job a worker claimed meanwhile. The browser drives the same pages
in test_web_browser.py; the attacks are in test_web_security.py.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from html import unescape
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode, urlsplit

from starlette.applications import Starlette
from starlette.routing import Mount

import pgqueue
from pgqueue.web import create_app
from tests.helpers import row, rows
from tests.test_web import BASE, buttons, client, listed_ids, token_of, words

if TYPE_CHECKING:
    import asyncpg

SAME_ORIGIN = {"origin": BASE, "sec-fetch-site": "same-origin"}


def hidden(page: str) -> dict[str, str]:
    """The hidden fields of a confirmation page's form, as a browser posts them."""
    return {
        unescape(name): unescape(value)
        for name, value in re.findall(
            r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page
        )
    }


async def seed(pool: asyncpg.Pool, queue: str) -> dict[str, list[int]]:
    """Jobs of users 1 to 3: user 1's 4 dead and 2 pending, user 2's 3 dead, user 3's 1 running."""
    q = pgqueue.Queue(pool, name=queue)
    ids: dict[str, list[int]] = {}
    for key, user, status, n in (
        ("u1-dead", 1, "dead", 4),
        ("u1-pending", 1, "pending", 2),
        ("u2-dead", 2, "dead", 3),
        ("u3-running", 3, "running", 1),
    ):
        made = [await q.enqueue("sync", {"user_id": user, "n": i}) for i in range(n)]
        await pool.execute(
            "UPDATE pgqueue_jobs SET status = $2, attempts = 1, max_attempts = 1,"
            " last_error = CASE WHEN $2 = 'dead' THEN 'TimeoutError: upstream' END"
            " WHERE id = ANY($1::bigint[])",
            made,
            status,
        )
        ids[key] = made
    return ids


async def statuses(pool: asyncpg.Pool, queue: str) -> dict[int, str]:
    return {r["id"]: r["status"] for r in await rows(pool, queue)}


# --- the filter ------------------------------------------------------------------------


async def test_where_lists_exactly_the_matching_jobs(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await seed(pool, queue_name)
    other = await pgqueue.Queue(pool, name=f"{queue_name}-x").enqueue(
        "sync", {"user_id": 1}
    )
    async with client(create_app(pool)) as c:
        cases = {
            ("payload.user_id=1",): [*ids["u1-dead"], *ids["u1-pending"]],
            ("payload.user_id=1", "status=dead"): ids["u1-dead"],
            ("status=dead", "error_contains=upstream"): [
                *ids["u1-dead"],
                *ids["u2-dead"],
            ],
            ('payload={"user_id": 3}',): ids["u3-running"],
            ("payload.user_id=4",): [],
        }
        for terms, expected in cases.items():
            query = urlencode([("queue", queue_name), *(("where", t) for t in terms)])
            page = await c.get(f"/jobs?{query}")
            assert page.status_code == 200, terms
            assert listed_ids(page.text) == sorted(expected, reverse=True), terms
        # The terms alone, the queue among them, and the other queue's job too.
        query = urlencode([("where", "payload.user_id=1")])
        assert other in listed_ids((await c.get(f"/jobs?{query}")).text)
        query = urlencode(
            [("where", f"queue={queue_name}"), ("where", "status=running")]
        )
        assert listed_ids((await c.get(f"/jobs?{query}")).text) == ids["u3-running"]
        # The form shows the terms given, and one more box for another.
        shown = (await c.get(f"/jobs?{query}")).text
        assert re.findall(r'name="where" value="([^"]*)"', shown) == [
            f"queue={queue_name}",
            "status=running",
            "",
        ]
        for bad in ("nokey", "colour=red", "status=sleeping", "payload=[1]"):
            answer = await c.get("/jobs", params={"where": bad})
            assert answer.status_code == 400, bad
            assert "bad filter" in answer.text
        twice = await c.get("/jobs", params={"queue": queue_name, "where": "queue=a"})
        assert twice.status_code == 400


async def test_pages_of_a_filter_keep_its_terms(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    q = pgqueue.Queue(pool, name=queue_name)
    made = [
        await q.enqueue("t", {"tenant": "acme" if i % 2 else "other"}) for i in range(7)
    ]
    acme = sorted(made[1::2], reverse=True)
    async with client(create_app(pool, page_size=2)) as c:
        query = urlencode(
            [("where", f"queue={queue_name}"), ("where", 'payload.tenant="acme"')]
        )
        first = (await c.get(f"/jobs?{query}")).text
        assert listed_ids(first) == acme[:2]
        older = unescape(re.search(r'href="([^"]+)" rel="next"', first)[1])  # type: ignore[index]
        assert parse_qs(urlsplit(older).query)["where"] == [
            f"queue={queue_name}",
            'payload.tenant="acme"',
        ]
        assert listed_ids((await c.get(older)).text) == acme[2:]


async def test_all_matching_counts_on_demand_past_one_page(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    await seed(pool, queue_name)
    terms = [f"queue={queue_name}", "payload.user_id=1"]
    async with client(create_app(pool, read_only=False, page_size=4)) as c:
        listing = (await c.get("/jobs", params={"where": terms})).text
        # Six match, four shown: the count is asked for when the box is checked.
        assert "All jobs matching the filter" in words(listing)
        source = unescape(re.search(r'data-src="([^"]+)"', listing)[1])  # type: ignore[index]
        assert parse_qs(urlsplit(source).query)["where"] == terms
        counted = await c.get(source)
        assert counted.json() == {"count": 6, "more": False, "text": "6 jobs"}
        assert counted.headers["cache-control"] == "no-store"
        one = await c.get(
            "/api/count", params={"where": [*terms, "status=pending", "payload.n=0"]}
        )
        assert one.json()["text"] == "1 job"
        assert (await c.get("/api/count", params={"where": "nokey"})).status_code == 400
    await pool.execute(
        "INSERT INTO pgqueue_jobs (queue, job_type, payload)"
        " SELECT $1, 'bulk', '{}' FROM generate_series(1, 10001)",
        f"{queue_name}-big",
    )
    async with client(create_app(pool)) as c:
        big = await c.get("/api/count", params={"where": f"queue={queue_name}-big"})
        assert big.json() == {"count": 10_000, "more": True, "text": "10,000+ jobs"}


# --- bulk actions ----------------------------------------------------------------------


async def test_all_matching_states_the_count_and_the_filter_then_acts_on_it(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await seed(pool, queue_name)
    before = await statuses(pool, queue_name)
    terms = [f"queue={queue_name}", "payload.user_id=1"]
    async with client(create_app(pool, read_only=False)) as c:
        listing = await c.get("/jobs", params={"where": terms})
        assert "All 6 jobs matching the filter" in words(listing.text)
        assert {"Retry…", "Cancel…", "Delete…", "Redrive…", "Move…"} <= set(
            buttons(listing.text)
        )
        confirm = await c.get("/bulk/retry", params={"where": terms, "all": "1"})
        assert confirm.status_code == 200
        said = words(confirm.text)
        assert "Retry 4 jobs matching the filter?" in said  # the dead ones of 6
        for term in terms:
            assert term in said
        assert buttons(confirm.text) == ["Retry 4 jobs"]
        assert await statuses(pool, queue_name) == before  # asking changes nothing
        fields = hidden(confirm.text)
        assert json.loads(fields["filter"]) == terms
        assert fields["limit"] == "4"
        done = await c.post("/bulk/retry", data=fields, headers=SAME_ORIGIN)
        assert done.status_code == 303
        location = done.headers["location"]
        assert parse_qs(urlsplit(location).query)["where"] == terms
        assert "Retried 4 jobs." in (await c.get(location)).text
    after = await statuses(pool, queue_name)
    for job_id in ids["u1-dead"]:
        assert after[job_id] == "pending"
    for job_id in ids["u2-dead"]:
        assert after[job_id] == "dead"


async def test_selected_rows_are_acted_on_by_id(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await seed(pool, queue_name)
    chosen = [ids["u1-pending"][0], ids["u3-running"][0], ids["u2-dead"][0]]
    async with client(create_app(pool, read_only=False)) as c:
        confirm = await c.get("/bulk/cancel", params={"id": [str(i) for i in chosen]})
        assert "Cancel 3 selected jobs?" in words(confirm.text)
        fields = hidden(confirm.text)
        assert fields["ids"] == ",".join(map(str, sorted(chosen)))
        assert "filter" not in fields
        done = await c.post("/bulk/cancel", data=fields, headers=SAME_ORIGIN)
        assert done.status_code == 303
        assert "Cancelled 2 jobs." in (await c.get(done.headers["location"])).text
    assert (await row(pool, chosen[0]))["status"] == "cancelled"
    assert (await row(pool, chosen[1]))["cancel_requested"] is True
    assert (await row(pool, chosen[2]))["status"] == "dead"
    assert (await row(pool, ids["u1-pending"][1]))["status"] == "pending"


async def test_delete_move_and_redrive_act_on_the_filter(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await seed(pool, queue_name)
    elsewhere = f"{queue_name}-to"

    async def act(verb: str, terms: list[str], **extra: str) -> str:
        confirm = await c.get(
            f"/bulk/{verb}", params={"where": terms, "all": "1", **extra}
        )
        assert confirm.status_code == 200, (verb, confirm.text)
        done = await c.post(
            f"/bulk/{verb}", data=hidden(confirm.text), headers=SAME_ORIGIN
        )
        assert done.status_code == 303, verb
        return words(confirm.text)

    async with client(create_app(pool, read_only=False)) as c:
        said = await act(
            "move",
            [f"queue={queue_name}", "payload.user_id=1", "status=pending"],
            to_queue=elsewhere,
        )
        assert "Move 2 jobs matching the filter to queue" in said
        said = await act(
            "redrive", [f"queue={queue_name}", "payload.user_id=2"], to_queue=elsewhere
        )
        assert "Redrive 3 jobs" in said
        said = await act("delete", [f"queue={queue_name}", "payload.user_id=1"])
        assert "Delete 4 jobs" in said  # the dead ones left: the pending ones moved
        missing = await c.get(
            "/bulk/move", params={"where": [f"queue={queue_name}"], "all": "1"}
        )
        assert missing.status_code == 400  # a move names its queue
    moved = {r["id"]: r for r in await rows(pool, elsewhere)}
    assert set(moved) == {*ids["u1-pending"], *ids["u2-dead"]}
    assert {moved[i]["status"] for i in ids["u2-dead"]} == {"pending"}
    left = await statuses(pool, queue_name)
    assert set(left) == set(ids["u3-running"])  # running: never moved or deleted


async def test_no_match_offers_nothing_to_confirm(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    await seed(pool, queue_name)
    async with client(create_app(pool, read_only=False)) as c:
        confirm = await c.get(
            "/bulk/retry",
            params={"where": [f"queue={queue_name}", "payload.user_id=3"], "all": "1"},
        )
        assert "No job would change" in confirm.text
        assert buttons(confirm.text) == []
        # A filter on a status the action never acts on: the page says why.
        running = await c.get(
            "/bulk/retry",
            params={"where": [f"queue={queue_name}", "status=running"], "all": "1"},
        )
        assert running.status_code == 200
        assert "acts on dead, cancelled jobs only" in unescape(running.text)
        assert buttons(running.text) == []
        for params in ({}, {"id": "abc"}, {"id": "0"}, {"all": "1", "where": "bad"}):
            answer = await c.get("/bulk/retry", params=params)
            assert answer.status_code == 400, params
        assert (await c.get("/bulk/explode", params={"id": "1"})).status_code == 404


async def test_a_token_acts_only_for_its_filter_count_ids_and_queue(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await seed(pool, queue_name)
    before = await statuses(pool, queue_name)
    terms = [f"queue={queue_name}", "payload.user_id=1"]
    async with client(create_app(pool, read_only=False)) as c:
        confirm = await c.get("/bulk/delete", params={"where": terms, "all": "1"})
        fields = hidden(confirm.text)
        by_id = hidden(
            (await c.get("/bulk/cancel", params={"id": str(ids["u1-pending"][0])})).text
        )
        move = hidden(
            (
                await c.get(
                    "/bulk/move", params={"where": terms, "all": "1", "to_queue": "a"}
                )
            ).text
        )
        wider = json.dumps([f"queue={queue_name}"], separators=(",", ":"))
        reordered = json.dumps(terms[::-1], separators=(",", ":"))
        delete = "/bulk/delete"
        refused = [
            (delete, {**fields, "csrf": ""}),  # no token
            (delete, {k: v for k, v in fields.items() if k != "csrf"}),
            (delete, {**fields, "filter": wider}),  # the filter changed
            (delete, {**fields, "filter": reordered}),
            (delete, {**fields, "filter": ""}),  # no filter: by ids, none
            (delete, {**fields, "limit": "1000"}),  # the count changed
            (delete, {**fields, "csrf": by_id["csrf"]}),  # another selection's token
            ("/bulk/cancel", {**by_id, "ids": ",".join(map(str, ids["u1-pending"]))}),
            ("/bulk/move", {**move, "to_queue": "b"}),  # another queue
        ]
        for path, form in refused:
            answer = await c.post(path, data=form, headers=SAME_ORIGIN)
            assert 400 <= answer.status_code < 500, form
            assert await statuses(pool, queue_name) == before, form
        # The token of a delete does not retry, nor the other way round.
        answer = await c.post("/bulk/retry", data=fields, headers=SAME_ORIGIN)
        assert answer.status_code == 403
        assert await statuses(pool, queue_name) == before
        done = await c.post("/bulk/delete", data=fields, headers=SAME_ORIGIN)
        assert done.status_code == 303
    assert set(await statuses(pool, queue_name)) == set(before) - set(
        ids["u1-dead"] + ids["u1-pending"]
    )


async def test_read_only_offers_no_bulk_action_or_edit_and_refuses_them(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await seed(pool, queue_name)
    pending = ids["u1-pending"][0]
    before = await statuses(pool, queue_name)
    async with client(create_app(pool)) as c:
        listing = (await c.get("/jobs", params={"queue": queue_name})).text
        assert buttons(listing) == ["Filter"]
        assert 'name="id"' not in listing
        assert buttons((await c.get(f"/jobs/{pending}")).text) == []
        for path, params in (
            ("/bulk/delete", {"id": str(pending)}),
            ("/bulk/retry", {"all": "1", "where": f"queue={queue_name}"}),
            (f"/jobs/{pending}/edit", {}),
        ):
            assert (await c.get(path, params=params)).status_code == 403
            forged = await c.post(
                path, data={"csrf": "0" * 80, "ids": str(pending)}, headers=SAME_ORIGIN
            )
            assert forged.status_code == 403
    assert await statuses(pool, queue_name) == before


# --- edit ------------------------------------------------------------------------------


async def test_edit_saves_the_changed_fields_of_a_pending_job(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("t", {"to": "a@example.com"}, priority=1)
    async with client(create_app(pool, read_only=False)) as c:
        assert "Edit" in buttons((await c.get(f"/jobs/{job_id}")).text)
        form_page = await c.get(f"/jobs/{job_id}/edit")
        assert form_page.status_code == 200
        assert buttons(form_page.text) == ["Save"]
        later = datetime.now(UTC) + timedelta(days=1)
        fields = {
            "csrf": token_of(form_page.text),
            "payload": '{"to": "b@example.com"}',
            "priority": "3",
            "run_at": later.isoformat(),
            "group": "",
            "max_attempts": "9",
        }
        done = await c.post(f"/jobs/{job_id}/edit", data=fields, headers=SAME_ORIGIN)
        assert done.status_code == 303
        assert done.headers["location"] == f"/jobs/{job_id}?done=updated"
        assert "Saved" in (await c.get(done.headers["location"])).text
        edited = await row(pool, job_id)
        assert json.loads(edited["payload"]) == {"to": "b@example.com"}
        assert (edited["priority"], edited["max_attempts"]) == (3, 9)
        assert edited["run_at"] == later
        # The form as shown, saved again: nothing differs.
        again = await c.get(f"/jobs/{job_id}/edit")
        shown = {
            name: unescape(value)
            for name, value in re.findall(r'name="(\w+)" value="([^"]*)"', again.text)
        }
        shown["payload"] = unescape(
            re.search(r"<textarea[^>]*>(.*?)</textarea>", again.text, re.S)[1]  # type: ignore[index]
        )
        same = await c.post(f"/jobs/{job_id}/edit", data=shown, headers=SAME_ORIGIN)
        assert same.headers["location"] == f"/jobs/{job_id}?done=unchanged"
        for bad, said in (
            ({"payload": "{nope"}, "not JSON"),
            ({"priority": "high"}, "priority"),
            ({"run_at": "tomorrow"}, "run_at"),
        ):
            answer = await c.post(
                f"/jobs/{job_id}/edit", data={**shown, **bad}, headers=SAME_ORIGIN
            )
            assert answer.status_code == 400, bad
            assert said in unescape(answer.text), bad
    assert await row(pool, job_id) == edited


async def test_edit_of_a_job_claimed_meanwhile_is_refused_saying_why(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("t", {"n": 1})
    async with client(create_app(pool, read_only=False)) as c:
        form_page = await c.get(f"/jobs/{job_id}/edit")
        token = token_of(form_page.text)
        await pool.execute(
            "UPDATE pgqueue_jobs SET status = 'running', attempts = 1 WHERE id = $1",
            job_id,
        )
        before = await row(pool, job_id)
        refused = await c.post(
            f"/jobs/{job_id}/edit",
            data={
                "csrf": token,
                "payload": '{"n": 2}',
                "priority": "0",
                "run_at": before["run_at"].isoformat(),
                "group": "",
                "max_attempts": "3",
            },
            headers=SAME_ORIGIN,
        )
        assert refused.status_code == 409
        said = words(refused.text)
        assert "Not saved" in said
        assert "running" in said
        assert '"n": 2' in unescape(refused.text)  # what was typed is kept
        assert await row(pool, job_id) == before
        # A running job's page offers no Edit; its edit page says why.
        assert "Edit" not in buttons((await c.get(f"/jobs/{job_id}")).text)
        closed = await c.get(f"/jobs/{job_id}/edit")
        assert "Only pending and waiting jobs can be edited" in closed.text
        assert buttons(closed.text) == []
        assert (await c.get("/jobs/99999999999/edit")).status_code == 404


async def test_edit_leaves_a_hidden_payload_alone(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("t", {"secret": "s3"})
    app = create_app(pool, read_only=False, show_payloads=False)
    async with client(app) as c:
        form_page = (await c.get(f"/jobs/{job_id}/edit")).text
        assert "s3" not in form_page
        assert "<textarea" not in form_page
        fields: dict[str, Any] = {
            "csrf": token_of(form_page),
            "payload": '{"secret": "changed"}',
            "priority": "5",
            "run_at": (await row(pool, job_id))["run_at"].isoformat(),
            "max_attempts": "3",
        }
        done = await c.post(f"/jobs/{job_id}/edit", data=fields, headers=SAME_ORIGIN)
        assert done.status_code == 303
    edited = await row(pool, job_id)
    assert json.loads(edited["payload"]) == {"secret": "s3"}
    assert edited["priority"] == 5


async def test_edit_tells_json_values_apart(
    pool: asyncpg.Pool, queue: pgqueue.Queue
) -> None:
    job_id = await queue.enqueue("t", {"flag": 1})
    async with client(create_app(pool, read_only=False)) as c:
        token = token_of((await c.get(f"/jobs/{job_id}/edit")).text)
        current = await row(pool, job_id)
        done = await c.post(
            f"/jobs/{job_id}/edit",
            data={
                "csrf": token,
                "payload": '{"flag": true}',  # equal to 1 in Python, not in JSON
                "priority": str(current["priority"]),
                "run_at": current["run_at"].isoformat(),
                "max_attempts": str(current["max_attempts"]),
            },
            headers=SAME_ORIGIN,
        )
        assert done.headers["location"] == f"/jobs/{job_id}?done=updated"
    assert json.loads((await row(pool, job_id))["payload"]) == {"flag": True}


async def test_bulk_pages_keep_the_mount_prefix(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await seed(pool, queue_name)
    app = Starlette(routes=[Mount("/ops/pgqueue", create_app(pool, read_only=False))])
    terms = [f"queue={queue_name}", "status=dead"]
    async with client(app) as c:
        listing = (await c.get("/ops/pgqueue/jobs", params={"where": terms})).text
        assert 'formaction="/ops/pgqueue/bulk/retry"' in listing
        confirm = await c.get(
            "/ops/pgqueue/bulk/retry", params={"where": terms, "all": "1"}
        )
        assert 'action="/ops/pgqueue/bulk/retry"' in confirm.text
        done = await c.post(
            "/ops/pgqueue/bulk/retry", data=hidden(confirm.text), headers=SAME_ORIGIN
        )
        assert done.headers["location"].startswith("/ops/pgqueue/jobs?")
        pending = ids["u1-pending"][0]
        edit = await c.get(f"/ops/pgqueue/jobs/{pending}/edit")
        assert f'action="/ops/pgqueue/jobs/{pending}/edit"' in edit.text
    assert {r["status"] for r in await rows(pool, queue_name)} == {"pending", "running"}
