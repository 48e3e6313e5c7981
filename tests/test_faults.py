"""Faults injected into real lock holders (OS processes), each run checked for violations."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections, transaction

import locks
from locks.models import Lock
from tests.app.models import FencedRecord
from tests.faults import Worker, kill_session, verify, wait_until_waiting
from tests.history import ERROR, LOST, OK, STALE, load
from tests.pgbouncer import ENABLED as PGBOUNCER
from tests.test_restart import restart_server
from tests.workers_reliability import Client

pytestmark = pytest.mark.django_db(transaction=True)

NO_SERVER = "SQLite has no server that could end a session or restart"


@pytest.fixture
def history(tmp_path: Path) -> Iterator[Path]:
    """A directory for the run's history files; its workers are killed at the end."""
    yield tmp_path


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.close()


def start(workers: list[Worker], history: Path, proc: str, *args: Any) -> Worker:
    worker = Worker(history, proc, *args)
    workers.append(worker)
    return worker


def records(*names: str) -> None:
    """The fenced resources the holders write to: one record per lock name."""
    FencedRecord.objects.bulk_create([FencedRecord(key=name) for name in names])


def test_a_sigkilled_lease_holder_keeps_the_lock_until_its_ttl_then_the_next_token_is_higher(
    history: Path, workers: list[Worker]
) -> None:
    records("orders:1")
    gate = history / "gate"
    a = start(workers, history, "a", "hold", "--name", "orders:1", "--ttl", 1.5, "--gate", gate)
    held = a.event()
    assert held["wrote"] == OK
    a.send(signal.SIGKILL)
    test = Client(str(history), "test")
    test.recorder.event("kill", "orders:1", target="a")

    # A lease outlives its holder: the row is the dead holder's until the TTL runs out.
    row = Lock.objects.get(name="orders:1")
    assert row.token == held["token"] and locks.is_locked("orders:1")
    _, lease = test.run("acquire", "orders:1", lambda: locks.acquire("orders:1", timeout=30))
    assert lease is not None
    assert lease.token > held["token"]
    assert lease.acquired_at >= datetime.fromisoformat(held["expires_at"])
    assert test.write("orders:1", lease.token) == OK
    test.run("release", "orders:1", lease.release, lease=lease)
    verify(history, "SIGKILL lease holder", 1)


def test_a_sigkilled_row_lock_holder_frees_the_row_at_once(
    history: Path, workers: list[Worker]
) -> None:
    gate = history / "gate"
    a = start(workers, history, "a", "row_hold", "--name", "orders:1", "--gate", gate)
    assert a.event()["event"] == "held"
    b = start(workers, history, "b", "row_hold", "--name", "orders:1", "--gate", gate)
    assert b.poll_event(1.0) is None, "b got the row lock while a held it"
    a.send(signal.SIGKILL)
    Client(str(history), "test").recorder.event("kill", "orders:1", target="a")
    killed = time.monotonic()
    # Row locks have no TTL: the server ends the dead client's transaction, and its lock.
    assert b.event(timeout=60)["event"] == "held"
    assert time.monotonic() - killed < 30
    gate.touch()
    assert b.event()["event"] == "released"
    b.finish()
    report = verify(history, "SIGKILL row-lock holder", 1)
    assert report.by_op["row_lock"] == 2


