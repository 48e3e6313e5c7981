"""App configuration: registers the system checks and connection lifecycle hooks."""

from __future__ import annotations

from django.apps import AppConfig


class LocksConfig(AppConfig):
    name = "locks"
    verbose_name = "Locks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core.signals import request_finished, request_started
        from django.db.backends.signals import connection_created

        from . import checks, connection  # noqa: F401 - registers the checks

        connection_created.connect(connection.prepare, dispatch_uid="locks.prepare")
        request_started.connect(connection._close_old_signal, dispatch_uid="locks.close_old")
        request_finished.connect(connection._close_old_signal, dispatch_uid="locks.close_old_end")
