"""Citus: drain throughput and CPU per job per node, side by side with plain PostgreSQL.

Usage: python -m benchmarks.citus [--jobs 20000] [--runs 3]
       [--concurrency 10 50] [--queues 1 8] [--tls] [--statements]

Needs the citus extension installed for the machine's PostgreSQL (see
docs/howto/scaling.md; nothing here builds it). Starts, on free loopback
ports in a temporary directory (removed at the end), a Citus coordinator
with two worker nodes (`pgqueue.testing._citus`) and a plain PostgreSQL
server with the same settings (fsync off on all four: the figures compare
the engines, not the disks). For each setup, concurrency C and queue count
Q, each run fills Q queues with N no-op jobs between them (`enqueue_many`
in calls of 1,000, not timed), then one in-process `pgqueue.Worker` drains
them (``run(until_empty=True)``, ``prefetch = C``; with 8 queues,
``max_concurrency = C`` over them). Setups:

- ``plain``: the plain server, `pgqueue.SCHEMA`;
- ``citus``: the worker connected to the coordinator, `SCHEMA_DISTRIBUTED`;
- ``citus-direct`` (one queue only): the worker connected straight to the
  worker node that holds its queue's shard (Citus 11+ takes queries on any
  node), the producer on the coordinator.

Citus turns TLS on between its nodes (``citus.node_conninfo =
'sslmode=require'``, and ``ssl`` on every node when the extension is
created); the plain server has none, so the cluster here runs with
``sslmode=disable`` and no setup pays for TLS (``--tls`` keeps Citus's
default, and then only Citus pays for it).

``--statements`` measures instead what one statement costs, by setup: the
median round trip (from the client, with its rows decoded) of a one-row
SELECT by key, the cheapest claim-shaped UPDATE (a subquery taking one job,
``FOR UPDATE SKIP LOCKED``), the worker's claim of 1 and of 100 jobs (on
Citus, of priority 0's line and of every line) and the completion of 100;
each in a transaction rolled back, 200 times.

CPU per job is the CPU time of each server's processes over the drain
(every process under its postmaster, sampled every 100 ms so backends that
exit still count) divided by N, and the client's own; the machine's two
cores are shared by every server, the client and other users. Medians of
the runs; the run order alternates setups.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import asyncpg
import psutil

import pgqueue
from benchmarks._common import process_cpu
from pgqueue._sql.claims import CLAIM, DISTRIBUTED_CLAIM, DISTRIBUTED_CLAIM_ZERO
from pgqueue._sql.literals import array, claim_places
from pgqueue._sql.outcomes import COMPLETE, DISTRIBUTED_COMPLETE
from pgqueue.testing._citus import CitusCluster, CitusNode, citus_cluster, citus_missing
from pgqueue.testing._clusters import binaries, free_port

if TYPE_CHECKING:
    from pathlib import Path

BATCH = 1000


class NodeSampler:
    """CPU seconds of every process under each node's postmaster, sampled in a thread."""

    def __init__(self, nodes: dict[str, Path], interval: float = 0.1) -> None:
        self._roots = {name: _postmaster(data) for name, data in nodes.items()}
        self._interval = interval
        self._last: dict[str, dict[int, float]] = {name: {} for name in nodes}
        self._before: dict[str, dict[int, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._sample()
        self._before = {name: dict(times) for name, times in self._last.items()}

    def _sample(self) -> None:
        for name, root in self._roots.items():
            for proc in [root, *root.children(recursive=True)]:
                try:
                    times = proc.cpu_times()
                except psutil.Error:
                    continue
                self._last[name][proc.pid] = times.user + times.system

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def __enter__(self) -> NodeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def seconds(self) -> dict[str, float]:
        """CPU seconds each node used while sampled."""
        return {
            name: sum(
                value - self._before[name].get(pid, 0.0) for pid, value in times.items()
            )
            for name, times in self._last.items()
        }


def _postmaster(data: Path) -> psutil.Process:
    return psutil.Process(int((data / "postmaster.pid").read_text().split()[0]))


def plain_node(cluster: CitusCluster) -> CitusNode:
    """A plain PostgreSQL server beside the cluster, with its settings but no Citus."""
    node = CitusNode(cluster, "plain", free_port())
    node.init({"max_connections": "300"})
    return node


async def fill(dsn: str, queues: list[str], jobs: int) -> None:
    """N jobs spread evenly over ``queues``."""
    async with asyncpg.create_pool(dsn, min_size=1, max_size=2) as pool:
        per = jobs // len(queues)
        for name in queues:
            queue = pgqueue.Queue(pool, name=name)
            for start in range(0, per, BATCH):
                await queue.enqueue_many(
                    [("noop", {}) for _ in range(min(BATCH, per - start))]
                )
        await pool.execute("VACUUM ANALYZE pgqueue_jobs")


async def drain(dsn: str, queues: list[str], concurrency: int) -> None:
    """Drain ``queues`` with one worker of ``concurrency`` slots."""
    async with asyncpg.create_pool(dsn, min_size=1, max_size=4) as pool:
        if len(queues) == 1:
            worker = pgqueue.Worker(
                pool, queue=queues[0], concurrency=concurrency, prefetch=concurrency
            )
        else:
            worker = pgqueue.Worker(
                pool,
                queues=dict.fromkeys(queues, concurrency),
                max_concurrency=concurrency,
                prefetch=concurrency,
            )

        @worker.handler("noop")
        async def noop(job: pgqueue.Job) -> None:
            pass

        await worker.run(until_empty=True)


async def shard_node(coordinator: str, queue: str) -> int:
    """The port of the worker node holding ``queue``'s shard."""
    conn = await asyncpg.connect(coordinator)
    try:
        port: int = await conn.fetchval(
            "SELECT nodeport FROM pg_dist_shard_placement"
            " WHERE shardid = get_shard_id_for_distribution_column('pgqueue_jobs', $1::text)",
            queue,
        )
        return port
    finally:
        await conn.close()


async def one_run(
    setup: str,
    nodes: dict[str, CitusNode],
    concurrency: int,
    queue_count: int,
    jobs: int,
) -> dict[str, Any]:
    """Fill and drain once; the rate and CPU per job of each node and of the client."""
    producer = (nodes["plain"] if setup == "plain" else nodes["coordinator"]).dsn
    tag = uuid.uuid4().hex[:8]
    queues = [f"bench-{tag}-{i}" for i in range(queue_count)]
    await fill(producer, queues, jobs)
    consumer = producer
    if setup == "citus-direct":
        port = await shard_node(producer, queues[0])
        consumer = next(node.dsn for node in nodes.values() if node.port == port)
    watched = (
        {"plain": nodes["plain"].data}
        if setup == "plain"
        else {name: nodes[name].data for name in ("coordinator", "worker1", "worker2")}
    )
    client_before = process_cpu()
    with NodeSampler(watched) as sampler:
        started = time.perf_counter()
        await drain(consumer, queues, concurrency)
        elapsed = time.perf_counter() - started
    client = process_cpu() - client_before
    cpu = sampler.seconds()
    return {
        "rate": jobs / elapsed,
        "cpu_us_per_job": {name: seconds / jobs * 1e6 for name, seconds in cpu.items()},
        "client_us_per_job": client / jobs * 1e6,
    }


async def prepare(nodes: dict[str, CitusNode], cluster: CitusCluster) -> None:
    await cluster.join()
    for name, distributed in (("coordinator", True), ("plain", False)):
        conn = await asyncpg.connect(nodes[name].dsn)
        try:
            await pgqueue.install(conn, distributed=distributed)
        finally:
            await conn.close()


STATEMENT_RUNS = 200


async def statements(nodes: dict[str, CitusNode]) -> None:
    """Print the round trip of single statements, by setup (``--statements``)."""
    queue = f"bench-{uuid.uuid4().hex[:8]}"
    await fill(nodes["coordinator"].dsn, [queue], 1000)
    await fill(nodes["plain"].dsn, [queue], 1000)
    port = await shard_node(nodes["coordinator"].dsn, queue)
    direct = next(node for node in nodes.values() if node.port == port)
    setups = {
        "citus": (nodes["coordinator"].dsn, True),
        "citus-direct": (direct.dsn, True),
        "plain": (nodes["plain"].dsn, False),
    }
    heads = claim_places({})
    rows: dict[str, dict[str, float]] = {}
    for setup, (dsn, distributed) in setups.items():
        conn = await asyncpg.connect(dsn)
        try:
            ids = [
                r[0]
                for r in await conn.fetch(
                    "SELECT id FROM pgqueue_jobs WHERE queue = $1 ORDER BY id LIMIT 100",
                    queue,
                )
            ]
            await conn.execute(
                "UPDATE pgqueue_jobs SET status = 'running', attempts = 1"
                " WHERE queue = $1 AND id = ANY($2::int8[])",
                queue,
                ids,
            )
            claim = DISTRIBUTED_CLAIM_ZERO if distributed else CLAIM
            complete = DISTRIBUTED_COMPLETE if distributed else COMPLETE
            done = (array(ids), array([1] * len(ids)), [None] * len(ids))
            measured = {
                "SELECT by key": await _timed(conn, _BY_KEY, queue, ids[0]),
                "cheapest claim": await _timed(conn, _CHEAPEST_CLAIM, queue),
                "claim of 1": await _timed(conn, claim, queue, 1, *heads),
                "claim of 100": await _timed(conn, claim, queue, 100, *heads),
                "complete 100": await _timed(
                    conn, complete, *done, *((queue,) if distributed else ())
                ),
            }
            if distributed:
                measured["claim of 100, every line"] = await _timed(
                    conn, DISTRIBUTED_CLAIM, queue, 100, *heads
                )
            rows[setup] = measured
        finally:
            await conn.close()
    names = list(dict.fromkeys(name for measured in rows.values() for name in measured))
    print()
    print("| statement (ms) | " + " | ".join(rows) + " |")
    print("|---|" + "---|" * len(rows))
    for name in names:
        cells = [f"{rows[s][name]:.3f}" if name in rows[s] else "-" for s in rows]
        print(f"| {name} | " + " | ".join(cells) + " |")


_BY_KEY = "SELECT id FROM pgqueue_jobs WHERE queue = $1 AND id = $2"
_CHEAPEST_CLAIM = """
UPDATE pgqueue_jobs SET status = 'running', attempts = attempts + 1
WHERE queue = $1 AND id = ANY(ARRAY(
    SELECT id FROM pgqueue_jobs WHERE queue = $1 AND status = 'pending'
    ORDER BY run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED))
RETURNING id
"""


async def _timed(conn: asyncpg.Connection[Any], statement: str, *args: object) -> float:
    """The median milliseconds of ``statement``, each in a transaction rolled back."""
    times = []
    for _ in range(STATEMENT_RUNS):
        transaction = conn.transaction()
        await transaction.start()
        try:
            started = time.perf_counter()
            await conn.fetch(statement, *args)
            times.append(time.perf_counter() - started)
        finally:
            await transaction.rollback()
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--queues", type=int, nargs="+", default=[1, 8])
    parser.add_argument(
        "--tls", action="store_true", help="keep Citus's TLS between its nodes"
    )
    parser.add_argument(
        "--statements", action="store_true", help="time single statements instead"
    )
    args = parser.parse_args()
    bindir = binaries()
    missing = citus_missing(bindir)
    if missing is not None:
        raise SystemExit(f"benchmarks.citus needs Citus: {missing}")
    assert bindir is not None
    settings = {} if args.tls else {"citus.node_conninfo": "'sslmode=disable'"}
    with citus_cluster(bindir, settings=settings) as cluster:
        nodes = {node.name: node for node in cluster.nodes}
        nodes["plain"] = plain = plain_node(cluster)
        try:
            asyncio.run(prepare(nodes, cluster))
            if args.statements:
                asyncio.run(statements(nodes))
                return
            results: dict[tuple[str, int, int], list[dict[str, Any]]] = {}
            for queue_count in args.queues:
                for concurrency in args.concurrency:
                    setups = ["plain", "citus"]
                    if queue_count == 1:
                        setups.append("citus-direct")
                    for run in range(args.runs):
                        order = setups if run % 2 == 0 else setups[::-1]
                        for setup in order:
                            result = asyncio.run(
                                one_run(
                                    setup, nodes, concurrency, queue_count, args.jobs
                                )
                            )
                            results.setdefault(
                                (setup, concurrency, queue_count), []
                            ).append(result)
                            print(
                                f"{setup:13} C={concurrency:<3} Q={queue_count}: "
                                f"{result['rate']:8.0f} jobs/s",
                                flush=True,
                            )
            report(results)
        finally:
            plain.stop("immediate")


def report(results: dict[tuple[str, int, int], list[dict[str, Any]]]) -> None:
    """A markdown table of the medians."""
    print()
    print(
        "| setup | C | queues | jobs/s | vs plain | µs CPU/job: coordinator (or plain) "
        "| worker1 | worker2 | client |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (setup, concurrency, queue_count), runs in sorted(
        results.items(), key=lambda item: (item[0][2], item[0][1], item[0][0])
    ):
        rate = statistics.median(r["rate"] for r in runs)
        plain = statistics.median(
            r["rate"] for r in results[("plain", concurrency, queue_count)]
        )

        def cpu(name: str, runs: list[dict[str, Any]] = runs) -> str:
            values = [
                r["cpu_us_per_job"][name] for r in runs if name in r["cpu_us_per_job"]
            ]
            return f"{statistics.median(values):.0f}" if values else "-"

        first = cpu("plain") if setup == "plain" else cpu("coordinator")
        client = statistics.median(r["client_us_per_job"] for r in runs)
        print(
            f"| {setup} | {concurrency} | {queue_count} | {rate:.0f} | {rate / plain:.2f}x "
            f"| {first} | {cpu('worker1')} | {cpu('worker2')} | {client:.0f} |"
        )


if __name__ == "__main__":
    main()
