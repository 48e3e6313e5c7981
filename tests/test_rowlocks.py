"""Row locks (``row_lock``, ``lock_rows``) held and contended by separate OS processes."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import NotSupportedError, connection, connections, transaction
from django.db.transaction import TransactionManagementError
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import locks
from locks.backends import for_connection
from locks.conf import conf
from locks.models import RowLock
from tests.app.models import Counter, Item
from tests.conftest import isolation_level
from tests.remote import Remote, remotes
from tests.test_leases import AsyncCallable, GeneratingCallable

pytestmark = pytest.mark.django_db(transaction=True)

BACKEND = for_connection(connections[conf.DATABASE])
NEEDS_ROW_LOCKS = pytest.mark.skipif(
    not BACKEND.has_row_locks,
    reason="SQLite has no row locks: a row lock is the database's one write lock, and the "
    "caller's own transaction (BEGIN IMMEDIATE) waits for it before any lock statement runs",
)
# Generous: the machine is shared and may be loaded.
PROMPTLY = 10.0


@pytest.fixture
def start() -> Iterator[Callable[..., Remote]]:
    with remotes() as start:
        yield start


def in_transaction() -> bool:
    """Whether Django's connection is inside an atomic block now."""
    return connection.in_atomic_block


def holding(start: Callable[..., Remote], name: str) -> Remote:
    """A worker process that holds the row lock ``name`` until told to commit."""
    remote = start()
    event = remote.call("hold", name=name)
    assert event["ok"] and event["locked"], event
    return remote


# --- bad input ---------------------------------------------------------------------------

BAD_ROW_LOCKS: list[tuple[dict[str, Any], type[Exception]]] = [
    ({"name": ""}, ValueError),
    ({"name": 42}, TypeError),
    ({"name": "a\x00b"}, ValueError),
    ({"name": "x" * 256}, ValueError),
    ({"name": "n", "nowait": "yes"}, TypeError),
    ({"name": "n", "skip_locked": 1}, TypeError),
    ({"name": "n", "nowait": True, "skip_locked": True}, ValueError),
    ({"name": "n", "timeout": -1}, ValueError),
    ({"name": "n", "timeout": float("nan")}, ValueError),
    ({"name": "n", "timeout": "5"}, TypeError),
    ({"name": "n", "timeout": 1, "nowait": True}, ValueError),
    ({"name": "n", "timeout": 1, "skip_locked": True}, ValueError),
    ({"name": "n", "using": "nope"}, ValueError),
]


@pytest.mark.parametrize(("kwargs", "error"), BAD_ROW_LOCKS)
def test_row_lock_refuses_bad_arguments_before_any_query(
    kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with CaptureQueriesContext(connection) as queries, pytest.raises(error):
        locks.row_lock(**kwargs)
    assert len(queries) == 0
    assert not in_transaction()
    assert not RowLock.objects.exists()


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_row_lock_built_before_the_settings_changed_reads_them_when_entered() -> None:
    # As a function decorated at import time: its database is LOCKS['DATABASE'] of the call.
    def where(name: str) -> list[str]:
        aliases = ("default", "other")
        return [alias for alias in aliases if RowLock.objects.using(alias).filter(name=name)]

    @locks.row_lock("rows:settings")
    def work() -> list[str]:
        return where("rows:settings")

    explicit = locks.row_lock("rows:explicit", using="default")
    with override_settings(LOCKS={"DATABASE": "other"}):
        assert work() == ["other"]
        with explicit:
            assert where("rows:explicit") == ["default"]


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_bad_database_setting_fails_where_a_row_lock_is_entered_not_decorated() -> None:
    # A bad setting is for manage.py check to report (locks.E002); raised here, it would
    # break importing the module of a decorated function, and check with it.
    def report() -> str:
        return "done"

    with override_settings(LOCKS={"DATABASE": "nowhere"}):
        work = locks.row_lock("rows:bad-setting")(report)
        with pytest.raises(ValueError, match=r"LOCKS\['DATABASE'\]"):
            work()
    assert work() == "done"
    assert RowLock.objects.filter(name="rows:bad-setting").exists()


def test_row_lock_error_messages_name_the_lock() -> None:
    with pytest.raises(ValueError, match=r"'orders:42'.*nowait and skip_locked"):
        locks.row_lock("orders:42", nowait=True, skip_locked=True)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: locks.lock_rows([1, 2]), TypeError),  # type: ignore[arg-type]
        (lambda: locks.lock_rows(Item.objects.all(), nowait=True, skip_locked=True), ValueError),
        (lambda: locks.lock_rows(Item.objects.all(), timeout=-1), ValueError),
        (lambda: locks.lock_rows(Item.objects.all()), TransactionManagementError),
        # The queryset's own select_for_update() flags count as if given to lock_rows().
        (
            lambda: locks.lock_rows(Item.objects.select_for_update(nowait=True), skip_locked=True),
            ValueError,
        ),
        (
            lambda: locks.lock_rows(Item.objects.select_for_update(skip_locked=True), timeout=1),
            ValueError,
        ),
        (
            lambda: locks.lock_rows(Item.objects.select_for_update(nowait=True), timeout=0),
            ValueError,
        ),
    ],
    ids=[
        "not-a-queryset",
        "nowait-and-skip-locked",
        "negative-timeout",
        "outside-atomic",
        "querysets-nowait-and-skip-locked",
        "querysets-skip-locked-and-timeout",
        "querysets-nowait-and-timeout-0",
    ],
)
def test_lock_rows_refuses_bad_arguments_before_any_query(
    call: Callable[[], Any], error: type[Exception]
) -> None:
    Item.objects.create(name="a", value=1)
    with CaptureQueriesContext(connection) as queries, pytest.raises(error):
        call()
    assert len(queries) == 0
    assert list(Item.objects.values_list("name", "value")) == [("a", 1)]


