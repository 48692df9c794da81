"""How ``pgqueue jobs show`` prints a durable handler's steps, signals, wait and progress.

Every name and message is a job's field: hostile text, printed escaped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgqueue.cli._common import printable

if TYPE_CHECKING:
    from datetime import datetime

    from pgqueue import JobInfo, ProgressInfo, SignalInfo, StepInfo, WaitInfo

__all__ = ["DURABLE_FIELDS", "durable_rows", "print_durable_tables"]

DURABLE_FIELDS = frozenset(
    {"steps", "steps_total", "signals", "signals_total", "wait", "progress"}
)
"""The fields of `pgqueue.JobInfo` printed here rather than as plain rows."""


def _time(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(timespec="seconds")


def _size(value: int | None) -> str:
    return "-" if value is None else f"{value:,} B"


def wait_text(wait: WaitInfo | None) -> str:
    """``signal "approve" (until ...)``, ``job 12``, ``sleep until ...``; ``-`` for none."""
    if wait is None:
        return "-"
    if wait.signal is not None:
        text = f"signal {printable(repr(wait.signal))}"
    elif wait.child is not None:
        text = f"job {wait.child} to end"
    else:
        return f"sleep until {_time(wait.until)}"
    return text if wait.until is None else f"{text} (until {_time(wait.until)})"


def progress_text(progress: ProgressInfo | None) -> str:
    """``50% waiting for approval (at ...)``; ``-`` for none."""
    if progress is None:
        return "-"
    share = "-" if progress.fraction is None else f"{progress.fraction:.0%}"
    message = "" if progress.message is None else f" {printable(progress.message)}"
    return f"{share}{message} (at {_time(progress.at)})"


def durable_rows(job: JobInfo) -> list[tuple[str, str]]:
    """The rows of the job's table: what it waits for and its progress (none for a plain job)."""
    if not (job.steps_total or job.signals_total or job.wait or job.progress):
        return []
    return [
        ("waits for", wait_text(job.wait)),
        ("progress", progress_text(job.progress)),
    ]


def print_durable_tables(console: Any, job: JobInfo) -> None:
    """Print the job's steps and signals, each a table (name, when, size), first recorded first."""
    from rich.table import Table
    from rich.text import Text

    shown: tuple[tuple[str, tuple[StepInfo | SignalInfo, ...], int], ...] = (
        ("steps, first recorded first", job.steps, job.steps_total),
        ("signals received, oldest first", job.signals, job.signals_total),
    )
    for title, records, total in shown:
        if not records:
            continue
        more = f" ({len(records)} of {total})" if total > len(records) else ""
        table = Table(title=title + more, title_justify="left")
        for column in ("name", "at", "size"):
            table.add_column(column)
        for record in records:
            name = "-" if record.name is None else printable(record.name)
            table.add_row(Text(name), _time(record.at), _size(record.size))
        console.print(table, markup=False, highlight=False)
