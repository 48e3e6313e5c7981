"""URLs for the versioning tests: an admin site with a ``VersionedModelAdmin``."""

from django.contrib import admin
from django.urls import path

from locks.versioning_admin import VersionedModelAdmin
from tests.app.models import VersionedNote

site = admin.AdminSite(name="versioning_admin")
site.register(VersionedNote, VersionedModelAdmin)

urlpatterns = [path("admin/", site.urls)]
