import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("testapp", "0006_versionedchapter_versionedtask"),
    ]

    operations = [
        migrations.CreateModel(
            name="Carton",
            fields=[
                ("carton_id", models.BigAutoField(primary_key=True, serialize=False)),
                ("label", models.CharField(blank=True, default="", max_length=100)),
            ],
        ),
        migrations.CreateModel(
            name="FencedCrate",
            fields=[
                (
                    "fence",
                    models.BigIntegerField(
                        default=0,
                        editable=False,
                        help_text="the greatest fencing token that wrote this row",
                    ),
                ),
                ("crate_id", models.BigAutoField(primary_key=True, serialize=False)),
                ("contents", models.CharField(blank=True, default="", max_length=100)),
            ],
            options={
                "abstract": False,
            },
        ),
        migrations.CreateModel(
            name="FencedPallet",
            fields=[
                (
                    "fencedcrate_ptr",
                    models.OneToOneField(
                        auto_created=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        parent_link=True,
                        to="testapp.fencedcrate",
                    ),
                ),
                (
                    "carton_ptr",
                    models.OneToOneField(
                        auto_created=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        parent_link=True,
                        primary_key=True,
                        serialize=False,
                        to="testapp.carton",
                    ),
                ),
                ("slot", models.CharField(blank=True, default="", max_length=100)),
            ],
            options={
                "abstract": False,
            },
            bases=("testapp.carton", "testapp.fencedcrate"),
        ),
    ]
