"""The auto-renew watchdog keeps leases alive, notices losses, and never outstays."""

from __future__ import annotations

import gc
import logging
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime, timedelta

import pytest
from django.db import DatabaseError, connections
from django.test import override_settings

import locks
from locks import watchdog
from locks.conf import conf
from locks.models import Lock
from tests import pgbouncer
from tests.conftest import finish, spawn
from tests.faults import hold_write_lock, kill_session
from tests.workers_reliability import SESSION_ID

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])


def wait_for(condition: object, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return True
        time.sleep(0.02)
    return False


def test_auto_renew_keeps_a_lease_alive_past_its_ttl() -> None:
    with locks.lock("orders:1", ttl=0.6, auto_renew=True) as lease:
        time.sleep(2.0)
        assert locks.check_token("orders:1", lease.token)
        assert locks.try_acquire("orders:1", holder="bob") is None
        assert not lease.lost
    assert not locks.is_locked("orders:1")


def test_watchdog_marks_a_broken_lease_lost_and_the_block_raises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="locks")
    with (
        pytest.raises(locks.LockLost, match="orders:1"),
        locks.lock("orders:1", ttl=0.6, auto_renew=True) as lease,
    ):
        locks.break_lock("orders:1")
        assert wait_for(lambda: lease.lost)
    assert any("orders:1" in record.getMessage() for record in caplog.records)


def test_a_lost_lease_does_not_mask_the_blocks_own_exception() -> None:
    with (
        pytest.raises(ValueError, match="own"),
        locks.lock("orders:1", ttl=0.6, auto_renew=True) as lease,
    ):
        locks.break_lock("orders:1")
        assert wait_for(lambda: lease.lost)
        raise ValueError("the block's own error")


