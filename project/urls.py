"""URL configuration of the demo project."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("demo/", include("project.urls_demo")),
    path("", RedirectView.as_view(url="/demo/", permanent=False)),
]
