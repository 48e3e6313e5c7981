"""The app's own connections are sessions of their own, whatever the alias's settings say."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.core.signals import request_finished, request_started
from django.db import connections, transaction

import locks
import locks.connection
from locks.models import Lock
from tests.app.models import Counter
from tests.conftest import BACKEND, NEEDS_POOL, ROOT, worker_env
from tests.faults import hold_write_lock, kill_session, other_sessions
from tests.pgbouncer import ENABLED as PGBOUNCER
from tests.remote import remotes
from tests.workers_reliability import SESSION_ID


def _pool_checkouts(alias: str) -> int:
    pool = connections[alias].pool  # type: ignore[attr-defined]  # PostgreSQL's wrapper only
    return int(pool.get_stats().get("requests_num", 0))


@NEEDS_POOL
@pytest.mark.django_db(transaction=True, databases=["default", "pooled"])
def test_lock_calls_work_while_the_orm_holds_the_pools_only_connection(pooled: str) -> None:
    with transaction.atomic(using=pooled):
        Counter.objects.using(pooled).create(name="holds-the-slot")
        lease = locks.acquire("orders:1", ttl=30, timeout=0, using=pooled)
        assert locks.is_locked("orders:1", using=pooled)
        lease.renew()
        lease.release()
        # The watchdog renews from a thread of its own, on a connection of its own.
        with locks.lock("orders:2", ttl=0.6, auto_renew=True, using=pooled) as renewed:
            time.sleep(1.2)
            assert locks.check_token("orders:2", renewed.token, using=pooled)
    assert _pool_checkouts(pooled) == 1, "only the ORM's connection came from the pool"


@NEEDS_POOL
@pytest.mark.django_db(transaction=True, databases=["default", "pooled"])
def test_orm_connections_from_the_pool_do_not_get_the_lock_connections_options(
    pooled: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import psycopg

    # Room for the ORM even if lock calls took a pooled connection too.
    monkeypatch.setitem(connections.settings[pooled]["OPTIONS"]["pool"], "max_size", 2)
    # A lock call first: had its connection made the alias's pool, the pool would open
    # every ORM connection with the lock connection's options (server-side binding,
    # prepared statements).
    locks.acquire("orders:1", ttl=30, using=pooled).release()
    assert Counter.objects.using(pooled).count() == 0
    orm = connections[pooled].connection
    assert issubclass(orm.cursor_factory, psycopg.ClientCursor), "Django's default binding"
    assert orm.prepare_threshold is None
    assert _pool_checkouts(pooled) == 1, "only the ORM's connection came from the pool"


@pytest.mark.django_db(transaction=True, databases=["default", "manual"])
def test_a_lease_on_an_alias_without_autocommit_is_seen_by_other_processes() -> None:
    lease = locks.acquire("orders:1", ttl=30, using="manual")
    with remotes() as start:
        other = start()  # on "default": the same database
        # A read first: it never waits, where an acquire would queue behind an open
        # transaction that has written the row.
        seen = other.call("check_token", name="orders:1", token=lease.token)
        assert seen["ok"] and seen["live"], seen
        refused = other.call("try_acquire", name="orders:1")
        assert refused["ok"] and not refused["acquired"], refused
        lease.release()
        granted = other.call("try_acquire", name="orders:1")
        assert granted["ok"] and granted["acquired"], granted


class _Thread:
    """Run ``work`` in a new thread, whose connections are made with the settings as they
    are when it runs; :meth:`result` returns what it returned or raises its error."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self._work = work
        self._outcome: list[tuple[bool, Any]] = []
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._outcome.append((True, self._work()))
        except BaseException as exc:  # handed to the test's thread
            self._outcome.append((False, exc))
        finally:
            connections.close_all()  # the thread's ORM connections, as Django would

    def result(self, timeout: float = 120) -> Any:
        self._thread.join(timeout)
        assert self._outcome, "the thread did not finish"
        ok, value = self._outcome[0]
        if not ok:
            raise value
        return value


