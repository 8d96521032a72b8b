import uuid

from django.db import migrations, models


class Migration(migrations.Migration):
    """The fence requests, in the on-call app's own table (issue 22). An installation that ran the rollout before
    has its requests copied here from rollout_fencerequest by rollout's migration 0008."""

    initial = True
    dependencies: list = []

    operations = [
        migrations.CreateModel(
            name="FenceRequest",
            fields=[
                ("fence_id", models.UUIDField(default=uuid.uuid4, primary_key=True, serialize=False)),
                ("namespace", models.CharField(max_length=100)),
                ("reason", models.TextField()),
                ("principal", models.CharField(max_length=200)),
                ("requested_at", models.DateTimeField()),
                ("runs", models.PositiveIntegerField(default=0)),
                ("scheduler_epoch", models.PositiveBigIntegerField(blank=True, null=True)),
                ("self_check", models.JSONField(blank=True, null=True)),
                ("finished_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "indexes": [
                    models.Index(fields=["namespace", "-requested_at"], name="oncall_fence_request_ns")
                ],
            },
        ),
    ]
