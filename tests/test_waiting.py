"""How blocked acquires wake: release notifications on PostgreSQL, bounded backoff anywhere."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest
from django.db import connections, transaction
from django.test import override_settings

import locks
from locks import waiting
from locks.models import Lock
from tests import pgbouncer
from tests.app.models import Counter
from tests.conftest import NEEDS_POOL
from tests.faults import hold_write_lock

pytestmark = pytest.mark.django_db(transaction=True)

# Backoff so slow that only a notification can explain a prompt wake-up.
SLOW_POLLING = {"BACKOFF_MIN": 10.0, "BACKOFF_MAX": 10.0}


def waiter(name: str, results: list[float], **kwargs: object) -> threading.Thread:
    def run() -> None:
        lease = locks.acquire(name, timeout=30, holder="waiter", **kwargs)  # type: ignore[arg-type]
        results.append(time.monotonic())
        lease.release()
        locks.connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


# Behind PgBouncer (transaction pooling) waiters still get the lock, by backoff and expiry.
needs_notifications = pytest.mark.skipif(
    pgbouncer.ENABLED, reason="LISTEN does not survive PgBouncer's transaction pooling"
)


@pytest.fixture
def listening(backend: str) -> Iterator[None]:
    if backend != "postgresql":
        pytest.skip("release notifications are PostgreSQL's LISTEN/NOTIFY")
    if pgbouncer.ENABLED:
        # Switched off by the pooled alias (test_notify_is_off_behind_a_transaction_pooler).
        pytest.skip("LISTEN does not survive PgBouncer's transaction pooling")
    yield


def assert_a_release_wakes_a_blocked_acquire_at_once(using: str = "default") -> None:
    lease = locks.acquire("orders:1", holder="first", using=using)
    results: list[float] = []
    thread = waiter("orders:1", results, using=using)
    deadline = time.monotonic() + 10
    while not Lock.objects.filter(name="orders:1", waiting=True).exists():
        assert time.monotonic() < deadline, "the waiter never flagged the row"
        time.sleep(0.01)
    released = time.monotonic()
    lease.release()
    thread.join()
    # Polling alone would have slept 10 s.
    assert results and results[0] - released < 3


@needs_notifications
@pytest.mark.usefixtures("listening")
@override_settings(LOCKS=SLOW_POLLING)
def test_a_release_wakes_a_blocked_acquire_at_once() -> None:
    assert_a_release_wakes_a_blocked_acquire_at_once()


@needs_notifications
@pytest.mark.usefixtures("listening")
@pytest.mark.django_db(transaction=True, databases=["default", "manual"])
@override_settings(LOCKS=SLOW_POLLING)
def test_a_release_wakes_a_blocked_acquire_on_an_alias_without_autocommit() -> None:
    # The listener's LISTEN takes effect at once, not at a commit that never comes.
    assert_a_release_wakes_a_blocked_acquire_at_once(using="manual")


@needs_notifications
@NEEDS_POOL
@pytest.mark.django_db(transaction=True, databases=["default", "pooled"])
@override_settings(LOCKS=SLOW_POLLING)
def test_a_release_wakes_a_blocked_acquire_while_the_orm_holds_the_pools_only_connection(
    pooled: str,
) -> None:
    # The listener has a connection of its own, not one it would wait for in the pool.
    with transaction.atomic(using=pooled):
        Counter.objects.using(pooled).create(name="holds-the-slot")
        assert_a_release_wakes_a_blocked_acquire_at_once(using=pooled)


@pytest.mark.usefixtures("listening")
@override_settings(LOCKS=SLOW_POLLING)
def test_a_waiter_wakes_when_the_holders_lease_expires() -> None:
    locks.acquire("orders:1", holder="crashed", ttl=1.0)  # never released
    results: list[float] = []
    started = time.monotonic()
    waiter("orders:1", results).join()
    assert results and results[0] - started < 5


@pytest.mark.usefixtures("listening")
def test_a_listener_that_cannot_connect_delays_no_waiter_past_its_timeout_and_then_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    locks.acquire("orders:1", holder="first")
    # New connections (the listener's) go to a port where nothing listens; this thread's
    # own lock connection is open already and goes on working.
    monkeypatch.setitem(connections.settings["default"], "PORT", "1")
    monkeypatch.setattr(waiting, "IDLE_SECONDS", 0.2)
    started = time.monotonic()
    with pytest.raises(locks.LockBusy):
        locks.acquire("orders:1", holder="second", timeout=0.1)
    # Not the second a waiter gives a listener that is connecting.
    assert time.monotonic() - started < 0.8
    # With nobody waiting any more, the listener stops retrying and its thread ends.
    deadline = time.monotonic() + 5
    while any(t.name.startswith("locks-listener") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the listener kept retrying with no waiter"
        time.sleep(0.05)


class Interrupted(Exception):
    """What a signal handler raises in the middle of a call (as a soft time limit does)."""


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted


@pytest.mark.usefixtures("listening")
def test_a_waiter_interrupted_while_the_listener_connects_leaves_no_subscription(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    locks.acquire("orders:1", holder="first")
    # The listener cannot connect (as in the test above), so a new waiter waits up to
    # LISTEN_WAIT_SECONDS for it: a soft time limit, say, strikes during that wait.
    monkeypatch.setitem(connections.settings["default"], "PORT", "1")
    monkeypatch.setattr(waiting, "IDLE_SECONDS", 0.2)
    wait_listening = waiting.Listener.wait_listening
    struck: list[bool] = []

    def armed(self: waiting.Listener, timeout: float) -> None:
        # Armed in this wait (up to a second), not before the acquire: however long its
        # first attempt took, the alarm strikes here.
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        try:
            wait_listening(self, timeout)
        except Interrupted:
            struck.append(True)
            raise

    monkeypatch.setattr(waiting.Listener, "wait_listening", armed)
    previous = signal.signal(signal.SIGALRM, _raise_interrupted)
    try:
        with pytest.raises(Interrupted):
            locks.acquire("orders:1", holder="second", timeout=30)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert struck, "the alarm struck while the waiter waited for the listener"
    # Nobody waits any more: nothing keeps the listener (its thread, its connection).
    assert not waiting.listener("default")._waiters
    deadline = time.monotonic() + 5
    while any(t.name.startswith("locks-listener") for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the interrupted waiter kept the listener"
        time.sleep(0.05)


@pytest.mark.usefixtures("listening")
@override_settings(LOCKS=SLOW_POLLING)
def test_one_listener_serves_every_waiter_of_the_process() -> None:
    held = [locks.acquire(f"orders:{i}", holder="first") for i in range(3)]
    results: list[float] = []
    threads = [waiter(f"orders:{i}", results) for i in range(3)]
    deadline = time.monotonic() + 10
    while Lock.objects.filter(waiting=True).count() < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    listeners = [t for t in threading.enumerate() if t.name.startswith("locks-listener")]
    assert len(listeners) == 1
    for lease in held:
        lease.release()
    for thread in threads:
        thread.join()
    assert len(results) == 3


@needs_notifications
@pytest.mark.usefixtures("listening")
def test_only_releases_a_waiter_asked_for_send_a_notification() -> None:
    from django.db import connections

    from locks.backends import for_connection

    listening = connections.create_connection("default")
    listening.ensure_connection()
    backend = for_connection(listening)
    backend.listen(listening.connection)
    try:
        locks.acquire("orders:1").release()
        with locks.lock("orders:2"):
            pass
        locks.acquire("orders:3")
        locks.break_lock("orders:3")
        assert list(backend.notifications(listening.connection, 0.5)) == []

        # A waiter at the head of the queue flags the row when its attempt is refused.
        lease = locks.acquire("orders:1")
        with locks.connection.get("default").cursor() as cursor:
            left = backend.acquire_as_head(cursor, "orders:1", "waiter", 30, "")
        assert isinstance(left, float) and 0 < left <= 60
        lease.release()
        flagged = locks.acquire("orders:3")
        with locks.connection.get("default").cursor() as cursor:
            backend.acquire_as_head(cursor, "orders:3", "waiter", 30, "")
        assert locks.break_lock("orders:3")
        assert list(backend.notifications(listening.connection, 0.5)) == ["orders:1", "orders:3"]
        assert flagged.token
    finally:
        listening.close()


def test_the_first_attempt_counts_against_the_timeout() -> None:
    # The first attempt waits 1 s for another connection's write lock on the row (on
    # SQLite, on the file), then finds the lock held: a 1 s timeout has run out by then.
    lease = locks.acquire("orders:1", ttl=60, holder="holder")
    blocker = hold_write_lock("orders:1", 1.0)
    began = time.monotonic()
    try:
        with pytest.raises(locks.LockBusy, match="gave up after 1 s"):
            locks.acquire("orders:1", ttl=60, timeout=1.0, holder="waiter")
        took = time.monotonic() - began
    finally:
        blocker.join()
    # Counting from after the first attempt instead would take at least 2 s.
    assert took < 1.7, took
    assert Lock.objects.get(name="orders:1").holder == "holder"
    lease.release()


@override_settings(LOCKS={"NOTIFY": False, "BACKOFF_MIN": 0.01, "BACKOFF_MAX": 0.05})
def test_without_notifications_waiters_poll_with_backoff() -> None:
    lease = locks.acquire("orders:1", holder="first")
    results: list[float] = []
    thread = waiter("orders:1", results)
    time.sleep(0.3)
    assert not results
    lease.release()
    thread.join()
    assert len(results) == 1
    assert not [t for t in threading.enumerate() if t.name.startswith("locks-listener")]


@override_settings(LOCKS={"BACKOFF_MIN": 0.002, "BACKOFF_MAX": 0.25})
def test_backoff_grows_by_half_with_jitter_up_to_the_bound() -> None:
    from locks.leases import BACKOFF_GROWTH, _backoff

    for attempt in range(40):
        cap = min(0.25, 0.002 * BACKOFF_GROWTH**attempt)
        pauses = [_backoff(attempt) for _ in range(200)]
        assert all(cap / 2 <= pause <= cap for pause in pauses)
        assert len(set(pauses)) > 1  # jittered: waiters do not retry in lockstep
    assert BACKOFF_GROWTH == 1.5
    assert _backoff(10_000) <= 0.25
