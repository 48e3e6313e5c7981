"""Create the lock table, and per database the token sequence (and SQLite's triggers)."""

from __future__ import annotations

from django.db import migrations, models

import locks.fields
from locks.backends import create_extras, drop_extras


class Migration(migrations.Migration):
    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="Lock",
            fields=[
                (
                    "name",
                    locks.fields.LockNameField(max_length=255, primary_key=True, serialize=False),
                ),
                ("holder", models.CharField(max_length=255)),
                (
                    "count",
                    models.PositiveIntegerField(default=1, help_text="re-entries by the holder"),
                ),
                (
                    "token",
                    models.BigIntegerField(help_text="fencing token of the current holding"),
                ),
                ("acquired_at", models.DateTimeField()),
                ("expires_at", models.DateTimeField(db_index=True)),
                ("note", models.CharField(blank=True, default="", max_length=255)),
                (
                    "waiting",
                    models.BooleanField(
                        db_default=False,
                        default=False,
                        help_text="a blocked acquire asked to be notified",
                    ),
                ),
            ],
            options={
                "db_table": "locks_lock",
                "ordering": ["-acquired_at"],
                "permissions": [("break_lock", "Can break locks held by others")],
            },
        ),
        # Not atomic: MariaDB cannot run DDL inside a transaction. On SQLite a later
        # migration that alters locks_lock rebuilds the table and loses its triggers:
        # such a migration must run create_extras again (it is idempotent).
        migrations.RunPython(create_extras, drop_extras, atomic=False),
    ]
