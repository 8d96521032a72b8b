"""The READY tasks of each fairness key in their order (``task_ready_key``): claims.queues counts a key's backlog
from it, a bounded range a key. On PostgreSQL built CONCURRENTLY — a table of millions of tasks keeps taking
creates, claims and commits while it builds; elsewhere a plain CREATE INDEX."""

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class AddIndexOnline(AddIndexConcurrently):
    def database_forwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_forwards(app_label, schema_editor, from_state, to_state)
        return migrations.AddIndex.database_forwards(self, app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label, schema_editor, from_state, to_state):
        if schema_editor.connection.vendor == "postgresql":
            return super().database_backwards(app_label, schema_editor, from_state, to_state)
        return migrations.AddIndex.database_backwards(self, app_label, schema_editor, from_state, to_state)


class Migration(migrations.Migration):
    atomic = False  # CREATE INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ("claims", "0026_priority_and_fair_share"),
    ]

    operations = [
        AddIndexOnline(
            model_name="task",
            index=models.Index(
                condition=models.Q(("state", "READY")),
                fields=["namespace", "priority", "fairness_key", "vtag"],
                name="task_ready_key",
            ),
        ),
    ]
