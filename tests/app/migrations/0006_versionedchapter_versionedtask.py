import django.db.models.deletion
from django.db import migrations, models

import locks.versioning


class Migration(migrations.Migration):
    dependencies = [("testapp", "0005_fencedparcel")]

    operations = [
        migrations.CreateModel(
            name="VersionedChapter",
            fields=[
                (
                    "versionednote_ptr",
                    models.OneToOneField(
                        auto_created=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        parent_link=True,
                        primary_key=True,
                        serialize=False,
                        to="testapp.versionednote",
                    ),
                ),
                ("code", models.CharField(max_length=20, unique=True)),
            ],
            bases=("testapp.versionednote",),
        ),
        migrations.CreateModel(
            name="VersionedTask",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "version",
                    locks.versioning.VersionField(
                        default=1,
                        help_text="incremented by every save; a save based on an older one fails",
                    ),
                ),
                ("title", models.CharField(default="", max_length=100)),
                (
                    "item",
                    models.ForeignKey(
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        to="testapp.item",
                    ),
                ),
            ],
            options={"abstract": False},
        ),
    ]
