"""Retention may delete from the append-only tables (0004, 0006); nothing else may, and nobody may update them.

The trigger lets a DELETE through only in a transaction that has run ``SET LOCAL claims.retention = 'on'`` — which
only ``claims.services.retention`` does, batch by batch — so a stray DELETE is still refused."""

from __future__ import annotations

from django.db import migrations

ALLOWING = (
    "CREATE OR REPLACE FUNCTION claims_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN "
    "IF TG_OP = 'DELETE' AND current_setting('claims.retention', true) = 'on' THEN RETURN OLD; END IF; "
    "RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; "
    "END $$"
)
REFUSING = (
    "CREATE OR REPLACE FUNCTION claims_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
    "BEGIN RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END $$"
)


def forwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ALLOWING, params=None)  # the '%' is plpgsql's, not a placeholder


def backwards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(REFUSING, params=None)


class Migration(migrations.Migration):
    dependencies = [("claims", "0012_metric_tallies")]
    operations = [migrations.RunPython(forwards, backwards)]
