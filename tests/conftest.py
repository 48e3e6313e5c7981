"""Shared fixtures: the backend under test, worker processes, statement counting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.test.utils import CaptureQueriesContext

import locks.connection
import locks.waiting
from locks.conf import conf
from tests.pgbouncer import through_pgbouncer  # noqa: F401  (LOCKS_TEST_PGBOUNCER=1)

ROOT = Path(__file__).resolve().parent.parent
BACKEND = os.environ.get("LOCKS_TEST_BACKEND", "sqlite")

#: For a test that forks while other threads run, on purpose: what the app does in such a
#: child (a pre-forking server's worker) is what it checks. Python 3.12+ warns of any such
#: fork, since the child may inherit a lock that another thread held.
forks_while_threaded = pytest.mark.filterwarnings(
    r"ignore:This process \(pid=\d+\) is multi-threaded, use of fork\(\):DeprecationWarning"
)


def pytest_configure(config: pytest.Config) -> None:
    from tests import flush

    flush.install()
    # Django deletes an old SQLite test database but not its -wal/-shm files, and SQLite
    # would replay a stale write-ahead log into the new database. Only a run on SQLite,
    # and only its Django version's files: another run may go on beside it (scripts/test
    # runs two at a time).
    if BACKEND != "sqlite":
        return
    from tests.settings import SQLITE_TAG

    for stale in (ROOT / "var").glob(f"test_{SQLITE_TAG}_*.sqlite3*"):
        stale.unlink(missing_ok=True)


@pytest.fixture(autouse=True)
def _close_own_connections() -> Iterator[None]:
    # The app's own connections outlive a test otherwise, and a server refuses to drop a
    # test database that still has sessions.
    yield
    locks.connection.close()
    locks.waiting.stop_listeners()


@pytest.fixture
def backend() -> str:
    """The backend under test: "sqlite", "postgresql" or "mariadb"."""
    return BACKEND


#: For tests on the "pooled" alias (tests/settings.py), with its databases in their
#: ``django_db`` mark: it exists where Django pools connections.
NEEDS_POOL = pytest.mark.skipif(
    BACKEND != "postgresql",
    reason="Django pools connections only on PostgreSQL (OPTIONS['pool'], psycopg 3)",
)


@pytest.fixture
def pooled() -> Iterator[str]:
    """The "pooled" alias of tests/settings.py: "default" with a pool of one connection."""
    try:
        yield "pooled"
    finally:
        locks.connection.close()
        locks.waiting.stop_listeners()
        orm = connections["pooled"]
        orm.close()
        # Django keeps the pool per alias, past its wrappers; its idle session would keep
        # the test database from being dropped, and count in other tests' sessions.
        orm.close_pool()  # type: ignore[attr-defined]  # PostgreSQL's wrapper only


def worker_env() -> dict[str, str]:
    """Environment for a worker process that uses this run's test databases."""
    names = {alias: str(connections[alias].settings_dict["NAME"]) for alias in connections}
    env = dict(os.environ)
    env.update(
        LOCKS_TEST_BACKEND=BACKEND,
        LOCKS_TEST_DB_NAMES=json.dumps(names),
        DJANGO_SETTINGS_MODULE="tests.settings",
        PYTHONPATH=str(ROOT),
    )
    return env


def spawn(
    scenario: str,
    *args: Any,
    module: str = "tests.workers",
    stdin: bool = False,
    wrap: Sequence[str] = (),
) -> subprocess.Popen[str]:
    """Start ``python -m MODULE SCENARIO ARGS...`` as a separate OS process.

    ``MODULE`` is a worker module like ``tests/workers.py``; it prints one JSON line per
    event on stdout. ``stdin``: a pipe the test writes cues to. ``wrap``: a command that
    runs it (``unshare ...``).
    """
    return subprocess.Popen(
        [*wrap, sys.executable, "-m", module, scenario, *map(str, args)],
        env=worker_env(),
        cwd=ROOT,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str], timeout: float = 300) -> list[dict[str, Any]]:
    """Wait for a worker, fail loudly if it failed, and return its JSON events."""
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"worker failed ({process.returncode}):\n{err}"
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def read_event(process: subprocess.Popen[str]) -> dict[str, Any]:
    """Read the next JSON event a running worker printed."""
    assert process.stdout is not None
    while True:
        line = process.stdout.readline()
        if not line:
            err = process.stderr.read() if process.stderr else ""
            raise AssertionError(f"worker ended without the expected event:\n{err}")
        if line.startswith("{"):
            event: dict[str, Any] = json.loads(line)
            return event


@pytest.fixture
def own_queries() -> Callable[[], CaptureQueriesContext]:
    """Capture the statements the app runs on its own connection (after it is open)."""

    def capture() -> CaptureQueriesContext:
        wrapper = locks.connection.get(conf.DATABASE)
        wrapper.ensure_connection()
        return CaptureQueriesContext(wrapper)

    return capture


@pytest.fixture
def atomic_requests() -> Iterator[None]:
    """ATOMIC_REQUESTS = True on the "default" database (the locks' and the admin's)."""
    # Django reads it per request from the live settings dict, which override_settings of
    # DATABASES would not reach.
    settings_dict = connections["default"].settings_dict
    settings_dict["ATOMIC_REQUESTS"] = True
    try:
        yield
    finally:
        settings_dict["ATOMIC_REQUESTS"] = False


_SET_ISOLATION = {
    "postgresql": "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL {}",
    "mysql": "SET SESSION TRANSACTION ISOLATION LEVEL {}",
}


@contextmanager
def isolation_level(level: str) -> Iterator[None]:
    """Django's default connection runs its transactions under ``level`` (as with the
    alias's ``OPTIONS["isolation_level"]``; REPEATABLE READ is MariaDB's own default),
    then READ COMMITTED again."""
    connection = connections["default"]
    statement = _SET_ISOLATION[connection.vendor]
    with connection.cursor() as cursor:
        cursor.execute(statement.format(level))
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(statement.format("READ COMMITTED"))
