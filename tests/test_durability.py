"""A grant is reported only once it is durable: lock statements commit synchronously.

Each database is set up here to acknowledge commits before they are safely on disk, as an
operator may set it up; the app's own sessions must commit durably anyway.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, connections

import locks
from locks.conf import conf
from tests import pgbouncer

pytestmark = pytest.mark.django_db(transaction=True)


@contextmanager
def asynchronous_commit() -> Iterator[None]:
    """PostgreSQL: ``synchronous_commit = off`` for every new session of the database."""
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{name}" RESET synchronous_commit')


@contextmanager
def normal_synchronous() -> Iterator[None]:
    """SQLite: WAL with ``synchronous = NORMAL`` (commits reach the disk at checkpoints)."""
    options = connections.settings["default"].setdefault("OPTIONS", {})
    before = options.get("init_command")
    options["init_command"] = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL"
    try:
        yield
    finally:
        if before is None:
            del options["init_command"]
        else:
            options["init_command"] = before


# backend: (how to relax it, the statement that reads the setting, relaxed, durable)
RELAXED: dict[str, tuple[Any, str, Any, Any]] = {
    "postgresql": (asynchronous_commit, "SHOW synchronous_commit", "off", "on"),
    "sqlite": (normal_synchronous, "PRAGMA synchronous", 1, 2),  # NORMAL, FULL
}


@pytest.fixture
def relaxed(backend: str) -> Iterator[tuple[str, Any, Any]]:
    """The database set up to commit less durably; yields what to read and expect."""
    if backend == "mariadb":
        pytest.skip(
            "innodb_flush_log_at_trx_commit is server-wide, no session can choose it: "
            "check locks.W003 warns instead (tests/test_checks.py)"
        )
    if pgbouncer.ENABLED:
        pytest.skip(
            "behind PgBouncer a session setting belongs to a pooled server connection, not "
            "to a client: keep synchronous_commit on for the role (docs/reliability.md)"
        )
    relax, read, loose, durable = RELAXED[backend]
    with relax():
        locks.connection.close()
        try:
            yield read, loose, durable
        finally:
            locks.connection.close()


def setting(wrapper: Any, read: str) -> Any:
    with wrapper.cursor() as cursor:
        cursor.execute(read)
        return cursor.fetchone()[0]


def test_lock_statements_commit_durably_whatever_the_database_is_set_to(
    relaxed: tuple[str, Any, Any],
) -> None:
    read, loose, durable = relaxed
    plain = connections.create_connection("default")
    try:
        assert setting(plain, read) == loose  # what any new session of this database gets
    finally:
        plain.close()
    with locks.lock("orders:1"):
        assert setting(locks.connection.get(conf.DATABASE), read) == durable
