"""PostgreSQL: blocked acquires queue in the server's lock manager, first come first served.

Only the head of a name's queue waits for the release notification, so a release wakes
one waiting process, and a new blocking acquire does not jump the queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import locks
from locks.backends.postgresql import _is_queue_lock, _queue_key
from locks.leases import QUEUE_PATIENCE
from locks.models import Lock
from tests import pgbouncer
from tests.conftest import finish, read_event, spawn

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def queues(backend: str) -> None:
    if backend != "postgresql":
        pytest.skip("the queue of blocked acquires is PostgreSQL's (with LISTEN/NOTIFY)")
    if pgbouncer.ENABLED:
        pytest.skip("session advisory locks do not survive PgBouncer's transaction pooling")


def queue_locks(name: str = "orders:1") -> tuple[int, int]:
    """(granted, waiting) advisory locks on the queue of ``name``, in every session on this
    test database (not those of another test run on the same server)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT count(*) FILTER (WHERE granted), count(*) FILTER (WHERE NOT granted) "
            f"FROM (SELECT {_queue_key('%s')} AS key) AS queue, pg_locks "
            f"WHERE {_is_queue_lock('queue.key')} "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            [name],
        )
        granted, waiting = cursor.fetchone()
    return int(granted), int(waiting)


def wait_for_queue(granted: int, waiting: int) -> None:
    deadline = time.monotonic() + 30
    while queue_locks() != (granted, waiting):
        assert time.monotonic() < deadline, f"queue is {queue_locks()}, not {(granted, waiting)}"
        time.sleep(0.01)


def wait_for_head(name: str) -> None:
    """Until a waiter is the head of the queue for ``name``, the only one in it."""
    # One granted queue lock can also be a first attempt's transaction lock, taken to see
    # an empty queue; the head has entered the queue once it has flagged the row.
    deadline = time.monotonic() + 30
    while not Lock.objects.get(name=name).waiting:
        assert time.monotonic() < deadline, f"no waiter flagged {name}"
        time.sleep(0.01)
    wait_for_queue(granted=1, waiting=0)


@contextmanager
def queued_for_ever(name: str) -> Iterator[None]:
    """A session that queued for ``name`` and never goes on (a paused waiter, say)."""
    params = connection.get_connection_params()
    with psycopg.connect(
        host=params.get("host"),
        port=params.get("port"),
        user=params.get("user"),
        dbname=params["dbname"],
        autocommit=True,
    ) as stuck:
        stuck.execute(f"SELECT pg_advisory_lock({_queue_key('%s')})", [name], prepare=False)
        yield


@pytest.fixture
def stuck_queue() -> Iterator[None]:
    with queued_for_ever("orders:1"):
        yield


def test_names_whose_32_bit_hashes_collide_do_not_share_a_queue(
    own_queries: Callable[[], CaptureQueriesContext],
) -> None:
    # Among 300,000 names some pairs have the same hashtext(), the 32-bit hash.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT min(name), max(name) FROM (SELECT 'orders:' || i AS name "
            "FROM generate_series(1, 300000) AS i) AS names "
            "GROUP BY hashtext(name) HAVING count(*) > 1 LIMIT 1"
        )
        waited_for, free = cursor.fetchone()
    with queued_for_ever(waited_for):
        assert queue_locks(free) == (0, 0)
        # A blocking acquire of the free one does not yield to the other name's waiter:
        # its first statement takes it.
        with own_queries() as queries:
            lease = locks.acquire(free, timeout=QUEUE_PATIENCE / 2)
        assert len(queries) == 1, [q["sql"] for q in queries]
        lease.release()


def test_waiters_get_the_lock_in_the_order_they_came() -> None:
    held = locks.acquire("orders:1", ttl=60, holder="first")
    workers = [spawn("hold_on_cue", "orders:1", 0.05, stdin=True) for _ in range(3)]
    try:
        for worker in workers:
            assert read_event(worker)["event"] == "ready"
        for position, worker in enumerate(workers):
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
            if position == 0:
                wait_for_head("orders:1")
            else:
                wait_for_queue(granted=1, waiting=position)
        held.release()
        tokens = [next(e["token"] for e in finish(w) if e["event"] == "acquired") for w in workers]
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    assert tokens == sorted(tokens), "the lock went to the waiters out of their order"
    assert tokens[0] > held.token
    assert queue_locks() == (0, 0)


@pytest.mark.usefixtures("stuck_queue")
def test_a_blocking_acquire_does_not_take_a_free_lock_from_a_queued_waiter() -> None:
    with pytest.raises(locks.LockBusy):
        locks.acquire("orders:1", timeout=min(0.5, QUEUE_PATIENCE / 2))
    assert not locks.is_locked("orders:1")


