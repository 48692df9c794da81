"""The shop's tasks, run by ``python manage.py pgqueue_worker``."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from django.tasks import TaskContext, task

from shop.models import Order

if TYPE_CHECKING:
    from pgqueue.django import JobContext


class PaymentDeclinedError(Exception):
    """The card was declined."""


@task
def send_receipt(order_id: int) -> dict[str, Any]:
    """Mark the order's receipt sent (a plain def: it runs in a thread)."""
    order = Order.objects.get(pk=order_id)
    order.receipt_sent = True
    order.save(update_fields=["receipt_sent"])
    return {"order": order_id, "item": order.item}


@task
async def total(order_ids: list[int]) -> int:
    """Add up orders (an async def: it runs on the worker's event loop)."""
    return sum([order.cents async for order in Order.objects.filter(pk__in=order_ids)])


@task(queue_name="payments", priority=50)
def charge(order_id: int) -> None:
    """Always declined: shows a failure after its retries."""
    raise PaymentDeclinedError(f"card declined for order {order_id}")


@task(takes_context=True)
def attempt(context: TaskContext) -> int:
    """Return the attempt that runs it (a task that takes its context)."""
    return int(context.attempt)


def buy_label(order_id: int) -> str:
    """Buy a shipping label (in a real shop: a call that must not happen twice)."""
    return f"label-{order_id}-{uuid.uuid4().hex[:8]}"


@task(takes_context=True)
async def ship(context: JobContext, order_id: int) -> str:
    """A durable task: the label is bought once, however often the task reruns.

    pgqueue's worker gives a task that takes its context a
    `pgqueue.django.JobContext`: its ``job`` is the run's `pgqueue.Job`.
    The first run buys the label, then sleeps (the slot freed, the attempt
    given back); the run after it replays the step from its record.
    """
    job = context.job
    label: str = await job.step("label", buy_label, order_id)
    if "slept" not in job.steps:  # the first run only
        await job.step("slept", lambda: True)
        await job.sleep(0.2)
    return label
