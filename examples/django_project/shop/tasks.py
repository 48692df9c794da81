"""The shop's tasks, run by ``python manage.py pgqueue_worker``."""

from __future__ import annotations

from typing import Any

from django.tasks import TaskContext, task

from shop.models import Order


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
