"""An order, and whether its receipt went out."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    """What a customer bought."""

    item = models.CharField(max_length=100)
    cents = models.IntegerField()
    receipt_sent = models.BooleanField(default=False)
