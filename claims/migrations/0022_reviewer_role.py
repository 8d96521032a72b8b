"""The reviewer role (issue 36): a principal role for the API and ``issue_token``, and a console group — reviewers
read what they need and review and explain shadow mismatches; they move no stage and fence nothing."""

from django.db import migrations, models


def create_group(apps, schema_editor):
    apps.get_model("auth", "Group").objects.get_or_create(name="reviewer")


class Migration(migrations.Migration):
    dependencies = [
        ("claims", "0021_dispatch_heard_not_sent"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        migrations.RemoveConstraint(model_name="principal", name="principal_role_valid"),
        migrations.AlterField(
            model_name="principal",
            name="role",
            field=models.CharField(
                choices=[
                    ("worker", "Worker"),
                    ("reviewer", "Reviewer"),
                    ("operator", "Operator"),
                    ("oncall", "Oncall"),
                ],
                max_length=16,
            ),
        ),
        migrations.AddConstraint(
            model_name="principal",
            constraint=models.CheckConstraint(
                condition=models.Q(("role__in", ["worker", "reviewer", "operator", "oncall"])),
                name="principal_role_valid",
            ),
        ),
        migrations.RunPython(create_group, migrations.RunPython.noop),
    ]
