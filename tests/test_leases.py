"""Behaviour of the lease API on the backend under test."""

from __future__ import annotations

import functools
import logging
import os
import platform
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest
from django.db import OperationalError, connections, transaction
from django.test import override_settings
from django.utils import timezone

import locks
from locks.backends import for_connection
from locks.conf import conf
from locks.leases import LockContext, reap_batches
from locks.models import Lock
from tests.conftest import finish, forks_while_threaded, spawn
from tests.faults import hold_table_lock

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])


def row(name: str, using: str = "default") -> Lock | None:
    return Lock.objects.using(using).filter(name=name).first()


def test_acquire_returns_a_lease_matching_its_row() -> None:
    lease = locks.acquire("orders:1", ttl=30, note="shipping")
    stored = row("orders:1")
    assert stored is not None
    assert (stored.holder, stored.token, stored.count) == (lease.holder, lease.token, 1)
    assert stored.note == "shipping"
    assert stored.expires_at == lease.expires_at
    assert stored.acquired_at == lease.acquired_at
    span = (lease.expires_at - lease.acquired_at).total_seconds()
    assert 29.9 < span <= 30.001
    assert lease.count == 1 and lease.held and not lease.lost
    assert lease.using == "default" and lease.ttl == 30


def test_release_deletes_the_row() -> None:
    lease = locks.acquire("orders:1")
    lease.release()
    assert row("orders:1") is None
    assert not lease.held
    assert not locks.is_locked("orders:1")


def test_reentry_keeps_the_token_and_counts_until_the_last_release() -> None:
    outer = locks.acquire("orders:1")
    inner = locks.acquire("orders:1")
    innermost = locks.try_acquire("orders:1")
    assert innermost is not None
    assert outer.token == inner.token == innermost.token
    assert (outer.count, inner.count, innermost.count) == (1, 2, 3)
    innermost.release()
    assert row("orders:1").count == 2  # type: ignore[union-attr]
    inner.release()
    assert locks.is_locked("orders:1")
    outer.release()
    assert row("orders:1") is None


def test_out_of_order_release_of_reentries_still_ends_cleanly() -> None:
    outer = locks.acquire("orders:1")
    inner = locks.acquire("orders:1")
    outer.release()
    assert locks.is_locked("orders:1")
    inner.release()
    assert row("orders:1") is None


def test_try_acquire_returns_none_and_changes_nothing_when_held() -> None:
    first = locks.acquire("orders:1", ttl=30, holder="alice")
    before = row("orders:1")
    assert locks.try_acquire("orders:1", ttl=300, holder="bob", note="x") is None
    after = row("orders:1")
    assert before is not None and after is not None
    assert (after.holder, after.token, after.count, after.expires_at, after.note) == (
        "alice",
        first.token,
        1,
        before.expires_at,
        "",
    )


def test_acquire_with_timeout_zero_gives_up_at_once() -> None:
    locks.acquire("orders:1", holder="alice")
    started = time.monotonic()
    with pytest.raises(locks.LockBusy, match="orders:1"):
        locks.acquire("orders:1", holder="bob", timeout=0)
    assert time.monotonic() - started < 5


def test_acquire_waits_up_to_its_timeout() -> None:
    locks.acquire("orders:1", holder="alice")
    started = time.monotonic()
    with pytest.raises(locks.LockBusy, match=r"gave up after 0\.3 s"):
        locks.acquire("orders:1", holder="bob", timeout=timedelta(seconds=0.3))
    assert time.monotonic() - started >= 0.3


def test_blocking_acquire_gets_the_lock_once_another_thread_releases_it() -> None:
    first = locks.acquire("orders:1")
    released = threading.Event()

    def release_later() -> None:
        time.sleep(0.3)
        first.release()
        released.set()
        connections.close_all()
        locks.connection.close()

    thread = threading.Thread(target=release_later)
    thread.start()
    second = locks.acquire("orders:1", holder="bob", timeout=30)
    assert released.is_set()
    assert second.token > first.token
    thread.join()


def test_takeover_of_an_expired_lease_locks_out_the_old_holder() -> None:
    old = locks.acquire("orders:1", ttl=0.2, holder="alice")
    time.sleep(0.3)
    new = locks.acquire("orders:1", ttl=30, holder="bob", timeout=0)
    assert new.token > old.token and new.count == 1
    with pytest.raises(locks.LockLost, match="orders:1"):
        old.renew()
    with pytest.raises(locks.LockLost, match="orders:1"):
        old.release()
    # The new holder is untouched.
    stored = row("orders:1")
    assert stored is not None and (stored.holder, stored.token) == ("bob", new.token)
    assert locks.check_token("orders:1", new.token)
    new.release()


