"""Producer-side benchmarks, pgqueue side by side with pgqueuer, rounds alternating (issue 25).

Sections (``--only`` picks some):

- ``producers``: 8 and 64 concurrent producers (a pool of that size, one
  task per connection, one job per call) for ``--seconds``: pgqueue's
  enqueue, in the caller's transaction, in ``queue.transaction(c)`` (when
  this tree has it), pgqueuer's enqueue, a bare INSERT (the floor) and
  INSERT + pg_notify in one statement;
- ``wake``: wake latency of an idle worker, alone and while 64 producers
  enqueue into another queue;
- ``bulk``: 50,000 jobs in calls of 1,000 and in one call, against COPY;
- ``hold``: a drain with and without a transaction held open meanwhile;
- ``noisy``: single jobs on queue B while a bulk producer floods queue A
  (``--flood-rate`` jobs/s), one worker serving both; and, as the control,
  a worker serving B alone.

Every measurement runs in a fresh database; each round runs every section
once, the order of the sides flipping every round. Ratios are paired (taken
within a round) and their median reported.

Usage: python -m benchmarks.producers [--rounds 3] [--only SECTION ...]
       [--producers 8 64] [--seconds 3] [--wake-jobs 200] [--bulk 50000]
       [--hold-jobs 20000] [--noisy-jobs 100] [--flood-rate 20000] [--busy]
       [--no-json]

``--busy`` runs a CPU-bound process per core beside every section (the
busy machine of issue 43's latency targets).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
from collections import defaultdict
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from benchmarks import _pgqueue_runs as pgq
from benchmarks import _producer_runs as prod
from benchmarks._common import (
    base_parser,
    fmt,
    fmt_summary,
    markdown_table,
    percentile,
    resolve_dsn,
    run,
    server_settings,
    summarize,
    write_json,
)
from benchmarks._pgqueue_runs import FLOOD_TYPE, JOB_TYPE
from benchmarks.wake import latency_points

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

SECTIONS = ("producers", "wake", "bulk", "hold", "noisy")
LIBS = ("pgqueue", "pgqueuer")
Values = dict[str, list[float]]
T = TypeVar("T")


def ordered(items: Sequence[T], round_index: int) -> list[T]:
    """``items`` in order on even rounds, reversed on odd ones."""
    return list(items) if round_index % 2 == 0 else list(items)[::-1]


def side(lib: str) -> Any:
    """The module that drives ``lib`` (pgqueuer's is imported only when asked for)."""
    if lib == "pgqueue":
        return pgq
    from benchmarks import _pgqueuer_runs

    return _pgqueuer_runs


def record_latencies(
    values: Values, key: str, latencies: list[float], calls: list[float]
) -> None:
    """Keep the latency points, and p50 and p99 of the call and of what follows it (ms).

    "after": from the return of the enqueue call (the commit) to the
    handler's start, job by job.
    """
    for point, ms in latency_points(latencies).items():
        values[f"{key}.{point}"].append(ms)
    after = [w - c for w, c in zip(latencies, calls, strict=True)]
    for name, seconds in (("call", calls), ("after", after)):
        for q in (50, 99):
            values[f"{key}.{name}_p{q}"].append(percentile(seconds, q) * 1000)


# --- measuring one round ------------------------------------------------------


def variants() -> list[str]:
    """The producer rows this tree can run (``tx_wake`` needs ``Queue.transaction``)."""
    return [v for v in prod.VARIANTS if v != "tx_wake" or prod.HAS_TX_WAKE]


def measure_producers(dsn: str, args: Any, values: Values, i: int) -> None:
    """Every variant at every producer count, once."""
    for p in args.producers:
        for v in ordered(variants(), i):
            r = prod.produce(dsn, v, p, args.seconds, args.warmup)
            key = f"producers.{p}.{v}"
            values[key].append(r["jobs_per_s"])
            values[f"{key}.pg_us"].append(r["postgres_db_cpu_s"] / r["enqueued"] * 1e6)
            values[f"{key}.client_us"].append(r["producer_cpu_s"] / r["enqueued"] * 1e6)
            values[f"{key}.on_notify_lock"].append(r["waits"].get("Lock:object", 0.0))
            values[f"{key}.idle"].append(r["waits"].get("idle", 0.0))
            print(f"  {p} producers, {v}: {r['jobs_per_s']:,.0f} jobs/s")


def measure_wake(dsn: str, args: Any, values: Values, i: int) -> None:
    """Each library's idle wake latency, then the same under a flood of another queue."""
    for loaded in (False, True):
        for lib in ordered(LIBS, i):
            flood = prod.Flood(lib, "other", args.load_producers, 1)
            latencies, calls = side(lib).wake_detail(
                dsn,
                args.wake_jobs,
                gap=args.gap,
                name=f"prod_wake_{lib}",
                alongside=flood if loaded else None,
            )
            key = f"wake.{'loaded' if loaded else 'idle'}.{lib}"
            record_latencies(values, key, latencies, calls)
            if loaded:
                values[f"{key}.flood"].append(flood.jobs_per_s)
            print(f"  wake {key}: p50 {values[f'{key}.p50'][-1]:.2f} ms")


def measure_bulk(dsn: str, args: Any, values: Values, i: int) -> None:
    """``--bulk`` jobs in calls of ``--chunk`` and in one call: pgqueue, COPY, pgqueuer."""
    n = args.bulk
    for chunk in (args.chunk, n):
        for who in ordered(("pgqueue", "copy", "pgqueuer"), i):
            if who == "copy":
                rate = prod.copy_floor(dsn, n, chunk)
            else:
                rate = side(who).enqueue_bulk(dsn, n, chunk, name=f"prod_bulk_{who}")
            values[f"bulk.{chunk}.{who}"].append(rate)
            print(f"  bulk {n} in calls of {chunk}, {who}: {rate:,.0f} jobs/s")


def measure_hold(dsn: str, args: Any, values: Values, i: int) -> None:
    """Each library's drain without and with a transaction held open."""
    for lib in ordered(LIBS, i):
        for hold in ordered((False, True), i):
            horizon = prod.Horizon(hold)
            r = side(lib).drain(
                dsn,
                args.hold_jobs,
                args.hold_concurrency,
                name=f"prod_hold_{lib}",
                around=horizon,
            )
            key = f"hold.{lib}.{'held' if hold else 'free'}"
            values[key].append(r["jobs_per_s"])
            values[f"{key}.dead"].append(horizon.dead)
            values[f"{key}.unremovable"].append(horizon.unremovable)
            print(
                f"  drain {key}: {r['jobs_per_s']:,.0f} jobs/s, {horizon.dead} dead,"
                f" {horizon.unremovable} left by VACUUM"
            )


def measure_noisy(dsn: str, args: Any, values: Values, i: int) -> None:
    """Queue B's start latency while a bulk producer floods queue A.

    "both": one worker serves A and B; "alone": the worker serves B only
    (A is flooded all the same), the control.
    """
    for served in ordered(("both", "alone"), i):
        for lib in ordered(LIBS, i):
            key = f"noisy.{served}.{lib}"
            latencies, calls, flood = noisy_run(dsn, args, lib, served == "both")
            record_latencies(values, key, latencies, calls)
            values[f"{key}.flood"].append(flood)
            print(f"  {key}: B p50 {values[f'{key}.p50'][-1]:.2f} ms")


def noisy_run(
    dsn: str, args: Any, lib: str, both: bool
) -> tuple[list[float], list[float], float]:
    """B's latencies and call times beside a flooded A; the flood's rate."""
    a = "a" if lib == "pgqueue" else FLOOD_TYPE
    flood = prod.Flood(lib, a, args.flood_producers, args.flood_chunk, args.flood_rate)
    lanes = {a: 10, "b": 10} if both else {"b": 10}
    options: dict[str, Any] = (
        {"queue": "b", "worker_queues": lanes}
        if lib == "pgqueue"
        # pgqueuer has no queues: B is the entrypoint JOB_TYPE.
        else {"entrypoints": {JOB_TYPE if k == "b" else k: n for k, n in lanes.items()}}
    )
    latencies, calls = side(lib).wake_detail(
        dsn,
        args.noisy_jobs,
        gap=args.noisy_gap,
        name=f"prod_noisy_{lib}",
        alongside=flood,
        **options,
    )
    return latencies, calls, flood.jobs_per_s


MEASURE: dict[str, Callable[[str, Any, Values, int], None]] = {
    "producers": measure_producers,
    "wake": measure_wake,
    "bulk": measure_bulk,
    "hold": measure_hold,
    "noisy": measure_noisy,
}


# --- reporting ----------------------------------------------------------------


def paired(a: list[float], b: list[float]) -> list[float]:
    """Per-round ratios ``a / b``."""
    return [x / y for x, y in zip(a, b, strict=True)]


def ratio_cell(ratios: list[float]) -> str:
    """``median (min..max)`` of ratios, two decimals."""
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}..{max(ratios):.2f})"