# --- one process -------------------------------------------------------------------------


def test_row_lock_creates_its_row_and_holds_a_transaction_for_the_block() -> None:
    with locks.row_lock("orders:1") as row:
        assert row is not None
        assert row.name == "orders:1"
        assert in_transaction()
    assert not in_transaction()
    assert list(RowLock.objects.values_list("name", flat=True)) == ["orders:1"]


def test_writes_in_the_block_commit_or_roll_back_with_the_lock() -> None:
    with locks.row_lock("orders:2"):
        Item.objects.create(name="kept")
    with pytest.raises(RuntimeError), locks.row_lock("orders:2"):
        Item.objects.create(name="dropped")
        raise RuntimeError("the block fails")
    assert list(Item.objects.values_list("name", flat=True)) == ["kept"]


def test_a_transaction_can_take_its_own_row_lock_again() -> None:
    with locks.row_lock("orders:16"), locks.row_lock("orders:16", nowait=True) as again:
        assert again is not None


def test_row_lock_works_as_a_decorator() -> None:
    @locks.row_lock("orders:3")
    def decorated() -> bool:
        return in_transaction()

    assert decorated() and decorated()
    assert not in_transaction()


@pytest.mark.parametrize("use", ["with", "decorated"])
def test_one_row_lock_object_shared_by_threads_holds_the_lock_in_each_in_turn(use: str) -> None:
    # A module-level guard, or a decorated function, used by several threads at once:
    # each thread takes the lock in its own transaction and ends its own.
    guard = locks.row_lock("shared:guard", timeout=PROMPTLY)
    first_in, let_go = threading.Event(), threading.Event()
    spans: dict[str, tuple[float, float]] = {}

    def critical(who: str) -> None:
        began = time.monotonic()
        assert in_transaction()
        if who == "first":
            first_in.set()
            assert let_go.wait(PROMPTLY)
        spans[who] = (began, time.monotonic())

    def run(who: str) -> None:
        try:
            if use == "with":
                with guard:
                    critical(who)
            else:
                guard(critical)(who)
        finally:
            first_in.set()  # never leave the test waiting for a first that failed
            connections.close_all()  # this thread's connections, as Django would

    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(run, "first")
        assert first_in.wait(PROMPTLY)
        second = pool.submit(run, "second")
        time.sleep(0.5)  # the second waits for the lock meanwhile
        let_go.set()
        first.result(timeout=PROMPTLY)
        second.result(timeout=PROMPTLY)
    assert spans["second"][0] >= spans["first"][1], spans
    assert spans["second"][0] - spans["first"][0] >= 0.5, "it must have waited for the first"
    with guard as row:  # and the object is free for the next block
        assert row is not None


def test_one_row_lock_object_entered_again_in_its_own_block_is_refused() -> None:
    guard = locks.row_lock("orders:20")
    with guard:
        with pytest.raises(locks.LockError, match="already held by this context manager"), guard:
            pytest.fail("the inner block must not run")
        assert in_transaction()  # the outer block still holds the lock
    with guard as row:
        assert row is not None