def test_reacquiring_after_ones_own_expiry_is_a_new_holding() -> None:
    old = locks.acquire("orders:1", ttl=0.2)
    time.sleep(0.3)
    new = locks.acquire("orders:1", ttl=30, timeout=0)
    assert new.holder == old.holder
    assert new.count == 1 and new.token > old.token
    with pytest.raises(locks.LockLost):
        old.release()
    assert locks.check_token("orders:1", new.token)
    new.release()
    assert row("orders:1") is None


def test_renew_extends_the_lease_by_the_database_clock() -> None:
    lease = locks.acquire("orders:1", ttl=0.5)
    first_expiry = lease.expires_at
    lease.renew(ttl=30)
    assert lease.expires_at > first_expiry
    assert row("orders:1").expires_at == lease.expires_at  # type: ignore[union-attr]
    time.sleep(0.6)
    assert locks.is_locked("orders:1")
    lease.renew()  # its own TTL (0.5 s) is shorter than what is left: never shortens
    assert row("orders:1").expires_at == lease.expires_at  # type: ignore[union-attr]
    lease.release()


def test_the_local_deadline_of_a_lease_never_outlasts_its_row(backend: str) -> None:
    # lock_view commits a request's writes without a statement while the local deadline
    # has not passed: it must never be later than the row's expiry. The servers here run
    # on this machine, so their clock is ours (and SQLite's is ours anyway).
    def wall(deadline: float) -> datetime:
        return datetime.now(UTC) + timedelta(seconds=deadline - time.monotonic())

    slack = timedelta(microseconds=100)  # reading the two clocks one after the other
    for i in range(20):
        # A ttl between SQLite's milliseconds: the modifier rounds it down.
        lease = locks.acquire(f"deadline:{i}", ttl=30.0014)
        assert wall(lease._local_deadline) <= lease.expires_at + slack, backend
        lease.renew(ttl=60.0014)
        assert wall(lease._local_deadline) <= lease.expires_at + slack, backend
        lease.release()


def test_renew_after_expiry_raises_lock_lost_even_if_nobody_took_over() -> None:
    lease = locks.acquire("orders:1", ttl=0.2)
    time.sleep(0.3)
    with pytest.raises(locks.LockLost, match="orders:1"):
        lease.renew()
    assert lease.lost


def test_release_after_expiry_raises_lock_lost_and_removes_the_row() -> None:
    lease = locks.acquire("orders:1", ttl=0.2)
    time.sleep(0.3)
    with pytest.raises(locks.LockLost, match="expired before it was released"):
        lease.release()
    assert row("orders:1") is None


@pytest.mark.parametrize("first", ["inner", "outer"])
def test_releases_of_an_expired_reentered_holding_raise_lock_lost_and_remove_the_row(
    first: str,
) -> None:
    outer = locks.acquire("orders:1", ttl=0.2)
    inner = locks.acquire("orders:1", ttl=0.2)
    assert inner.count == 2
    time.sleep(0.3)
    leases = {"outer": outer, "inner": inner}
    earlier = leases.pop(first)
    # Whichever re-entry is released first, the holding had expired: it was not ours to
    # the end, and its row goes (nobody is left to release it).
    with pytest.raises(locks.LockLost, match="expired before it was released"):
        earlier.release()
    assert row("orders:1") is None
    (later,) = leases.values()
    with pytest.raises(locks.LockLost):
        later.release()
    assert row("orders:1") is None


def test_an_old_lease_cannot_renew_its_own_holders_newer_holding() -> None:
    old = locks.acquire("orders:1", ttl=0.2)
    time.sleep(0.3)
    new = locks.acquire("orders:1", ttl=0.5, timeout=0)
    assert new.holder == old.holder and new.token > old.token
    with pytest.raises(locks.LockLost, match="orders:1"):
        old.renew(ttl=60)
    stored = row("orders:1")
    assert stored is not None and (stored.token, stored.expires_at) == (new.token, new.expires_at)
    new.release()


