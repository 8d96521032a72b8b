from django.db import migrations

COLUMNS = (
    "fence_id, namespace, reason, principal, requested_at, runs, scheduler_epoch, self_check, finished_at"
)


class Migration(migrations.Migration):
    """The fence requests move to the on-call app (issue 22): copied into its table, then dropped here."""

    dependencies = [
        ("rollout", "0007_retention_indexes"),
        ("oncall", "0001_initial"),
    ]

    operations = [
        migrations.RunSQL(
            f"INSERT INTO oncall_fencerequest ({COLUMNS}) SELECT {COLUMNS} FROM rollout_fencerequest",
            reverse_sql=f"INSERT INTO rollout_fencerequest ({COLUMNS}) SELECT {COLUMNS} FROM oncall_fencerequest",
        ),
        migrations.DeleteModel(name="FenceRequest"),
    ]