def test_row_lock_with_skip_locked_refuses_to_decorate_before_any_query() -> None:
    # The decorated function could not tell a skipped lock from a held one (the block's
    # None), so it would run without the lock.
    guard = locks.row_lock("reports:nightly", skip_locked=True)
    with (
        CaptureQueriesContext(connection) as queries,
        pytest.raises(TypeError, match=r"skip_locked=True\) on '\S*build_report'.*row is None"),
    ):

        @guard
        def build_report() -> None:
            pytest.fail("never decorated, never run")

    assert len(queries) == 0
    assert not in_transaction()
    with guard as row:  # in a with block it is fine
        assert row is not None


def test_row_lock_refuses_to_decorate_what_runs_after_the_call_returns() -> None:
    # Calling these only makes a coroutine or generator: the transaction, and with it the
    # row lock, would end before the body ran, which would then run without the lock.
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
        with (
            CaptureQueriesContext(connection) as queries,
            pytest.raises(TypeError, match=f"{kind} function.*hold the row lock inside"),
        ):
            locks.row_lock("orders:21")(function)
        assert len(queries) == 0
    objects: list[tuple[Callable[..., Any], str]] = [
        (AsyncCallable(), "a coroutine"),
        (GeneratingCallable(), "a generator"),
    ]
    for obj, kind in objects:
        with pytest.raises(TypeError, match=f"{kind} function.*hold the row lock inside"):
            locks.row_lock("orders:21")(obj)
    assert not in_transaction()
    assert not RowLock.objects.exists()


def test_taking_an_existing_row_lock_is_one_statement(
    own_queries: Callable[[], CaptureQueriesContext],
) -> None:
    with locks.row_lock("orders:4"):
        pass  # creates the row
    with (
        own_queries() as own,
        CaptureQueriesContext(connection) as queries,
        locks.row_lock("orders:4"),
    ):
        pass
    statements = [q["sql"] for q in queries.captured_queries if "locks_rowlock" in q["sql"]]
    assert len(statements) == 1, statements
    assert len(own) == 0


@pytest.mark.skipif(
    not BACKEND.creates_row_in_transaction,
    reason="only where one statement in the caller's transaction creates and locks the row "
    "(MariaDB)",
)
def test_taking_a_new_row_lock_in_the_callers_transaction_is_one_statement(
    own_queries: Callable[[], CaptureQueriesContext],
) -> None:
    with (
        own_queries() as own,
        CaptureQueriesContext(connection) as queries,
        locks.row_lock("orders:22"),
    ):
        pass
    statements = [q["sql"] for q in queries.captured_queries if "locks_rowlock" in q["sql"]]
    assert len(statements) == 1, statements
    assert len(own) == 0
    assert RowLock.objects.filter(name="orders:22").exists()


# --- several processes ---------------------------------------------------------------------


def test_nowait_raises_lock_busy_at_once_while_another_process_holds_it(
    start: Callable[..., Remote],
) -> None:
    holder = holding(start, "orders:5")
    started = time.monotonic()
    with pytest.raises(locks.LockBusy, match="'orders:5'"), locks.row_lock("orders:5", nowait=True):
        pytest.fail("the block must not run")
    assert time.monotonic() - started < PROMPTLY
    assert not in_transaction()
    assert holder.call("commit")["ok"]
    with locks.row_lock("orders:5", nowait=True) as row:
        assert row is not None


def test_timeout_raises_lock_busy_after_about_the_timeout(start: Callable[..., Remote]) -> None:
    holding(start, "orders:6")
    started = time.monotonic()
    with (
        pytest.raises(locks.LockBusy, match=r"'orders:6'.*after 0\.5 s"),
        locks.row_lock("orders:6", timeout=0.5),
    ):
        pytest.fail("the block must not run")
    elapsed = time.monotonic() - started
    assert 0.45 <= elapsed < PROMPTLY


@contextmanager
def a_short_server_lock_wait_limit() -> Iterator[None]:
    """Shorten the server's own limit on lock waits (no timeout of ours) in the block."""
    if connection.vendor == "postgresql":
        # SET LOCAL: this transaction's only, so it is also right behind PgBouncer (and the
        # row locks in the block are savepoints in it).
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '300ms'")
            yield
        return
    setting = {
        "mysql": "SET SESSION innodb_lock_wait_timeout = 1",
        "sqlite": "PRAGMA busy_timeout = 300",
    }[connection.vendor]
    with connection.cursor() as cursor:
        cursor.execute(setting)
    try:
        yield
    finally:
        connection.close()  # the setting goes with the session


def test_a_wait_cut_short_by_the_servers_own_limit_is_lock_busy(
    start: Callable[..., Remote],
) -> None:
    holding(start, "orders:18")
    with (
        a_short_server_lock_wait_limit(),
        pytest.raises(locks.LockBusy, match=r"'orders:18'.*the server's lock wait limit ran out"),
        locks.row_lock("orders:18"),
    ):
        pytest.fail("the block must not run")


