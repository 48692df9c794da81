"""The example's routes."""

from __future__ import annotations

from django.urls import path
from shop import views

urlpatterns = [
    path("orders", views.place_order),
    path("tasks/<str:result_id>", views.task_status),
]
