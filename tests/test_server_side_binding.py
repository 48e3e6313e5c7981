"""PostgreSQL with psycopg's server-side binding (OPTIONS["server_side_binding"] = True)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connections

import locks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def bound_alias(backend: str) -> Iterator[str]:
    if backend != "postgresql":
        pytest.skip("server-side binding is an option of Django's psycopg backend")
    settings_dict = connections.settings["default"]
    options = settings_dict.get("OPTIONS", {})
    # Django's connection (row locks) binds on the server now; the app's own connections
    # to PostgreSQL do anyway, unless PREPARED_STATEMENTS is off (see the test below).
    locks.connection.close()
    settings_dict["OPTIONS"] = {**options, "server_side_binding": True}
    try:
        yield "default"
    finally:
        locks.connection.close()
        settings_dict["OPTIONS"] = options


def test_every_lease_statement_works_with_server_side_binding(bound_alias: str) -> None:
    lease = locks.acquire("orders:1", ttl=30, using=bound_alias)
    inner = locks.acquire("orders:1", using=bound_alias)
    assert locks.try_acquire("orders:1", holder="bob", using=bound_alias) is None
    assert locks.is_locked("orders:1", using=bound_alias)
    assert locks.check_token("orders:1", lease.token, using=bound_alias)
    lease.renew()
    inner.release()
    lease.release()
    assert not locks.is_locked("orders:1", using=bound_alias)
    with locks.row_lock("orders:1", timeout=1, using=bound_alias):
        pass
    locks.acquire("orders:2", ttl=0.01, using=bound_alias)
    assert locks.break_lock("orders:2", using=bound_alias)
    assert locks.reap_expired(using=bound_alias) == 0


def test_the_apps_own_connection_prepares_each_lock_statement_once(backend: str) -> None:
    if backend != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's (psycopg)")
    from tests import pgbouncer

    if pgbouncer.ENABLED:
        pytest.skip("off behind a transaction pooler (tests/test_pgbouncer.py shows it)")
    for _ in range(3):
        locks.acquire("orders:1", ttl=30).release()
    raw = locks.connection.get("default").connection
    prepared = [
        row[0] for row in raw.execute("SELECT statement FROM pg_prepared_statements", prepare=False)
    ]
    assert sum("INSERT INTO locks_lock" in text for text in prepared) == 1
    assert sum("DELETE FROM locks_lock" in text for text in prepared) == 1