@NEEDS_ROW_LOCKS
def test_a_lock_rows_wait_cut_short_by_the_servers_own_limit_is_lock_busy(
    start: Callable[..., Remote],
) -> None:
    item = Item.objects.create(name="held")
    start().call("hold_rows", pks=[item.pk])
    limit = r"Item rows.*the server's lock wait limit ran out"
    with a_short_server_lock_wait_limit(), transaction.atomic():
        with pytest.raises(locks.LockBusy, match=limit):
            locks.lock_rows(Item.objects.filter(pk=item.pk))
        transaction.set_rollback(True)  # documented: PostgreSQL aborted the transaction


@pytest.mark.parametrize(
    "timeout",
    # 30 days: more milliseconds than PostgreSQL's lock_timeout and SQLite's busy_timeout
    # take (2**31 - 1); PostgreSQL refused it, SQLite read it as "do not wait".
    [None, 30 * 24 * 3600],
    ids=["no timeout", "beyond the servers' longest wait"],
)
def test_a_waiter_gets_the_row_lock_right_after_the_holder_commits(
    start: Callable[..., Remote], timeout: float | None
) -> None:
    holder = holding(start, "orders:7")
    holder.send("commit", delay=1.0)
    started = time.monotonic()
    with locks.row_lock("orders:7", timeout=timeout):
        got_at = time.time()
    committed = holder.reply()
    assert committed["ok"]
    assert time.monotonic() - started >= 0.5, "it must have waited for the holder"
    assert committed["committing_at"] <= got_at < committed["committing_at"] + PROMPTLY


def test_a_killed_holder_frees_the_row_lock(start: Callable[..., Remote]) -> None:
    holder = holding(start, "orders:8")
    with pytest.raises(locks.LockBusy), locks.row_lock("orders:8", nowait=True):
        pass
    holder.kill()
    with locks.row_lock("orders:8", timeout=PROMPTLY) as row:
        assert row is not None


def test_skip_locked_runs_the_block_with_none_and_no_transaction(
    start: Callable[..., Remote],
) -> None:
    holder = holding(start, "orders:9")
    with locks.row_lock("orders:9", skip_locked=True) as row:
        assert row is None
        assert not in_transaction()
    holder.call("commit")
    other = start()
    with locks.row_lock("orders:10", skip_locked=True) as row:
        assert row is not None
        assert not other.call("hold", name="orders:10", nowait=True)["ok"]


def test_a_nested_row_lock_lasts_until_the_outer_transaction_ends(
    start: Callable[..., Remote],
) -> None:
    other = start()
    with transaction.atomic():
        with locks.row_lock("orders:11"):
            pass
        busy = other.call("hold", name="orders:11", nowait=True)
        assert not busy["ok"] and busy["error"] == "LockBusy", busy
    free = other.call("hold", name="orders:11", nowait=True)
    assert free["ok"] and free["locked"], free


def test_a_nested_row_lock_whose_block_fails_is_released_with_its_savepoint(
    start: Callable[..., Remote],
) -> None:
    with locks.row_lock("orders:17"):
        pass  # the row exists from now on
    other = start()
    with transaction.atomic():
        with pytest.raises(RuntimeError), locks.row_lock("orders:17"):
            raise RuntimeError("the block fails: its savepoint is rolled back")
        probe = other.call("hold", name="orders:17", nowait=True)
        # PostgreSQL and MariaDB drop row locks taken after a savepoint when rolling back
        # to it; on SQLite the outer transaction holds the write lock anyway.
        assert probe["ok"] is BACKEND.has_row_locks, probe
        other.call("commit")


@NEEDS_ROW_LOCKS
def test_lock_busy_in_a_nested_row_lock_leaves_the_outer_transaction_usable(
    start: Callable[..., Remote],
) -> None:
    holding(start, "orders:12")
    with transaction.atomic():
        Item.objects.create(name="before")
        with pytest.raises(locks.LockBusy), locks.row_lock("orders:12", nowait=True):
            pass
        with pytest.raises(locks.LockBusy), locks.row_lock("orders:12", timeout=0.2):
            pass
        Item.objects.create(name="after")
    assert sorted(Item.objects.values_list("name", flat=True)) == ["after", "before"]


