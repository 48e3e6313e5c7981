"""This app (``locks``) through its public API, on each database."""

from __future__ import annotations

from typing import Any, ClassVar

import locks
from bench import db

from .base import Busy, Contender, DjangoCounting

TTL = 60.0

# Scenario (e) fills the lock table with expired rows in one statement per database.
FILL_EXPIRED = {
    "postgresql": """
        INSERT INTO locks_lock (name, holder, count, token, acquired_at, expires_at, note)
        SELECT %s || g, 'bench', 1, 0, clock_timestamp() - interval '2 hours',
               clock_timestamp() - interval '1 hour', ''
        FROM generate_series(1, %s) AS g
    """,
    "mariadb": """
        INSERT INTO locks_lock (name, holder, count, token, acquired_at, expires_at, note)
        SELECT CONCAT(%s, seq), 'bench', 1, 0, UTC_TIMESTAMP(6) - INTERVAL 2 HOUR,
               UTC_TIMESTAMP(6) - INTERVAL 1 HOUR, ''
        FROM seq_1_to_{rows}
    """,
    "sqlite": """
        WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < %s)
        INSERT INTO locks_lock (name, holder, count, token, acquired_at, expires_at, note)
        SELECT %s || n, 'bench', 1, 0,
               strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-2 hours') || '000',
               strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', '-1 hours') || '000', ''
        FROM g
    """,
}


class App(DjangoCounting, Contender):
    """``locks.try_acquire`` / ``locks.acquire(timeout=...)`` / ``Lease.release``.

    Example::

        App("postgresql").try_acquire("bench:k")
    """

    family = "locks"
    title = "locks"
    backends: ClassVar[tuple[str, ...]] = ("postgresql", "mariadb", "sqlite")
    scenarios = frozenset("abcde")

    def clear(self, prefix: str) -> None:
        db.execute(self.backend, "DELETE FROM locks_lock WHERE name LIKE %s", [prefix + "%"])

    def open(self) -> None:
        self.using = db.alias(self.backend)
        self.install_counter([self.using], own=True)

    def close(self) -> None:
        db.close_all()

    def try_acquire(self, key: str) -> Any | None:
        return self.counted(lambda: locks.try_acquire(key, ttl=TTL, using=self.using))

    def acquire(self, key: str, timeout: float) -> Any:
        try:
            return self.counted(
                lambda: locks.acquire(key, ttl=TTL, timeout=timeout, using=self.using)
            )
        except locks.LockBusy as exc:
            raise Busy(str(exc)) from exc

    def release(self, handle: Any) -> None:
        self.counted(handle.release)

    def fill_expired(self, prefix: str, rows: int) -> None:
        """Parent side: insert ``rows`` expired lock rows named ``prefix<n>`` in one statement."""
        sql = FILL_EXPIRED[self.backend]
        if self.backend == "mariadb":
            db.execute(self.backend, sql.format(rows=int(rows)), [prefix])
        elif self.backend == "sqlite":
            db.execute(self.backend, sql, [rows, prefix])
        else:
            db.execute(self.backend, sql, [prefix, rows])

    def reap(self) -> int:
        """Worker side: the reaper, through the public API."""
        return locks.reap_expired(batch_size=1000, using=self.using)


class AppPooled(App):
    """This app on PostgreSQL set up as behind a transaction pooler (PgBouncer).

    Same database as ``locks/postgresql``, through the alias ``postgresql_pooled``
    (``DISABLE_SERVER_SIDE_CURSORS``), where the app turns off LISTEN/NOTIFY, the waiters'
    queue and prepared statements by itself: what these features are worth.

    Example::

        AppPooled("postgresql").probe()  # None when it can run
    """

    family = "locks_pooled"
    title = "locks, as behind a transaction pooler"
    backends: ClassVar[tuple[str, ...]] = ("postgresql",)
    scenarios = frozenset("abcd")

    def probe(self) -> str | None:
        from django.db import DatabaseError

        try:
            lease = locks.try_acquire("bench:probe", ttl=5, using="postgresql_pooled")
            if lease is not None:
                lease.release()
        except DatabaseError as exc:
            return f"the pooled alias does not work: {str(exc).splitlines()[0]}"
        finally:
            db.close_all()
        return None

    def open(self) -> None:
        self.using = "postgresql_pooled"
        self.install_counter([self.using], own=True)
