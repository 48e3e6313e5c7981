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
    # The app's own connections are made from these settings when they (re)connect.
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
