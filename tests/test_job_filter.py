"""`pgqueue.JobFilter`: its terms, and the jobs `Admin.jobs(filter=...)` finds on a real server.

Each field is tried against a queue of jobs whose rows differ in it, and
the ids found must be exactly those expected; containment is tried with
the GIN index of the operate guide, whose use the plan shows.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

import pgqueue
from pgqueue import JobFilter, Status
from pgqueue._extension import listing
from pgqueue._sql.listings import jobs_query
from tests.helpers import plan_nodes

# --- the value and its terms -------------------------------------------------------------


def test_parse_reads_fields_paths_and_json_values() -> None:
    found = JobFilter.parse(
        [
            "queue=orders",
            "payload.user_id=42",
            "status=dead",
            "payload.user.name=bob",
            'payload.code="42"',
            "result.ok=true",
            "created_after=2026-01-02",
            "error_contains=card declined",
        ]
    )
    assert found == JobFilter(
        queue="orders",
        status="dead",
        payload={"user_id": 42, "user": {"name": "bob"}, "code": "42"},
        result={"ok": True},
        created_after=datetime(2026, 1, 2, tzinfo=UTC),
        error_contains="card declined",
    )
    assert hash(found) == hash(JobFilter.parse(found.terms()))


@pytest.mark.parametrize(
    "value",
    [
        JobFilter(),
        JobFilter(queue="42", job_type='"quoted"', group="g", unique_key="k=1"),
        JobFilter(status="scheduled", due_before=datetime(2026, 5, 1, 12, tzinfo=UTC)),
        JobFilter(payload={"a.b": 1, "c": {"d": [1, 2]}}),
        JobFilter(payload={"s": "true", "t": "", "u": None, "e": {}}),
        JobFilter(result={"x": {"y": "text with = sign"}}, error_contains="null"),
        JobFilter(
            finished_after=datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=2))),
            created_before=datetime(2027, 1, 1, tzinfo=UTC),
        ),
    ],
)
def test_terms_parse_back_to_an_equal_filter(value: JobFilter) -> None:
    assert JobFilter.parse(value.terms()) == value
    assert str(value) == (" ".join(value.terms()) or "every job")


@pytest.mark.parametrize(
    ("terms", "error"),
    [
        (["queue"], "KEY=VALUE"),
        (["=orders"], "KEY=VALUE"),
        (["bogus=1"], "unknown filter key"),
        (["payloads.a=1"], "unknown filter key"),
        (["status=running-ish"], "status must be one of"),
        (["queue=a", "queue=b"], "given twice"),
        (["payload.a=1", "payload.a=2"], "two values"),
        (["payload=[1]"], "JSON object"),
        (["payload.a..b=1"], "empty step"),
        (["created_after=yesterday"], "ISO 8601"),
        (["queue=bad\x07name"], "control character"),
    ],
)
def test_a_bad_term_raises_value_error(terms: list[str], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        JobFilter.parse(terms)


def test_bad_fields_raise_when_the_filter_is_made() -> None:
    with pytest.raises(TypeError):
        JobFilter.parse("queue=orders")
    with pytest.raises(ValueError, match="timezone-aware"):
        JobFilter(created_after=datetime(2026, 1, 1))
    with pytest.raises(TypeError, match="dict"):
        JobFilter(payload=[1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="JSON values"):
        JobFilter(payload={"a": object()})
    with pytest.raises(ValueError, match="status"):
        JobFilter(status="bogus")


def test_the_payload_is_a_copy_of_its_own() -> None:
    given = {"a": {"b": 1}}
    found = JobFilter(payload=given)
    given["a"]["b"] = 2
    assert found.payload == {"a": {"b": 1}}
    assert found == JobFilter.parse(["payload.a.b=1"])


# --- the jobs it finds -------------------------------------------------------------------


async def _make(pool: asyncpg.Pool, queue: str) -> dict[str, int]:
    """A queue of jobs, each differing from the others in a field; their ids by name."""
    q = pgqueue.Queue(pool, name=queue)
    soon = datetime.now(UTC) + timedelta(hours=1)
    ids = {
        "gold": await q.enqueue(
            "ship", {"user_id": 1, "tier": "gold"}, group="g1", unique_key="k-a"
        ),
        "later": await q.enqueue("ship", {"user_id": 2}, run_at=soon),
        "dead": await q.enqueue("bill", {"user_id": 1, "items": [1, 2]}),
        "done": await q.enqueue("bill", {"user_id": 3}),
        "cancelled": await q.enqueue("mail", {"nested": {"x": 1}}),
        "old": await q.enqueue("mail", {"user_id": 1}),
    }
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = $2, attempts = 5, last_error = $3,"
        " updated_at = now() - interval '1 hour' WHERE id = $1",
        ids["dead"],
        Status.DEAD,
        "boom: card declined\nat line 3",
    )
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = $2, attempts = 1, result = $3::text::jsonb,"
        " completed_at = now(), last_error = 'earlier: timeout' WHERE id = $1",
        ids["done"],
        Status.COMPLETED,
        json.dumps({"total": 10, "ok": True, "lines": [{"sku": "a"}]}),
    )
    await pool.execute(
        "UPDATE pgqueue_jobs SET status = $2, last_error = 'cancelled by request' WHERE id = $1",
        ids["cancelled"],
        Status.CANCELLED,
    )
    await pool.execute(
        "UPDATE pgqueue_jobs SET created_at = now() - interval '2 days' WHERE id = $1",
        ids["old"],
    )
    return ids


DAY_AGO = object()  # stands for now - 1 day, in the table below


EXPECTED: list[tuple[dict[str, Any], set[str]]] = [
    ({}, {"gold", "later", "dead", "done", "cancelled", "old"}),
    ({"job_type": "ship"}, {"gold", "later"}),
    ({"status": "pending"}, {"gold", "later", "old"}),
    ({"status": "ready"}, {"gold", "old"}),
    ({"status": "scheduled"}, {"later"}),
    ({"status": "dead"}, {"dead"}),
    ({"status": "completed"}, {"done"}),
    ({"status": "cancelled"}, {"cancelled"}),
    ({"status": "running"}, set()),
    ({"group": "g1"}, {"gold"}),
    ({"unique_key": "k-a"}, {"gold"}),
    ({"unique_key": "k-b"}, set()),
    ({"created_before": DAY_AGO}, {"old"}),
    ({"created_after": DAY_AGO}, {"gold", "later", "dead", "done", "cancelled"}),
    ({"due_after": "soon"}, {"later"}),
    ({"due_before": "soon"}, {"gold", "dead", "done", "cancelled", "old"}),
    ({"finished_after": DAY_AGO}, {"dead", "done", "cancelled"}),
    ({"finished_before": DAY_AGO}, set()),
    ({"error_contains": "card declined"}, {"dead"}),
    ({"error_contains": "by request"}, {"cancelled"}),
    ({"error_contains": "%"}, set()),
    ({"payload": {"user_id": 1}}, {"gold", "dead", "old"}),
    ({"payload": {"user_id": 1, "tier": "gold"}}, {"gold"}),
    ({"payload": {"items": [2]}}, {"dead"}),
    ({"payload": {"nested": {"x": 1}}}, {"cancelled"}),
    ({"payload": {"user_id": "1"}}, set()),
    ({"result": {"ok": True}}, {"done"}),
    ({"result": {"lines": [{"sku": "a"}]}}, {"done"}),
    ({"payload": {"user_id": 1}, "status": "pending", "job_type": "mail"}, {"old"}),
]


def _resolved(fields: dict[str, Any]) -> dict[str, Any]:
    now = datetime.now(UTC)
    values = {}
    for name, value in fields.items():
        if value is DAY_AGO:
            value = now - timedelta(days=1)
        elif value == "soon":
            value = now + timedelta(minutes=30)
        values[name] = value
    return values


@pytest.mark.parametrize(("fields", "expected"), EXPECTED)
async def test_each_field_finds_exactly_its_jobs(
    pool: asyncpg.Pool, queue_name: str, fields: dict[str, Any], expected: set[str]
) -> None:
    ids = await _make(pool, queue_name)
    admin = pgqueue.Admin(pool)
    found = JobFilter(queue=queue_name, **_resolved(fields))
    listed = await admin.jobs(filter=found)
    assert {job.id for job in listed} == {ids[name] for name in expected}
    assert [job.id for job in listed] == sorted(
        (job.id for job in listed), reverse=True
    )
    assert await admin.count(filter=found) == len(expected)
    summaries = await admin.job_summaries(filter=found)
    assert [s.id for s in summaries] == [job.id for job in listed]
    # The same filter, as terms (the CLI's and the dashboard's).
    again = await admin.jobs(filter=JobFilter.parse(found.terms()))
    assert [job.id for job in again] == [job.id for job in listed]


async def test_paths_merge_into_one_containment(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await _make(pool, queue_name)
    found = JobFilter.parse(
        [f"queue={queue_name}", "payload.user_id=1", "payload.tier=gold"]
    )
    listed = await pgqueue.Admin(pool).jobs(filter=found)
    assert [job.id for job in listed] == [ids["gold"]]


async def test_the_keywords_and_the_filter_combine_and_page(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    ids = await _make(pool, queue_name)
    admin = pgqueue.Admin(pool)
    user_1 = JobFilter(payload={"user_id": 1})
    listed = await admin.jobs(queue=queue_name, filter=user_1)
    assert [job.id for job in listed] == [ids["old"], ids["dead"], ids["gold"]]
    first = await admin.jobs(queue=queue_name, filter=user_1, limit=2)
    assert [job.id for job in first] == [ids["old"], ids["dead"]]
    rest = await admin.jobs(
        queue=queue_name, filter=user_1, limit=2, before_id=first[-1].id
    )
    assert [job.id for job in rest] == [ids["gold"]]
    back = await admin.jobs(
        queue=queue_name, filter=user_1, limit=2, after_id=rest[0].id
    )
    assert [job.id for job in back] == [ids["old"], ids["dead"]]
    assert await admin.count(filter=JobFilter(queue=queue_name), limit=4) == 4
    by_status = await admin.jobs(queue=queue_name, status="dead", filter=user_1)
    assert [job.id for job in by_status] == [ids["dead"]]
    with pytest.raises(ValueError, match="contradicts"):
        await admin.jobs(queue="other", filter=JobFilter(queue=queue_name))


async def test_a_filtered_listing_puts_the_callers_setting_back(
    pool: asyncpg.Pool, queue_name: str
) -> None:
    await _make(pool, queue_name)
    async with pool.acquire() as connection, connection.transaction():
        before = await connection.fetchval("SHOW statement_timeout")
        listed = await pgqueue.Admin(connection).jobs(
            filter=JobFilter(queue=queue_name, job_type="ship")
        )
        assert len(listed) == 2
        assert await connection.fetchval("SHOW statement_timeout") == before


async def test_a_filtered_listing_is_cancelled_at_its_timeout(
    fresh_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search that cannot finish (here, the table locked by another session) is cancelled by the server."""
    monkeypatch.setattr("pgqueue._admin.SEARCH_TIMEOUT", 0.2)
    monkeypatch.setattr("pgqueue._bulk.SEARCH_TIMEOUT", 0.2)
    monkeypatch.setattr("pgqueue._actions.SEARCH_TIMEOUT", 0.2)
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=2) as pool:
        admin = pgqueue.Admin(pool)
        found = JobFilter(payload={"user_id": 1})
        locker = await asyncpg.connect(fresh_dsn)
        try:
            async with locker.transaction():
                await locker.execute("LOCK TABLE pgqueue_jobs IN ACCESS EXCLUSIVE MODE")
                with anyio.fail_after(10):
                    with pytest.raises(asyncpg.QueryCanceledError):
                        await admin.jobs(filter=found)
                    with pytest.raises(asyncpg.QueryCanceledError):
                        await admin.retry(filter=found, dry_run=True)
                    with pytest.raises(asyncpg.QueryCanceledError):
                        await admin.count(filter=found)
            assert await admin.jobs(filter=found) == []
        finally:
            await locker.close()


