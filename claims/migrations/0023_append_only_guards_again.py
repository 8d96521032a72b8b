"""The append-only guards back on SQLite. 0017 altered two of the timeline's foreign keys; SQLite alters a column
by rebuilding the table, and the rebuilt ``claims_taskevent`` had no trigger (3 guards after 0016, 2 after 0017):
the embedded default let a timeline row be rewritten. Each guard is made again where it is missing — idempotent,
so a database migrated before 0017 was fixed, or created fresh, ends the same. PostgreSQL keeps its triggers
through an ALTER TABLE and is left as it is.

The guarantee on each backend (``APPEND_ONLY`` below; tests/claims/test_append_only.py holds it after the last
migration): PostgreSQL refuses UPDATE and DELETE (retention's DELETE only, under ``SET LOCAL claims.retention``);
SQLite refuses UPDATE — its test runner empties tables with DELETE (0004).
"""

from __future__ import annotations

from django.db import migrations

APPEND_ONLY = ("claims_taskevent", "claims_auditentry", "claims_effectevent")


def sqlite_guard(table: str) -> str:
    return (
        f"CREATE TRIGGER IF NOT EXISTS {table}_append_only BEFORE UPDATE ON {table} "
        f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END"
    )


def guards_again(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for table in APPEND_ONLY:
            schema_editor.execute(sqlite_guard(table))


class Migration(migrations.Migration):
    dependencies = [("claims", "0022_reviewer_role")]
    operations = [migrations.RunPython(guards_again, migrations.RunPython.noop)]
