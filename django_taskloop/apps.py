from django.apps import AppConfig


class TaskloopConfig(AppConfig):
    name = "django_taskloop"
    label = "django_taskloop"
    verbose_name = "Task loop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Register the system checks, and the built-in handlers with the worker registry."""
        # Imported here, not at the top: these modules import the models, which Django loads
        # only after it has imported every app's apps.py (ready() is its hook for that).
        from . import checks  # noqa: F401  (registers the system checks)
        from .backends import task_handlers
        from .schedules import schedule_handlers
        from .shards import use_registrations
        from .workers import add_handler_source, registered_options

        # The Tasks backend's queues and the schedules' tube: the registry imports neither.
        add_handler_source(task_handlers)
        add_handler_source(schedule_handlers)
        # shards.tube() makes a tube with its handler's options (shards is a floor below).
        use_registrations(registered_options)