def test_releasing_twice_is_an_error() -> None:
    lease = locks.acquire("orders:1")
    lease.release()
    with pytest.raises(locks.LockError, match="already released"):
        lease.release()
    with pytest.raises(locks.LockError, match="already released"):
        lease.renew()


def test_is_locked_follows_the_database_clock() -> None:
    assert not locks.is_locked("orders:1")
    locks.acquire("orders:1", ttl=0.2)
    assert locks.is_locked("orders:1")
    time.sleep(0.3)
    assert not locks.is_locked("orders:1")
    assert row("orders:1") is not None  # expired, not yet reaped


def test_check_token_is_true_only_for_the_live_holders_token() -> None:
    old = locks.acquire("orders:1", ttl=0.2)
    assert locks.check_token("orders:1", old.token)
    assert not locks.check_token("orders:1", old.token + 1)
    assert not locks.check_token("orders:2", old.token)
    time.sleep(0.3)
    assert not locks.check_token("orders:1", old.token)  # expired
    new = locks.acquire("orders:1", holder="bob")
    assert not locks.check_token("orders:1", old.token)
    assert locks.check_token("orders:1", new.token)


def test_break_lock_frees_the_name_and_the_holder_learns_it() -> None:
    lease = locks.acquire("orders:1", holder="alice")
    assert locks.break_lock("orders:1") is True
    assert locks.break_lock("orders:1") is False
    assert not locks.is_locked("orders:1")
    with pytest.raises(locks.LockLost):
        lease.renew()
    successor = locks.acquire("orders:1", holder="bob")
    assert successor.token > lease.token
    with pytest.raises(locks.LockLost):
        lease.release()
    assert locks.is_locked("orders:1")


def test_tokens_rise_forever_whatever_ended_the_previous_holding() -> None:
    tokens = []
    for end in ["release", "break", "expire", "reap", "release"]:
        lease = locks.acquire("orders:1", ttl=0.2 if end in {"expire", "reap"} else 30)
        tokens.append(lease.token)
        if end == "release":
            lease.release()
        elif end == "break":
            locks.break_lock("orders:1")
        else:
            time.sleep(0.3)
            if end == "reap":
                assert locks.reap_expired() >= 1
                assert row("orders:1") is None
    tokens.append(locks.acquire("orders:1").token)
    assert tokens == sorted(set(tokens)), tokens


def test_reaper_deletes_expired_rows_in_batches_and_leaves_live_ones() -> None:
    for i in range(5):
        locks.acquire(f"short:{i}", ttl=0.2)
    live = [locks.acquire(f"long:{i}", ttl=30) for i in range(3)]
    renewed = locks.acquire("renewed", ttl=0.2)
    time.sleep(0.3)
    with pytest.raises(locks.LockLost):
        renewed.renew()  # expired: a late renewal does not resurrect it
    kept = locks.acquire("kept", ttl=0.4)
    time.sleep(0.2)
    kept.renew(ttl=30)
    time.sleep(0.3)  # past its first expiry; the renewal must protect it
    assert locks.reap_expired(batch_size=2) == 6
    assert sorted(Lock.objects.values_list("name", flat=True)) == sorted(
        [lease.name for lease in live] + ["kept"]
    )
    assert locks.reap_expired() == 0


