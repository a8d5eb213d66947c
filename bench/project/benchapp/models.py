"""The benchmark's loop: ids of no-op work."""

from django_taskloop.models import TaskLoop


class BenchLoop(TaskLoop):
    """One row per id of the loop scenario."""

    class Meta:
        app_label = "benchapp"
        db_table = "taskloop_bench_loop"
