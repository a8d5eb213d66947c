"""django-taskloop: share work between many workers through your Django database."""

from typing import Any

__version__ = "0.1.0.dev0"

_MODELS = ("TaskLoop", "Lockable", "JobBoard", "Job", "JobPriority", "Tube", "Task")

__all__ = list(_MODELS)


def __getattr__(name: str) -> Any:
    # Lazy so that importing the package does not import models before apps are ready.
    if name in _MODELS:
        from . import models

        return getattr(models, name)
    raise AttributeError(f"module 'django_taskloop' has no attribute {name!r}")