def cell(values: list[float], unit: str = "") -> str:
    """``median (min..max) unit`` of one row's rounds."""
    return fmt_summary(summarize(values), unit)


Report = tuple[str, list[str], list[list[str]], dict[str, Any]]
"""A section's title, table headers, rows and paired ratios (for the JSON)."""


def report_producers(values: Values, args: Any) -> Report:
    """Jobs/s per variant and producer count; ratios to the floor and to pgqueuer."""
    rows, ratios = [], {}
    for p in args.producers:
        floor = values[f"producers.{p}.{prod.FLOOR}"]
        held = values.get(f"producers.{p}.insert_held")
        theirs = values[f"producers.{p}.pgqueuer"]
        for v, label in prod.VARIANTS.items():
            key = f"producers.{p}.{v}"
            if key not in values:
                rows.append([str(p), label, *["n/a"] * 8])
                continue
            of_floor = paired(values[key], floor)
            vs = paired(values[key], theirs)
            ratios[f"{key}/floor"] = of_floor
            ratios[f"{key}/pgqueuer"] = vs
            of_held = paired(values[key], held) if held else None
            if of_held is not None:
                ratios[f"{key}/held_floor"] = of_held
            mine = not v.startswith("insert") and v != "pgqueuer"
            rows.append(
                [
                    str(p),
                    label,
                    cell(values[key]),
                    ratio_cell(of_floor),
                    ratio_cell(of_held) if of_held is not None else "n/a",
                    ratio_cell(vs) if mine else "",
                    fmt(statistics.median(values[f"{key}.pg_us"])),
                    fmt(statistics.median(values[f"{key}.client_us"])),
                    fmt(statistics.median(values[f"{key}.on_notify_lock"])),
                    fmt(statistics.median(values[f"{key}.idle"])),
                ]
            )
    headers = [
        "producers",
        "row",
        "jobs/s",
        "/ floor",
        "/ held floor",
        "/ pgqueuer",
        "PG CPU µs/job",
        "producer CPU µs/job",
        "backends on NOTIFY's lock",
        "backends idle",
    ]
    return "Concurrent producers", headers, rows, ratios


