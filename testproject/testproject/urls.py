from demo import views
from django.contrib import admin
from django.urls import path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("demo/tasks/", views.enqueue, name="demo-enqueue"),
    path("demo/tasks/<str:result_id>/", views.result, name="demo-result"),
]
