"""Model fields of the locks app."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


class LockNameField(models.CharField):  # type: ignore[type-arg]
    """A ``CharField`` compared byte for byte on every database.

    For text that identifies something and must match exactly: lock names, and the
    holders that the lock statements compare. MySQL/MariaDB compare text case-, accent-
    and trailing-space-insensitively by default ("Lock" = "lock " there), which would let
    holder "alice" re-enter, renew or release the lock of holder "Alice". On MySQL/MariaDB
    the column is ``varchar(255)`` whatever ``max_length`` says.

    Example::

        holder = LockNameField(max_length=255)
    """

    def db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        from .backends import for_connection

        params = super().db_parameters(connection)
        params.update(for_connection(connection).name_db_parameters(connection))
        return params
