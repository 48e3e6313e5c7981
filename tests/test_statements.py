"""Round trips per operation on the app's own connection (the performance contract)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.test.utils import CaptureQueriesContext

import locks

pytestmark = pytest.mark.django_db(transaction=True)

# PostgreSQL and SQLite decide every operation in one statement; MariaDB needs a second
# one to read back a renewed expiry (it has no UPDATE ... RETURNING).
RENEW_STATEMENTS = {"sqlite": 1, "postgresql": 1, "mariadb": 2}

Capture = Callable[[], CaptureQueriesContext]


def test_uncontended_acquire_is_one_statement(own_queries: Capture) -> None:
    with own_queries() as queries:
        lease = locks.acquire("orders:1")
    assert len(queries) == 1, queries.captured_queries
    lease.release()


def test_release_is_one_statement(own_queries: Capture) -> None:
    lease = locks.acquire("orders:1")
    with own_queries() as queries:
        lease.release()
    assert len(queries) == 1, queries.captured_queries


def test_failed_try_is_one_statement(own_queries: Capture) -> None:
    locks.acquire("orders:1", holder="alice")
    with own_queries() as queries:
        assert locks.try_acquire("orders:1", holder="bob") is None
    assert len(queries) == 1, queries.captured_queries


def test_reentry_and_its_release_are_one_statement_each(own_queries: Capture) -> None:
    outer = locks.acquire("orders:1")
    with own_queries() as queries:
        inner = locks.acquire("orders:1")
        inner.release()
    assert len(queries) == 2, queries.captured_queries
    outer.release()


def test_renew_statements(own_queries: Capture, backend: str) -> None:
    lease = locks.acquire("orders:1")
    with own_queries() as queries:
        lease.renew()
    assert len(queries) == RENEW_STATEMENTS[backend], queries.captured_queries


def test_reads_and_break_are_one_statement_each(own_queries: Capture) -> None:
    lease = locks.acquire("orders:1")
    with own_queries() as queries:
        locks.is_locked("orders:1")
        locks.check_token("orders:1", lease.token)
        locks.break_lock("orders:1")
    assert len(queries) == 3, queries.captured_queries


def test_lock_statements_never_touch_the_callers_connection() -> None:
    from django.db import connection

    with CaptureQueriesContext(connection) as queries:
        with locks.lock("orders:1") as lease:
            lease.renew()
        locks.is_locked("orders:1")
    assert queries.captured_queries == []


def test_statements_skip_djangos_cursor_unless_someone_watches(own_queries: Capture) -> None:
    from django.db.backends.utils import CursorWrapper

    from locks.conf import conf

    wrapper = locks.connection.get(conf.DATABASE)
    locks.acquire("orders:1").release()
    assert isinstance(locks.connection.cursor(wrapper), locks.connection.DirectCursor)

    seen: list[str] = []

    def hook(execute: Callable[..., object], sql: str, *args: object) -> object:
        seen.append(sql)
        return execute(sql, *args)

    with wrapper.execute_wrapper(hook):
        assert isinstance(locks.connection.cursor(wrapper), CursorWrapper)
        locks.acquire("orders:1").release()
    assert len(seen) == 2, seen
    with own_queries() as queries:
        locks.acquire("orders:1").release()
    assert len(queries) == 2, queries.captured_queries
    locks.acquire("orders:1").release()
    assert len(seen) == 2 and len(queries) == 2  # nobody watches: nothing recorded
    assert isinstance(locks.connection.cursor(wrapper), locks.connection.DirectCursor)


def test_the_direct_cursor_raises_djangos_errors() -> None:
    from django.db import DatabaseError

    from locks.conf import conf

    wrapper = locks.connection.get(conf.DATABASE)
    cursor = locks.connection.cursor(wrapper)
    assert isinstance(cursor, locks.connection.DirectCursor)
    with pytest.raises(DatabaseError) as caught:
        cursor.execute("SELECT no_such_column FROM locks_lock", [])
    assert isinstance(caught.value.__cause__, wrapper.Database.Error)  # type: ignore[attr-defined]
    # Django's rule: the connection is checked before it is reused.
    assert wrapper.errors_occurred
    cursor.execute("SELECT 1", [])
    assert cursor.fetchone()[0] == 1


def test_a_hook_installed_when_django_opens_the_connection_sees_lock_statements() -> None:
    from django.db.backends.signals import connection_created

    seen: list[str] = []

    def hook(execute: Callable[..., object], sql: str, *args: object) -> object:
        seen.append(sql)
        return execute(sql, *args)

    def install(sender: object, connection: Any, **kwargs: object) -> None:
        connection.execute_wrappers.append(hook)

    locks.connection.close()  # the next lock call opens a new connection of its own
    connection_created.connect(install)
    try:
        locks.acquire("orders:1").release()
    finally:
        connection_created.disconnect(install)
        locks.connection.close()
    assert sum("locks_lock" in sql for sql in seen) == 2, seen