@pytest.mark.skipif(
    not BACKEND.has_row_locks,
    reason="SQLite: a row lock is the database's write lock, which every other writer, "
    "lease statements included, waits for (documented)",
)
def test_row_locks_and_leases_of_one_name_do_not_interfere(start: Callable[..., Remote]) -> None:
    holding(start, "orders:13")
    lease = locks.try_acquire("orders:13", ttl=5)
    assert lease is not None
    lease.release()


def test_processes_creating_and_taking_the_same_new_rows_never_overlap(
    start: Callable[..., Remote],
) -> None:
    names = [f"fresh:{i}" for i in range(15)]
    Counter.objects.bulk_create(Counter(name=name, value=0) for name in names)
    workers = [start() for _ in range(3)]
    for worker in workers:  # all three race to create each row, in the same order
        worker.send("increment_each", names=names)
    for worker in workers:
        event = worker.reply()
        assert event["ok"], event
    # A second holder at any moment would lose one of the non-atomic increments.
    assert set(Counter.objects.values_list("value", flat=True)) == {len(workers)}
    assert RowLock.objects.count() == len(names)


NEEDS_INSERT_DEADLOCK = pytest.mark.skipif(
    not BACKEND.creates_row_in_transaction,
    reason="only where a new row is inserted inside the caller's transaction (MariaDB) can "
    "sessions that create it at once deadlock",
)


def creating_at_once(
    start: Callable[..., Remote], tmp_path: Path, write_first: list[str], creator_dies: bool
) -> list[dict[str, Any]]:
    """Two sessions that create row lock "new" at once, with ``write_first`` each (see
    ``lock_after_pause``), while a third has inserted it and not committed yet: both wait
    for it. If it commits, they take the row in turn. If it dies (``creator_dies``), its
    insert is rolled back, both insert the row at once, and one of them deadlocks. Their
    events, in order."""
    gate = tmp_path / "go"
    late = [start(), start()]
    for worker, write in zip(late, write_first, strict=True):
        # Both stop right before their statement that creates (or locks) the row.
        worker.send("lock_after_pause", name="new", gate=str(gate), write_first=write)
        assert worker.reply()["event"] == "paused"
    first = holding(start, "new")  # inserts the row; not committed yet
    gate.touch()
    time.sleep(0.5)  # both inserts now wait for the first
    if creator_dies:
        first.kill()  # the server rolls its transaction back
    else:
        first.call("commit")
    return [worker.reply() for worker in late]


@NEEDS_INSERT_DEADLOCK
def test_sessions_waiting_for_a_new_row_get_it_in_turn_when_its_creator_commits(
    start: Callable[..., Remote], tmp_path: Path
) -> None:
    # In manual transactions, where a deadlock would not be retried: there is none (each
    # waits for the row exclusively, no shared lock to upgrade).
    for event in creating_at_once(start, tmp_path, ["w0", "w1"], creator_dies=False):
        assert event["ok"] and event["locked"] and event["kept"], event


@NEEDS_INSERT_DEADLOCK
def test_sessions_that_deadlock_creating_one_new_row_both_get_the_lock(
    start: Callable[..., Remote], tmp_path: Path
) -> None:
    # The deadlock is retried.
    for event in creating_at_once(start, tmp_path, ["", ""], creator_dies=True):
        assert event["ok"] and event["locked"], event


@NEEDS_INSERT_DEADLOCK
def test_a_deadlock_in_a_manual_transaction_is_not_retried_over_its_lost_writes(
    start: Callable[..., Remote], tmp_path: Path
) -> None:
    # With autocommit off (Django's manual transactions), the deadlock rolls back the
    # caller's whole transaction: a retry would go on in a new one as if nothing was lost.
    events = creating_at_once(start, tmp_path, ["w0", "w1"], creator_dies=True)
    for event in events:
        assert (event["ok"] and event["kept"]) or "Deadlock" in event["message"], event
    assert any(not event["ok"] for event in events), events


@pytest.mark.skipif(not BACKEND.has_row_locks, reason="SQLite has no isolation levels")
def test_a_row_created_after_a_repeatable_read_snapshot(start: Callable[..., Remote]) -> None:
    other = start()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        Item.objects.count()  # the snapshot is taken here
        assert other.call("hold", name="late")["ok"]  # creates the row after the snapshot
        assert other.call("commit")["ok"]
        if connection.vendor == "postgresql":
            # Even a locking read cannot see a row newer than the snapshot: a clear error.
            with pytest.raises(locks.LockError, match="snapshot"), locks.row_lock("late"):
                pytest.fail("the block must not run")
            assert Item.objects.count() == 0  # the outer transaction is still usable
        else:
            # MariaDB's locking reads see the newest committed row.
            with locks.row_lock("late") as row:
                assert row is not None


