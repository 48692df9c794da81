"""The Order table."""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import migrations, models


class Migration(migrations.Migration):
    """Create shop_order."""

    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[Any]] = [
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("item", models.CharField(max_length=100)),
                ("cents", models.IntegerField()),
                ("receipt_sent", models.BooleanField(default=False)),
            ],
        )
    ]
