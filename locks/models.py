"""Models of the locks app: the ``Lock`` row of a lease, the ``RowLock`` row of a row lock."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.sql.compiler import SQLCompiler

from .fields import LockNameField, NoteField


class DatabaseNow(models.Func):
    """The database server's clock, as the lock statements read it.

    Example::

        Lock.objects.filter(expires_at__gt=DatabaseNow())
    """

    output_field = models.DateTimeField()

    def as_sql(
        self,
        compiler: SQLCompiler,
        connection: BaseDatabaseWrapper,
        function: str | None = None,
        template: str | None = None,
        arg_joiner: str | None = None,
        **extra_context: Any,
    ) -> tuple[str, list[str | int]]:
        from .backends import for_connection

        return for_connection(connection).NOW, []


class LockQuerySet(models.QuerySet["Lock"]):
    """Queries over lock rows, judged by the database clock."""

    def held(self) -> LockQuerySet:
        """Rows whose lease is live.

        Example::

            Lock.objects.held().count()
        """
        return self.filter(expires_at__gt=DatabaseNow())

    def expired(self) -> LockQuerySet:
        """Rows whose lease has expired (the reaper deletes these).

        Example::

            Lock.objects.expired().count()
        """
        return self.filter(expires_at__lte=DatabaseNow())


class Lock(models.Model):
    """One row per lock name with a current or expired lease.

    Written only by the lease engine's own statements; read it, never write it.
    """

    name = LockNameField(max_length=255, primary_key=True)
    # Exact like ``name``: the lock statements compare holders to decide who owns the row.
    holder = LockNameField(max_length=255)
    count = models.PositiveIntegerField(default=1, help_text="re-entries by the holder")
    token = models.BigIntegerField(help_text="fencing token of the current holding")
    acquired_at = models.DateTimeField()
    expires_at = models.DateTimeField(db_index=True)
    # Any text on every database: a view's note carries its (Unicode) request path.
    note = NoteField(max_length=255, blank=True, default="")
    waiting = models.BooleanField(
        default=False, db_default=False, help_text="a blocked acquire asked to be notified"
    )

    objects = LockQuerySet.as_manager()

    class Meta:
        db_table = "locks_lock"
        ordering = ["-acquired_at"]
        permissions = [("break_lock", "Can break locks held by others")]

    def __str__(self) -> str:
        return str(self.name)


class RowLock(models.Model):
    """One row per name used with :func:`locks.row_lock`; its transaction locks the row.

    Kept apart from lease rows, so row locks and leases never get in each other's way.
    Created on first use; a row nobody holds may be deleted at any time (the next
    ``row_lock`` creates it again).

    Example::

        with locks.row_lock("orders:42") as row:
            assert row.name == "orders:42"
    """

    name = LockNameField(max_length=255, primary_key=True)

    class Meta:
        db_table = "locks_rowlock"

    def __str__(self) -> str:
        return str(self.name)


# The abstract models live in their own modules; importing them here is what makes
# ``from locks.models import FencedModel, VersionedModel`` work.
from .fencing import FencedModel as FencedModel  # noqa: E402
from .fencing import FencedQuerySet as FencedQuerySet  # noqa: E402
from .versioning import VersionedModel as VersionedModel  # noqa: E402
from .versioning import VersionedQuerySet as VersionedQuerySet  # noqa: E402
from .versioning import VersionField as VersionField  # noqa: E402
