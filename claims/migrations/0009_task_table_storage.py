"""Storage settings for the task table on PostgreSQL (docs/benchmarks.md, soak): every claim, renew and commit
updates a task row, and none of those updates can be HOT (each changes a column an index depends on), so the
table makes dead tuples at about two per cycle. Room on each page (fillfactor 80) lets the new version land on the
same page, and a vacuum at 2 % dead rows instead of 20 % keeps the table and its indexes from bloating under a
steady claim rate. SQLite has no such settings."""

from __future__ import annotations

from django.db import migrations

SETTINGS = (
    "fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000, "
    "autovacuum_analyze_scale_factor = 0.05"
)


def tune(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE claims_task SET ({SETTINGS})")


def untune(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "ALTER TABLE claims_task RESET (fillfactor, autovacuum_vacuum_scale_factor, "
            "autovacuum_vacuum_threshold, autovacuum_analyze_scale_factor)"
        )


class Migration(migrations.Migration):
    dependencies = [("claims", "0008_ui_groups")]
    operations = [migrations.RunPython(tune, untune)]
