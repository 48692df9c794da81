"""A view whose transaction writes an order and enqueues its receipt."""

from __future__ import annotations

import json

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.tasks import default_task_backend
from django.tasks.exceptions import TaskResultDoesNotExist
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from shop.models import Order
from shop.tasks import send_receipt


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> HttpResponse:
    """Create the order and enqueue its receipt, both or neither.

    ``"fail": true`` in the body raises after both: the transaction rolls
    back, and no worker ever sees the task.
    """
    body = json.loads(request.body)
    with transaction.atomic():
        order = Order.objects.create(item=body["item"], cents=body["cents"])
        result = send_receipt.enqueue(order.pk)
        if body.get("fail"):
            msg = "failed after writing"
            raise RuntimeError(msg)
    return JsonResponse({"order": order.pk, "task": result.id}, status=201)


@require_GET
def task_status(request: HttpRequest, result_id: str) -> HttpResponse:
    """A task's status, and its return value once it succeeded."""
    try:
        result = default_task_backend.get_result(result_id)
    except TaskResultDoesNotExist:
        return JsonResponse({"error": "no such task"}, status=404)
    body = {"status": result.status, "attempts": result.attempts}
    if result.status == "SUCCESSFUL":
        body["return_value"] = result.return_value
    return JsonResponse(body)
