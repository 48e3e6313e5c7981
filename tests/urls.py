"""URLs used by the tests."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("locking/", include("tests.urls_locking")),
]