def latency_row(values: Values, key: str, label: str) -> list[str]:
    """p50, p95, p99, max (ms) and the enqueue call's p50/p99 of one latency row."""
    flood = values.get(f"{key}.flood")
    return [
        label,
        cell(values[f"{key}.p50"]),
        cell(values[f"{key}.p95"]),
        cell(values[f"{key}.p99"]),
        cell(values[f"{key}.max"]),
        pair(values, f"{key}.call"),
        pair(values, f"{key}.after"),
        cell(flood) if flood else "",
    ]


def pair(values: Values, key: str) -> str:
    """``p50 / p99``: the medians over rounds of ``key``'s p50 and p99."""
    p50 = statistics.median(values[f"{key}_p50"])
    return f"{fmt(p50)} / {fmt(statistics.median(values[f'{key}_p99']))}"


LATENCY_HEADERS = [
    "row",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "max ms",
    "enqueue call p50 / p99 ms",
    "after the call p50 / p99 ms",
    "flood jobs/s",
]


def latency_ratios(values: Values, prefix: str) -> dict[str, list[float]]:
    """pgqueue/pgqueuer per round for p50, p95 and p99 of ``prefix.<lib>``."""
    return {
        f"{prefix}.{point}": paired(
            values[f"{prefix}.pgqueue.{point}"], values[f"{prefix}.pgqueuer.{point}"]
        )
        for point in ("p50", "p95", "p99")
    }


