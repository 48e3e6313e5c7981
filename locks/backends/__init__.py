"""Chooses the vendor SQL for a connection; the only place that looks at ``connection.vendor``."""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from .base import Backend, Cursor, Grant, Released

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor

__all__ = [
    "Backend",
    "Cursor",
    "Grant",
    "Released",
    "create_extras",
    "drop_extras",
    "for_connection",
    "for_vendor",
]


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


def create_extras(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """``RunPython`` step: create the token sequence and triggers (idempotent).

    Any migration that alters ``locks_lock`` runs it again: on SQLite the alteration
    rebuilds the table, which drops the triggers.

    Example::

        migrations.RunPython(create_extras, drop_extras, atomic=False)
    """
    for_connection(schema_editor.connection).create_extras(schema_editor)


def drop_extras(apps: Any, schema_editor: BaseDatabaseSchemaEditor) -> None:
    """``RunPython`` step: undo :func:`create_extras`.

    Example::

        migrations.RunPython(create_extras, drop_extras, atomic=False)
    """
    for_connection(schema_editor.connection).drop_extras(schema_editor)
