"""Model fields of the locks app."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


class LockNameField(models.CharField):  # type: ignore[type-arg]
    """A ``CharField`` compared byte for byte on every database.

    MySQL/MariaDB compare text case- and trailing-space-insensitively by default
    ("Lock" = "lock " there); lock names must be exact everywhere.
    """

    def db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        from .backends import for_connection

        params = super().db_parameters(connection)
        params.update(for_connection(connection).name_db_parameters(connection))
        return params
