"""Leases are independent of the caller's transaction, and connections do not leak."""

from __future__ import annotations

import gc
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from django.db import connection, transaction
from django.test import Client, override_settings

import locks
from locks.models import Lock
from tests import pgbouncer
from tests.app.models import Counter
from tests.conftest import finish, spawn

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])


def probe(name: str, using: str = "default") -> bool:
    """Whether another OS process sees ``name`` as locked."""
    return bool(finish(spawn("probe", name, using))[0]["locked"])


@pytest.fixture
def lock_alias(backend: str) -> Iterator[str]:
    """Where leases go while the caller has a transaction open on "default".

    On a server database that is the same database; SQLite allows one writer per file,
    so there the locks get their own file (the documented fix).
    """
    if backend == "sqlite":
        with override_settings(LOCKS={"DATABASE": "other"}):
            yield "other"
    else:
        yield "default"


@pytest.mark.parametrize("outcome", ["rollback", "commit"])
def test_a_lease_taken_in_a_transaction_is_independent_of_it(outcome: str, lock_alias: str) -> None:
    class Rollback(Exception):
        pass

    try:
        with transaction.atomic():
            Counter.objects.create(name="in-transaction")
            lease = locks.acquire("orders:1", ttl=30)
            assert probe("orders:1", lock_alias), "other processes see the lease before the commit"
            if outcome == "rollback":
                raise Rollback
    except Rollback:
        pass
    assert Counter.objects.filter(name="in-transaction").exists() == (outcome == "commit")
    assert probe("orders:1", lock_alias)
    assert Lock.objects.using(lock_alias).filter(name="orders:1").exists()
    lease.release()
    assert not probe("orders:1", lock_alias)


def test_renew_and_release_inside_a_rolled_back_transaction_stay_done(lock_alias: str) -> None:
    lease = locks.acquire("orders:1", ttl=30)
    with transaction.atomic():
        lease.renew(ttl=60)
        expires_at = lease.expires_at
        transaction.set_rollback(True)
    assert Lock.objects.using(lock_alias).get(name="orders:1").expires_at == expires_at
    with transaction.atomic():
        lease.release()
        transaction.set_rollback(True)
    assert not Lock.objects.using(lock_alias).filter(name="orders:1").exists()


@pytest.mark.usefixtures("atomic_requests")
def test_a_lease_taken_under_atomic_requests_survives_the_requests_rollback(
    lock_alias: str,
) -> None:
    response = Client(raise_request_exception=False).get(
        "/acquire-then-fail/", {"name": "orders:1", "holder": "request-1"}
    )
    assert response.status_code == 500
    row = Lock.objects.using(lock_alias).get(name="orders:1")
    assert row.holder == "request-1"
    assert probe("orders:1", lock_alias)


def test_sqlite_refuses_a_lease_inside_a_write_transaction_on_the_same_file(
    backend: str,
) -> None:
    if backend != "sqlite":
        pytest.skip("only SQLite has a single writer per database file")
    with transaction.atomic():
        Counter.objects.create(name="writer")
        with pytest.raises(locks.LockError, match=r'LOCKS = \{"DATABASE"'):
            locks.acquire("orders:1")
        with pytest.raises(locks.LockError, match="one writer per file"):
            locks.break_lock("orders:1")
    assert not Lock.objects.exists()
    # Outside the transaction, the same call works.
    locks.acquire("orders:1").release()


def test_sqlite_refuses_every_lease_write_inside_a_write_transaction_and_writes_nothing(
    backend: str,
) -> None:
    if backend != "sqlite":
        pytest.skip("only SQLite has a single writer per database file")
    lease = locks.acquire("orders:1", ttl=30)
    expired = locks.acquire("orders:2", ttl=0.05)
    time.sleep(0.1)
    before = sorted(Lock.objects.values_list("name", "holder", "token", "count", "expires_at"))
    calls: dict[str, Callable[[], object]] = {
        "try_acquire": lambda: locks.try_acquire("orders:3"),
        "acquire": lambda: locks.acquire("orders:3", timeout=5),
        "lock": lambda: locks.lock("orders:3").__enter__(),
        "re-entry": lambda: locks.acquire("orders:1"),
        "renew": lease.renew,
        "release": lease.release,
        "break_lock": lambda: locks.break_lock("orders:1"),
        "reap_expired": locks.reap_expired,
    }
    for what, call in calls.items():
        with transaction.atomic():
            Counter.objects.create(name=f"writer:{what}")
            # The error naming the fix, raised before the statement (which would wait for
            # this very thread's transaction until the busy timeout, then fail otherwise).
            with pytest.raises(locks.LockError, match=r'LOCKS = \{"DATABASE"'):
                call()
    after = sorted(Lock.objects.values_list("name", "holder", "token", "count", "expires_at"))
    assert after == before
    assert lease.held and locks.check_token("orders:1", lease.token)
    lease.release()
    with pytest.raises(locks.LockLost):
        expired.release()


def test_server_databases_allow_a_lease_inside_the_callers_transaction(backend: str) -> None:
    if backend == "sqlite":
        pytest.skip("SQLite refuses this on purpose (see the test above)")
    with transaction.atomic():
        Counter.objects.create(name="writer")
        locks.acquire("orders:1").release()


def _server_sessions() -> int:
    """Sessions the database server has open to the test database."""
    if connection.vendor == "sqlite":
        # SQLite has no server; its VFS even keeps a closed connection's file descriptor
        # while another connection of the process holds locks on the file. Count the
        # live SQLite connection objects instead.
        gc.collect()
        return sum(isinstance(obj, sqlite3.Connection) for obj in gc.get_objects())
    if pgbouncer.ENABLED:  # the pooler keeps its server sessions: count its clients
        return pgbouncer.clients(str(connection.settings_dict["NAME"]))
    query = {
        "postgresql": "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()",
        "mysql": "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE()",
    }[connection.vendor]
    with connection.cursor() as cursor:
        cursor.execute(query)
        return int(cursor.fetchone()[0])


def test_own_connections_close_with_their_threads() -> None:
    connection.ensure_connection()
    locks.connection.close()
    gc.collect()
    before = _server_sessions()

    def work(i: int) -> None:
        with locks.lock(f"thread:{i}"):
            pass

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert locks.connection.open_count() == 0
    # The server ends a session a moment after its client hangs up.
    deadline = time.monotonic() + 10
    while _server_sessions() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _server_sessions() == before


def test_own_connection_is_closed_at_the_end_of_a_request_like_djangos() -> None:
    response = Client().get("/acquire-and-release/", {"name": "orders:1"})
    assert response.status_code == 200
    # CONN_MAX_AGE is 0 in the test settings: Django closes its connection after each
    # request, and the app's own connection of this thread goes with it.
    assert locks.connection.open_count() == 0


@override_settings(LOCKS={"DATABASE": "other"})
def test_locks_database_setting_moves_the_lock_table() -> None:
    with locks.lock("orders:1") as lease:
        assert lease.using == "other"
        assert Lock.objects.using("other").filter(name="orders:1").exists()
        assert not Lock.objects.filter(name="orders:1").exists()
