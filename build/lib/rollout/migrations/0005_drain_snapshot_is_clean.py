"""DrainSnapshot.clean → is_clean, the column kept as ``clean``: the attribute shadowed Model.clean()."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("rollout", "0004_rollout_state")]

    operations = [
        migrations.RenameField(model_name="drainsnapshot", old_name="clean", new_name="is_clean"),
        migrations.AlterField(
            model_name="drainsnapshot", name="is_clean", field=models.BooleanField(db_column="clean")
        ),
    ]
