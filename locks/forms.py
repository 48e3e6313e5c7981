"""Model forms for ``VersionedModel``: the version travels in the form; stale edits are refused."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError

STALE_VERSION = "stale_version"


class VersionedModelForm(forms.ModelForm):  # type: ignore[type-arg]
    """A ModelForm for a :class:`~locks.models.VersionedModel` that refuses stale edits.

    The version the user started from is a hidden field. If the row was saved by
    someone else since, the form is invalid with a clear error (code
    ``"stale_version"``) and nothing is written; if that happens between validation and
    ``save()``, the save raises ``locks.ConcurrentUpdate`` and writes nothing either.

    Example::

        class DocumentForm(VersionedModelForm):
            class Meta:
                model = Document
                fields = ["title", "body"]

        form = DocumentForm(request.POST, instance=document)
        if form.is_valid():
            form.save()
    """

    version = forms.IntegerField(widget=forms.HiddenInput, min_value=0)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The version of the row as this request loaded it.
        self._loaded_version: int = self.instance.version
        self.initial.setdefault("version", self._loaded_version)

    def clean(self) -> dict[str, Any]:
        cleaned: dict[str, Any] = super().clean() or self.cleaned_data
        submitted = cleaned.get("version")
        if submitted is None or self.instance._state.adding:
            return cleaned
        if submitted != self._loaded_version:
            raise ValidationError(
                "%(model)s was changed by someone else after you opened it (you edited "
                "version %(submitted)s; it is now at version %(current)s). Nothing was "
                "saved. Reload the page to see the current data, then make your change "
                "again.",
                code=STALE_VERSION,
                params={
                    "model": str(self.instance._meta.verbose_name).capitalize(),
                    "submitted": submitted,
                    "current": self._loaded_version,
                },
            )
        # save() writes only if the row is still at the version the user started from.
        self.instance.version = submitted
        return cleaned
