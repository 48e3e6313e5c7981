"""Chooses the vendor SQL for a connection; the only place that looks at ``connection.vendor``."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from .base import Backend, Cursor, Grant, Released

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

__all__ = ["Backend", "Cursor", "Grant", "Released", "for_connection", "for_vendor"]


@cache
def for_vendor(vendor: str) -> Backend:
    """Return the backend for a Django ``connection.vendor`` string.

    Example::

        for_vendor("postgresql").ACQUIRE
    """
    from ..exceptions import LockError

    if vendor == "postgresql":
        from .postgresql import PostgreSQLBackend

        return PostgreSQLBackend()
    if vendor == "mysql":
        from .mysql import MySQLBackend

        return MySQLBackend()
    if vendor == "sqlite":
        from .sqlite import SQLiteBackend

        return SQLiteBackend()
    raise LockError(
        f"the locks app supports PostgreSQL, MySQL/MariaDB and SQLite, not {vendor!r}; "
        'point LOCKS = {"DATABASE": alias} at one of those'
    )


def for_connection(connection: BaseDatabaseWrapper) -> Backend:
    """Return the backend for a Django database connection.

    Example::

        for_connection(connections["default"]).reap(cursor, 1000)
    """
    return for_vendor(connection.vendor)
