"""The core forgets the rollout: a namespace's stage and protocol minimum move to the rollout app's own record
(``rollout.RolloutState``, copied by ``rollout/migrations/0004_rollout_state`` which runs before this one when
the app is installed), and the timeline's ``validated`` flag becomes ``via`` — the protocol a passed-on request
arrived through ("legacy" for the rollout's mirrored operations, "" for a claim.v1 request of its own). What
"validated" means is the rollout's business: ``via == ""``.

The timeline is append-only in the database itself (0004); the one-off backfill of ``via`` suspends that guard
inside this migration's transaction only.
"""

from __future__ import annotations

from django.db import migrations, models
from django.db.models import Q

EVENTS = "claims_taskevent"


def _backfill_via(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {EVENTS} DISABLE TRIGGER {EVENTS}_append_only")
        schema_editor.execute(f"UPDATE {EVENTS} SET via = 'legacy' WHERE validated IS FALSE")
        schema_editor.execute(f"ALTER TABLE {EVENTS} ENABLE TRIGGER {EVENTS}_append_only")
    elif vendor == "sqlite":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {EVENTS}_append_only")
        schema_editor.execute(f"UPDATE {EVENTS} SET via = 'legacy' WHERE validated = 0")


def _guard_again(apps, schema_editor):
    """SQLite rebuilds a table to drop a column, and the rebuilt table has no trigger: put the guard back."""
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(f"DROP TRIGGER IF EXISTS {EVENTS}_append_only")
        schema_editor.execute(
            f"CREATE TRIGGER {EVENTS}_append_only BEFORE UPDATE ON {EVENTS} "
            f"BEGIN SELECT RAISE(ABORT, '{EVENTS} is append-only'); END"
        )


class Migration(migrations.Migration):
    dependencies = [("claims", "0010_namespace_pause_hold")]

    operations = [
        migrations.RemoveConstraint(model_name="namespace", name="namespace_stage_valid"),
        migrations.RemoveConstraint(model_name="namespace", name="namespace_protocol_valid"),
        migrations.RemoveField(model_name="namespace", name="stage"),
        migrations.RemoveField(model_name="namespace", name="min_protocol"),
        migrations.AddField(
            model_name="taskevent",
            name="via",
            field=models.CharField(blank=True, default="", max_length=16),
        ),
        migrations.RunPython(_backfill_via, migrations.RunPython.noop),
        migrations.RemoveConstraint(model_name="taskevent", name="event_point_valid"),
        migrations.RemoveField(model_name="taskevent", name="validated"),
        migrations.AddConstraint(
            model_name="taskevent",
            constraint=models.CheckConstraint(
                condition=Q(point__isnull=True)
                | Q(point__in=["claim", "renew", "release", "effect", "commit"]),
                name="event_point_valid",
            ),
        ),
        migrations.RunPython(_guard_again, migrations.RunPython.noop),
    ]
