"""Admin support for ``VersionedModel``: a change form based on an old version is refused."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.utils import flatten_fieldsets
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect

from .exceptions import ConcurrentUpdate
from .forms import VersionedModelForm

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldsetSpec


class VersionedModelAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """ModelAdmin for a :class:`~locks.models.VersionedModel` that never overwrites silently.

    The change form carries the version it was opened at; a save based on an older
    version is refused with an error above the form, and nothing is written. If someone
    saves between validation and the write, the admin says so and reloads the form.
    A custom ``form`` must subclass :class:`locks.forms.VersionedModelForm`; ``version``
    is never read-only here (it is a hidden field of the form; show it in ``list_display``).
    ``fields`` and ``fieldsets`` need not list ``version``: it is added to the first
    fieldset, hidden.

    Example::

        from locks.versioning_admin import VersionedModelAdmin

        @admin.register(Document)
        class DocumentAdmin(VersionedModelAdmin):
            list_display = ["title", "version"]
    """

    form = VersionedModelForm

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> _FieldsetSpec:
        """The fieldsets to show, with the hidden ``version`` in the first one if missing.

        The change form renders only the fields of its fieldsets, and the form requires
        ``version``: left out, it would never be posted and every save would fail.

        Example::

            class DocumentAdmin(VersionedModelAdmin):
                fields = ["title", "body"]  # the form still carries the version
        """
        fieldsets = list(super().get_fieldsets(request, obj))
        if "version" in flatten_fieldsets(fieldsets):
            return fieldsets
        if not fieldsets:
            return [(None, {"fields": ["version"]})]
        name, options = fieldsets[0]
        # New containers: the admin's own fields/fieldsets attributes must not grow.
        fieldsets[0] = (name, {**options, "fields": [*options["fields"], "version"]})
        return fieldsets

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # A read-only version would be dropped from the form, and with it the check.
        return [name for name in super().get_readonly_fields(request, obj) if name != "version"]

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except ConcurrentUpdate as exc:
            # The admin's transaction was rolled back: nothing of this edit was written.
            self.message_user(
                request,
                f"Not saved: {exc} Your changes were not applied; this is the current data.",
                messages.ERROR,
            )
            return HttpResponseRedirect(request.get_full_path())
