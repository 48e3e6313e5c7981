"""The interface every contender implements, and helpers shared by the database ones."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, ClassVar

from django.db import connections

from bench import db


class Busy(Exception):
    """A blocking acquire ran out of time (the bench treats it as an error).

    Example::

        raise Busy("bench:k: still busy after 30 s")
    """


class Contender:
    """One lock implementation on one database, driven by the scenario loops.

    The parent process calls :meth:`missing`, :meth:`prepare` and the ``counter_*``
    book-keeping; each worker process builds its own instance and calls :meth:`open`,
    the lock calls and :meth:`close`. ``statements`` counts the statements the lock
    calls sent (not the counter's).

    Example::

        contender = REGISTRY["locks/postgresql"]()
        contender.open()
        handle = contender.try_acquire("bench:k")
        contender.release(handle)
    """

    family: ClassVar[str] = ""
    title: ClassVar[str] = ""
    backends: ClassVar[tuple[str, ...]] = ()
    scenarios: ClassVar[frozenset[str]] = frozenset("abcd")
    #: Python modules that must import (installed only in .venv-bench for the peers).
    needs: ClassVar[tuple[str, ...]] = ()

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.statements = 0

    @property
    def key(self) -> str:
        return f"{self.family}/{self.backend}"

    @property
    def label(self) -> str:
        return f"{self.title} ({self.backend})"

    @property
    def floor(self) -> str:
        """The floor contender this one is compared with (same database when there is one)."""
        return f"floor/{self.backend if self.backend in db.BACKENDS else 'postgresql'}"

    def missing(self) -> str | None:
        """Why this contender cannot run here, or ``None``."""
        import importlib.util

        for module in self.needs:
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed (scripts/bench installs it into .venv-bench)"
        return self.unreachable()

    def unreachable(self) -> str | None:
        """Why the contender's server cannot be reached, or ``None``."""
        return db.unreachable(self.backend)

    def probe(self) -> str | None:
        """Parent side, after the database is ready: why the contender cannot run, or ``None``."""
        return None

    def prepare(self) -> None:
        """Parent side, once per run: create what the contender needs."""

    def clear(self, prefix: str) -> None:
        """Parent side, before every measurement: forget locks left under ``prefix``."""

    def open(self) -> None:
        """Worker side: connect (connections are not measured)."""

    def close(self) -> None:
        """Worker side: disconnect."""

    def try_acquire(self, key: str) -> Any | None:
        """One non-blocking attempt; a handle, or ``None`` when the lock is held."""
        raise NotImplementedError

    def acquire(self, key: str, timeout: float) -> Any:
        """Block until the lock is ours (raise :class:`Busy` after ``timeout``)."""
        raise NotImplementedError

    def release(self, handle: Any) -> None:
        raise NotImplementedError

    # The counter of scenario (c): a row in the same database, read then written.
    def counter_init(self, key: str) -> None:
        db.execute(self.backend, "DELETE FROM bench_counter WHERE name = %s", [key])
        db.execute(self.backend, "INSERT INTO bench_counter (name, value) VALUES (%s, 0)", [key])

    def counter_value(self, key: str) -> int:
        return int(
            db.scalar(self.backend, "SELECT value FROM bench_counter WHERE name = %s", [key])
        )

    def counter_get(self, key: str) -> int:
        with connections[db.alias(self.backend)].cursor() as cursor:
            cursor.execute("SELECT value FROM bench_counter WHERE name = %s", [key])
            return int(cursor.fetchone()[0])

    def counter_set(self, key: str, value: int) -> None:
        with connections[db.alias(self.backend)].cursor() as cursor:
            cursor.execute("UPDATE bench_counter SET value = %s WHERE name = %s", [value, key])


#: The counter that counts now in this (worker) process, if any: see DjangoCounting.
_COUNTING: list[DjangoCounting] = []
_PATCHED: set[type[Any]] = set()


def _count_in(cursor_class: type[Any]) -> None:
    """Make ``execute`` of a database backend's cursor class count for ``_COUNTING``."""
    if cursor_class in _PATCHED:
        return
    original = cursor_class.execute

    def execute(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _COUNTING:
            _COUNTING[0].statements += 1
        return original(self, *args, **kwargs)

    cursor_class.execute = execute
    _PATCHED.add(cursor_class)


class DjangoCounting:
    """Counts the statements a lock call sends through Django's database backends.

    It counts at the driver's cursor class (what Django's cursor wrappers wrap), under
    every wrapper and hook, so that counting costs a lock about as little as it
    costs the floor: an ``execute_wrapper`` would add Django's hook machinery to every
    statement, and the app, which skips ``CursorWrapper`` when no hook is installed,
    would be measured on its slower path. Only statements run inside :meth:`counted` are
    counted, so the counter update of scenario (c) on the same connection is left out.

    Example::

        self.install_counter(["postgresql"])
        self.counted(lambda: lease.release())
    """

    statements: int

    def install_counter(self, alias_names: list[str], own: bool = False) -> None:
        import locks.connection
        from locks.backends import for_connection
        from locks.backends.libpq import PreparedCursor

        for name in alias_names:
            wrapper = locks.connection.get(name) if own else connections[name]
            with wrapper.cursor() as cursor:
                # The class under every wrapper, which the app's direct cursor calls too.
                driver = for_connection(wrapper).driver_cursor(cursor)
                if not own and isinstance(driver, PreparedCursor):
                    # The app's own PostgreSQL cursor sends its hot statements below
                    # psycopg's cursor; Django's statements (django-db-mutex's) go to it.
                    driver = cursor.cursor
                _count_in(type(driver))

    def counted(self, call: Callable[[], Any]) -> Any:
        _COUNTING.append(self)
        try:
            return call()
        finally:
            _COUNTING.pop()


def backoff_wait(attempt_fn: Callable[[], Any | None], key: str, timeout: float) -> Any:
    """Blocking acquire for a lock that only has a try: bounded exponential backoff + jitter.

    Pauses start at 1 ms and double up to 50 ms, each a random point in its upper half.

    Example::

        handle = backoff_wait(lambda: contender.try_acquire("k"), "k", 30)
    """
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        handle = attempt_fn()
        if handle is not None:
            return handle
        if time.monotonic() >= deadline:
            raise Busy(f"{key}: still busy after {timeout} s")
        time.sleep(random.uniform(pause / 2, pause))
        pause = min(pause * 2, 0.05)