def test_a_holder_paused_past_its_ttl_learns_it_lost_and_its_fenced_writes_are_refused(
    history: Path, workers: list[Worker]
) -> None:
    records("orders:1")
    gate = history / "gate"
    args = ["--name", "orders:1", "--ttl", 1.0, "--gate", gate, "--auto-renew"]
    a = start(workers, history, "a", "hold", *args, "--steps", "write,renew,release")
    held = a.event()
    assert held["wrote"] == OK
    # The whole process stops, auto-renew watchdog and all: a GC pause, swapping, a VM
    # migration. Its lease runs out meanwhile and a new holder takes over and writes.
    a.send(signal.SIGSTOP)
    test = Client(str(history), "test")
    test.recorder.event("stop", "orders:1", target="a")
    _, lease = test.run("acquire", "orders:1", lambda: locks.acquire("orders:1", timeout=30))
    assert lease is not None and lease.token > held["token"]
    assert test.write("orders:1", lease.token) == OK
    gate.touch()
    a.send(signal.SIGCONT)
    test.recorder.event("cont", "orders:1", target="a")

    after = a.event()
    assert (after["write"], after["renew"], after["release"]) == (STALE, LOST, LOST)
    assert FencedRecord.objects.get(key="orders:1").fence == lease.token
    test.run("release", "orders:1", lease.release, lease=lease)
    a.finish()
    verify(history, "SIGSTOP holder past its TTL", 1)


@pytest.mark.skipif(PGBOUNCER, reason="PgBouncer gives a client no server session of its own")
def test_a_holder_whose_session_the_server_ends_gets_a_clear_error_and_recovers(
    history: Path, workers: list[Worker], backend: str
) -> None:
    if backend == "sqlite":
        pytest.skip(NO_SERVER)
    records("orders:1")
    gate = history / "gate"
    a = start(
        workers,
        history,
        "a",
        "hold",
        "--name",
        "orders:1",
        "--ttl",
        2.0,
        "--gate",
        gate,
        "--session",
        "--steps",
        "renew,renew_again",
    )
    session = a.event()["session"]
    held = a.event()
    kill_session(session)
    gate.touch()
    after = a.event()
    # The renewal on the dead session fails with the server's error, naming the lock;
    # the next call opens a new session and the lease, intact, is renewed.
    assert (after["renew"], after["renew_again"]) == (ERROR, OK)
    assert len(after["errors"]) == 1
    assert "while trying to renew lock 'orders:1'" in after["errors"][0]
    a.finish()
    row = Lock.objects.get(name="orders:1")
    assert (row.token, row.count) == (held["token"], 1)
    # Its process is gone without releasing: the lock is free once the TTL runs out.
    test = Client(str(history), "test")
    _, lease = test.run("acquire", "orders:1", lambda: locks.acquire("orders:1", timeout=30))
    assert lease is not None and lease.token > held["token"]
    assert lease.acquired_at >= row.expires_at
    test.run("release", "orders:1", lease.release, lease=lease)
    verify(history, "server ends the holder's session", 1)


@pytest.mark.skipif(PGBOUNCER, reason="PgBouncer gives a client no server session of its own")
def test_a_session_ended_in_the_middle_of_a_takeover_leaves_the_row_as_it_was(
    history: Path, workers: list[Worker], backend: str
) -> None:
    if backend == "sqlite":
        pytest.skip(NO_SERVER)
    old = locks.acquire("orders:1", ttl=0.05, holder="old")
    time.sleep(0.1)
    gate = history / "gate"
    with transaction.atomic():
        with connection.cursor() as cursor:  # the takeover has to wait for this row lock
            cursor.execute("SELECT 1 FROM locks_lock WHERE name = %s FOR UPDATE", ["orders:1"])
        a = start(workers, history, "a", "hold", "--name", "orders:1", "--gate", gate, "--session")
        session = a.event()["session"]
        wait_until_waiting(session)
        kill_session(session)
        failed = a.event()
    assert failed["event"] == "not_acquired" and failed["result"] == ERROR
    assert "while trying to acquire lock 'orders:1'" in failed["errors"][0]
    a.finish()
    row = Lock.objects.get(name="orders:1")
    assert (row.holder, row.token, row.count) == ("old", old.token, 1)
    lease = locks.acquire("orders:1", timeout=0)
    assert lease.token > old.token
    lease.release()
    verify(history, "server ends a session mid-statement", 1)


SKEWS = (-300, 300, -120, 120)  # seconds: app servers five and two minutes off