def test_the_reaper_never_deletes_a_row_taken_over_while_its_batch_runs() -> None:
    # The trap of select-then-delete: a row expired when the reaper chose its batch is
    # taken over (live again) before the reaper's delete reaches it.
    locks.acquire("orders:1", ttl=0.05, holder="old")
    locks.acquire("orders:2", ttl=0.05, holder="old")
    time.sleep(0.1)
    reaped: list[int] = []
    reading = threading.Event()

    def on_first_read(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        # On SQLite a batch first takes the file's write lock, which this transaction has.
        if "locks_lock" in sql or sql == "BEGIN IMMEDIATE":
            reading.set()
        return execute(sql, params, many, context)

    def reap() -> None:
        try:
            with locks.connection.get("default").execute_wrapper(on_first_read):
                reaped.append(locks.reap_expired())
        finally:
            connections.close_all()
            locks.connection.close()

    reaper = threading.Thread(target=reap)
    with transaction.atomic():
        # A takeover in flight: it has the row (a write lock) and commits it live.
        later = timezone.now() + timedelta(hours=1)
        Lock.objects.filter(name="orders:1").update(holder="new", expires_at=later)
        reaper.start()
        # Not a bound on the thread's start and its connecting: the reaper's first
        # statement on the table is on its way before this commit, whatever the load.
        assert reading.wait(timeout=30), "the reaper never read the table"
        reaper.join(timeout=0.5)  # it skips the row or waits for this commit
    reaper.join(timeout=60)
    assert not reaper.is_alive()
    assert reaped == [1]  # orders:2 only
    taken = row("orders:1")
    assert taken is not None and taken.holder == "new"
    assert locks.is_locked("orders:1")


def test_reap_time_budget_stops_after_a_batch() -> None:
    for i in range(4):
        locks.acquire(f"short:{i}", ttl=0.1)
    time.sleep(0.2)
    assert locks.reap_expired(batch_size=1, time_budget=0) == 1
    assert Lock.objects.count() == 3


def test_a_reaper_batch_that_waited_for_another_writer_reports_what_it_held(
    backend: str,
) -> None:
    for i in range(2):
        locks.acquire(f"short:{i}", ttl=0.05)
    time.sleep(0.2)
    holding = hold_table_lock(1.0)
    report = reap_batches(10, "default", None)
    holding.join()
    assert (report.deleted, report.batches) == (2, 1)
    assert report.elapsed >= 0.9  # it waited for the other writer
    if for_connection(connections["default"]).writers_poll:
        # SQLite: it waited for the file before its batch began; the batch, and the pause
        # it owes waiting acquires, is only the time it held the write lock.
        assert report.longest_batch < 0.5
    else:
        # The DELETE itself waited in the server's lock queue, holding the rows it had.
        assert report.longest_batch >= 0.9
    assert not Lock.objects.exists()


def own_busy_timeout(ms: int | None = None) -> int:
    """The busy timeout of the app's own SQLite connection, set to ``ms`` first if given."""
    own = locks.connection.get(conf.DATABASE)
    own.ensure_connection()
    with own.cursor() as cursor:
        if ms is not None:
            cursor.execute(f"PRAGMA busy_timeout = {ms}")
        cursor.execute("PRAGMA busy_timeout")
        return int(cursor.fetchone()[0])


@contextmanager
def an_expired_row_in_a_busy_sqlite_file(backend: str, seconds: float) -> Iterator[None]:
    """One expired row; the app's connection waits 0.3 s for a busy file; another
    connection holds the file's write lock for ``seconds`` or until the block ends."""
    if backend != "sqlite":
        pytest.skip("the busy timeout is SQLite's; the servers queue lock waiters")
    locks.acquire("short:1", ttl=0.05)
    time.sleep(0.2)
    own_busy_timeout(300)
    holding = hold_table_lock(seconds)
    try:
        yield
    finally:
        holding.end()
        holding.join()


@override_settings(LOCKS={"TRANSIENT_RETRIES": 20, "BACKOFF_MIN": 0.01, "BACKOFF_MAX": 0.02})
def test_a_reaper_batch_waits_for_the_sqlite_file_as_long_as_the_busy_timeout(
    backend: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="locks")
    with an_expired_row_in_a_busy_sqlite_file(backend, 1.5):
        # The file stays busy past the busy timeout: an error, retried as transient.
        assert locks.reap_expired() == 1
    assert any("transient error, retrying" in r.getMessage() for r in caplog.records)
    # The batch set its own busy timeouts while it waited, and put the connection's back.
    assert own_busy_timeout() == 300


@override_settings(LOCKS={"TRANSIENT_RETRIES": 1, "BACKOFF_MIN": 0.01, "BACKOFF_MAX": 0.02})
def test_a_reaper_that_gives_up_on_a_busy_sqlite_file_deletes_nothing_and_leaves_no_transaction(
    backend: str,
) -> None:
    with (
        an_expired_row_in_a_busy_sqlite_file(backend, 10.0),
        pytest.raises(OperationalError) as raised,
    ):
        locks.reap_expired()
    assert "database is locked" in str(raised.value)
    assert "while trying to reap" in "".join(raised.value.__notes__)
    assert Lock.objects.count() == 1
    assert locks.reap_expired() == 1  # the app's connection is not stuck in a transaction


def test_lock_context_manager_releases_on_exit_and_on_error() -> None:
    with locks.lock("orders:1", ttl=30) as lease:
        assert locks.is_locked("orders:1")
        assert lease.count == 1
    assert not locks.is_locked("orders:1")
    with pytest.raises(ZeroDivisionError), locks.lock("orders:1"):
        1 / 0  # noqa: B018
    assert not locks.is_locked("orders:1")


def test_lock_works_as_a_decorator_with_a_fresh_lease_per_call() -> None:
    tokens = []

    @locks.lock("orders:1", ttl=30, timeout=5)
    def work() -> None:
        tokens.append(Lock.objects.get(name="orders:1").token)

    work()
    work()
    assert len(tokens) == 2 and tokens[0] < tokens[1]
    assert not locks.is_locked("orders:1")


@contextmanager
def decorated_and_held_in_another_thread() -> Iterator[tuple[Callable[[], None], threading.Event]]:
    """A function decorated here (once) with ``locks.lock``, running in another thread.

    Yields it and the event that lets that call end; the call must end without error.
    """
    inside, done = threading.Event(), threading.Event()

    @locks.lock("orders:1", ttl=30, timeout=0)
    def work() -> None:
        inside.set()
        assert done.wait(10)

    errors: list[BaseException] = []

    def hold() -> None:
        try:
            work()
        except BaseException as exc:
            errors.append(exc)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert inside.wait(10)
        yield work, done
    finally:
        done.set()
        holder.join(10)
    assert errors == []


def test_one_lock_object_shared_by_threads_releases_each_threads_own_lease() -> None:
    # A module-level guard: A holds it past its TTL, B takes it over, then A's block ends.
    guard = locks.lock("orders:shared", ttl=0.5, timeout=10)
    a_in, b_in, a_out, b_go = (threading.Event() for _ in range(4))
    outcomes: dict[str, object] = {}

    def a() -> None:
        try:
            with guard:
                a_in.set()
                b_in.wait(10)
        except locks.LockLost:
            outcomes["a"] = "lost"
        a_out.set()

    def b() -> None:
        with guard as lease:
            outcomes["b"] = lease
            b_in.set()
            b_go.wait(10)

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    threads[0].start()
    assert a_in.wait(10)
    threads[1].start()
    assert a_out.wait(10)
    held = row("orders:shared")
    b_lease = outcomes["b"]
    assert isinstance(b_lease, locks.Lease)
    assert outcomes.get("a") == "lost"  # A learns its lease expired and went to B...
    assert held is not None and held.holder == b_lease.holder  # ...and leaves B's alone
    b_go.set()
    for thread in threads:
        thread.join(10)
    assert row("orders:shared") is None


def test_a_lock_block_that_ends_in_another_thread_releases_its_lease() -> None:
    # A generator holding the lock, resumed to its end by another thread.
    def holding() -> Iterator[None]:
        with locks.lock("orders:moved", ttl=30):
            yield

    steps = holding()
    next(steps)
    assert locks.is_locked("orders:moved")
    ended: list[BaseException | None] = []

    def finish() -> None:
        try:
            next(steps, None)
            ended.append(None)
        except BaseException as exc:
            ended.append(exc)

    thread = threading.Thread(target=finish)
    thread.start()
    thread.join(10)
    assert ended == [None]
    assert not locks.is_locked("orders:moved")


def _in_thread(body: Callable[[], object]) -> list[object]:
    """Run ``body`` in a new thread to its end; what it returned or raised."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(body())
        except BaseException as exc:
            outcome.append(exc)
        finally:
            locks.connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    return outcome


@contextmanager
def _held_by_another_thread(guard: LockContext) -> Iterator[list[object]]:
    """Another thread holds ``guard`` for the block; then it must have left it cleanly."""
    inside, leave = threading.Event(), threading.Event()
    outcome: list[object] = []

    def hold() -> str:
        with guard as lease:
            outcome.append(lease)
            inside.set()
            assert leave.wait(10)
        return "exited"

    thread = threading.Thread(target=lambda: outcome.extend(_in_thread(hold)))
    thread.start()
    assert inside.wait(10)
    try:
        yield outcome
    finally:
        leave.set()
        thread.join(10)
    assert outcome[1:] == ["exited"]


def _generator_holding(guard: LockContext) -> Iterator[None]:
    with guard:
        yield


def test_a_block_ending_in_another_thread_never_releases_another_threads_holding() -> None:
    guard = locks.lock("orders:shared", ttl=0.5, timeout=10)  # one object, several threads
    steps = _generator_holding(guard)
    next(steps)
    time.sleep(0.8)  # the generator's lease runs out
    with _held_by_another_thread(guard) as other:  # taken over there: a live holding
        # The generator's block ends in a third thread: which of the object's leases is
        # its own cannot be told there, so it releases none, and says so.
        ended = _in_thread(lambda: next(steps, None))
        assert len(ended) == 1 and isinstance(ended[0], locks.LockError), ended
        holder = cast(locks.Lease, other[0]).holder
        assert Lock.objects.get(name="orders:shared").holder == holder
    assert not locks.is_locked("orders:shared")


def test_blocks_of_one_shared_holder_ending_in_other_threads_each_give_back_one_entry() -> None:
    guard = locks.lock("orders:svc", ttl=30, holder="svc", timeout=0)
    steps = _generator_holding(guard)
    next(steps)  # count 1
    with _held_by_another_thread(guard):  # the same holder: a re-entry, count 2
        assert _in_thread(lambda: next(steps, None)) == [None]
        assert Lock.objects.get(name="orders:svc").count == 1
    assert not locks.is_locked("orders:svc")


def test_a_lock_built_before_the_settings_changed_reads_them_when_entered() -> None:
    # As a function decorated at import time: ttl and database are the call's defaults.
    guard = locks.lock("reports:settings")
    explicit = locks.lock("reports:explicit", ttl=7, using="default")
    with override_settings(LOCKS={"DEFAULT_TTL": 5, "DATABASE": "other"}):
        with guard as lease:
            assert (lease.ttl, lease.using) == (5.0, "other")
            assert row("reports:settings", "other") is not None
            assert row("reports:settings") is None
        with explicit as lease:
            assert (lease.ttl, lease.using) == (7.0, "default")


def test_lock_refuses_to_decorate_what_runs_after_the_call_returns() -> None:
    async def coroutine() -> None: ...

    async def async_generator() -> AsyncIterator[int]:
        yield 1

    def generator() -> Iterator[int]:
        yield 1

    for function, kind in [
        (coroutine, "a coroutine"),
        (async_generator, "an async generator"),
        (generator, "a generator"),
    ]:
        with pytest.raises(TypeError, match=f"{kind} function.*locks.alock"):
            locks.lock("orders:1")(function)
    assert not Lock.objects.exists()


class AsyncCallable:
    async def __call__(self) -> None: ...


class GeneratingCallable:
    def __call__(self) -> Iterator[int]:
        yield 1


async def coroutine_function() -> None: ...


def test_lock_looks_through_callable_objects_and_staticmethods_when_refusing() -> None:
    # Called, each only makes a coroutine or generator, as a function of that kind does.
    cases: list[tuple[Callable[..., Any], str]] = [
        (AsyncCallable(), "a coroutine"),
        (GeneratingCallable(), "a generator"),
        (staticmethod(coroutine_function), "a coroutine"),
        # Wrapped once more, a callable object's __call__ is still what runs.
        (functools.partial(AsyncCallable()), "a coroutine"),
        (staticmethod(AsyncCallable()), "a coroutine"),
        (functools.partial(GeneratingCallable()), "a generator"),
    ]
    for function, kind in cases:
        with pytest.raises(TypeError, match=f"{kind} function.*locks.alock"):
            locks.lock("orders:1")(function)
    assert not Lock.objects.exists()
    # A plain callable object is decorated, and runs under the lock.
    seen: list[bool] = []

    class Plain:
        def __call__(self) -> None:
            seen.append(locks.is_locked("orders:1"))

    locks.lock("orders:1")(Plain())()
    assert seen == [True]


def test_a_decorated_function_excludes_its_own_calls_in_other_threads() -> None:
    # The decorator is built once, in this thread; each call holds as its own thread.
    with decorated_and_held_in_another_thread() as (work, _):
        with pytest.raises(locks.LockBusy):
            work()
        assert Lock.objects.get(name="orders:1").count == 1
    assert not locks.is_locked("orders:1")


@forks_while_threaded
def test_a_decorated_function_excludes_its_own_calls_in_forked_children() -> None:
    # Pre-forking servers import (and decorate) in the parent, then serve in children.
    # The holding thread's connection is inherited by the child, which must leave it be.
    with decorated_and_held_in_another_thread() as (work, done):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports by its exit code
            code = 3
            try:
                done.set()  # the child's copy: its own call must not wait on it
                work()
                code = 1  # re-entered the parent's holding
            except locks.LockBusy:
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert Lock.objects.get(name="orders:1").count == 1
    assert not locks.is_locked("orders:1")


def _what_a_child_can_do_with(lease: locks.Lease) -> int:
    """In a forked child: 0 if it can neither renew nor release its parent's lease."""
    for attempt in (lease.renew, lease.release):
        try:
            attempt()
        except locks.LockError as exc:
            if "forked child" not in str(exc):
                return 2
        else:
            return 3
    return 0


@forks_while_threaded
def test_a_forked_child_neither_renews_nor_releases_its_parents_lease() -> None:
    pid, code = -1, 1
    try:
        with locks.lock("orders:forked", ttl=30) as lease:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child reports by its exit code
                code = _what_a_child_can_do_with(lease)
            else:
                _, status = os.waitpid(pid, 0)
                assert os.waitstatus_to_exitcode(status) == 0
                assert Lock.objects.get(name="orders:forked").token == lease.token
    finally:
        if pid == 0:  # pragma: no cover
            # Out of the block now, as the parent will be: its end left the lease alone.
            os._exit(code or (0 if locks.is_locked("orders:forked") else 4))
    assert not locks.is_locked("orders:forked")


def test_one_lock_object_entered_again_inside_its_block_releases_both_holdings() -> None:
    guard = locks.lock("orders:1", ttl=30)
    with guard as outer:
        with guard as inner:
            assert (inner.token, inner.count) == (outer.token, 2)
        assert Lock.objects.get(name="orders:1").count == 1
        assert locks.is_locked("orders:1")
    assert not locks.is_locked("orders:1")


def test_a_lease_released_inside_its_with_block_is_not_released_again() -> None:
    with locks.acquire("orders:1") as lease:
        lease.release()
        successor = locks.acquire("orders:1", holder="bob")
    assert successor.held and locks.is_locked("orders:1")


def test_lease_is_a_context_manager_too() -> None:
    with locks.acquire("orders:1") as lease:
        assert lease.held
    assert not locks.is_locked("orders:1")


def test_block_raises_lock_lost_at_exit_when_the_lock_was_broken_meanwhile() -> None:
    with pytest.raises(locks.LockLost, match="orders:1"), locks.lock("orders:1"):
        locks.break_lock("orders:1")


def test_lost_lock_does_not_mask_the_blocks_own_exception() -> None:
    with pytest.raises(KeyError), locks.lock("orders:1"):
        locks.break_lock("orders:1")
        raise KeyError("the block's own error")


def test_names_are_exact_case_and_trailing_space_sensitive() -> None:
    names = ["Lock", "lock", "lock ", "LOCK", "lóck"]
    leases = [locks.acquire(name, holder=f"h{i}", timeout=0) for i, name in enumerate(names)]
    assert len({lease.token for lease in leases}) == len(names)
    assert sorted(Lock.objects.values_list("name", flat=True)) == sorted(names)


# Variants that MariaDB's default collations (utf8mb4_unicode_ci here) count as equal.
HOLDER_VARIANTS = ["alice", "ALICE", "Alice ", "Alíce"]


def test_holders_are_exact_so_a_lookalike_neither_reenters_nor_extends() -> None:
    alice = locks.acquire("orders:1", ttl=30, holder="Alice")
    before = row("orders:1")
    for holder in HOLDER_VARIANTS:
        assert locks.try_acquire("orders:1", ttl=300, holder=holder) is None, holder
    with pytest.raises(locks.LockBusy, match="orders:1"):
        locks.acquire("orders:1", ttl=300, holder="alice", timeout=0.2)
    after = row("orders:1")
    assert before is not None and after is not None
    assert (after.holder, after.token, after.count, after.expires_at) == (
        "Alice",
        alice.token,
        1,
        before.expires_at,
    )
    alice.release()
    assert row("orders:1") is None
    assert not locks.is_locked("orders:1")


def lookalike(lease: locks.Lease, holder: str) -> locks.Lease:
    """``lease`` rebuilt (its constructor is public) with another holder and the same token."""
    return locks.Lease(
        name=lease.name,
        holder=holder,
        token=lease.token,
        count=lease.count,
        acquired_at=lease.acquired_at,
        expires_at=lease.expires_at,
        ttl=300,
        using=lease.using,
        note=lease.note,
        local_deadline=time.monotonic() + 300,
    )


def test_a_lookalike_holder_cannot_renew_or_release_a_lease_with_its_token() -> None:
    alice = locks.acquire("orders:1", ttl=30, holder="Alice")
    before = row("orders:1")
    assert before is not None
    for holder in HOLDER_VARIANTS:
        with pytest.raises(locks.LockLost, match="orders:1"):
            lookalike(alice, holder).renew()
        with pytest.raises(locks.LockLost, match="orders:1"):
            lookalike(alice, holder).release()
        with pytest.raises(locks.LockLost, match="orders:1"):
            lookalike(alice, holder).release(entirely=True)
        after = row("orders:1")
        assert after is not None, holder
        assert (after.holder, after.count, after.expires_at) == ("Alice", 1, before.expires_at)
    alice.release()
    assert row("orders:1") is None


def test_unicode_and_maximum_length_names_round_trip() -> None:
    for name in ["заказ:42/🚀", "x" * 255, "a:b/c%d"]:
        with locks.lock(name) as lease:
            assert row(name) is not None
            assert locks.check_token(name, lease.token)


def test_leases_on_another_alias_live_in_that_database() -> None:
    lease = locks.acquire("orders:1", using="other")
    assert row("orders:1", "other") is not None
    assert row("orders:1", "default") is None
    assert locks.is_locked("orders:1", using="other")
    assert not locks.is_locked("orders:1")
    assert locks.check_token("orders:1", lease.token, using="other")
    lease.release()
    assert row("orders:1", "other") is None


def test_default_holder_differs_per_thread_and_a_new_thread_does_not_reenter() -> None:
    main = locks.acquire("orders:1")
    seen: list[object] = []

    def other_thread() -> None:
        seen.append(locks.try_acquire("orders:1"))
        locks.connection.close()

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert seen == [None]
    main.release()


def test_explicit_holder_shares_a_lease_with_another_process() -> None:
    lease = locks.acquire("job:7", ttl=30, holder="job-7")
    events = finish(spawn("release_as", "job:7", "job-7", 30))
    assert events[0] == {"event": "acquired", "token": lease.token, "count": 2}
    assert events[1] == {"event": "released"}
    assert row("job:7").count == 1  # type: ignore[union-attr]
    lease.release()
    assert row("job:7") is None


def test_releases_of_a_shared_holder_that_cross_each_other_both_count() -> None:
    """The first lease's release misses (the row counts 2), then the second's runs before
    its next statement: the count it was looking for moved under it."""
    first = locks.acquire("job:8", ttl=30, holder="job-8")
    second = locks.acquire("job:8", ttl=30, holder="job-8")
    statements: list[str] = []

    def release_second_after_the_first_statement(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        result = execute(sql, params, many, context)
        statements.append(sql)
        if len(statements) == 1:
            thread = threading.Thread(target=second.release)  # its own connection
            thread.start()
            thread.join()
        return result

    with locks.connection.get("default").execute_wrapper(release_second_after_the_first_statement):
        first.release()  # was LockLost, leaving the row to count 1 until it expired
    assert len(statements) >= 3
    assert row("job:8") is None


def test_a_lease_is_visible_to_other_processes_at_once() -> None:
    lease = locks.acquire("orders:1")
    assert finish(spawn("probe", "orders:1")) == [{"event": "probe", "locked": True}]
    lease.release()
    assert finish(spawn("probe", "orders:1")) == [{"event": "probe", "locked": False}]


#: Runs a worker as pid 1 of a new pid namespace, without address randomization: two
#: such processes have the same host, pid and main-thread ident, like a process that
#: reuses a dead one's pid.
SAME_PID_AND_THREAD = ["setarch", platform.machine(), "-R", "unshare", "--pid", "--fork"]


def test_a_new_process_with_a_dead_ones_host_pid_and_thread_does_not_reenter_its_lease() -> None:
    first = finish(spawn("acquire_only", "orders:1", 30, wrap=SAME_PID_AND_THREAD))
    second = finish(spawn("probe_default", "orders:1", wrap=SAME_PID_AND_THREAD))
    dead, new = first[0]["holder"], second[0]["holder"]
    # Everything but the per-process nonce is the same: host, pid 1, thread, serial.
    assert dead.rsplit(":", 1)[0] == new.rsplit(":", 1)[0], (dead, new)
    assert dead.split(":")[1] == "1", dead
    assert dead != new
    assert second[0]["locked"] is True
    assert row("orders:1").holder == dead  # type: ignore[union-attr]
