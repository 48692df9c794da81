"""DBOS Transact's side of benchmarks.durable, run by an interpreter that has ``dbos``.

Not imported by the project: ``python benchmarks/_dbos_runs.py JSON`` where
JSON holds ``mode`` ("steps" or "latency"), ``dsn`` (its own database,
DBOS's system database), ``steps`` (K), and ``jobs`` and ``concurrency``
(steps) or ``runs`` (latency). It talks to the parent over its standard
streams, one line each: prints ``ready`` once DBOS is launched, waits for
``go``, prints the result as JSON, waits for ``exit`` (so its connections
are still open while the parent samples the server).

DBOS is configured as documented (``DBOSConfig`` with ``name`` and
``system_database_url``; the default pool) and its async workflows are
started directly (``await workflow(...)``), its fastest path: no DBOS queue
and its polling.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from dbos import DBOS, DBOSConfig

STEPS = 10
body: list[float] = []


@DBOS.step()
async def noop() -> None:
    """The step: does nothing, returns nothing."""


@DBOS.workflow()
async def durable(steps: int) -> None:
    """``steps`` no-op steps."""
    start = time.perf_counter()
    for _ in range(steps):
        await noop()
    body.append(time.perf_counter() - start)


def handshake(result: dict[str, Any] | None) -> None:
    """Tell the parent where we are; wait for its next word."""
    print("ready" if result is None else json.dumps(result), flush=True)
    sys.stdin.readline()


async def steps_run(jobs: int, steps: int, concurrency: int) -> dict[str, Any]:
    """``jobs`` workflows of ``steps`` steps, ``concurrency`` of them at a time."""
    left = iter(range(jobs))

    async def lane() -> None:
        for _ in left:
            await durable(steps)

    cpu0 = time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    return {
        "seconds": elapsed,
        "steps_per_s": jobs * steps / elapsed,
        "jobs_per_s": jobs / elapsed,
        "worker_cpu_s": time.process_time() - cpu0,
    }


async def latency_run(runs: int, steps: int) -> dict[str, Any]:
    """``runs`` workflows one after the other, each of ``steps`` steps and of none."""
    out: dict[str, list[float]] = {}
    for k in (steps, 0):
        for _ in range(3):  # warm up: the first calls build caches and connections
            await durable(k)
        body.clear()
        totals = []
        for _ in range(runs):
            start = time.perf_counter()
            await durable(k)
            totals.append(time.perf_counter() - start)
        out[f"total_{k}"] = totals
        out[f"body_{k}"] = list(body)
    return out


async def verify(engine: Any, jobs: int, steps: int) -> None:
    """Fail unless DBOS recorded ``jobs`` successful workflows and their steps."""
    import sqlalchemy as sa  # DBOS's dependency

    with engine.connect() as connection:
        done = connection.execute(
            sa.text(
                "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'"
            )
        ).scalar()
        recorded = connection.execute(
            sa.text("SELECT count(*) FROM dbos.operation_outputs")
        ).scalar()
    if done != jobs or recorded != jobs * steps:
        msg = f"DBOS: {done} workflows succeeded, {recorded} steps recorded; expected {jobs}, {jobs * steps}"
        raise AssertionError(msg)


async def main(spec: dict[str, Any]) -> None:
    config: DBOSConfig = {
        "name": "pgqueue-durable-bench",
        "system_database_url": spec["dsn"],
    }
    DBOS(config=config)
    DBOS.launch()
    try:
        handshake(None)
        steps = spec["steps"]
        if spec["mode"] == "steps":
            result = await steps_run(spec["jobs"], steps, spec["concurrency"])
            import sqlalchemy as sa

            engine = sa.create_engine(
                spec["dsn"].replace("postgresql://", "postgresql+psycopg://", 1)
            )
            try:
                await verify(engine, spec["jobs"], steps)
            finally:
                engine.dispose()
        else:
            result = await latency_run(spec["runs"], steps)
        result["dbos"] = sys.modules["dbos"].__file__
        handshake(result)
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