@pytest.mark.usefixtures("stuck_queue")
def test_try_acquire_and_timeout_zero_take_a_free_lock_whoever_waits() -> None:
    lease = locks.try_acquire("orders:1")
    assert lease is not None
    lease.release()
    locks.acquire("orders:1", timeout=0).release()


@pytest.mark.usefixtures("stuck_queue")
def test_the_holder_re_enters_past_the_queue() -> None:
    lease = locks.acquire("orders:1", timeout=0)
    inner = locks.acquire("orders:1", timeout=1)
    assert (inner.token, inner.count) == (lease.token, 2)
    inner.release()
    lease.release()


@pytest.mark.usefixtures("stuck_queue")
def test_a_stuck_queue_delays_a_free_lock_by_the_queue_patience_only() -> None:
    started = time.monotonic()
    lease = locks.acquire("orders:1", timeout=QUEUE_PATIENCE * 5)
    waited = time.monotonic() - started
    lease.release()
    assert QUEUE_PATIENCE * 0.9 <= waited < QUEUE_PATIENCE * 5


def test_a_waiter_that_gives_up_leaves_the_queue() -> None:
    held = locks.acquire("orders:1", holder="first")
    worker = spawn("hold_on_cue", "orders:1", 0, stdin=True)
    try:
        assert read_event(worker)["event"] == "ready"
        assert worker.stdin is not None
        worker.stdin.write("go\n")
        worker.stdin.flush()
        wait_for_head("orders:1")
        with pytest.raises(locks.LockBusy):
            locks.acquire("orders:1", timeout=0.3, holder="second")
        assert queue_locks() == (1, 0)  # the worker's, not ours
        held.release()
        finish(worker)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert queue_locks() == (0, 0)


def test_the_heads_attempt_flags_a_live_foreign_row_and_changes_nothing_else() -> None:
    from locks.backends import Grant, for_connection

    own = locks.connection.get("default")
    backend = for_connection(own)
    lease = locks.acquire("orders:1", ttl=30, holder="first", note="mine")
    before = Lock.objects.values().get(name="orders:1")
    left = backend.acquire_as_head(locks.connection.cursor(own), "orders:1", "second", 99, "x")
    after = Lock.objects.values().get(name="orders:1")
    assert isinstance(left, float) and 0 < left <= 30
    assert after == {**before, "waiting": True}
    # Its own live holding: a re-entry, same token.
    again = backend.acquire_as_head(locks.connection.cursor(own), "orders:1", "first", 30, "")
    assert isinstance(again, Grant) and (again.token, again.count) == (lease.token, 2)
    # An expired one: taken over with a higher token, the flag cleared.
    locks.acquire("orders:2", ttl=0.01, holder="gone")
    time.sleep(0.05)
    taken = backend.acquire_as_head(locks.connection.cursor(own), "orders:2", "third", 30, "")
    assert isinstance(taken, Grant) and taken.count == 1 and taken.token > lease.token
    row = Lock.objects.get(name="orders:2")
    assert (row.holder, row.waiting) == ("third", False)


@pytest.mark.parametrize("queued", [True, False], ids=["head", "async-waiter"])
def test_a_refused_waiter_commits_its_flag_without_waiting_for_the_disk(queued: bool) -> None:
    from django.db import transaction

    from locks.backends import for_connection

    backend = for_connection(connection)
    held = locks.acquire("orders:1", holder="alice")

    def commit_mode_after_attempt(holder: str) -> tuple[str, object]:
        # The statement runs in a transaction of the test's connection, so the setting it
        # leaves for its own commit can still be read; the rollback undoes it all.
        with transaction.atomic(), connection.cursor() as cursor:
            outcome = backend.acquire_as_head(cursor, "orders:1", holder, 30, "", queued=queued)
            cursor.execute("SELECT current_setting('synchronous_commit')")
            mode = str(cursor.fetchone()[0])
            transaction.set_rollback(True)
        return mode, outcome

    mode, outcome = commit_mode_after_attempt("bob")
    assert isinstance(outcome, float) and mode == "off"
    held.release()
    if queued:
        # The head's grant also leaves the queue: the test's session must be in it first.
        with connection.cursor() as cursor:
            assert backend.enter_queue(cursor, "orders:1", 5)
    mode, outcome = commit_mode_after_attempt("bob")
    assert not isinstance(outcome, float) and mode == "on"
    assert queue_locks() == (0, 0)
