"""Test-only loop models: one per kind of id (big integer, string, UUID, one-to-one)."""

from django.db import models

from django_taskloop.models import TaskLoop

__all__ = ["IntLoop", "StrLoop", "UuidLoop", "Thing", "ThingLoop"]


class IntLoop(TaskLoop):
    """The default: big integer ids."""

    class Meta:
        app_label = "testapp"


class StrLoop(TaskLoop):
    """String ids."""

    id = models.CharField(max_length=64, primary_key=True)

    class Meta:
        app_label = "testapp"


class UuidLoop(TaskLoop):
    """UUID ids."""

    id = models.UUIDField(primary_key=True)

    class Meta:
        app_label = "testapp"


class Thing(models.Model):
    """Something a loop goes over: ``ThingLoop`` refreshes things."""

    name = models.CharField(max_length=50, default="")
    active = models.BooleanField(default=True)

    class Meta:
        app_label = "testapp"

    def __str__(self) -> str:
        return self.name


class ThingLoop(TaskLoop):
    """A loop whose id is a one-to-one key to the thing it refreshes (no ``id`` column)."""

    thing = models.OneToOneField(Thing, primary_key=True, on_delete=models.CASCADE)

    class Meta:
        app_label = "testapp"
