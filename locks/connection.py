"""The app's own database connections: one per thread and alias, in autocommit mode.

Lock statements never run on the caller's connection, so a lease taken inside the
caller's ``transaction.atomic()`` is visible to other processes at once and survives
the caller's rollback, and a lock statement never waits behind the caller's long
transaction. The connections follow Django's lifecycle: they are closed at the end of
a request when Django closes its own (``CONN_MAX_AGE``, health checks), and with the
thread that opened them.
"""

from __future__ import annotations

import os
import threading
import weakref
from contextlib import suppress
from typing import TYPE_CHECKING, Any, cast

from django.db import connections

from .backends import for_connection

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.utils import CursorWrapper


class _Closer:
    """Closes a thread's connections when the thread ends.

    A thread's ``threading.local`` values are dropped when it exits; Django's connection
    wrappers sit in reference cycles and would wait for the cyclic garbage collector,
    keeping server sessions open. This object has no cycles, so it goes at once.
    """

    def __init__(self, wrappers: dict[str, BaseDatabaseWrapper]) -> None:
        self.wrappers = wrappers
        self.pid = os.getpid()
        # Kept on the object: this may run at interpreter exit, when the module's globals
        # are already gone (None).
        self.getpid = os.getpid

    def __del__(self) -> None:
        if self.getpid() != self.pid:
            # A forked child drops the parent's other threads, and with them this: their
            # sockets are the parent's sessions. Park them with the rest of the
            # inheritance, unless the child's interpreter is already exiting: then the
            # list is gone, and the sockets were made harmless at the fork anyway.
            inherited = _inherited
            if inherited is not None:
                inherited.append(self.wrappers)
            return
        for wrapper in self.wrappers.values():
            raw = wrapper.connection
            wrapper.connection = None
            # The cached cursor points back at the wrapper: break that cycle now.
            wrapper.__dict__.pop("locks_cursor", None)
            if raw is not None:
                # Not contextlib.suppress: at interpreter exit that global may be gone.
                try:  # noqa: SIM105
                    raw.close()
                except Exception:
                    pass


class _PerThread(threading.local):
    def __init__(self) -> None:
        self.wrappers: dict[str, BaseDatabaseWrapper] = {}
        self.closer = _Closer(self.wrappers)


_local = _PerThread()
#: Every connection of ours still alive, in any thread (for tests and diagnostics).
_alive: weakref.WeakSet[BaseDatabaseWrapper] = weakref.WeakSet()
# A forked child must not touch the parent's sockets, not even to close them (that would
# end the parent's sessions); the inherited wrappers are parked here and forgotten.
_inherited: list[Any] = []


def _detach(raw: Any) -> None:
    """Point the socket of an inherited driver connection at /dev/null, in a forked child.

    The parked wrappers still go when the child's interpreter exits, and some drivers say
    goodbye as they go: mysqlclient sends COM_QUIT, which on the shared socket ends the
    parent's session (psycopg does not, in a child). Whatever they send now goes nowhere,
    and closing the descriptor closes only the child's /dev/null.
    """
    fileno = getattr(raw, "fileno", None)  # socket drivers; SQLite has no socket to share
    if fileno is None:
        return
    try:
        fd = int(fileno())
    except Exception:  # a driver connection already closed has no descriptor left
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def _forget_after_fork() -> None:
    global _local
    # Every thread's connections, not only the forking thread's: the other threads'
    # go with their thread-local values in the child.
    for wrapper in list(_alive):
        if wrapper.connection is not None:
            _detach(wrapper.connection)
    _inherited.append(_local)
    _local = _PerThread()


os.register_at_fork(after_in_child=_forget_after_fork)


def session(alias: str) -> BaseDatabaseWrapper:
    """A new, unopened autocommit connection to ``alias`` apart from the ORM's.

    It shares nothing with the ORM's connections (no pool) whatever the alias's settings
    say. For connections of the app's own that are not for lock statements (the release
    listener); lock statements go through :func:`get`.

    Example::

        wrapper = locks.connection.session("default")
    """
    wrapper = connections.create_connection(alias)
    # Our own copy: Django's wrapper shares the dict with settings.DATABASES.
    settings_dict = for_connection(wrapper).session_settings(dict(wrapper.settings_dict))
    # With the alias's AUTOCOMMIT = False, Django would open a transaction on connect that
    # nothing of ours commits: no other session would see a lease (nor a LISTEN take
    # effect), and closing the connection would roll it back.
    settings_dict["AUTOCOMMIT"] = True
    wrapper.settings_dict = settings_dict
    return wrapper


def get(alias: str) -> BaseDatabaseWrapper:
    """Return this thread's own autocommit connection to ``alias``, creating it if needed.

    Example::

        with locks.connection.get("default").cursor() as cursor:
            cursor.execute("SELECT 1")
    """
    wrapper = _local.wrappers.get(alias)
    if wrapper is None:
        wrapper = session(alias)
        wrapper.settings_dict = for_connection(wrapper).own_settings(wrapper.settings_dict)
        wrapper.locks_own = True  # type: ignore[attr-defined]  # marks it for on_connect
        _local.wrappers[alias] = wrapper
        _alive.add(wrapper)
    return wrapper