def report_wake(values: Values, args: Any) -> Report:
    """Idle and loaded wake latency, both libraries."""
    rows = [
        latency_row(values, f"wake.{state}.{lib}", f"{lib}, {label}")
        for state, label in (
            ("idle", "idle"),
            ("loaded", f"{args.load_producers} producers on another queue"),
        )
        for lib in LIBS
    ]
    ratios = {
        **latency_ratios(values, "wake.idle"),
        **latency_ratios(values, "wake.loaded"),
    }
    rows += [
        [f"pgqueue/pgqueuer, {k}", ratio_cell(r), "", "", "", "", "", ""]
        for k, r in ratios.items()
    ]
    return "Wake latency", LATENCY_HEADERS, rows, ratios


def report_bulk(values: Values, args: Any) -> Report:
    """Bulk rates, ratios to COPY of the same chunking and pgqueue/pgqueuer."""
    rows, ratios = [], {}
    for chunk in (args.chunk, args.bulk):
        copy = values[f"bulk.{chunk}.copy"]
        for who in ("pgqueue", "pgqueuer", "copy"):
            key = f"bulk.{chunk}.{who}"
            ratios[f"{key}/copy"] = paired(values[key], copy)
            vs = ""
            if who == "pgqueue":
                ratios[f"{key}/pgqueuer"] = paired(
                    values[key], values[f"bulk.{chunk}.pgqueuer"]
                )
                vs = ratio_cell(ratios[f"{key}/pgqueuer"])
            rows.append(
                [
                    f"{args.bulk:,} in calls of {chunk:,}",
                    who,
                    cell(values[key]),
                    ratio_cell(ratios[f"{key}/copy"]),
                    vs,
                ]
            )
    headers = ["jobs", "who", "jobs/s", "/ COPY", "/ pgqueuer"]
    return "Bulk enqueue", headers, rows, ratios


def report_hold(values: Values, args: Any) -> Report:
    """Drain rates with and without a held transaction, and the dead tuples left."""
    rows, ratios = [], {}
    for lib in LIBS:
        free, held = values[f"hold.{lib}.free"], values[f"hold.{lib}.held"]
        ratios[f"hold.{lib}.held/free"] = paired(held, free)
        for state, label in (("free", "no"), ("held", "yes")):
            key = f"hold.{lib}.{state}"
            rows.append(
                [
                    lib,
                    label,
                    cell(values[key]),
                    ratio_cell(ratios[f"hold.{lib}.held/free"])
                    if state == "held"
                    else "",
                    fmt(statistics.median(values[f"{key}.dead"])),
                    fmt(statistics.median(values[f"{key}.unremovable"])),
                ]
            )
    headers = [
        "library",
        "transaction held",
        "drain jobs/s",
        "held / free",
        "dead tuples after",
        "left by VACUUM",
    ]
    return "Drain under a held transaction", headers, rows, ratios


