"""Transient database errors are retried inside an attempt, bounded; others surface."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.db import DatabaseError, OperationalError, connection, connections
from django.test import override_settings

import locks
from locks.backends import for_connection
from locks.conf import conf
from locks.leases import _execute
from locks.models import Lock
from tests.faults import hold_table_lock, hold_write_lock

pytestmark = pytest.mark.django_db(transaction=True)


def short_lock_waits(backend: str) -> None:
    """Make the app's own connection give up waiting for a lock after half a second."""
    own = locks.connection.get(conf.DATABASE)
    own.ensure_connection()
    with own.cursor() as cursor:
        if backend == "sqlite":
            cursor.execute("PRAGMA busy_timeout = 500")
        elif backend == "mariadb":
            cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")


def test_busy_and_lock_wait_timeouts_are_retried_until_the_write_goes_through(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    if backend == "postgresql":
        pytest.skip("PostgreSQL lock statements wait for row locks without a timeout")
    expired = locks.acquire("x", ttl=0.05, holder="old")
    time.sleep(0.1)
    short_lock_waits(backend)
    caplog.set_level(logging.DEBUG, logger="locks")
    thread = hold_write_lock("x", 2.5)
    lease = locks.acquire("x", timeout=0, holder="new")
    thread.join()
    assert lease.token > expired.token
    assert any("transient error, retrying" in r.getMessage() for r in caplog.records)


@override_settings(LOCKS={"TRANSIENT_RETRIES": 1, "BACKOFF_MIN": 0.01, "BACKOFF_MAX": 0.02})
def test_retries_are_bounded_and_the_error_names_the_lock(backend: str) -> None:
    if backend == "postgresql":
        pytest.skip("PostgreSQL lock statements wait for row locks without a timeout")
    locks.acquire("x", ttl=0.05, holder="old")
    time.sleep(0.1)
    short_lock_waits(backend)
    thread = hold_write_lock("x", 6)
    with pytest.raises(OperationalError) as raised:
        locks.acquire("x", timeout=0, holder="new")
    thread.join()
    assert "while trying to acquire lock 'x'" in "".join(raised.value.__notes__)
    assert Lock.objects.get(name="x").holder == "old"


def a_real_transient_error(backend: str) -> DatabaseError:
    """A transient error from the server under test: a real deadlock between two sessions
    (PostgreSQL 40P01, MariaDB 1213); on SQLite, which has one writer at a time and cannot
    deadlock, a write refused because another connection holds the file."""
    if backend == "sqlite":
        holding = hold_table_lock(10.0)
        try:
            with connections.create_connection("default").cursor() as c:
                c.execute("PRAGMA busy_timeout = 0")
                with pytest.raises(DatabaseError) as busy:
                    c.execute("UPDATE locks_lock SET note = note")
        finally:
            holding.end()
            holding.join()
        return busy.value
    first, second = connection, connections.create_connection("default")
    try:
        with first.cursor() as c:
            c.execute("DROP TABLE IF EXISTS dl")
            c.execute("CREATE TABLE dl (id int primary key)")
            c.execute("INSERT INTO dl VALUES (1), (2)")
        error: list[DatabaseError] = []

        # Two explicit transactions lock rows in opposite order.
        first.set_autocommit(False)
        second.set_autocommit(False)
        with first.cursor() as c:
            c.execute("UPDATE dl SET id = id WHERE id = 1")
        with second.cursor() as c:
            c.execute("UPDATE dl SET id = id WHERE id = 2")

        def second_waits() -> None:
            try:
                with second.cursor() as c:
                    c.execute("UPDATE dl SET id = id WHERE id = 1")
            except DatabaseError as exc:
                error.append(exc)

        second.inc_thread_sharing()
        waiting = threading.Thread(target=second_waits)
        waiting.start()
        time.sleep(0.3)
        try:
            with first.cursor() as c:
                c.execute("UPDATE dl SET id = id WHERE id = 2")
        except DatabaseError as exc:
            error.append(exc)
        waiting.join()
        assert len(error) == 1, error
        assert "deadlock" in str(error[0]).lower(), error
        return error[0]
    finally:
        for conn in (first, second):
            conn.rollback()
            conn.set_autocommit(True)
        second.dec_thread_sharing()
        second.close()
        with first.cursor() as c:
            c.execute("DROP TABLE dl")


def test_transient_errors_are_told_apart_from_others(backend: str) -> None:
    """Real errors from the server under test: a deadlock or busy file, and a typo."""
    backend_sql = for_connection(connection)
    with pytest.raises(DatabaseError) as typo, connection.cursor() as cursor:
        cursor.execute("SELEKT 1")
    assert not backend_sql.is_transient(typo.value)
    assert backend_sql.is_transient(a_real_transient_error(backend))


@override_settings(LOCKS={"TRANSIENT_RETRIES": 3, "BACKOFF_MIN": 4, "BACKOFF_MAX": 4})
def test_a_retry_with_a_deadline_does_not_sleep_past_it(backend: str) -> None:
    # A watchdog renewal has until the next lease falls due: a transient error early in
    # it is tried again by then, however long the backoff would be (2 to 4 s here).
    error = a_real_transient_error(backend)
    tries: list[float] = []

    def operation(backend_sql: object, cursor: object) -> str:
        tries.append(time.monotonic())
        if len(tries) == 1:
            raise error
        return "renewed"

    started = time.monotonic()
    assert _execute(conf.DATABASE, "renew", "x", operation, deadline=started + 0.3) == "renewed"
    assert len(tries) == 2
    assert tries[1] - started < 1.5, tries[1] - started
    # Past the deadline, the error is not tried again.
    tries.clear()
    with pytest.raises(DatabaseError):
        _execute(conf.DATABASE, "renew", "x", operation, deadline=time.monotonic() - 0.1)
    assert len(tries) == 1
