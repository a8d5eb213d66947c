from demo import views
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("taskloop/", include("django_taskloop.urls")),
    path("demo/tasks/", views.enqueue, name="demo-enqueue"),
    path("demo/tasks/<str:result_id>/", views.result, name="demo-result"),
]
