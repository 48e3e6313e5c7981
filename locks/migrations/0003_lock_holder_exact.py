"""Make ``Lock.holder`` exact like ``name``: binary, no-pad collation on MySQL/MariaDB.

Before this, MariaDB compared holders with the database's default collation, so holder
"alice" or "Alice " could re-enter, renew or release the lock of holder "Alice".
"""

from __future__ import annotations

from django.db import migrations

import locks.fields
from locks.backends import create_extras


class Migration(migrations.Migration):
    dependencies = [
        ("locks", "0002_rowlock"),
    ]

    operations = [
        # On SQLite, altering locks_lock rebuilds the table, which drops its token
        # triggers (see 0001_initial): create them again after the rebuild, in either
        # direction. create_extras is idempotent; not atomic, as in 0001, for MariaDB.
        migrations.RunPython(migrations.RunPython.noop, create_extras, atomic=False),
        migrations.AlterField(
            model_name="lock",
            name="holder",
            field=locks.fields.LockNameField(max_length=255),
        ),
        migrations.RunPython(create_extras, migrations.RunPython.noop, atomic=False),
    ]
