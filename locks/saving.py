"""What FencedModel and VersionedModel share of Django's save machinery."""

from __future__ import annotations

from typing import Any

from django.db import connections, models


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


def newest(rows: models.QuerySet[Any]) -> models.QuerySet[Any]:
    """``rows``, read so as to see what a conditional write on them has just seen.

    MySQL/MariaDB writes and locking reads see the newest committed rows, but a plain
    read inside a REPEATABLE READ transaction sees the transaction's snapshot, which may
    predate them: inside a transaction there, the read locks the rows. PostgreSQL's reads
    and writes in one transaction see the same snapshot (a write to a row changed since a
    REPEATABLE READ snapshot fails instead), and SQLite has one writer at a time.

    Example::

        newest(Account.objects.using("default").filter(pk=7)).values_list("fence", flat=True)
    """
    connection = connections[rows.db]
    if connection.vendor == "mysql" and not connection.get_autocommit():
        return rows.select_for_update()
    return rows
