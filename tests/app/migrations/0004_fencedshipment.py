import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('testapp', '0003_celeryrun'),
    ]

    operations = [
        migrations.CreateModel(
            name='FencedShipment',
            fields=[
                ('fencedrecord_ptr', models.OneToOneField(auto_created=True, on_delete=django.db.models.deletion.CASCADE, parent_link=True, primary_key=True, serialize=False, to='testapp.fencedrecord')),
                ('carrier', models.CharField(blank=True, default='', max_length=100)),
            ],
            bases=('testapp.fencedrecord',),
        ),
    ]
