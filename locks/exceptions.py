"""Exceptions raised by the locks app; all derive from :class:`LockError`."""

from __future__ import annotations


class LockError(Exception):
    """Base class of every error this app raises on purpose.

    Example::

        try:
            with locks.lock("orders:42", timeout=0):
                ...
        except locks.LockError as exc:
            log.warning("could not run: %s", exc)
    """


class LockBusy(LockError):
    """Another holder has the lock and the wait (``timeout``) ran out.

    Example::

        try:
            lease = locks.acquire("orders:42", timeout=5)
        except locks.LockBusy:
            return HttpResponse(status=423)
    """


class LockLost(LockError):
    """The lease is no longer ours: it expired, was taken over, broken or reaped.

    Example::

        try:
            lease.renew()
        except locks.LockLost:
            abort_work()
    """


class StaleToken(LockError):
    """A write carried a fencing token older than one that already wrote.

    Example::

        try:
            account.save(fence=lease.token)
        except locks.StaleToken:
            pass  # a newer holder wrote first; our view of the world is stale
    """


class ConcurrentUpdate(LockError):
    """An optimistic (versioned) save lost against a concurrent update.

    Example::

        try:
            order.save()
        except locks.ConcurrentUpdate:
            order.refresh_from_db()
    """


class DuplicateTask(LockBusy):
    """A de-duplicated Celery task is already queued or running with the same lock key.

    Raised by ``SingletonTask.apply_async``/``delay`` when the task has
    ``on_duplicate = "raise"``; ``name`` is the lock key and ``task_id`` the id of the
    task already queued or running (``None`` if another kind of holder has the lock).

    Example::

        try:
            export_report.delay(report_id)
        except locks.DuplicateTask as exc:
            messages.info(request, f"already running as {exc.task_id}")
    """

    def __init__(self, message: str, name: str, task_id: str | None) -> None:
        # All three in args: pickle, copy and Celery's result backends (which store an
        # exception's args, then call the class with them) rebuild it from args alone.
        super().__init__(message, name, task_id)
        self.name = name
        self.task_id = task_id

    def __str__(self) -> str:
        return str(self.args[0])
