"""Bench databases: create and migrate them, raw driver connections, the bench's own tables."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.db import connections

from .settings import ALIASES

BACKENDS = ("postgresql", "mariadb", "sqlite")

# Tables of the benchmark itself: the floor's small row with a unique key, and the
# counter that scenario (c) updates non-atomically inside the lock.
TABLES = [
    "CREATE TABLE IF NOT EXISTS bench_floor (name VARCHAR(200) NOT NULL PRIMARY KEY)",
    "CREATE TABLE IF NOT EXISTS bench_counter"
    " (name VARCHAR(200) NOT NULL PRIMARY KEY, value BIGINT NOT NULL)",
]
#: The floor's pair, as the benchmark's floor and ``bench.anatomy`` send it.
FLOOR_INSERT = "INSERT INTO bench_floor (name) VALUES (%s)"
FLOOR_DELETE = "DELETE FROM bench_floor WHERE name = %s"


def alias(backend: str) -> str:
    """The Django alias of a backend ("sqlite" -> "default").

    Example::

        alias("sqlite")  # "default"
    """
    return ALIASES[backend]


def params(backend: str) -> dict[str, Any]:
    """The Django settings dict of a backend's bench database.

    Example::

        params("postgresql")["NAME"]
    """
    return dict(settings.DATABASES[alias(backend)])


def connect(backend: str, database: str | None = None) -> Any:
    """A raw autocommit connection through the driver Django uses (no Django in between).

    Example::

        connect("mariadb").cursor().execute("SELECT 1")
    """
    p = params(backend)
    if backend == "postgresql":
        import psycopg

        return psycopg.connect(
            host=p["HOST"],
            port=int(p["PORT"]),
            user=p["USER"],
            password=p["PASSWORD"] or None,
            dbname=database or p["NAME"],
            autocommit=True,
            connect_timeout=10,
        )
    if backend == "mariadb":
        import MySQLdb

        connection = MySQLdb.connect(
            host=p["HOST"],
            port=int(p["PORT"]),
            user=p["USER"],
            password=p["PASSWORD"],
            database=database if database is not None else p["NAME"],
            charset="utf8mb4",
            autocommit=True,
            connect_timeout=10,
        )
        return connection
    connection = sqlite3.connect(p["NAME"], timeout=30, isolation_level=None)
    connection.execute("PRAGMA journal_mode=WAL")
    return connection


def unreachable(backend: str) -> str | None:
    """Why a backend's server cannot be used, or ``None`` when it answers.

    Example::

        unreachable("postgresql")  # None when the server answers
    """
    if backend == "sqlite":
        return None
    try:
        connect(backend, database="postgres" if backend == "postgresql" else "").close()
    except Exception as exc:
        return f"{backend} server not reachable: {exc}".splitlines()[0]
    return None


def _schema_stamp() -> str:
    """A fingerprint of what decides the bench databases' schema: apps and their migrations."""
    from django.apps import apps

    digest = hashlib.sha256()
    for config in apps.get_app_configs():
        digest.update(config.label.encode())
        for path in sorted(Path(config.path).glob("migrations/*.py")):
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _drop_database(backend: str) -> None:
    name = params(backend)["NAME"]
    connections[alias(backend)].close()
    if backend == "postgresql":
        server = connect(backend, database="postgres")
        try:
            server.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            server.close()
    elif backend == "mariadb":
        server = connect(backend, database="")
        try:
            server.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")
        finally:
            server.close()
    else:
        for suffix in ("", "-wal", "-shm"):
            Path(f"{name}{suffix}").unlink(missing_ok=True)


def ensure_database(backend: str) -> None:
    """Create the bench database if it is missing, migrate it, and create the bench tables.

    A database made from other migrations (an initial migration edited in place, say) is
    dropped and made afresh: the bench keeps nothing worth keeping in it.

    Example::

        ensure_database("postgresql")
    """
    name = params(backend)["NAME"]
    stamp = Path(settings.BASE_DIR) / "var" / "bench" / f"{name}.{backend}.schema"
    want = _schema_stamp()
    if not stamp.exists() or stamp.read_text() != want:
        _drop_database(backend)
    if backend == "postgresql":
        server = connect(backend, database="postgres")
        try:
            cur = server.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
            if cur.fetchone() is None:
                server.execute(f'CREATE DATABASE "{name}"')
        finally:
            server.close()
    elif backend == "mariadb":
        server = connect(backend, database="")
        try:
            server.cursor().execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
        finally:
            server.close()
    call_command("migrate", database=alias(backend), verbosity=0, interactive=False)
    with connections[alias(backend)].cursor() as cursor:
        for statement in TABLES:
            cursor.execute(statement)
    stamp.write_text(want)


# The bench's tables churn: autovacuum may be off on a test server (it is on this one), and
# dead rows left by earlier measurements must not slow down later ones.
CHURNED = ["locks_lock", "bench_floor", "bench_counter", "db_mutex_dbmutex"]


def tidy(backend: str) -> None:
    """Vacuum and analyze the bench's tables on PostgreSQL (what autovacuum would do).

    Example::

        tidy("postgresql")
    """
    if backend != "postgresql":
        return
    with connections[alias(backend)].cursor() as cursor:
        for table in CHURNED:
            cursor.execute("SELECT to_regclass(%s)", [table])
            if cursor.fetchone()[0] is not None:
                cursor.execute(f"VACUUM ANALYZE {table}")


def analyze(backend: str, table: str) -> None:
    """Refresh the planner's statistics of ``table`` (after a bulk insert).

    Example::

        analyze("mariadb", "locks_lock")
    """
    if backend in ("postgresql", "mariadb"):
        execute(backend, f"ANALYZE {'TABLE ' if backend == 'mariadb' else ''}{table}")


def execute(backend: str, sql: str, args: list[Any] | None = None) -> int:
    """Run one statement on the backend's Django connection; return the row count.

    Example::

        execute("sqlite", "DELETE FROM bench_floor")
    """
    with connections[alias(backend)].cursor() as cursor:
        cursor.execute(sql, args or [])
        return int(cursor.rowcount)


def scalar(backend: str, sql: str, args: list[Any] | None = None) -> Any:
    """Run one query on the backend's Django connection; return the first column of its row.

    Example::

        scalar("postgresql", "SELECT count(*) FROM locks_lock")
    """
    with connections[alias(backend)].cursor() as cursor:
        cursor.execute(sql, args or [])
        row = cursor.fetchone()
        return None if row is None else row[0]


def close_all() -> None:
    """Close every connection of this process (before forking workers).

    Example::

        close_all()
    """
    import locks.connection

    connections.close_all()
    locks.connection.close()
