"""Contenders on the bare drivers: the floor, PostgreSQL advisory locks, MariaDB GET_LOCK."""

from __future__ import annotations

import zlib
from typing import Any, ClassVar

from bench import db

from .base import Busy, Contender


class Raw(Contender):
    """A contender that talks to the database through its driver, with no Django in between.

    Example::

        row = contender.run("SELECT 1", ())
    """

    def open(self) -> None:
        self.connection = db.connect(self.backend)
        self.cursor = self.connection.cursor()
        self.placeholder = "?" if self.backend == "sqlite" else "%s"

    def close(self) -> None:
        self.connection.close()

    def run(self, sql: str, args: tuple[Any, ...]) -> Any:
        """Execute one statement (counted) and return its first row, if any."""
        self.statements += 1
        if self.placeholder != "%s":
            sql = sql.replace("%s", self.placeholder)
        self.cursor.execute(sql, args)
        return self.cursor.fetchone() if self.cursor.description else None

    def counter_get(self, key: str) -> int:
        self.statements -= 1  # the counter's statements are not the lock's
        return int(self.run("SELECT value FROM bench_counter WHERE name = %s", (key,))[0])

    def counter_set(self, key: str, value: int) -> None:
        self.statements -= 1
        self.run("UPDATE bench_counter SET value = %s WHERE name = %s", (value, key))


class Floor(Raw):
    """The physical floor: one autocommit INSERT of a small row with a unique key, one DELETE.

    It is not a lock (nothing waits), so scenarios (c) and (d) measure what the fastest
    conceivable lock on this database would need; see ``bench.scenarios``.

    Example::

        floor = Floor("mariadb")
        floor.release(floor.try_acquire("bench:k"))
    """

    family = "floor"
    title = "floor"
    backends: ClassVar[tuple[str, ...]] = ("postgresql", "mariadb", "sqlite")

    @property
    def floor(self) -> str:
        return self.key

    def clear(self, prefix: str) -> None:
        db.execute(self.backend, "DELETE FROM bench_floor WHERE name LIKE %s", [prefix + "%"])

    def try_acquire(self, key: str) -> Any | None:
        self.run(db.FLOOR_INSERT, (key,))
        return key

    def release(self, handle: Any) -> None:
        self.run(db.FLOOR_DELETE, (handle,))


def _advisory_key(key: str) -> int:
    return zlib.crc32(key.encode())


class PgAdvisory(Raw):
    """``pg_try_advisory_lock`` / blocking ``pg_advisory_lock`` / ``pg_advisory_unlock``.

    Example::

        PgAdvisory("postgresql").acquire("bench:k", 30)
    """

    family = "pg_advisory"
    title = "pg advisory lock"
    backends: ClassVar[tuple[str, ...]] = ("postgresql",)

    def open(self) -> None:
        super().open()
        # A bench bug must not hang forever in pg_advisory_lock.
        self.cursor.execute("SET statement_timeout = 60000")

    def try_acquire(self, key: str) -> Any | None:
        number = _advisory_key(key)
        return number if self.run("SELECT pg_try_advisory_lock(%s)", (number,))[0] else None

    def acquire(self, key: str, timeout: float) -> Any:
        number = _advisory_key(key)
        self.run("SELECT pg_advisory_lock(%s)", (number,))
        return number

    def release(self, handle: Any) -> None:
        if not self.run("SELECT pg_advisory_unlock(%s)", (handle,))[0]:
            raise RuntimeError(f"advisory lock {handle} was not held")


class GetLock(Raw):
    """MariaDB ``GET_LOCK(name, 0)`` / ``GET_LOCK(name, timeout)`` / ``RELEASE_LOCK``.

    Example::

        GetLock("mariadb").acquire("bench:k", 30)
    """

    family = "get_lock"
    title = "GET_LOCK"
    backends: ClassVar[tuple[str, ...]] = ("mariadb",)

    def try_acquire(self, key: str) -> Any | None:
        return key if self.run("SELECT GET_LOCK(%s, 0)", (key,))[0] == 1 else None

    def acquire(self, key: str, timeout: float) -> Any:
        if self.run("SELECT GET_LOCK(%s, %s)", (key, timeout))[0] != 1:
            raise Busy(f"GET_LOCK({key!r}) timed out after {timeout} s")
        return key

    def release(self, handle: Any) -> None:
        if self.run("SELECT RELEASE_LOCK(%s)", (handle,))[0] != 1:
            raise RuntimeError(f"GET_LOCK lock {handle!r} was not held")
