"""PostgreSQL's JIT off for this database: the control plane runs short statements, and JIT compiles any whose
estimated cost passes ``jit_above_cost`` — which a list's plan does once the tasks table holds a million rows,
though the statement then reads a hundred of them. Measured (bench/history.py): a task list page and its bounded
count at 1 M tasks spent ~230 ms compiling and 0.5–2.4 ms executing.

``ALTER DATABASE`` applies to every new session, also through PgBouncer (a startup ``options`` parameter would not
pass a transaction-mode pooler). It needs the database's owner; without that right the migration says so and goes
on — run ``ALTER DATABASE <name> SET jit = off`` as the owner (docs/deployment.md)."""

from __future__ import annotations

from django.db import migrations


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        "DO $$ BEGIN "
        "EXECUTE format('ALTER DATABASE %I SET jit = off', current_database()); "
        "EXCEPTION WHEN insufficient_privilege THEN "
        "RAISE NOTICE 'jit stays on: run ALTER DATABASE ... SET jit = off as the database owner'; "
        "END $$",
        params=None,
    )


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET jit', current_database()); "
            "EXCEPTION WHEN insufficient_privilege THEN NULL; END $$",
            params=None,
        )


class Migration(migrations.Migration):
    dependencies = [("claims", "0013_retention_may_delete")]
    operations = [migrations.RunPython(forwards, backwards)]
