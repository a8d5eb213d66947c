# Schedules (SPEC §7): one row per @periodic function or TASKLOOP["SCHEDULE"] entry; workers claim a
# tick by moving next_run_at with one conditional UPDATE.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_taskloop', '0003_derived_put'),
    ]

    operations = [
        migrations.CreateModel(
            name='Schedule',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=100, unique=True)),
                ('kind', models.CharField(choices=[('periodic', 'periodic'), ('task', 'task')], max_length=8)),
                ('cron', models.CharField(max_length=255)),
                ('time_zone', models.CharField(default='UTC', max_length=64)),
                ('target', models.CharField(max_length=255)),
                ('next_run_at', models.DateTimeField()),
                ('last_run_at', models.DateTimeField(blank=True, null=True)),
                ('runs', models.PositiveBigIntegerField(default=0)),
                ('paused', models.BooleanField(default=False)),
                ('last_error', models.TextField(blank=True, default='')),
            ],
            options={
                'db_table': 'taskloop_schedule',
                'ordering': ['name'],
            },
        ),
    ]