class DirectCursor:
    """The cursor a session of ours keeps for lock statements, when nobody watches them.

    Django's ``CursorWrapper`` logs queries and runs ``execute_wrapper`` hooks, and wraps
    every ``fetchone`` in a new error-translating function. Lock calls are short and many:
    when neither logging nor a hook is on, this calls the backend's own cursor and only
    translates driver errors into Django's, as Django does. That is some 8 us less per
    statement, a few percent of an uncontended acquire+release.

    Example::

        DirectCursor(django_cursor.cursor, wrapper.wrap_database_errors).execute("SELECT 1")
    """

    __slots__ = ("_cursor", "_errors")

    def __init__(self, cursor: Any, errors: Any) -> None:
        self._cursor = cursor
        self._errors = errors

    def execute(self, sql: str, params: Any = None) -> Any:
        """Run one statement; driver errors come out as Django's (``django.db.Error``)."""
        with self._errors:
            return self._cursor.execute(sql, params)

    def fetchone(self) -> Any:
        """The next row of the last statement's result, or ``None``."""
        with self._errors:
            return self._cursor.fetchone()

    def close(self) -> None:
        """Close the driver cursor, finishing a statement left unfinished."""
        self._cursor.close()

    @property
    def rowcount(self) -> int:
        """Rows the last statement changed (matched, on MySQL/MariaDB)."""
        return int(self._cursor.rowcount)

    @property
    def connection(self) -> Any:
        """The driver's connection under the cursor (the session's), as Django's cursor gives."""
        return self._cursor.connection


def _watched(wrapper: BaseDatabaseWrapper) -> int:
    """Which cursor Django would give: 2 a logging one, 1 a plain one for hooks, 0 none."""
    return 2 if wrapper.queries_logged else 1 if wrapper.execute_wrappers else 0


def cursor(wrapper: BaseDatabaseWrapper) -> DirectCursor | CursorWrapper:
    """A cursor on one of our connections, reused while the same session lasts.

    A Django cursor costs two wrapper objects and a driver cursor per statement; lock
    calls are short and many, so each session keeps one. It is a :class:`DirectCursor` unless
    Django logs queries (``DEBUG``, ``CaptureQueriesContext``) or an ``execute_wrapper``
    hook is installed on the connection: then it is Django's own cursor, which records
    the statements and runs the hooks.

    Example::

        locks.connection.cursor(locks.connection.get("default")).execute("SELECT 1")
    """
    raw = wrapper.connection
    cached = getattr(wrapper, "locks_cursor", None)
    if (
        raw is not None
        and cached is not None
        and cached[0] is raw
        and cached[1] == _watched(wrapper)
        # With CONN_HEALTH_CHECKS, Django checks a connection before its first use after
        # close_old() (each request's start and end), in wrapper.cursor(); without them
        # this costs no statement.
        and (wrapper.health_check_done or not wrapper.health_check_enabled)  # type: ignore[attr-defined]
    ):
        return cast("DirectCursor | CursorWrapper", cached[2])
    # Before ensure_connection: a connection that fails the check is closed and opened
    # anew, and opening it runs connection_created receivers, which may install hooks.
    wrapper.close_if_health_check_failed()
    wrapper.ensure_connection()
    watched = _watched(wrapper)
    fresh = wrapper.cursor()
    if watched:
        chosen: DirectCursor | CursorWrapper = fresh
    else:
        driver = for_connection(wrapper).driver_cursor(fresh)
        chosen = DirectCursor(driver, wrapper.wrap_database_errors)
    wrapper.locks_cursor = (wrapper.connection, watched, chosen)  # type: ignore[attr-defined]
    return chosen


def abandon(wrapper: BaseDatabaseWrapper) -> None:
    """Close one of our connections left mid-statement, whatever state it is in.

    Never raises: it runs while another exception is on its way out.

    Example::

        locks.connection.abandon(locks.connection.get("default"))
    """
    # The kept cursor first: SQLite closes a connection with an unfinished statement only
    # once that statement is gone, keeping the file's write lock till then.
    cached = wrapper.__dict__.pop("locks_cursor", None)
    with suppress(Exception):
        if cached is not None:
            cached[2].close()
    with suppress(Exception):
        wrapper.close()


def close_old() -> None:
    """Close this thread's connections that Django would close now (age, errors).

    Connected to ``request_started`` and ``request_finished`` like Django's own
    ``close_old_connections``.

    Example::

        locks.connection.close_old()
    """
    for wrapper in list(_local.wrappers.values()):
        wrapper.close_if_unusable_or_obsolete()


def close() -> None:
    """Close all of this thread's own connections.

    Example::

        locks.connection.close()  # e.g. before forking worker processes
    """
    for wrapper in _local.wrappers.values():
        wrapper.close()


def open_count() -> int:
    """How many of the app's own connections are open, in every thread.

    Example::

        assert locks.connection.open_count() == 0
    """
    return sum(1 for wrapper in list(_alive) if wrapper.connection is not None)


def prepare(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """``connection_created`` receiver: set up a new connection of ours for lock statements."""
    if getattr(connection, "locks_own", False):
        for_connection(connection).on_connect(connection)


def _close_old_signal(**kwargs: Any) -> None:
    close_old()
