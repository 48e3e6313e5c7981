"""URLs used by the tests."""

from django.contrib import admin
from django.urls import include, path

from tests import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("acquire-then-fail/", views.acquire_then_fail),
    path("acquire-and-release/", views.acquire_and_release),
    path("locking/", include("tests.urls_locking")),
]
