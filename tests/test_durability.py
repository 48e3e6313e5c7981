"""A grant is reported only once it is durable: PostgreSQL lock statements commit synchronously."""

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