@pytest.fixture
def repeatable_read() -> Iterator[None]:
    """Django's connection runs its transactions under REPEATABLE READ, as with the alias's
    ``OPTIONS["isolation_level"]`` (and MariaDB's own default)."""
    with isolation_level("REPEATABLE READ"):
        yield


@NEEDS_ROW_LOCKS
def test_a_row_lock_opening_its_own_transaction_takes_a_new_name_under_repeatable_read(
    repeatable_read: None,
) -> None:
    # The block's transaction is the row lock's own: a snapshot taken before the row was
    # created is its own doing, and a fresh transaction sees the row.
    with locks.row_lock("fresh:rr") as row:
        assert row is not None and row.name == "fresh:rr"
        assert in_transaction()
    assert not in_transaction()
    assert RowLock.objects.filter(name="fresh:rr").exists()
    # Nobody holds it: SKIP LOCKED must not take the unseen new row for a held one.
    with locks.row_lock("fresh:rr:skip", skip_locked=True) as row:
        assert row is not None and row.name == "fresh:rr:skip"


@NEEDS_ROW_LOCKS
@pytest.mark.parametrize("level", ["REPEATABLE READ", "READ COMMITTED"])
def test_row_locks_of_two_new_names_do_not_block_each_other(
    level: str, start: Callable[..., Remote]
) -> None:
    # Under MariaDB REPEATABLE READ, a locking read that finds no row would lock the gap
    # around the name until the transaction ends, and block creating any name in it.
    other = start()
    with isolation_level(level), locks.row_lock("gap:1") as row:
        assert row is not None
        # Nobody holds (or creates) "gap:2": it must be free at once.
        event = other.call("hold", name="gap:2", nowait=True)
        assert event["ok"] and event["locked"], event
        other.call("commit")
        # "gap:1" itself, created in this transaction, is held.
        busy = other.call("hold", name="gap:1", nowait=True)
        assert not busy["ok"] and busy["error"] == "LockBusy", busy
        skipped = other.call("hold", name="gap:1", skip_locked=True)
        assert skipped["ok"] and not skipped["locked"], skipped
        other.call("commit")
    free = other.call("hold", name="gap:1", nowait=True)
    assert free["ok"] and free["locked"], free


# Test-only server SQL: whether another session of the test database waits for a lock
# (MariaDB's INNODB_TRX does not always list a waiting transaction; PROCESSLIST shows its
# row lock statement still running, and 200 ms leave it time to have queued).
LOCK_WAITS = {
    "postgresql": "SELECT 1 FROM pg_stat_activity "
    "WHERE datname = current_database() AND wait_event_type = 'Lock'",
    "mysql": "SELECT 1 FROM information_schema.PROCESSLIST "
    "WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND COMMAND = 'Query' "
    "AND INFO LIKE '%locks_rowlock%' AND TIME_MS > 200",
}


def until_a_session_waits() -> None:
    """Return once another session of the test database waits for a lock."""
    deadline = time.monotonic() + 60
    while True:
        with connection.cursor() as cursor:
            cursor.execute(LOCK_WAITS[connection.vendor])
            if cursor.fetchone() is not None:
                return
        assert time.monotonic() < deadline, "no session ever waited for a lock"
        time.sleep(0.02)


@NEEDS_ROW_LOCKS
@pytest.mark.xfail(
    BACKEND.creates_row_in_transaction,
    strict=True,
    reason="MariaDB: a session that waited for a new name whose creator rolled back keeps "
    "a gap lock until its transaction ends (InnoDB turns the waiting lock into one on the "
    "gap when the creator's insert goes), under READ COMMITTED too (not fixed: documented)",
)
def test_a_row_lock_taken_after_its_creator_rolled_back_does_not_block_other_new_names(
    start: Callable[..., Remote],
) -> None:
    for name in ("gap:1", "gap:9"):  # the gap between them is where the new names go
        with locks.row_lock(name):
            pass
    creator = holding(start, "gap:5")  # creates the row; not committed yet
    waiter = start()
    waiter.send("hold", name="gap:5")
    until_a_session_waits()
    creator.kill()  # the server rolls its transaction back, and its row with it
    taken = waiter.reply()
    assert taken["ok"] and taken["locked"], taken
    # Nobody holds (or creates) "gap:6": it must be free at once.
    event = start().call("hold", name="gap:6", nowait=True)
    assert event["ok"] and event["locked"], event


