"""A task group whose block's own exception comes out as itself.

anyio's task group raises an ``ExceptionGroup`` for whatever leaves its
block, even when only the block failed and its tasks were merely cancelled.
`Tracker`, `Connections` and `Subscriber.run` run background tasks in a task
group that spans the caller's ``async with`` block (or the callbacks): with
anyio's group, ``except TimeoutError`` around ``tracker.wait(...)`` would
never catch. Through `BlockTaskGroup`, the block's exception leaves as
itself, with its own traceback; a group is raised only when a background
task failed too, and then it holds the tasks' exceptions and the block's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

if TYPE_CHECKING:
    from types import TracebackType

    from anyio.abc import TaskGroup

__all__ = ["BlockTaskGroup"]


class BlockTaskGroup:
    """``anyio.create_task_group()``, minus the group around the block's lone error.

    Usage::

        async with BlockTaskGroup() as tg:
            tg.start_soon(background)
            await body()  # raises ValueError: out comes that ValueError
    """

    __slots__ = ("_tg",)

    def __init__(self) -> None:
        self._tg = anyio.create_task_group()

    async def __aenter__(self) -> TaskGroup:
        return await self._tg.__aenter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            return bool(await self._tg.__aexit__(exc_type, exc, tb))
        except BaseExceptionGroup as group:
            if exc is None or len(group.exceptions) != 1:
                raise
            if group.exceptions[0] is not exc:
                raise
        # Only the block failed (its tasks were cancelled, not failed): not
        # suppressing lets the block's exception propagate untouched.
        return False
