"""What FencedModel and VersionedModel share of Django's save machinery."""

from __future__ import annotations

from typing import Any

from django.db import models


class RawSaveAware(models.Model):
    """Abstract base that knows, while it saves, whether the save is raw.

    Django saves raw while loading fixtures (``loaddata``): the values are written as the
    fixture has them, so its version or fence must not be checked or changed.

    Example::

        class Account(RawSaveAware):
            def _do_update(self, *args):
                if self._locks_raw:
                    return super()._do_update(*args)
    """

    _locks_raw = False

    class Meta:
        abstract = True

    def _save_table(self, raw: bool = False, *args: Any, **kwargs: Any) -> Any:
        if not raw:
            return super()._save_table(raw, *args, **kwargs)  # type: ignore[misc]
        self._locks_raw = True
        try:
            return super()._save_table(raw, *args, **kwargs)  # type: ignore[misc]
        finally:
            del self._locks_raw
