import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("testapp", "0004_fencedshipment"),
    ]

    operations = [
        migrations.CreateModel(
            name="Parcel",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("label", models.CharField(blank=True, default="", max_length=100)),
            ],
        ),
        migrations.CreateModel(
            name="FencedParcel",
            fields=[
                (
                    "parcel_ptr",
                    models.OneToOneField(
                        auto_created=True,
                        on_delete=django.db.models.deletion.CASCADE,
                        parent_link=True,
                        primary_key=True,
                        serialize=False,
                        to="testapp.parcel",
                    ),
                ),
                (
                    "fence",
                    models.BigIntegerField(
                        default=0,
                        editable=False,
                        help_text="the greatest fencing token that wrote this row",
                    ),
                ),
                ("state", models.CharField(blank=True, default="", max_length=100)),
            ],
            options={
                "abstract": False,
            },
            bases=("testapp.parcel", models.Model),
        ),
    ]
