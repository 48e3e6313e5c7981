"""Make ``Lock.note`` hold any text on MySQL/MariaDB: ``utf8mb4`` whatever the default.

Before this, the column took the database's default character set; in a ``latin1`` or
``utf8mb3`` database a note with emoji or other 4-byte characters (a view's note carries
its request path) failed the acquire with error 1366. No change on other databases.
"""

from __future__ import annotations

from django.db import migrations

import locks.fields
from locks.backends import create_extras


class Migration(migrations.Migration):
    dependencies = [
        ("locks", "0003_lock_holder_exact"),
    ]

    operations = [
        # As in 0003: on SQLite the AlterField rebuilds locks_lock, dropping its token
        # triggers; create them again in either direction.
        migrations.RunPython(migrations.RunPython.noop, create_extras, atomic=False),
        migrations.AlterField(
            model_name="lock",
            name="note",
            field=locks.fields.NoteField(blank=True, default="", max_length=255),
        ),
        migrations.RunPython(create_extras, migrations.RunPython.noop, atomic=False),
    ]
