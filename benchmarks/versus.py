"""pgqueue now vs another revision of it (the last release), runs alternating.

The revision's ``src`` and ``benchmarks`` are exported with ``git archive``
into a temporary directory; each measurement runs in a fresh interpreter
whose ``PYTHONPATH`` starts with one side's tree, using that side's own
benchmark code. Every round measures every metric for both sides back to
back (the order flips every round), so both see the same noise; ratios are
taken per round (paired) and their median is reported.

Usage: python -m benchmarks.versus --baseline REF [--rounds 5] [--jobs 20000]
       [--single 2000] [--bulk 50000] [--wake-jobs 200] [--only drain,floor,...]
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path
from typing import Any

from benchmarks._common import (
    base_parser,
    fmt,
    markdown_table,
    resolve_dsn,
    summarize,
    write_json,
)

ROOT = Path(__file__).resolve().parent.parent

# Runs in the side's tree: one measurement, printed as JSON on the last line.
MEASURE = """
import json, sys
import pgqueue
from benchmarks import _pgqueue_runs as pgq
from benchmarks._common import percentile
kind, dsn, n, extra = json.loads(sys.argv[1])
if kind == "drain":
    r = pgq.drain(dsn, n, extra)
    out = {"jobs_per_s": r["jobs_per_s"], "cpu_us": r["worker_cpu_s"] / n * 1e6}
elif kind == "floor":
    r = pgq.floor(dsn, n, extra)
    out = {"jobs_per_s": r["jobs_per_s"]}
elif kind == "single":
    out = {"jobs_per_s": pgq.enqueue_single(dsn, n)}
elif kind == "bulk":
    out = {"jobs_per_s": pgq.enqueue_bulk(dsn, n, extra)}
else:
    latencies = pgq.wake(dsn, n)
    out = {"p50_ms": percentile(latencies, 50) * 1e3, "p99_ms": percentile(latencies, 99) * 1e3}
out["pgqueue"] = pgqueue.__file__
print(json.dumps(out))
"""

# (label, measurement kind, its argument, value, higher is better)
METRICS = (
    ("drain C=10, jobs/s", "drain", 10, "jobs_per_s", True),
    ("drain C=10, worker CPU µs/job", "drain", 10, "cpu_us", False),
    ("drain C=100, jobs/s", "drain", 100, "jobs_per_s", True),
    ("drain C=100, worker CPU µs/job", "drain", 100, "cpu_us", False),
    (
        "floor: bare SQL, claims of 100, pipelined, jobs/s",
        "floor",
        100,
        "jobs_per_s",
        True,
    ),
    ("enqueue, jobs/s", "single", None, "jobs_per_s", True),
    ("enqueue_many, jobs/s", "bulk", 1000, "jobs_per_s", True),
    ("wake p50, ms", "wake", None, "p50_ms", False),
    ("wake p99, ms", "wake", None, "p99_ms", False),
)


def export(ref: str, into: Path) -> str:
    """Write ``ref``'s ``src`` and ``benchmarks`` under ``into``; return its commit."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", f"{ref}^{{commit}}"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "src", "benchmarks"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return commit


def measure(
    tree: Path, kind: str, dsn: str, n: int, extra: int | None
) -> dict[str, Any]:
    """One measurement with ``tree``'s pgqueue and benchmark code."""
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}"}
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, json.dumps([kind, dsn, n, extra])],
        cwd=tree,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not Path(result["pgqueue"]).is_relative_to(tree):
        msg = f"measured {result['pgqueue']}, not the tree at {tree}"
        raise RuntimeError(msg)
    return result


def main() -> None:
    parser = base_parser(__doc__ or "")
    parser.add_argument("--baseline", required=True, help="git ref to compare against")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--single", type=int, default=2_000)
    parser.add_argument("--bulk", type=int, default=50_000)
    parser.add_argument("--wake-jobs", type=int, default=200)
    parser.add_argument(
        "--only",
        default="drain,floor,single,bulk,wake",
        help="the measurements to run, comma-separated (default: all)",
    )
    args = parser.parse_args()
    only = set(args.only.split(","))
    if unknown := only - {"drain", "floor", "single", "bulk", "wake"}:
        parser.error(f"--only: unknown measurements {sorted(unknown)}")
    metrics = [metric for metric in METRICS if metric[1] in only]
    dsn = resolve_dsn(args.dsn)
    sizes = {
        "drain": args.jobs,
        "floor": args.jobs,
        "single": args.single,
        "bulk": args.bulk,
        "wake": args.wake_jobs,
    }
    kinds = list(dict.fromkeys((kind, extra) for _, kind, extra, _, _ in metrics))
    values: dict[str, dict[str, list[float]]] = {"baseline": {}, "current": {}}
    with tempfile.TemporaryDirectory(prefix="pgqueue-versus-") as tmp:
        commit = export(args.baseline, Path(tmp))
        trees = {"baseline": Path(tmp), "current": ROOT}
        for round_ in range(args.rounds):
            for kind, extra in kinds:
                sides = ["baseline", "current"]
                if round_ % 2:
                    sides.reverse()
                for side in sides:
                    got = measure(trees[side], kind, dsn, sizes[kind], extra)
                    for label, k, e, key, _ in metrics:
                        if (k, e) == (kind, extra):
                            values[side].setdefault(label, []).append(got[key])
            print(f"round {round_ + 1} of {args.rounds} done", flush=True)
    rows = []
    out: dict[str, Any] = {
        "baseline": {"ref": args.baseline, "commit": commit},
        "rounds": args.rounds,
        "sizes": sizes,
        "metrics": {},
    }
    for label, _, _, _, higher_is_better in metrics:
        base, now = values["baseline"][label], values["current"][label]
        paired = statistics.median(c / b for b, c in zip(base, now, strict=True))
        out["metrics"][label] = {
            "baseline": summarize(base),
            "current": summarize(now),
            "paired_ratio": paired,
            "higher_is_better": higher_is_better,
            "runs": {"baseline": base, "current": now},
        }
        rows.append(
            [
                label,
                fmt(statistics.median(base)),
                fmt(statistics.median(now)),
                f"{paired:.2f}x",
            ]
        )
    print()
    print(
        markdown_table(
            ["metric", f"{commit} median", "now median", "now / then (paired median)"],
            rows,
        )
    )
    floor_label = next((m[0] for m in metrics if m[1] == "floor"), None)
    if floor_label is not None:
        # Each side's drain over the bare-SQL floor, measured in the same round.
        shares = []
        for label, kind, _, key, _ in metrics:
            if kind != "drain" or key != "jobs_per_s":
                continue
            row = [label.replace(", jobs/s", " / floor")]
            for side in ("baseline", "current"):
                ratios = [
                    d / f
                    for d, f in zip(
                        values[side][label], values[side][floor_label], strict=True
                    )
                ]
                out["metrics"][f"{label} / floor ({side})"] = summarize(ratios)
                row.append(f"{statistics.median(ratios):.2f}")
            shares.append(row)
        print()
        print(markdown_table(["drain / floor", commit, "now"], shares))
    write_json("versus", out, enabled=not args.no_json)


if __name__ == "__main__":
    main()
