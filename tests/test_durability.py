"""A grant is reported only once it is durable: lock statements commit synchronously."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection, connections

import locks
from locks.conf import conf
from tests import pgbouncer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def asynchronous_commit_by_default(backend: str) -> Iterator[None]:
    if backend != "postgresql":
        pytest.skip("synchronous_commit is a PostgreSQL setting")
    if pgbouncer.ENABLED:
        pytest.skip(
            "behind PgBouncer a session setting belongs to a pooled server connection, not "
            "to a client: keep synchronous_commit on for the role (docs/reliability.md)"
        )
    name = connection.settings_dict["NAME"]
    with connection.cursor() as cursor:
        cursor.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    locks.connection.close()
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f'ALTER DATABASE "{name}" RESET synchronous_commit')
        locks.connection.close()


def setting(wrapper: object) -> str:
    with wrapper.cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute("SHOW synchronous_commit")
        return str(cursor.fetchone()[0])


@pytest.mark.usefixtures("asynchronous_commit_by_default")
def test_lock_statements_commit_synchronously_even_when_the_database_says_off() -> None:
    plain = connections.create_connection("default")
    try:
        assert setting(plain) == "off"  # what any new session of this database gets
    finally:
        plain.close()
    with locks.lock("orders:1"):
        assert setting(locks.connection.get(conf.DATABASE)) == "on"


@pytest.fixture
def normal_synchronous_by_default(backend: str) -> Iterator[None]:
    if backend != "sqlite":
        pytest.skip("PRAGMA synchronous is a SQLite setting")
    options = connections.settings["default"].setdefault("OPTIONS", {})
    before = options.get("init_command")
    # WAL with synchronous=NORMAL: commits reach the disk only at checkpoints.
    options["init_command"] = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL"
    locks.connection.close()
    try:
        yield
    finally:
        if before is None:
            del options["init_command"]
        else:
            options["init_command"] = before
        locks.connection.close()


def synchronous(wrapper: object) -> int:
    with wrapper.cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute("PRAGMA synchronous")
        return int(cursor.fetchone()[0])


@pytest.mark.usefixtures("normal_synchronous_by_default")
def test_lock_statements_reach_the_disk_on_commit_even_when_the_settings_say_normal() -> None:
    plain = connections.create_connection("default")
    try:
        assert synchronous(plain) == 1  # NORMAL: what any connection of this alias gets
    finally:
        plain.close()
    with locks.lock("orders:1"):
        assert synchronous(locks.connection.get(conf.DATABASE)) == 2  # FULL
