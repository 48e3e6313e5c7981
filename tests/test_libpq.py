"""PostgreSQL: the app's own sessions send the hot lock statements prepared through libpq."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError
from django.test.utils import CaptureQueriesContext

import locks
from locks.backends import postgresql
from locks.backends.libpq import PreparedCursor, Unsendable, _text, plan
from locks.models import Lock
from tests.faults import hold_write_lock

Capture = Callable[[], CaptureQueriesContext]


@pytest.fixture
def postgresql_session(backend: str) -> Iterator[None]:
    if backend != "postgresql":
        pytest.skip("psycopg's libpq layer is PostgreSQL's")
    from tests import pgbouncer

    if pgbouncer.ENABLED:
        pytest.skip("off behind a transaction pooler, as psycopg's own prepares are")
    locks.connection.close()  # a session of our own opened under the test's settings
    yield
    locks.connection.close()


def _raw() -> Any:
    return locks.connection.get("default").connection


def _prepared() -> list[str]:
    """The statements the app's own session prepared through libpq, as names of HOT."""
    by_name = {found.name.decode(): sql for sql, found in postgresql.HOT.items()}
    rows = _raw().execute(
        "SELECT name FROM pg_prepared_statements WHERE name LIKE 'locks_hot_%'", prepare=False
    )
    names = {
        postgresql.ACQUIRE: "acquire",
        postgresql.ACQUIRE_YIELDING: "acquire_yielding",
        postgresql.RENEW: "renew",
        postgresql.RELEASE_LAST: "release_last",
        postgresql.RELEASE_REENTRY: "release_reentry",
    }
    return sorted(names.get(by_name[name], name) for (name,) in rows)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("postgresql_session")
def test_acquire_renew_and_release_go_through_libpq_each_prepared_once() -> None:
    for _ in range(3):
        lease = locks.acquire("orders:1", ttl=30)  # a blocking acquire's first try
        inner = locks.try_acquire("orders:1")
        assert inner is not None
        lease.renew()
        inner.release()
        lease.release()
    assert _prepared() == [
        "acquire", "acquire_yielding", "release_last", "release_reentry", "renew",
    ]  # fmt: skip
    # psycopg's cursor, which would have prepared them under names of its own, sent none.
    by_psycopg = _raw().execute(
        "SELECT statement FROM pg_prepared_statements WHERE name NOT LIKE 'locks_hot_%'",
        prepare=False,
    )
    assert not [text for (text,) in by_psycopg if "locks_lock" in text]
    own = locks.connection.get("default")
    assert isinstance(locks.connection.cursor(own)._cursor, PreparedCursor)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("postgresql_session")
def test_what_comes_back_through_libpq_is_what_the_table_holds() -> None:
    lease = locks.acquire("orders:ü 1", ttl=12.5, note="nöte")
    held = Lock.objects.get(name="orders:ü 1")
    assert (lease.token, lease.count, lease.acquired_at, lease.expires_at) == (
        held.token, 1, held.acquired_at, held.expires_at,
    )  # fmt: skip
    assert held.expires_at - held.acquired_at == timedelta(seconds=12.5)
    assert (held.holder, held.note) == (lease.holder, "nöte")
    again = locks.acquire("orders:ü 1")
    assert (again.token, again.count) == (lease.token, 2)
    lease.renew(60)
    assert lease.expires_at == Lock.objects.get(name="orders:ü 1").expires_at
    assert lease.expires_at - held.expires_at > timedelta(seconds=40)
    again.release()
    assert Lock.objects.get(name="orders:ü 1").count == 1
    lease.release()
    assert not Lock.objects.filter(name="orders:ü 1").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("postgresql_session")
def test_a_session_whose_prepared_statements_were_dropped_prepares_them_again() -> None:
    locks.try_acquire("orders:1").release()  # type: ignore[union-attr]
    _raw().execute("DEALLOCATE ALL", prepare=False)
    assert _prepared() == []
    lease = locks.try_acquire("orders:1")
    assert lease is not None
    assert Lock.objects.get(name="orders:1").token == lease.token
    lease.release()
    assert _prepared() == ["acquire", "release_last"]
    assert not locks.is_locked("orders:1")


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("postgresql_session")
def test_a_new_cursor_on_the_same_session_uses_what_the_session_prepared(
    own_queries: Capture,
) -> None:
    locks.try_acquire("orders:1").release()  # type: ignore[union-attr]
    pid = _raw().info.backend_pid
    with own_queries() as queries:  # Django's own cursor, which records the statements
        locks.try_acquire("orders:2").release()  # type: ignore[union-attr]
    assert len(queries) == 2
    # Then a new cursor of the app's own, on the same session, whose statements exist.
    locks.try_acquire("orders:3").release()  # type: ignore[union-attr]
    assert _raw().info.backend_pid == pid
    assert _prepared() == ["acquire", "release_last"]
    assert not Lock.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("postgresql_session")
def test_an_error_in_a_hot_statement_comes_out_as_djangos_and_the_session_goes_on() -> None:
    other = locks.acquire("orders:1", ttl=60, holder="other")
    _raw().execute("SET statement_timeout = '200ms'", prepare=False)
    blocker = hold_write_lock("orders:1", 2.0)
    with pytest.raises(OperationalError) as caught:
        locks.try_acquire("orders:1", ttl=30)
    blocker.join()
    assert getattr(caught.value.__cause__, "sqlstate", None) == "57014"  # query_canceled
    assert "while trying to acquire lock 'orders:1'" in "".join(caught.value.__notes__)
    held = Lock.objects.get(name="orders:1")
    assert (held.holder, held.token, held.count) == ("other", other.token, 1)
    lease = locks.try_acquire("orders:2", ttl=30)
    assert lease is not None
    lease.release()


@pytest.mark.parametrize(
    ("sql", "keys", "converted"),
    [
        ("SELECT %s, %s", 2, "SELECT $1, $2"),
        ("SELECT %(a)s, %(b)s, %(a)s", ("a", "b"), "SELECT $1, $2, $1"),
    ],
)
def test_a_plan_numbers_the_placeholders(sql: str, keys: object, converted: str) -> None:
    found = plan(sql, "locks_hot_x")
    assert (found.name, found.sql, found.keys) == (b"locks_hot_x", converted.encode(), keys)


@pytest.mark.parametrize("sql", ["SELECT %s, %(a)s", "SELECT 100 %% 7, %s"])
def test_a_statement_a_plan_cannot_number_is_refused(sql: str) -> None:
    with pytest.raises(ValueError, match="not a statement for a prepared plan"):
        plan(sql, "locks_hot_x")


def test_parameters_are_sent_in_postgresqls_text_form() -> None:
    assert [
        _text(value, "utf-8")
        for value in ("ö", None, True, False, 17, timedelta(seconds=1.5, days=1))
    ] == [b"\xc3\xb6", None, b"t", b"f", b"17", b"86401500000 microseconds"]
    # Left to psycopg's cursor, which refuses a NUL with its own clear error.
    for value in ("a\x00b", 1.5, object()):
        with pytest.raises(Unsendable):
            _text(value, "utf-8")
