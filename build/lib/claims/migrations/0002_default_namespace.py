from __future__ import annotations

from django.db import migrations
from django.utils import timezone


def create_default(apps, schema_editor):
    Namespace = apps.get_model("claims", "Namespace")
    now = timezone.now()
    Namespace.objects.get_or_create(
        name="default",
        defaults={
            "scheduler_epoch": 1,
            "stage": "V1_ONLY",
            "min_protocol": "legacy",
            "created_at": now,
            "updated_at": now,
        },
    )


class Migration(migrations.Migration):
    dependencies = [("claims", "0001_initial")]
    operations = [migrations.RunPython(create_default, migrations.RunPython.noop)]
