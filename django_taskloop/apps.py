from django.apps import AppConfig


class TaskloopConfig(AppConfig):
    name = "django_taskloop"
    label = "django_taskloop"
    verbose_name = "Task loop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
