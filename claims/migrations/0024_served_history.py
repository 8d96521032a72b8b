"""The database history the control plane serves from (issue 39: a failover is a fence).

- ``claims_servedhistory`` (``models.ServedHistory``, not managed by Django so that a test's flush leaves it), with
  its first row: the cluster, timeline and synchronous state the database is migrated on. Append-only on
  PostgreSQL, like the timeline.
- ``claims_serving_check()`` (PostgreSQL): compares the live cluster, timeline and synchronous state with the latest
  row, and raises SQLSTATE P0F01 when they differ. Every statement that takes a decision's locks calls it
  (``services.statements.after_locks``), so no decision is made on a history the control plane has not checked;
  ``services.serving.serving_check`` then records the new state — and fences when acknowledged decisions may have
  been lost — before the request is answered 503 and sent again.

The timeline is the one WAL is written on now (the first 8 hex digits of the current WAL file's name): a promotion
changes it at once, where ``pg_control_checkpoint()`` waits for the next checkpoint. The cluster's identifier is read
from pg_control once per session (``claims.system_identifier``): it cannot change under an open connection.
"""

from __future__ import annotations

from django.db import migrations, models

SERVING_CHECK = r"""
CREATE OR REPLACE FUNCTION claims_serving_check() RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  live_system text := nullif(current_setting('claims.system_identifier', true), '');
  live_timeline integer := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer;
  live_sync boolean := current_setting('synchronous_standby_names') <> ''
    AND current_setting('synchronous_commit') IN ('on', 'remote_apply', 'remote_write');
  served record;
BEGIN
  IF live_system IS NULL THEN
    SELECT system_identifier::text INTO live_system FROM pg_control_system();
    PERFORM set_config('claims.system_identifier', live_system, false);
  END IF;
  SELECT system_identifier, timeline, synchronous INTO served FROM claims_servedhistory ORDER BY id DESC LIMIT 1;
  IF NOT FOUND OR served.system_identifier <> live_system OR served.timeline <> live_timeline
     OR served.synchronous <> live_sync THEN
    RAISE EXCEPTION 'the database serves cluster % timeline % (synchronous: %); the control plane last served %',
      live_system, live_timeline, live_sync,
      coalesce(served.system_identifier || ' timeline ' || served.timeline || ' (synchronous: '
               || served.synchronous || ')', 'nothing')
      USING ERRCODE = 'P0F01',
            HINT = 'the control plane checks the new history (services.serving.serving_check), then answers again';
  END IF;
  RETURN live_timeline;
END $$
"""

FIRST_ROW = """
INSERT INTO claims_servedhistory (system_identifier, timeline, synchronous, seen_at, fenced, cause)
SELECT system_identifier::text,
       ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::integer,
       current_setting('synchronous_standby_names') <> ''
         AND current_setting('synchronous_commit') IN ('on', 'remote_apply', 'remote_write'),
       statement_timestamp(), false, 'migrated'
FROM pg_control_system()
"""


def create(apps, schema_editor):
    schema_editor.create_model(apps.get_model("claims", "ServedHistory"))
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        "CREATE TRIGGER claims_servedhistory_append_only BEFORE UPDATE OR DELETE ON claims_servedhistory "
        "FOR EACH ROW EXECUTE FUNCTION claims_append_only()"
    )
    schema_editor.execute(SERVING_CHECK, None)  # no parameters: its % are PL/pgSQL's
    schema_editor.execute(FIRST_ROW)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute("DROP FUNCTION IF EXISTS claims_serving_check()")
    schema_editor.delete_model(apps.get_model("claims", "ServedHistory"))


class Migration(migrations.Migration):
    dependencies = [("claims", "0023_append_only_guards_again")]

    operations = [
        migrations.CreateModel(
            name="ServedHistory",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("system_identifier", models.CharField(max_length=20)),
                ("timeline", models.PositiveIntegerField()),
                ("synchronous", models.BooleanField()),
                ("seen_at", models.DateTimeField()),
                ("fenced", models.BooleanField(default=False)),
                ("cause", models.CharField(blank=True, default="", max_length=300)),
            ],
            options={"db_table": "claims_servedhistory", "managed": False},
        ),
        migrations.RunPython(create, drop),
    ]
