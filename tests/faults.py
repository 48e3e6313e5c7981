"""Fault-injection helpers: recorded worker processes, server-side session kills, verdicts."""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction

from tests.conftest import BACKEND
from tests.history import load
from tests.history_check import Report, check, summarize
from tests.pgbouncer import ENABLED as PGBOUNCER
from tests.processes import EventProcess

#: Test-only server SQL, per ``connection.vendor`` (the one place that branches on it).
SESSIONS = {
    # Sessions of the test database other than the caller's own.
    "postgresql": "SELECT pid FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()",
    "mysql": "SELECT ID FROM information_schema.PROCESSLIST "
    "WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND COMMAND <> 'Killed'",
}
KILL = {"postgresql": "SELECT pg_terminate_backend(%s)", "mysql": "KILL %s"}
# Blocks writes to one name's row (SQLite's only lock is the file's: every write waits).
LOCK_ROW = {
    "postgresql": "SELECT 1 FROM locks_lock WHERE name = %s FOR UPDATE",
    "mysql": "SELECT 1 FROM locks_lock WHERE name = %s FOR UPDATE",
    "sqlite": "UPDATE locks_lock SET note = note WHERE name = %s",
}
# Every statement on the lock table waits while these are held (and the lock's end).
LOCK_TABLE = {
    "postgresql": ("LOCK TABLE locks_lock IN ACCESS EXCLUSIVE MODE", None),
    "mysql": ("LOCK TABLES locks_lock WRITE", "UNLOCK TABLES"),
    "sqlite": ("UPDATE locks_lock SET note = note", None),  # readers still read
}
# Whether a session is in the middle of a lock statement that waits (PostgreSQL: for a
# lock; MariaDB's INNODB_TRX does not always list the waiting statement, PROCESSLIST does).
WAITING = {
    "postgresql": "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
    "mysql": "SELECT 1 FROM information_schema.PROCESSLIST "
    "WHERE ID = %s AND COMMAND = 'Query' AND INFO LIKE '%%locks_lock%%' AND TIME_MS > 200",
}


class Worker(EventProcess):
    """A ``tests.workers_reliability`` process recording into ``history``.

    Example::

        worker = Worker(history, "a", "hold", "--name", "x", "--gate", gate)
        held = worker.event()
    """

    def __init__(self, history: Path, proc: str, scenario: str, *args: Any) -> None:
        self.proc = proc
        command = [sys.executable, "-m", "tests.workers_reliability", scenario]
        command += ["--history", str(history), "--proc", proc, *map(str, args)]
        super().__init__(command, open(history / f"{proc}.stderr", "w+"))  # noqa: SIM115

    def event(self, timeout: float = 120) -> dict[str, Any]:
        """The next event the worker printed; fails with its stderr if it ended instead."""
        try:
            event = self._events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"{self.proc}: no event in {timeout} s:\n{self.errors()}"
            ) from None
        if event is None:
            raise AssertionError(f"{self.proc} ended ({self.process.wait()}):\n{self.errors()}")
        return event

    def poll_event(self, timeout: float) -> dict[str, Any] | None:
        """The next event if one comes within ``timeout`` seconds, else ``None``."""
        try:
            return self._events.get(timeout=timeout)
        except queue.Empty:
            return None

    def send(self, sig: int) -> None:
        os.kill(self.pid, sig)
        if sig == signal.SIGKILL:
            self.process.wait(timeout=60)

    def finish(self, timeout: float = 300) -> list[dict[str, Any]]:
        """Wait for the end; fail with its stderr unless it exited cleanly; its last events."""
        code = self.process.wait(timeout=timeout)
        assert code == 0, f"{self.proc} failed ({code}):\n{self.errors()}"
        events = []
        while (event := self._events.get(timeout=10)) is not None:
            events.append(event)
        return events

    def close(self) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGKILL)
            self.process.wait(timeout=60)
        self._stderr.close()


def verify(history: Path, fault: str, injected: int) -> Report:
    """Check every history in ``history`` and the lock rows left; log it for the docs."""
    from locks.models import Lock

    final = list(Lock.objects.values_list("name", "token"))
    report = check(load(sorted(history.glob("*.jsonl"))), final)
    summarize(fault, BACKEND + ("+pgbouncer" if PGBOUNCER else ""), injected, report)
    report.assert_clean()
    return report


def kill_session(session: int) -> None:
    """End another session of the test database from the server side."""
    with connection.cursor() as cursor:
        cursor.execute(KILL[connection.vendor], [session])


def other_sessions() -> list[int]:
    """Server session ids of every other connection to the test database."""
    with connection.cursor() as cursor:
        cursor.execute(SESSIONS[connection.vendor])
        return [int(row[0]) for row in cursor.fetchall()]


def wait_until_waiting(session: int, seconds: float = 30) -> None:
    """Wait until ``session`` is stuck in a lock statement (waiting for another transaction)."""
    deadline = time.monotonic() + seconds
    while True:
        with connection.cursor() as cursor:
            cursor.execute(WAITING[connection.vendor], [session])
            if cursor.fetchone() is not None:
                return
        assert time.monotonic() < deadline, f"session {session} never waited for a lock"
        time.sleep(0.05)


class Holding(threading.Thread):
    """A thread that holds a lock from a transaction of another connection for a while.

    Example::

        holding = Holding("default", "LOCK TABLE locks_lock", [], 5.0)
        holding.end()  # lets go now, not after 5 s
        holding.join()
    """

    def __init__(
        self, using: str, take: str, params: list[Any], seconds: float, end: str | None = None
    ) -> None:
        super().__init__()
        self.using, self.take, self.params, self.seconds, self.ending = (
            using, take, params, seconds, end,
        )  # fmt: skip
        self.ready = threading.Event()
        self.over = threading.Event()
        self.start()
        assert self.ready.wait(10)

    def run(self) -> None:
        held = connections[self.using]  # this thread's own
        with transaction.atomic(using=self.using), held.cursor() as cursor:
            cursor.execute(self.take, self.params)
            self.ready.set()
            self.over.wait(self.seconds)
            if self.ending:
                cursor.execute(self.ending)
        held.close()

    def end(self) -> None:
        """Let go now, before its time is up."""
        self.over.set()


def hold_write_lock(name: str, seconds: float, using: str = DEFAULT_DB_ALIAS) -> Holding:
    """Block writes to lock ``name``'s row on database ``using`` from another connection
    for ``seconds``.

    On SQLite, whose only lock is the file's write lock, every write waits.
    """
    return Holding(using, LOCK_ROW[connections[using].vendor], [name], seconds)


def hold_table_lock(seconds: float) -> Holding:
    """Block every write to the lock table (on SQLite: to the file) for ``seconds``,
    from a transaction of another connection.

    Example::

        thread = hold_table_lock(5.0)
    """
    take, end = LOCK_TABLE[connection.vendor]
    return Holding(DEFAULT_DB_ALIAS, take, [], seconds, end)
