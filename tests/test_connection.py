"""The app's own connections are sessions of their own, whatever the alias's settings say."""

from __future__ import annotations

import time

import pytest
from django.db import connections, transaction

import locks
import locks.connection
from tests.app.models import Counter
from tests.conftest import NEEDS_POOL
from tests.remote import remotes


def _pool_checkouts(alias: str) -> int:
    pool = connections[alias].pool  # type: ignore[attr-defined]  # PostgreSQL's wrapper only
    return int(pool.get_stats().get("requests_num", 0))


@NEEDS_POOL
@pytest.mark.django_db(transaction=True, databases=["default", "pooled"])
def test_lock_calls_work_while_the_orm_holds_the_pools_only_connection(pooled: str) -> None:
    with transaction.atomic(using=pooled):
        Counter.objects.using(pooled).create(name="holds-the-slot")
        lease = locks.acquire("orders:1", ttl=30, timeout=0, using=pooled)
        assert locks.is_locked("orders:1", using=pooled)
        lease.renew()
        lease.release()
        # The watchdog renews from a thread of its own, on a connection of its own.
        with locks.lock("orders:2", ttl=0.6, auto_renew=True, using=pooled) as renewed:
            time.sleep(1.2)
            assert locks.check_token("orders:2", renewed.token, using=pooled)
    assert _pool_checkouts(pooled) == 1, "only the ORM's connection came from the pool"


@NEEDS_POOL
@pytest.mark.django_db(transaction=True, databases=["default", "pooled"])
def test_orm_connections_from_the_pool_do_not_get_the_lock_connections_options(
    pooled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    # Room for the ORM even if lock calls took a pooled connection too.
    monkeypatch.setitem(connections.settings[pooled]["OPTIONS"]["pool"], "max_size", 2)
    # A lock call first: had its connection made the alias's pool, the pool would open
    # every ORM connection with the lock connection's options (server-side binding,
    # prepared statements).
    locks.acquire("orders:1", ttl=30, using=pooled).release()
    assert Counter.objects.using(pooled).count() == 0
    orm = connections[pooled].connection
    assert issubclass(orm.cursor_factory, psycopg.ClientCursor), "Django's default binding"
    assert orm.prepare_threshold is None
    assert _pool_checkouts(pooled) == 1, "only the ORM's connection came from the pool"


@pytest.mark.django_db(transaction=True, databases=["default", "manual"])
def test_a_lease_on_an_alias_without_autocommit_is_seen_by_other_processes() -> None:
    lease = locks.acquire("orders:1", ttl=30, using="manual")
    with remotes() as start:
        other = start()  # on "default": the same database
        # A read first: it never waits, where an acquire would queue behind an open
        # transaction that has written the row.
        seen = other.call("check_token", name="orders:1", token=lease.token)
        assert seen["ok"] and seen["live"], seen
        refused = other.call("try_acquire", name="orders:1")
        assert refused["ok"] and not refused["acquired"], refused
        lease.release()
        granted = other.call("try_acquire", name="orders:1")
        assert granted["ok"] and granted["acquired"], granted
