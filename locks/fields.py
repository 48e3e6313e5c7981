"""Model fields of the locks app."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import lookups

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper


class NoteField(models.CharField):  # type: ignore[type-arg]
    """A ``CharField`` that holds any text on every database, emoji included.

    On MySQL/MariaDB the column is ``utf8mb4`` whatever the database's default character
    set is (a ``latin1`` or ``utf8mb3`` database would refuse such text with error 1366).

    Example::

        note = NoteField(max_length=255, blank=True, default="")
    """

    def db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        from .backends import for_connection

        params = super().db_parameters(connection)
        params.update(for_connection(connection).text_db_parameters(connection))
        return params


class LockNameField(NoteField):
    """A :class:`NoteField` compared byte for byte on every database.

    For text that identifies something and must match exactly: lock names, and the
    holders that the lock statements compare. MySQL/MariaDB compare text case-, accent-
    and trailing-space-insensitively by default ("Lock" = "lock " there), which would let
    holder "alice" re-enter, renew or release the lock of holder "Alice". On MySQL/MariaDB
    the column is ``varchar(255)`` whatever ``max_length`` says. The case-insensitive
    lookups (``iexact``, ``icontains``, ``istartswith``, ``iendswith``) stay
    case-insensitive there, as on the other databases, so the admin's search finds
    "orders:1" for "ORDERS".

    Example::

        holder = LockNameField(max_length=255)
    """

    def db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        from .backends import for_connection

        params = super().db_parameters(connection)
        params.update(for_connection(connection).name_db_parameters(connection))
        return params


class _FoldedOnMySQL(lookups.Lookup):  # type: ignore[type-arg]
    """Compare lower-cased sides on MySQL/MariaDB, where the column's binary collation
    would make Django's ``LIKE`` case-sensitive (other databases fold case themselves)."""

    def process_lhs(self, compiler: Any, connection: Any, lhs: Any = None) -> Any:
        sql, params = super().process_lhs(compiler, connection, lhs)
        return (f"LOWER({sql})", params) if connection.vendor == "mysql" else (sql, params)

    def process_rhs(self, compiler: Any, connection: Any) -> Any:
        sql, params = super().process_rhs(compiler, connection)
        return (f"LOWER({sql})", params) if connection.vendor == "mysql" else (sql, params)


@LockNameField.register_lookup
class _IExact(_FoldedOnMySQL, lookups.IExact):  # type: ignore[type-arg]
    pass


@LockNameField.register_lookup
class _IContains(_FoldedOnMySQL, lookups.IContains):
    pass


@LockNameField.register_lookup
class _IStartsWith(_FoldedOnMySQL, lookups.IStartsWith):
    pass


@LockNameField.register_lookup
class _IEndsWith(_FoldedOnMySQL, lookups.IEndsWith):
    pass
