"""The timeline and the audit log are append-only in the database itself, not only by convention.

PostgreSQL refuses UPDATE and DELETE of their rows (TRUNCATE, used only to reset a test database, is a statement
and fires no row trigger). SQLite refuses UPDATE; DELETE stays possible there because the test runner empties
tables with DELETE.
"""

from __future__ import annotations

from django.db import migrations

TABLES = ("claims_taskevent", "claims_auditentry")


def forwards(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(
            "CREATE OR REPLACE FUNCTION claims_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END $$",
            params=None,  # the '%' is plpgsql's, not a placeholder
        )
        for table in TABLES:
            schema_editor.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION claims_append_only()"
            )
    elif vendor == "sqlite":
        for table in TABLES:
            schema_editor.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE ON {table} "
                f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
            )


def backwards(apps, schema_editor):
    for table in TABLES:
        schema_editor.execute(
            f"DROP TRIGGER IF EXISTS {table}_append_only"
            + (f" ON {table}" if schema_editor.connection.vendor == "postgresql" else "")
        )


class Migration(migrations.Migration):
    dependencies = [("claims", "0003_task_has_successors")]
    operations = [migrations.RunPython(forwards, backwards)]