@pytest.mark.skipif(BACKEND != "mariadb", reason="MariaDB's CLIENT.FOUND_ROWS client flag")
@pytest.mark.django_db(transaction=True)
def test_a_renew_that_keeps_the_expiry_holds_on_whatever_client_flag_the_alias_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from MySQLdb.constants import CLIENT

    # An alias's OPTIONS["client_flag"] (here for multi-statement scripts) replaces Django's
    # default FOUND_ROWS: a session without it counts changed rows, not matched ones.
    settings_dict = connections.settings["default"]
    options = {**(settings_dict.get("OPTIONS") or {}), "client_flag": CLIENT.MULTI_STATEMENTS}
    monkeypatch.setitem(settings_dict, "OPTIONS", options)

    def renew_shorter() -> bool:
        try:
            lease = locks.acquire("orders:1", ttl=60)
            # The expiry stays as it is (renew never shortens a lease): no row changes.
            lease.renew(ttl=5)
            held = lease.held
            lease.release()
            return held
        finally:
            locks.connection.close()  # made with this test's settings: not for later ones

    assert _Thread(renew_shorter).result() is True


def _session_of(wrapper: Any) -> int:
    with wrapper.cursor() as cursor:
        cursor.execute(SESSION_ID[wrapper.vendor])
        return int(cursor.fetchone()[0])