def report_noisy(values: Values, args: Any) -> Report:
    """Queue B's start latency beside a flooded queue A; the control without A."""
    labels = {"both": "serves A and B", "alone": "serves B only (control)"}
    rows = [
        latency_row(values, f"noisy.{served}.{lib}", f"{lib}, {label}")
        for served, label in labels.items()
        for lib in LIBS
    ]
    ratios = {
        **latency_ratios(values, "noisy.both"),
        **latency_ratios(values, "noisy.alone"),
    }
    rows += [
        [f"pgqueue/pgqueuer, {k}", ratio_cell(r), "", "", "", "", "", ""]
        for k, r in ratios.items()
    ]
    title = "Noisy neighbour: queue B while queue A is flooded"
    return title, LATENCY_HEADERS, rows, ratios


REPORT: dict[str, Callable[[Values, Any], Report]] = {
    "producers": report_producers,
    "wake": report_wake,
    "bulk": report_bulk,
    "hold": report_hold,
    "noisy": report_noisy,
}


# --- the command --------------------------------------------------------------


def parse() -> argparse.Namespace:
    """The command line."""
    parser = base_parser(__doc__ or "")
    add = parser.add_argument
    add("--rounds", dest="runs", type=int, default=argparse.SUPPRESS, help="= --runs")
    add("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    add("--producers", nargs="+", type=int, default=[8, 64])
    add("--seconds", type=float, default=3.0, help="measured window per row")
    add("--warmup", type=float, default=0.5, help="unmeasured start of each row")
    add("--wake-jobs", type=int, default=200)
    add("--gap", type=float, default=0.02, help="seconds between measured jobs")
    add("--load-producers", type=int, default=64)
    add("--bulk", type=int, default=50_000)
    add("--chunk", type=int, default=1000)
    add("--hold-jobs", type=int, default=20_000)
    add("--hold-concurrency", type=int, default=10)
    add("--noisy-jobs", type=int, default=100)
    add("--noisy-gap", type=float, default=0.05)
    add("--flood-producers", type=int, default=1)
    add("--flood-chunk", type=int, default=1000)
    add("--flood-rate", type=float, default=20_000, help="jobs/s cap, 0 for none")
    add(
        "--busy",
        action="store_true",
        help="a CPU-bound process per core beside the whole run (a busy machine)",
    )
    return parser.parse_args()


def _spin() -> None:
    while True:
        pass


@contextmanager
def busy(enabled: bool) -> Iterator[None]:
    """With ``enabled``, one CPU-bound process per core until the block ends."""
    context = multiprocessing.get_context("spawn")
    spinners = [
        context.Process(target=_spin, daemon=True)
        for _ in range((os.cpu_count() or 1) if enabled else 0)
    ]
    for process in spinners:
        process.start()
    try:
        yield
    finally:
        for process in spinners:
            process.kill()
            process.join()


def main() -> None:
    args = parse()
    dsn = resolve_dsn(args.dsn)
    print(f"queue.transaction(connection): {'yes' if prod.HAS_TX_WAKE else 'n/a'}")
    values: Values = defaultdict(list)
    with busy(args.busy):
        for i in range(args.runs):
            print(f"round {i + 1} of {args.runs}")
            for section in args.only:
                MEASURE[section](dsn, args, values, i)
    out: dict[str, Any] = {
        "settings": vars(args),
        "server": run(server_settings(dsn)),
        "queue_transaction": prod.HAS_TX_WAKE,
        "sections": {},
    }
    print(
        f"\n{args.runs} rounds; median (min..max) over rounds; ratios: median "
        "(min..max) of per-round ratios"
    )
    for section in args.only:
        title, headers, rows, ratios = REPORT[section](values, args)
        print(f"\n### {title}\n\n{markdown_table(headers, rows)}")
        out["sections"][section] = {
            "values": {k: v for k, v in values.items() if k.startswith(f"{section}.")},
            "summary": {
                k: summarize(v)
                for k, v in values.items()
                if k.startswith(f"{section}.")
            },
            "ratios": {k: {**summarize(r), "values": r} for k, r in ratios.items()},
        }
    write_json("producers", out, enabled=not args.no_json)


if __name__ == "__main__":
    main()
