"""MariaDB: a session of the app's own that has sent a few acquires prepares the pair."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import locks
from locks.backends.mysql import PREPARE_AT, PREPARED_FLAG

pytestmark = pytest.mark.django_db(transaction=True)

Capture = Callable[[], CaptureQueriesContext]


@pytest.fixture(autouse=True)
def mariadb(backend: str) -> Iterator[None]:
    if backend != "mariadb":
        pytest.skip("SQL-level PREPARE/EXECUTE is how the MariaDB backend prepares")
    locks.connection.close()  # a session of our own opened under the test's settings
    yield
    locks.connection.close()


def _sent(queries: CaptureQueriesContext) -> list[str]:
    """The first two words of each statement sent: what it does and to what."""
    return [" ".join(query["sql"].split()[:2]) for query in queries.captured_queries]


def _pairs(count: int, name: str = "orders:1") -> None:
    for _ in range(count):
        locks.acquire(name).release()


def test_a_session_prepares_the_pair_at_its_fifth_acquire_and_executes_it_from_then_on(
    own_queries: Capture,
) -> None:
    assert PREPARE_AT == 5
    with own_queries() as queries:
        _pairs(PREPARE_AT - 1)
    assert _sent(queries) == ["INSERT INTO", "DELETE FROM"] * (PREPARE_AT - 1)
    with own_queries() as queries:
        _pairs(2)
    assert _sent(queries) == [
        "PREPARE locks_lock_acquire",
        "PREPARE locks_lock_release_last",
        "EXECUTE locks_lock_acquire",
        "EXECUTE locks_lock_release_last",
        "EXECUTE locks_lock_acquire",
        "EXECUTE locks_lock_release_last",
    ]
    # A new session starts counting again.
    locks.connection.close()
    with own_queries() as queries:
        _pairs(1)
    assert _sent(queries) == ["INSERT INTO", "DELETE FROM"]


def test_prepared_statements_read_the_database_clock_at_each_execution() -> None:
    _pairs(PREPARE_AT)
    first = locks.acquire("orders:1", ttl=30)
    first.release()
    time.sleep(0.01)
    second = locks.acquire("orders:1", ttl=30)
    # Prepared once, the statement still takes the time of each execution, not of PREPARE.
    assert second.acquired_at > first.acquired_at
    assert second.expires_at > first.expires_at
    assert second.token > first.token
    second.release()


def test_prepared_statements_keep_the_owner_check(own_queries: Capture) -> None:
    _pairs(PREPARE_AT)
    lease = locks.acquire("orders:1")
    with own_queries() as queries:
        assert locks.try_acquire("orders:1", holder="bob") is None
        assert lease.held
        lease.release()
    assert _sent(queries) == ["EXECUTE locks_lock_acquire", "EXECUTE locks_lock_release_last"]
    assert not locks.is_locked("orders:1")
    assert not lease.held


@override_settings(LOCKS={"PREPARED_STATEMENTS": False})
def test_with_prepared_statements_off_the_pair_is_sent_as_text(own_queries: Capture) -> None:
    with own_queries() as queries:
        _pairs(PREPARE_AT + 1)
    assert _sent(queries) == ["INSERT INTO", "DELETE FROM"] * (PREPARE_AT + 1)


@pytest.fixture
def no_prepared_statements() -> Iterator[None]:
    """The server takes no more prepared statements (as when max_prepared_stmt_count is
    reached); other sessions preparing meanwhile only fall back to text."""
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT @@GLOBAL.max_prepared_stmt_count")
        (before,) = cursor.fetchone()
        cursor.execute("SET GLOBAL max_prepared_stmt_count = 0")
        try:
            yield
        finally:
            cursor.execute("SET GLOBAL max_prepared_stmt_count = %s", [before])


def test_a_session_that_could_not_prepare_sends_the_pair_as_text(
    own_queries: Capture, no_prepared_statements: None
) -> None:
    with own_queries() as queries:
        _pairs(PREPARE_AT + 1)
        lease = locks.acquire("orders:1")
        assert locks.try_acquire("orders:1", holder="bob") is None
        lease.release()
    sent = _sent(queries)
    # One try, at the fifth acquire, which Django logs under the text of the statement
    # before it (on MySQL it reports the last statement the driver ran); the rest as text.
    attempt = 2 * (PREPARE_AT - 1)
    assert sent[:attempt] + sent[attempt + 1 :] == ["INSERT INTO", "DELETE FROM"] * (
        PREPARE_AT + 1
    ) + ["INSERT INTO", "INSERT INTO", "DELETE FROM"]
    # It gave up for this session, rather than try again at every acquire.
    assert getattr(locks.connection.get("default").connection, PREPARED_FLAG) is None
    assert not locks.is_locked("orders:1")


def _reset_server_session() -> None:
    """Reset the server session under this thread's own connection, as a proxy or pooler
    does (COM_CHANGE_USER): the driver's connection is the same, its prepared statements
    are gone."""
    own = locks.connection.get("default")
    settings = own.settings_dict
    own.connection.change_user(settings["USER"], settings["PASSWORD"], settings["NAME"])


def test_a_session_that_lost_its_prepared_pair_sends_the_text_instead_of_failing(
    own_queries: Capture,
) -> None:
    _pairs(PREPARE_AT)
    lease = locks.acquire("orders:1")  # by EXECUTE
    _reset_server_session()
    with own_queries() as queries:
        lease.release()
        again = locks.acquire("orders:1")
        assert locks.try_acquire("orders:1", holder="bob") is None
        again.release()
    # The first statement, the EXECUTE that found the statement gone (Django logs a failed
    # one under whatever the driver ran before it); the session sends the text from then
    # on, and does not prepare again.
    sent = _sent(queries)
    assert sent[1:] == ["DELETE FROM", "INSERT INTO", "INSERT INTO", "DELETE FROM"], sent
    assert getattr(locks.connection.get("default").connection, PREPARED_FLAG) is None
    assert not locks.is_locked("orders:1")


def test_an_acquire_on_a_session_that_lost_its_prepared_pair_is_granted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    _pairs(PREPARE_AT)
    _reset_server_session()
    lease = locks.acquire("orders:1")
    assert lease.count == 1
    assert locks.acquire("orders:1", holder=lease.holder).count == 2
    lease.release(entirely=True)
    assert not locks.is_locked("orders:1")
    assert "PREPARED_STATEMENTS" in caplog.text