@pytest.mark.skipif(
    BACKEND.has_row_locks, reason="transaction modes (deferred, immediate) are SQLite's"
)
def test_sqlite_row_locks_in_deferred_transactions_wait_for_the_write_lock_too(
    start: Callable[..., Remote],
) -> None:
    holder = holding(start, "a")
    deferred = start(LOCKS_TEST_SQLITE_DEFERRED="1")
    assert "transaction_mode" not in deferred.call("options")["options"]
    busy = deferred.call("hold", name="b", nowait=True)
    assert not busy["ok"] and busy["error"] == "LockBusy", busy
    busy = deferred.call("hold", name="b", timeout=0.5)
    assert not busy["ok"] and busy["error"] == "LockBusy", busy
    assert 0.45 <= busy["elapsed"] < PROMPTLY
    skipped = deferred.call("hold", name="b", skip_locked=True)
    assert skipped["ok"] and not skipped["locked"], skipped
    holder.send("commit", delay=1.0)
    got = deferred.call("hold", name="b")
    assert got["ok"] and got["locked"], got
    assert got["at"] >= holder.reply()["committing_at"]
    with pytest.raises(locks.LockBusy), locks.row_lock("c", nowait=True):
        pass


@pytest.mark.skipif(
    BACKEND.has_row_locks, reason="transaction modes (deferred, immediate) are SQLite's"
)
def test_sqlite_lock_rows_keeps_the_querysets_nowait_and_skip_locked(
    start: Callable[..., Remote],
) -> None:
    # In a deferred transaction, lock_rows() is what takes the write lock, and so where the
    # queryset's select_for_update() flags matter.
    item = Item.objects.create(name="x")
    holder = holding(start, "a")
    holder.send("commit", delay=5.0)  # had they waited, they would have got it then
    deferred = start(LOCKS_TEST_SQLITE_DEFERRED="1")
    busy = deferred.call("hold_rows", pks=[item.pk], nowait=True, on_queryset=True)
    assert not busy["ok"] and busy["error"] == "LockBusy", busy
    skipped = deferred.call("hold_rows", pks=[item.pk], skip_locked=True, on_queryset=True)
    assert skipped["ok"] and skipped["pks"] == [], skipped
    assert holder.reply()["ok"]


# --- lock_rows -------------------------------------------------------------------------------


def test_lock_rows_returns_the_locked_objects_and_holds_them() -> None:
    items = Item.objects.bulk_create([Item(name="a", value=1), Item(name="b", value=2)])
    with transaction.atomic():
        rows = locks.lock_rows(Item.objects.filter(pk__in=[i.pk for i in items]).order_by("pk"))
        assert [(row.name, row.value) for row in rows] == [("a", 1), ("b", 2)]


def test_lock_rows_keeps_the_querysets_of_and_no_key() -> None:
    item = Item.objects.create(name="a")
    rows = Item.objects.filter(pk=item.pk).select_for_update(of=("self",), no_key=True)
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        if connection.vendor == "mysql":
            # MariaDB has neither: Django says so rather than locking otherwise than asked.
            with pytest.raises(NotSupportedError, match="not supported"):
                locks.lock_rows(rows)
            return
        assert locks.lock_rows(rows) == [item]
    sql = [q["sql"] for q in queries.captured_queries]
    if connection.vendor == "postgresql":
        table = connection.ops.quote_name(Item._meta.db_table)
        assert any(f"FOR NO KEY UPDATE OF {table}" in each for each in sql), sql
    else:  # SQLite locks the file for writing; FOR UPDATE clauses do not exist there
        assert not any("FOR " in each for each in sql), sql


def test_lock_rows_touches_no_table_but_the_querysets_own() -> None:
    # So it works on a database that has the queryset's tables but not the locks app's.
    item = Item.objects.create(name="a")
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        assert locks.lock_rows(Item.objects.filter(pk=item.pk)) == [item]
    sql = [q["sql"] for q in queries.captured_queries]
    assert sql and all(Item._meta.db_table in each for each in sql if "SAVEPOINT" not in each)
    assert not any("locks_" in each for each in sql), sql


