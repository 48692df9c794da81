"""Control notifications as hints: parsing, batching, and cancels only on the row's word (no database)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import anyio
import pytest

from pgqueue._engine.control import CancelHints, job_id_of
from tests.helpers import RecordingLogger

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Collection


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ("1", 1),
        ("0042", 42),
        ("9223372036854775807", 2**63 - 1),
        ("", None),
        ("x", None),
        ("-1", None),
        ("+1", None),
        (" 1", None),
        ("1\n", None),
        ("1_000", None),
        ("²", None),
        ("١٢", None),  # Arabic-Indic digits, which int() reads
        ("9" * 20, None),
        ("9" * 7999, None),  # more digits than int() converts
    ],
)
def test_a_payload_names_a_job_only_in_ascii_digits_of_a_bigint(
    payload: str, expected: int | None
) -> None:
    assert job_id_of(payload) == expected


class Rows:
    """The read's stand-in: which ids have cancel_requested, and every read made."""

    def __init__(self, requested: Collection[int] = ()) -> None:
        self.requested = set(requested)
        self.reads: list[tuple[float, list[int]]] = []
        self.failing = 0
        self._read = anyio.Event()

    async def read(self, ids: list[int]) -> Collection[int]:
        self.reads.append((anyio.current_time(), list(ids)))
        self._read.set()
        if self.failing:
            self.failing -= 1
            msg = "connection lost"
            raise ConnectionError(msg)
        return [i for i in ids if i in self.requested]

    async def wait_reads(self, count: int, within: float = 5.0) -> None:
        with anyio.fail_after(within):
            while len(self.reads) < count:
                self._read = anyio.Event()
                await self._read.wait()


class Worker:
    """What the hints ask of a worker: the jobs it holds, and the cancels."""

    def __init__(self, held: Collection[int]) -> None:
        self.held = set(held)
        self.cancelled: list[int] = []
        self._cancel = anyio.Event()

    def cancel(self, job_id: int) -> None:
        self.cancelled.append(job_id)
        self._cancel.set()

    async def wait_cancels(self, count: int, within: float = 5.0) -> None:
        with anyio.fail_after(within):
            while len(self.cancelled) < count:
                self._cancel = anyio.Event()
                await self._cancel.wait()


@contextlib.asynccontextmanager
async def hints(
    rows: Rows,
    worker: Worker,
    interval: float = 0.1,
    logger: RecordingLogger | None = None,
) -> AsyncIterator[CancelHints]:
    control = CancelHints(
        rows.read,
        holds=worker.held.__contains__,
        cancel=worker.cancel,
        logger=logger or RecordingLogger(),
        fields={"queue": "q"},
        interval=interval,
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(control.run)
        yield control
        tg.cancel_scope.cancel()


async def test_payloads_naming_no_held_job_read_nothing() -> None:
    rows, worker = Rows(requested={5}), Worker(held={5})
    logger = RecordingLogger()
    async with hints(rows, worker, logger=logger) as control:
        for payload in ["", "junk", "²", "9" * 7999, *map(str, range(6, 100_000))]:
            control.hint(payload)
        control.hint("5")  # the one held job: read alone, once
        await worker.wait_cancels(1)
    assert [ids for _, ids in rows.reads] == [[5]]
    assert worker.cancelled == [5]
    assert logger.records == []


async def test_only_jobs_whose_row_asks_are_cancelled() -> None:
    rows, worker = Rows(requested={2}), Worker(held={1, 2, 3})
    async with hints(rows, worker) as control:
        for payload in ["1", "2", "3", "2", "1"]:
            control.hint(payload)
        await rows.wait_reads(1)
        await worker.wait_cancels(1)
    assert [ids for _, ids in rows.reads] == [[1, 2, 3]]
    assert worker.cancelled == [2]


async def test_hints_are_read_in_one_batch_at_most_every_interval() -> None:
    held = set(range(1, 1001))
    rows, worker = Rows(requested={999}), Worker(held=held)
    async with hints(rows, worker, interval=0.3) as control:
        control.hint("1")
        await rows.wait_reads(1)
        # While the next read waits for the interval, every hint joins it.
        for job_id in range(2, 1001):
            control.hint(str(job_id))
        await rows.wait_reads(2)
        await worker.wait_cancels(1)
    (first_at, first), (second_at, second) = rows.reads
    assert (first, second) == ([1], list(range(2, 1001)))
    assert second_at - first_at >= 0.3
    assert worker.cancelled == [999]


async def test_a_job_that_ended_before_the_read_is_not_read() -> None:
    rows, worker = Rows(requested={1, 2}), Worker(held={1, 2})
    async with hints(rows, worker, interval=0.3) as control:
        control.hint("1")
        await rows.wait_reads(1)
        control.hint("2")
        control.hint("1")
        worker.held.discard(2)  # its handler ended meanwhile
        await rows.wait_reads(2)
        await worker.wait_cancels(2)
    assert [ids for _, ids in rows.reads] == [[1], [1]]


async def test_a_failed_read_is_logged_once_and_tried_again() -> None:
    rows, worker = Rows(requested={7}), Worker(held={7})
    rows.failing = 1
    logger = RecordingLogger()
    async with hints(rows, worker, logger=logger) as control:
        control.hint("7")
        await worker.wait_cancels(1)
    assert [ids for _, ids in rows.reads] == [[7], [7]]
    # An outage: at DEBUG (the worker's Outage says it once, as a WARNING).
    assert logger.messages("debug") == ["reading cancel requests failed"]
    assert logger.messages("warning") == []
