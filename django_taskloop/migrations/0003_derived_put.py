# calls.put is derived (tasks in the tube + done + truncated) instead of counted on every put, so
# that a put is one statement. The counts recorded so far carry over: the tube's first slot gets
# ``truncated = put - done - tasks`` (what truncate removed before it was counted), which makes
# the derived value equal the counted one at the moment of the migration.

from django.db import migrations, models
from django.db.models import Count, Sum


def carry_over(apps, schema_editor):
    TubeStat = apps.get_model("django_taskloop", "TubeStat")
    Task = apps.get_model("django_taskloop", "Task")
    db = schema_editor.connection.alias
    stats = TubeStat.objects.using(db)
    rows = dict(
        Task.objects.using(db).order_by().values("tube_id").annotate(n=Count("pk")).values_list("tube_id", "n")
    )
    sums = stats.order_by().values("tube_id").annotate(put=Sum("put"), done=Sum("done"), first=models.Min("slot"))
    for tube in sums:
        offset = (tube["put"] or 0) - (tube["done"] or 0) - rows.get(tube["tube_id"], 0)
        if offset:
            stats.filter(tube_id=tube["tube_id"], slot=tube["first"]).update(truncated=offset)


def count_again(apps, schema_editor):
    TubeStat = apps.get_model("django_taskloop", "TubeStat")
    Task = apps.get_model("django_taskloop", "Task")
    db = schema_editor.connection.alias
    stats = TubeStat.objects.using(db)
    rows = dict(
        Task.objects.using(db).order_by().values("tube_id").annotate(n=Count("pk")).values_list("tube_id", "n")
    )
    sums = stats.order_by().values("tube_id").annotate(
        done=Sum("done"), truncated=Sum("truncated"), first=models.Min("slot")
    )
    for tube in sums:
        put = rows.get(tube["tube_id"], 0) + (tube["done"] or 0) + (tube["truncated"] or 0)
        stats.filter(tube_id=tube["tube_id"], slot=tube["first"]).update(put=put)


class Migration(migrations.Migration):
    dependencies = [
        ("django_taskloop", "0002_operating"),
    ]

    operations = [
        migrations.AddField(
            model_name="tubestat",
            name="truncated",
            field=models.BigIntegerField(default=0),
        ),
        migrations.RunPython(carry_over, count_again),
        migrations.RemoveField(
            model_name="tubestat",
            name="put",
        ),
    ]