def test_a_bad_renew_fraction_set_while_a_lease_is_watched_does_not_stop_the_watchdog(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lease = locks.acquire("orders:1", ttl=0.6, auto_renew=True)
    with override_settings(LOCKS={"RENEW_FRACTION": 2}):
        # The renewal due at 0.2 s succeeds, then reads the bad fraction for the next one.
        assert wait_for(lambda: "RENEW_FRACTION" in caplog.text, 5), caplog.text
    time.sleep(1.0)  # well past the TTL: only renewals can have kept it
    assert (lease.held, lease.lost, locks.is_locked("orders:1")) == (True, False, True)
    lease.release()
    assert not locks.is_locked("orders:1")


def test_watchdog_stops_renewing_after_release() -> None:
    lease = locks.acquire("orders:1", ttl=0.3, auto_renew=True)
    lease.release()
    # Another holder's lease of the same name must simply run out.
    other = locks.acquire("orders:1", ttl=0.5, holder="bob")
    first_expiry = other.expires_at
    time.sleep(0.8)
    assert not locks.is_locked("orders:1")
    assert Lock.objects.get(name="orders:1").expires_at == first_expiry
    assert wait_for(lambda: not watchdog._watchdogs[conf.DATABASE]._queue, 2)


def test_a_release_that_fails_stops_the_renewals_and_the_lease_runs_out(backend: str) -> None:
    if backend == "sqlite" or pgbouncer.ENABLED:
        pytest.skip("a server session of the app's own to end: PostgreSQL and MariaDB")
    lease = locks.acquire("orders:1", ttl=1, auto_renew=True)
    own = locks.connection.get(conf.DATABASE)
    with own.cursor() as cursor:
        cursor.execute(SESSION_ID[own.vendor])
        (session,) = cursor.fetchone()
    kill_session(session)  # the release's statement cannot reach the server
    with pytest.raises(DatabaseError):
        lease.release()
    # The watchdog (on a connection of its own) must not keep it alive: the holder is done.
    assert wait_for(lambda: not locks.is_locked("orders:1"), 5)


def _start_in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    """``call()`` run in a thread of its own, started; the errors it raises kept."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread, errors


def test_a_release_that_races_a_due_renewal_stops_no_other_renewals() -> None:
    other = locks.acquire("orders:2", ttl=3, auto_renew=True)  # renewed every second
    lease = locks.acquire("orders:1", ttl=1.5, auto_renew=True)  # every 0.5 s
    # The release waits on the server for 1 s (less than the TTL); meanwhile a renewal
    # falls due and finds the lease still held, busy with the release.
    blocker = hold_write_lock("orders:1", 1.0)
    releasing, errors = _start_in_thread(lease.release)
    blocker.join(10)
    releasing.join(10)
    assert errors == []
    assert not lease.held and not lease.lost
    assert not locks.is_locked("orders:1")
    time.sleep(3.0)  # past the other lease's first expiry: it must have been renewed
    assert locks.check_token("orders:2", other.token)
    assert not other.lost
    other.release()


def test_a_renewal_stuck_on_one_database_does_not_starve_the_leases_on_another() -> None:
    # "other" stands for a second database server that hangs (here: a transaction holds
    # the lock row's write lock); the leases on "default" must go on being renewed.
    stuck = locks.acquire("orders:1", ttl=4.5, using="other", auto_renew=True)  # due at 1.5 s
    # Renewed every 0.4 s: a renewal may come up to 0.8 s late (a busy machine) and find
    # the lease still held; one held up behind the stuck one would find it expired at 2.7 s.
    lease = locks.acquire("orders:2", ttl=1.2, auto_renew=True)
    blocker = hold_write_lock("orders:1", 3.5, using="other")
    time.sleep(3.0)  # the stuck renewal waits from about 1.5 s to 3.5 s
    try:
        assert locks.check_token("orders:2", lease.token)
        assert not lease.lost
    finally:
        blocker.join(10)
    assert locks.check_token("orders:1", stuck.token, using="other")
    assert not stuck.lost
    lease.release()
    stuck.release()


def test_a_renewal_that_waits_for_the_lock_row_gives_the_lease_up_at_its_deadline() -> None:
    # A transaction holds the lock row longer than the lease can last: the renewal due at
    # 1/3 s waits for it. The lease is surely ours only until about 1 s; the holder must
    # learn it is lost then, not once that transaction ends.
    lease = locks.acquire("orders:1", ttl=1, auto_renew=True)
    blocker = hold_write_lock("orders:1", 4.0)
    try:
        assert wait_for(lambda: lease.lost, 2.0)
        assert not lease.held
    finally:
        blocker.join(10)
    with pytest.raises(locks.LockLost, match="orders:1"):
        lease.renew()


def _assert_renewed_past(lease: locks.Lease, first_expiry: datetime, by: timedelta) -> None:
    """``lease`` is still held, and renewed in the database ``by`` past ``first_expiry``."""
    assert locks.try_acquire(lease.name, holder="bob") is None
    assert locks.check_token(lease.name, lease.token)
    expiry = Lock.objects.get(name=lease.name).expires_at
    assert expiry - first_expiry > by, (first_expiry, expiry)
    assert not lease.lost


def test_a_renewal_that_waits_for_the_lock_row_does_not_hold_up_a_lease_due_sooner(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    if backend == "sqlite":
        pytest.skip("a lock row of its own to hold: SQLite's only lock is the file's")
    caplog.set_level(logging.WARNING, logger="locks")
    stuck = locks.acquire("orders:1", ttl=8, auto_renew=True)  # due at 2.7 s, ours until 8 s
    # Renewed every 0.4 s, so a renewal that comes up to 0.8 s late still finds it held.
    lease = locks.acquire("orders:2", ttl=1.2, auto_renew=True)
    first_expiry = lease.expires_at
    # The renewal of "orders:1" may wait for its row until about 8 s, but "orders:2" falls
    # due again within 0.4 s: it must not wait behind it.
    blocker = hold_write_lock("orders:1", 5.0)
    time.sleep(4.4)
    try:
        _assert_renewed_past(lease, first_expiry, timedelta(seconds=2.4))
        assert stuck.held  # not given up before its own deadline
    finally:
        blocker.join(10)
    # Tried again, "orders:1" is renewed once the row is free (and every 2.7 s after).
    renewed = stuck.expires_at
    assert wait_for(lambda: stuck.expires_at > renewed and not stuck.lost, 4.0)
    assert locks.check_token("orders:1", stuck.token)
    # Its renewals cut short and tried again are the watchdog's doing, not a failure: a row
    # busy for a while, as before, warns of nothing unless the lease is lost.
    assert caplog.records == []
    stuck.release()
    lease.release()


def test_a_holders_own_renewal_that_waits_does_not_hold_up_the_other_leases(
    backend: str,
) -> None:
    if backend == "sqlite":
        pytest.skip("a lock row of its own to hold: SQLite's only lock is the file's")
    stuck = locks.acquire("orders:1", ttl=6, auto_renew=True)  # the watchdog's due at 2 s
    # Renewed every 0.4 s: a renewal may come up to 0.8 s late (a busy machine) and find
    # the lease still held; one held up behind the holder's would find it expired.
    lease = locks.acquire("orders:2", ttl=1.2, auto_renew=True)
    first_expiry = lease.expires_at
    # The holder renews "orders:1" itself while a transaction holds its row: the renewal
    # waits about 4 s, through the watchdog's own renewal of it falling due.
    blocker = hold_write_lock("orders:1", 4.0)
    renewing, errors = _start_in_thread(stuck.renew)
    time.sleep(3.6)
    try:
        # The other lease went on being renewed, in the database, past its first expiry.
        _assert_renewed_past(lease, first_expiry, timedelta(seconds=2))
    finally:
        blocker.join(10)
        renewing.join(10)
    assert errors == []
    assert stuck.held and not stuck.lost
    # The watchdog looks after it again: its next renewal (every 2 s) extends it further.
    renewed = Lock.objects.get(name="orders:1").expires_at
    assert wait_for(lambda: Lock.objects.get(name="orders:1").expires_at > renewed, 4)
    stuck.release()
    lease.release()


def test_a_holders_own_renewal_that_outlasts_the_lease_has_it_reported_lost_at_its_deadline() -> (
    None
):
    # The watchdog cannot renew the lease while its holder's renewal waits for the row: it
    # must not leave the lease shown held past the time it is surely ours.
    lease = locks.acquire("orders:1", ttl=1, auto_renew=True)
    blocker = hold_write_lock("orders:1", 3.0)
    renewing, errors = _start_in_thread(lease.renew)
    try:
        assert wait_for(lambda: lease.lost, 1.8)
        assert renewing.is_alive()  # still waiting
        assert not lease.held
    finally:
        blocker.join(10)
        renewing.join(10)
    assert len(errors) == 1 and isinstance(errors[0], locks.LockLost), errors


def test_a_holders_own_renewal_that_ends_after_the_lease_was_given_up_raises_lock_lost() -> None:
    # Reported lost (its deadline passed while its holder's renewal waited), the lease
    # stays lost: the renewal that then gets through tells its caller so, rather than
    # have it go on with a lease that nothing renews any more.
    lease = locks.acquire("orders:1", ttl=3, auto_renew=True)  # the watchdog's due at 1 s
    lease._local_deadline = time.monotonic() + 0.5  # as if the acquire's answer came late
    blocker = hold_write_lock("orders:1", 2.0)
    renewing, errors = _start_in_thread(lease.renew)
    try:
        assert wait_for(lambda: lease.lost, 1.8)
    finally:
        blocker.join(10)
        renewing.join(10)
    assert len(errors) == 1 and isinstance(errors[0], locks.LockLost), errors
    assert "given up while this renewal waited" in str(errors[0])  # it got through
    assert lease.lost


def test_a_holders_renewal_that_gets_through_as_the_watchdog_gives_up_keeps_the_lease() -> None:
    # The watchdog finds the lease past its deadline, busy with its holder's renewal; that
    # renewal gets through before the watchdog marks the lease lost. The holder was told
    # the lease is renewed, so it must not be marked lost behind its back (with nothing
    # renewing it any more) on the strength of the deadline the renewal has just moved.
    lease = locks.acquire("orders:1", ttl=3, auto_renew=True)  # the watchdog's due at 1 s
    lease._local_deadline = time.monotonic() + 0.5  # as if the acquire's answer came late
    blocker = hold_write_lock("orders:1", 1.5)
    renewing, errors = _start_in_thread(lease.renew)
    mark_lost = lease._mark_lost

    def mark_lost_once_renewed(*args: object, **kwargs: bool) -> bool:
        renewing.join(10)  # the holder's renewal ends first
        return mark_lost(*args, **kwargs)

    lease._mark_lost = mark_lost_once_renewed  # type: ignore[method-assign]
    blocker.join(10)
    renewing.join(10)
    assert errors == []
    time.sleep(0.3)  # the watchdog, past its look at 1 s, has made up its mind
    assert lease.held and not lease.lost
    assert locks.check_token("orders:1", lease.token)
    lease.release()


def test_a_holders_renewal_that_gets_through_as_a_failed_renewal_gives_up_keeps_the_lease(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The watchdog's own renewal fails past the lease's deadline (its row held by another
    # transaction); before the watchdog marks the lease lost, the holder's renewal gets
    # through. The holder was told the lease is renewed: it must stay held, and renewed.
    lease = locks.acquire("orders:1", ttl=2, auto_renew=True)  # the watchdog's due at 0.67 s
    lease._local_deadline = time.monotonic() + 0.3  # as if the acquire's answer came late
    blocker = hold_write_lock("orders:1", 1.0)
    mark_lost = lease._mark_lost
    renewals: list[tuple[threading.Thread, list[BaseException]]] = []

    def mark_lost_once_renewed(*args: object, **kwargs: bool) -> bool:
        blocker.join(10)
        renewing, errors = _start_in_thread(lease.renew)  # the holder's renewal ends first
        renewing.join(10)
        renewals.append((renewing, errors))
        return mark_lost(*args, **kwargs)

    lease._mark_lost = mark_lost_once_renewed  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="locks.watchdog"):
        blocker.join(10)
        assert wait_for(lambda: bool(renewals), 5)
        renewing, errors = renewals[0]
        renewing.join(10)
        assert errors == []
        time.sleep(0.3)  # the watchdog has made up its mind
        assert lease.held and not lease.lost
        # Renewed by the holder until about 3 s from the start; held later only if the
        # watchdog still renews it.
        time.sleep(2.6)
        assert locks.check_token("orders:1", lease.token)
    assert not [r for r in caplog.records if "lost" in r.getMessage()]
    lease.release()


def test_a_lease_watched_while_an_idle_watchdog_ends_is_still_renewed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dog = watchdog.Watchdog()
    dog.IDLE_SECONDS = 0.05
    ending, go_on = threading.Event(), threading.Event()
    next_due = dog._next_due

    def held_up_when_idle() -> weakref.ref[locks.Lease] | None:
        ref = next_due()
        if ref is None:  # the idle thread is ending: keep it alive here a while
            ending.set()
            go_on.wait(10)
        return ref

    monkeypatch.setattr(dog, "_next_due", held_up_when_idle)
    monkeypatch.setitem(watchdog._watchdogs, conf.DATABASE, dog)
    try:
        locks.acquire("orders:1", ttl=0.3, auto_renew=True).release()
        assert ending.wait(5)
        lease = locks.acquire("orders:2", ttl=0.6, auto_renew=True)
        time.sleep(1.2)  # twice its TTL
        assert locks.check_token("orders:2", lease.token)
        lease.release()
    finally:
        go_on.set()


def test_a_dropped_lease_is_not_kept_alive_by_the_watchdog() -> None:
    lease = locks.acquire("orders:1", ttl=0.5, auto_renew=True)
    ref = weakref.ref(lease)
    del lease
    gc.collect()
    assert ref() is None
    time.sleep(0.8)
    assert not locks.is_locked("orders:1")


def test_watchdog_runs_as_a_daemon_thread() -> None:
    with locks.lock("orders:1", ttl=5, auto_renew=True):
        threads = [t for t in threading.enumerate() if t.name == "locks-watchdog"]
        assert threads and all(t.daemon for t in threads)


def test_watchdog_never_keeps_a_process_alive() -> None:
    # The worker takes an auto-renewing lease and returns from main() without releasing.
    events = finish(spawn("auto_renew_exit", "orders:1", 5), timeout=60)
    assert events == [{"event": "acquired"}]


def test_a_lease_lost_to_failing_renewals_raises_lock_lost_when_its_release_fails_too() -> None:
    # From inside the block on, every lock statement on "other" fails (its table is gone,
    # as good as a database that is down): the renewals fail until the lease is surely
    # over, then the release at the end fails too. The block must still raise LockLost:
    # it was not protected to its end.
    other = connections["other"]
    gone = False
    try:
        with (
            pytest.raises(locks.LockLost, match="orders:1") as caught,
            locks.lock("orders:1", ttl=1, using="other", auto_renew=True) as lease,
        ):
            with other.cursor() as cursor:
                cursor.execute("ALTER TABLE locks_lock RENAME TO locks_lock_away")
            gone = True
            assert wait_for(lambda: lease.lost, 5)
    finally:
        if gone:
            with other.cursor() as cursor:
                cursor.execute("ALTER TABLE locks_lock_away RENAME TO locks_lock")
    assert isinstance(caught.value.__cause__, DatabaseError)


class _PausedMarking(locks.Lease):
    """A lease whose state, read by one thread, is read there once the caller lets it go
    on: a release can then end between the watchdog's look at the state and its write."""

    marker: threading.Thread | None = None
    looked = threading.Event()
    go_on = threading.Event()

    @property
    def _state(self) -> str:
        state: str = self.__dict__["_state"]
        if threading.current_thread() is type(self).marker:
            type(self).marker = None
            type(self).looked.set()
            type(self).go_on.wait(10)
        return state

    @_state.setter
    def _state(self, value: str) -> None:
        self.__dict__["_state"] = value


def test_a_release_that_ends_while_the_watchdog_gives_the_lease_up_leaves_it_released() -> None:
    lease = locks.acquire("orders:1", ttl=30)
    lease.__class__ = _PausedMarking
    # The watchdog gives the lease up (its renewals kept failing) and has just seen it held.
    marking = threading.Thread(target=lease._mark_lost)
    _PausedMarking.marker = marking
    _PausedMarking.looked.clear()
    _PausedMarking.go_on.clear()
    marking.start()
    assert _PausedMarking.looked.wait(10)
    releasing = threading.Thread(target=lease.release)
    releasing.start()
    releasing.join(0.5)  # a release that may end now, does
    _PausedMarking.go_on.set()
    marking.join(10)
    releasing.join(10)
    assert not locks.is_locked("orders:1")
    assert (lease.held, lease.lost) == (False, False)
    with pytest.raises(locks.LockError, match="already released"):
        lease.release()


def test_a_renewal_due_as_its_lease_fails_to_release_does_not_extend_the_lease() -> None:
    # The watchdog has found the lease held and still watched; before its renewal runs,
    # the holder's release fails (the database is as good as down). The holder wanted the
    # lease over: it must run out at the end of its TTL, not one renewal later.
    other = connections["other"]
    lease = locks.acquire("orders:1", ttl=30, using="other")
    before = Lock.objects.using("other").get(name="orders:1").expires_at
    assert lease.held and not lease._unwatched  # what the watchdog looks at first
    with other.cursor() as cursor:
        cursor.execute("ALTER TABLE locks_lock RENAME TO locks_lock_away")
    try:
        with pytest.raises(DatabaseError):
            lease.release()
    finally:
        with other.cursor() as cursor:
            cursor.execute("ALTER TABLE locks_lock_away RENAME TO locks_lock")
    watchdog.Watchdog()._renew(lease)  # then the renewal it had decided on
    assert Lock.objects.using("other").get(name="orders:1").expires_at == before
