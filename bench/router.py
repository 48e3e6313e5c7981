"""Routes django-db-mutex (which has no ``using=``) to the database a bench worker measures."""

from __future__ import annotations

from typing import Any

#: Alias the ``db_mutex`` app reads and writes in this process; set by its contender.
target: str | None = None


class PeerRouter:
    """Send ``db_mutex`` queries to :data:`target`; leave everything else alone.

    Example::

        bench.router.target = "postgresql"
    """

    def db_for_read(self, model: type[Any], **hints: Any) -> str | None:
        return target if model._meta.app_label == "db_mutex" else None

    def db_for_write(self, model: type[Any], **hints: Any) -> str | None:
        return target if model._meta.app_label == "db_mutex" else None