async def test_containment_uses_the_gin_index_when_it_exists(fresh_dsn: str) -> None:
    """The plan of a filtered listing reads the operate guide's GIN index.

    With ``enable_seqscan`` off (as on a big table, where the planner
    prefers the index on its own); without the index, the same listing
    still finds the job, by a scan.
    """
    async with asyncpg.create_pool(fresh_dsn, min_size=1, max_size=2) as pool:
        queue = pgqueue.Queue(pool, name="orders")
        await queue.enqueue_many(
            [("ship", {"user_id": i, "tier": "basic"}) for i in range(3000)]
        )
        found = JobFilter(payload={"user_id": 1234})
        statement, args = listing(jobs_query, None, None, None, 50, None, None, found)
        admin = pgqueue.Admin(pool)
        assert [job.payload["user_id"] for job in await admin.jobs(filter=found)] == [
            1234
        ]
        await pool.execute(GIN_INDEX)
        await pool.execute("ANALYZE pgqueue_jobs")
        async with pool.acquire() as connection:
            await connection.execute("SET enable_seqscan = off")
            raw = await connection.fetchval("EXPLAIN (FORMAT JSON) " + statement, *args)
            await connection.execute("RESET enable_seqscan")
        nodes = plan_nodes(json.loads(raw)[0]["Plan"])
        assert "idx_pgqueue_jobs_payload" in {n.get("Index Name") for n in nodes}, raw
        assert [job.payload["user_id"] for job in await admin.jobs(filter=found)] == [
            1234
        ]


GIN_INDEX = """
CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_pgqueue_jobs_payload
    ON pgqueue_jobs USING gin (payload jsonb_path_ops)
"""
"""The index docs/howto/operate.md tells operators to make (test_docs checks it is there)."""


def test_the_operate_guide_gives_the_index_the_plan_test_makes() -> None:
    guide = (Path(__file__).parent.parent / "docs" / "howto" / "operate.md").read_text()
    assert " ".join(GIN_INDEX.split()) + ";" in " ".join(guide.split())
