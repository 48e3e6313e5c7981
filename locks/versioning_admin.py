"""Admin support for ``VersionedModel``: a change form based on an old version is refused."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect

from .exceptions import ConcurrentUpdate
from .forms import VersionedModelForm


class VersionedModelAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """ModelAdmin for a :class:`~locks.models.VersionedModel` that never overwrites silently.

    The change form carries the version it was opened at; a save based on an older
    version is refused with an error above the form, and nothing is written. If someone
    saves between validation and the write, the admin says so and reloads the form.
    A custom ``form`` must subclass :class:`locks.forms.VersionedModelForm`; ``version``
    is never read-only here (it is a hidden field of the form; show it in ``list_display``).

    Example::

        from locks.versioning_admin import VersionedModelAdmin

        @admin.register(Document)
        class DocumentAdmin(VersionedModelAdmin):
            list_display = ["title", "version"]
    """

    form = VersionedModelForm

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