@NEEDS_ROW_LOCKS
def test_lock_rows_nowait_timeout_and_skip_locked_against_another_process(
    start: Callable[..., Remote],
) -> None:
    held, free = Item.objects.bulk_create([Item(name="held"), Item(name="free")])
    holder = start()
    assert holder.call("hold_rows", pks=[held.pk])["pks"] == [held.pk]
    both = Item.objects.filter(pk__in=[held.pk, free.pk]).order_by("pk")
    with transaction.atomic():
        Item.objects.filter(pk=free.pk).update(value=1)
        assert [row.pk for row in locks.lock_rows(both, skip_locked=True)] == [free.pk]
        with pytest.raises(locks.LockBusy, match="Item rows"):
            locks.lock_rows(both, nowait=True)
        started = time.monotonic()
        with pytest.raises(locks.LockBusy):
            locks.lock_rows(both, timeout=0.5)
        assert 0.45 <= time.monotonic() - started < PROMPTLY
        # The failed attempts were rolled back to their savepoints; the rest stands.
        assert Item.objects.get(pk=free.pk).value == 1
    holder.send("commit", delay=1.0)
    with transaction.atomic():
        assert [row.pk for row in locks.lock_rows(both)] == [held.pk, free.pk]
        got_at = time.time()
    assert holder.reply()["committing_at"] <= got_at
    assert Item.objects.get(pk=free.pk).value == 1


@NEEDS_ROW_LOCKS
def test_lock_rows_keeps_the_querysets_nowait_and_skip_locked(
    start: Callable[..., Remote],
) -> None:
    held, free = Item.objects.bulk_create([Item(name="held"), Item(name="free")])
    holder = start()
    assert holder.call("hold_rows", pks=[held.pk])["pks"] == [held.pk]
    # Had they waited, they would have got the held row once this commits.
    holder.send("commit", delay=5.0)
    both = Item.objects.filter(pk__in=[held.pk, free.pk]).order_by("pk")
    with transaction.atomic():
        skipping = both.select_for_update(skip_locked=True)
        assert [row.pk for row in locks.lock_rows(skipping)] == [free.pk]
        with pytest.raises(locks.LockBusy, match=r"Item rows.*\(nowait\)"):
            locks.lock_rows(both.select_for_update(nowait=True))
        # The nowait attempt ran in a savepoint: the transaction and its locks carry on.
        assert Item.objects.filter(pk=free.pk).update(value=1) == 1
    assert holder.reply()["ok"]


def test_lock_rows_keeps_other_processes_out_until_the_transaction_ends(
    start: Callable[..., Remote],
) -> None:
    item = Item.objects.create(name="x")
    other = start()
    # Where there are no row locks, the database's write lock keeps every writer out (and a
    # worker's own transaction could not even begin): probe with a row lock there.
    probe: dict[str, Any] = {"op": "hold_rows", "pks": [item.pk], "nowait": True}
    if not BACKEND.has_row_locks:
        probe = {"op": "hold", "name": "probe", "nowait": True}
    with transaction.atomic():
        locks.lock_rows(Item.objects.filter(pk=item.pk))
        busy = other.call(**probe)
        assert not busy["ok"] and busy["error"] == "LockBusy", busy
        other.call("commit")
    got = other.call(**probe)
    assert got["ok"], got


# --- session settings ----------------------------------------------------------------------


def test_lock_wait_settings_do_not_leak_to_the_next_use_of_the_connection(
    start: Callable[..., Remote],
) -> None:
    before = BACKEND.lock_wait_settings(connection)
    with locks.row_lock("orders:15", timeout=5):
        # Put back right after the lock was taken, for the rest of the block too.
        assert BACKEND.lock_wait_settings(connection) == before
    assert BACKEND.lock_wait_settings(connection) == before
    holder = holding(start, "orders:14")
    with pytest.raises(locks.LockBusy), locks.row_lock("orders:14", timeout=0.3):
        pass
    assert BACKEND.lock_wait_settings(connection) == before
    with pytest.raises(locks.LockBusy), locks.row_lock("orders:14", nowait=True):
        pass
    assert BACKEND.lock_wait_settings(connection) == before
    # The next plain wait on this connection is not cut short by a leftover limit.
    holder.send("commit", delay=1.5)
    started = time.monotonic()
    with locks.row_lock("orders:14"):
        waited = time.monotonic() - started
    assert holder.reply()["ok"]
    assert waited >= 1.0


@NEEDS_ROW_LOCKS
def test_lock_rows_timeout_does_not_leak_into_the_rest_of_the_transaction(
    start: Callable[..., Remote],
) -> None:
    before = BACKEND.lock_wait_settings(connection)
    item = Item.objects.create(name="x")
    holder = start()
    holder.call("hold_rows", pks=[item.pk])
    with transaction.atomic():
        with pytest.raises(locks.LockBusy):
            locks.lock_rows(Item.objects.filter(pk=item.pk), timeout=0.3)
        assert BACKEND.lock_wait_settings(connection) == before
        free = Item.objects.create(name="free")
        assert locks.lock_rows(Item.objects.filter(pk=free.pk), timeout=5) == [free]
        assert BACKEND.lock_wait_settings(connection) == before
    assert BACKEND.lock_wait_settings(connection) == before
