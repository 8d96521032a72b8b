"""The rollout's own record of each namespace's stage and protocol minimum, copied from the columns the core
used to hold. Runs before the core drops them (``run_before``), so nothing is lost; the core never depends on
this app."""

from __future__ import annotations

import django.db.models.deletion
from django.db import migrations, models
from django.db.models import Q


def _copy(apps, schema_editor):
    Namespace = apps.get_model("claims", "Namespace")
    RolloutState = apps.get_model("rollout", "RolloutState")
    RolloutState.objects.bulk_create(
        RolloutState(
            namespace_id=ns.pk, stage=ns.stage, min_protocol=ns.min_protocol, updated_at=ns.updated_at
        )
        for ns in Namespace.objects.all()
    )


class Migration(migrations.Migration):
    dependencies = [("claims", "0010_namespace_pause_hold"), ("rollout", "0003_fence_request")]
    run_before = [("claims", "0011_rollout_leaves_the_core")]

    operations = [
        migrations.CreateModel(
            name="RolloutState",
            fields=[
                (
                    "namespace",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="rollout",
                        serialize=False,
                        to="claims.namespace",
                    ),
                ),
                (
                    "stage",
                    models.CharField(
                        choices=[
                            ("LEGACY", "Legacy"),
                            ("SHADOW", "Shadow"),
                            ("V1_READS", "V1 Reads"),
                            ("V1_WRITES", "V1 Writes"),
                            ("V1_ONLY", "V1 Only"),
                        ],
                        default="V1_ONLY",
                        max_length=16,
                    ),
                ),
                (
                    "min_protocol",
                    models.CharField(
                        choices=[("legacy", "Legacy"), ("claim.v1", "Claim V1")],
                        default="legacy",
                        max_length=16,
                    ),
                ),
                ("updated_at", models.DateTimeField()),
            ],
            options={
                "constraints": [
                    models.CheckConstraint(
                        condition=Q(stage__in=["LEGACY", "SHADOW", "V1_READS", "V1_WRITES", "V1_ONLY"]),
                        name="rollout_stage_valid",
                    ),
                    models.CheckConstraint(
                        condition=Q(min_protocol__in=["legacy", "claim.v1"]), name="rollout_protocol_valid"
                    ),
                ],
            },
        ),
        migrations.RunPython(_copy, migrations.RunPython.noop),
    ]
