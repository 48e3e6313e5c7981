"""URLs for the versioning tests: admin sites with ``VersionedModelAdmin`` variants."""

from django.contrib import admin
from django.urls import path

from locks.versioning_admin import VersionedModelAdmin
from tests.app.models import VersionedNote


class FieldsNoteAdmin(VersionedModelAdmin):
    # Lists neither "version" nor "body": the admin must still send the version.
    fields = ["title"]


class FieldsetsNoteAdmin(VersionedModelAdmin):
    fieldsets = [
        (None, {"fields": [("title",)]}),
        ("More", {"fields": ["body"], "classes": ["collapse"]}),
    ]


site = admin.AdminSite(name="versioning_admin")
site.register(VersionedNote, VersionedModelAdmin)
# One model registers once per site: each variant gets a site of its own.
fields_site = admin.AdminSite(name="versioning_fields_admin")
fields_site.register(VersionedNote, FieldsNoteAdmin)
fieldsets_site = admin.AdminSite(name="versioning_fieldsets_admin")
fieldsets_site.register(VersionedNote, FieldsetsNoteAdmin)

urlpatterns = [
    path("admin/", site.urls),
    path("admin-fields/", fields_site.urls),
    path("admin-fieldsets/", fieldsets_site.urls),
]
