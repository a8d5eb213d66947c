"""URLs of django-taskloop: ``path("taskloop/", include("django_taskloop.urls"))``."""

from django.urls import path

from .metrics import metrics

app_name = "django_taskloop"

urlpatterns = [
    path("metrics", metrics, name="metrics"),
]
