"""The effect history is append-only in the database too (see 0004)."""

from __future__ import annotations

from django.db import migrations

TABLE = "claims_effectevent"


def forwards(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(
            f"CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE OR DELETE ON {TABLE} "
            "FOR EACH ROW EXECUTE FUNCTION claims_append_only()"
        )
    elif vendor == "sqlite":
        schema_editor.execute(
            f"CREATE TRIGGER {TABLE}_append_only BEFORE UPDATE ON {TABLE} "
            f"BEGIN SELECT RAISE(ABORT, '{TABLE} is append-only'); END"
        )


def backwards(apps, schema_editor):
    suffix = f" ON {TABLE}" if schema_editor.connection.vendor == "postgresql" else ""
    schema_editor.execute(f"DROP TRIGGER IF EXISTS {TABLE}_append_only{suffix}")


class Migration(migrations.Migration):
    dependencies = [("claims", "0005_effects_and_resources")]
    operations = [migrations.RunPython(forwards, backwards)]