def test_app_clocks_skewed_by_minutes_both_ways_change_nothing(
    history: Path, workers: list[Worker]
) -> None:
    names = [f"skew{i}" for i in range(2)]
    records(*names)
    for i, skew in enumerate(SKEWS):
        start(
            workers,
            history,
            f"w{i}",
            "contend",
            "--prefix",
            "skew",
            "--names",
            len(names),
            "--seconds",
            6,
            "--seed",
            i,
            "--skew",
            skew,
            "--late",
            0.4,
        )
    done = [worker.finish()[-1] for worker in workers]
    now = datetime.now(UTC)
    for event, skew in zip(done, SKEWS, strict=True):
        app_clock = datetime.fromisoformat(event["app_clock"])
        assert abs(app_clock - now - timedelta(seconds=skew)) < timedelta(seconds=60)
    report = verify(history, "app clocks skewed ±2 and ±5 min", len(SKEWS))
    ops = load(history.glob("*.jsonl"))
    # Leases (abandoned or overstayed) ran out by the database clock while the
    # processes' clocks disagreed by up to ten minutes.
    assert any(op.result == LOST for op in ops), report
    # Skewed app clocks are no fault of the database's: no operation may fail with an error.
    errors = [f"{op.op} {op.name}: {op.error}" for op in ops if op.result == ERROR]
    assert not errors, errors[:5]
    # Liveness, not speed: with 40 % of the leases abandoned or overstayed, each name is
    # busy for a whole TTL at a time, so a loaded machine sees as few as 9 holdings in 6 s.
    assert report.holdings >= 2 * len(names), report


def wait_for_progress(history: Path, procs: list[str], after: float, seconds: float = 120) -> None:
    """Wait until every process has had a few successful operations begun after ``after``."""
    deadline = time.monotonic() + seconds
    while True:
        ops = load(history.glob("*.jsonl"))
        done = Counter(op.proc for op in ops if op.result == OK and op.m0 > after)
        if all(done[proc] >= 5 for proc in procs):
            return
        assert time.monotonic() < deadline, f"no progress after the restart: {done}"
        time.sleep(0.5)


def test_processes_contending_through_a_server_restart_recover_and_tokens_keep_rising(
    history: Path, workers: list[Worker], backend: str
) -> None:
    if backend == "sqlite":
        pytest.skip(NO_SERVER)
    records(*(f"restart{i}" for i in range(3)))
    stop = history / "stop"
    procs = [f"w{i}" for i in range(4)]
    for i, proc in enumerate(procs):
        args = ["--prefix", "restart", "--names", 3, "--seconds", 300, "--stop", stop]
        start(workers, history, proc, "contend", *args, "--seed", i, "--breaks", 0)
    wait_for_progress(history, procs, after=0)
    test = Client(str(history), "test")
    test.recorder.event("restart", "*")
    before = time.monotonic()
    restart_server(backend)
    connections.close_all()  # this test's own sessions ended with the server too
    restarted = time.monotonic()
    # The same processes, without a restart of their own, carry on.
    wait_for_progress(history, procs, after=restarted)
    stop.touch()
    for worker in workers:
        worker.finish()
    verify(history, "database server restart", 1)

    ops = load(history.glob("*.jsonl"))
    # Fresh holdings only: a re-entry (count > 1) keeps its holding's token by design,
    # and the workers re-enter leases they abandoned, also across the restart.
    grants = [
        op for op in ops if op.op == "acquire" and op.result == OK and op.token and op.count == 1
    ]
    earlier = max(op.token or 0 for op in grants if op.end < before)
    later = min(op.token or 0 for op in grants if op.m0 > restarted)
    assert later > earlier
    errors = [op for op in ops if op.result == ERROR]
    assert errors, "the restart went unnoticed"
    for op in errors:
        # Every error is the database's own, and a lock call's names the lock.
        assert op.error.startswith(("OperationalError", "InterfaceError")), op.error
        if op.op != "write":
            assert "locks: while trying to" in op.error, op.error
            assert f"lock {op.name!r} on database 'default'" in op.error, op.error
