"""MariaDB: the acquire and the last release are prepared once per session of the app's own."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from django.db import connections
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import locks

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


def test_the_pair_runs_as_statements_prepared_when_the_session_opened(own_queries: Capture) -> None:
    with own_queries() as queries:
        lease = locks.acquire("orders:1")
        lease.release()
    assert _sent(queries) == ["EXECUTE locks_lock_acquire", "EXECUTE locks_lock_release_last"]


def test_prepared_statements_read_the_database_clock_at_each_execution() -> None:
    first = locks.acquire("orders:1", ttl=30)
    first.release()
    time.sleep(0.01)
    second = locks.acquire("orders:1", ttl=30)
    # Prepared once, the statement still takes the time of each execution, not of PREPARE.
    assert second.acquired_at > first.acquired_at
    assert second.expires_at > first.expires_at
    assert second.token > first.token
    second.release()


@override_settings(LOCKS={"PREPARED_STATEMENTS": False})
def test_with_prepared_statements_off_the_pair_is_sent_as_text(own_queries: Capture) -> None:
    with own_queries() as queries:
        locks.acquire("orders:1").release()
    assert _sent(queries) == ["INSERT INTO", "DELETE FROM"]


def test_a_session_that_could_not_prepare_sends_the_pair_as_text(own_queries: Capture) -> None:
    # PREPARE checks the tables: with the lock table away when our session opens (not yet
    # migrated, say), the session cannot prepare and must still work once the table is there.
    with connections["default"].cursor() as cursor:
        cursor.execute("RENAME TABLE locks_lock TO locks_lock_away")
        try:
            locks.connection.get("default").ensure_connection()
        finally:
            cursor.execute("RENAME TABLE locks_lock_away TO locks_lock")
    with own_queries() as queries:
        lease = locks.acquire("orders:1")
        assert locks.try_acquire("orders:1", holder="bob") is None
        lease.release()
    assert _sent(queries) == ["INSERT INTO", "INSERT INTO", "DELETE FROM"]
    assert not locks.is_locked("orders:1")
