"""The operator UI's roles are Django groups: viewer, operator, oncall."""

from __future__ import annotations

from django.db import migrations


def create_groups(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    for name in ("viewer", "operator", "oncall"):
        Group.objects.get_or_create(name=name)


class Migration(migrations.Migration):
    dependencies = [("claims", "0007_task_has_resources"), ("auth", "0012_alter_user_first_name_max_length")]
    operations = [migrations.RunPython(create_groups, migrations.RunPython.noop)]