@pytest.mark.skipif(PGBOUNCER, reason="PgBouncer gives a client no server session of its own")
@pytest.mark.django_db(transaction=True)
def test_a_request_after_the_lock_connections_session_ended_gets_a_healthy_one(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Persistent connections with health checks: Django checks each connection before its
    # first use in a request, and so must the app for its own.
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", None)
    monkeypatch.setitem(connections.settings["default"], "CONN_HEALTH_CHECKS", True)

    def two_requests() -> tuple[int, int]:
        request_started.send(sender=None)
        locks.acquire("orders:1", ttl=30).release()
        own = locks.connection.get("default")
        first = own.connection
        request_finished.send(sender=None)
        assert own.connection is first, "CONN_MAX_AGE=None: kept between requests"
        if backend != "sqlite":  # SQLite has no server session to end
            session = _session_of(own)
            kill_session(session)
            deadline = time.monotonic() + 10
            while session in other_sessions():
                assert time.monotonic() < deadline, "the session did not end"
                time.sleep(0.05)
        request_started.send(sender=None)
        lease = locks.acquire("orders:1", ttl=30)  # raised OperationalError before
        assert locks.check_token("orders:1", lease.token)
        lease.release()
        assert not locks.is_locked("orders:1")
        request_finished.send(sender=None)
        return id(first), id(own.connection)

    # In a thread of its own: this thread's connection would keep the patched settings.
    first, second = _Thread(two_requests).result()
    if backend == "sqlite":
        assert second == first, "a healthy connection is kept"
    else:
        assert second != first, "the ended session was replaced"


@pytest.mark.django_db(transaction=True, databases=["default", "impatient"])
def test_blocked_acquires_outlast_a_statement_timeout_shorter_than_their_wait(
    backend: str,
) -> None:
    # "impatient" cancels any statement after 0.5 s (tests/settings.py). On PostgreSQL the
    # second of two blocked acquires waits behind the first in the queue of the name, in
    # one statement, for longer than that.
    timeout_setting = {
        "postgresql": "SELECT current_setting('statement_timeout')",
        "mysql": "SELECT @@max_statement_time",
    }
    holding = locks.acquire("orders:1", ttl=30, holder="alice")

    def wait() -> tuple[str, float, int]:
        own = locks.connection.get("impatient")
        limit = ""
        if own.vendor in timeout_setting:
            with own.cursor() as cursor:
                cursor.execute(timeout_setting[own.vendor])
                limit = str(cursor.fetchone()[0])
        began = time.monotonic()
        lease = locks.acquire("orders:1", ttl=30, timeout=20, using="impatient")
        waited = time.monotonic() - began
        time.sleep(0.1)  # the other waiter is still blocked meanwhile
        lease.release()
        return limit, waited, lease.token

    waiters = [_Thread(wait)]
    time.sleep(0.3)  # the first is at the head of the queue, the second waits behind it
    waiters.append(_Thread(wait))
    time.sleep(1.5)  # three statement timeouts
    holding.release()
    results = [waiter.result() for waiter in waiters]
    # Through PgBouncer, "impatient" has no session setting of its own.
    options = {
        alias: connections[alias].settings_dict["OPTIONS"] for alias in ("impatient", "default")
    }
    if backend != "sqlite" and options["impatient"] != options["default"]:
        assert {limit for limit, _, _ in results} <= {"500ms", "0.500000", "0.5"}, results
    assert all(waited >= 1.4 for _, waited, _ in results), "both waited for the release"
    assert len({token for _, _, token in results}) == 2
    assert min(token for _, _, token in results) > holding.token
    assert not locks.is_locked("orders:1")


FORK = """
import json, os, sys, threading
import django
django.setup()
import locks

lease = locks.acquire("orders:parent", ttl=30)
# Another thread's connection is inherited too (its thread is not, in the child).
asked, done = threading.Event(), threading.Event()
def other_thread():
    locks.is_locked("orders:other")
    asked.set()
    done.wait(60)
    locks.acquire("orders:other", ttl=30).release()
thread = threading.Thread(target=other_thread)
thread.start()
asked.wait(60)
children = []
for uses_a_lock in (False, True):
    pid = os.fork()
    if pid == 0:
        if uses_a_lock:
            with locks.lock("orders:child", ttl=30) as own:
                print(json.dumps({"child_token": own.token}), flush=True)
        sys.exit(0)  # a normal exit: the interpreter shuts down and frees what it has
    children.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    assert locks.check_token("orders:parent", lease.token)
done.set()
thread.join()
lease.release()
print(json.dumps({"children": children, "released": not locks.is_locked("orders:parent")}))
"""


@pytest.mark.django_db(transaction=True)
def test_forked_children_that_exit_normally_leave_the_parents_sessions_alone() -> None:
    done = subprocess.run(
        [sys.executable, "-c", FORK],
        env=worker_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr  # the children's stderr too
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert events[-1] == {"children": [0, 0], "released": True}, events
    assert len([event for event in events if "child_token" in event]) == 1, events
    assert not locks.is_locked("orders:child")


class Interrupted(Exception):
    """What a signal handler raises in the middle of a call (as a soft time limit does)."""


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted


@pytest.mark.django_db(transaction=True)
def test_a_lock_call_interrupted_mid_statement_leaves_its_thread_a_working_connection(
    backend: str,
) -> None:
    outer = locks.acquire("interrupt:outer", ttl=60)
    # An expired holding, which the interrupted acquire takes over once it may write.
    locks.acquire("interrupt:x", ttl=0.2, holder="gone")
    time.sleep(0.3)
    blocker = hold_write_lock("interrupt:x", 1.5)
    previous = signal.signal(signal.SIGALRM, _raise_interrupted)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        # Interrupted while its statement waits (PostgreSQL) or right after the statement
        # returns, before its result is read (MariaDB, SQLite: their drivers wait in C).
        with pytest.raises(Interrupted):
            locks.try_acquire("interrupt:x", ttl=60)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    blocker.join()
    if backend == "sqlite":
        # The grant's statement left unfinished would keep the file's write lock.
        other = sqlite3.connect(connections["default"].settings_dict["NAME"], timeout=1)
        other.execute("BEGIN IMMEDIATE")
        other.rollback()
        other.close()
    # The thread's next lock calls work (not "another command is already in progress" or
    # "commands out of sync" on a connection left mid-statement).
    outer.release()
    assert locks.try_acquire("interrupt:after", ttl=60) is not None
    holding = Lock.objects.filter(name="interrupt:x").values_list("holder", flat=True).first()
    if backend in ("postgresql", "pgbouncer"):
        # The interrupted statement was cancelled: no grant that nobody holds. (MariaDB's
        # and SQLite's drivers return only once the statement has run: its grant stays
        # until its TTL ends, as a crashed client's would.)
        assert holding == "gone", holding
    else:
        assert holding is not None
