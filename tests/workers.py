"""Worker processes for the multi-process tests: ``python -m tests.workers SCENARIO ARGS``.

Each prints JSON events, one per line, on stdout.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import django


def emit(**event: Any) -> None:
    print(json.dumps(event, default=str), flush=True)


def contend(worker: int, name: str, rounds: int, ttl: float, gate: str = "") -> None:
    """Critical sections doing a non-atomic read-modify-write, timed by the database clock.

    ``gate``: connect, report ``ready``, and begin only once that file exists, so that
    workers started one after another all contend from their first round.
    """
    from django.db import connection

    import locks
    from tests.app.models import Counter, Hold

    if gate:
        connection.ensure_connection()
        locks.connection.get("default").ensure_connection()
        emit(event="ready", worker=worker)
        while not os.path.exists(gate):
            time.sleep(0.01)
    for _ in range(rounds):
        with locks.lock(name, ttl=ttl, timeout=120) as lease:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT {_now()}", [])
                started = _aware(cursor.fetchone()[0])
            counter = Counter.objects.get(name=name)
            counter.value += 1  # deliberately not F(): a second holder would lose updates
            counter.save(update_fields=["value"])
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT {_now()}", [])
                ended = _aware(cursor.fetchone()[0])
            Hold.objects.create(
                name=name, worker=worker, token=lease.token, started=started, ended=ended
            )
    emit(event="done", worker=worker)


def _aware(value: Any) -> Any:
    from django.db import connection

    from locks.backends import for_connection

    return for_connection(connection).to_datetime(value)


def _now() -> str:
    from django.db import connection

    from locks.backends import for_connection

    return for_connection(connection).NOW


def hold(name: str, ttl: float, seconds: float, holder: str = "") -> None:
    """Acquire ``name``, report it, hold it for ``seconds``, release, report."""
    import locks

    lease = locks.acquire(name, ttl=ttl, timeout=30, holder=holder or None)
    emit(event="acquired", token=lease.token, holder=lease.holder, count=lease.count)
    time.sleep(seconds)
    try:
        lease.release()
        emit(event="released")
    except locks.LockLost as exc:
        emit(event="lost", error=str(exc))


def hold_on_cue(name: str, seconds: float) -> None:
    """Like :func:`hold`, but call acquire only when a line arrives on stdin."""
    import locks

    locks.connection.get("default").ensure_connection()
    emit(event="ready")
    sys.stdin.readline()
    lease = locks.acquire(name, ttl=30, timeout=60)
    emit(event="acquired", token=lease.token)
    time.sleep(seconds)
    lease.release()
    emit(event="released")


def acquire_only(name: str, ttl: float, holder: str = "") -> None:
    """Acquire and exit without releasing (the lease outlives the process)."""
    import locks

    lease = locks.acquire(name, ttl=ttl, timeout=30, holder=holder or None)
    emit(event="acquired", token=lease.token, holder=lease.holder, count=lease.count)


def release_as(name: str, holder: str, ttl: float) -> None:
    """Re-enter a lease shared by an explicit holder, then release that re-entry."""
    import locks

    lease = locks.acquire(name, ttl=ttl, timeout=0, holder=holder)
    emit(event="acquired", token=lease.token, count=lease.count)
    lease.release()
    emit(event="released")


def probe(name: str, using: str = "default") -> None:
    """Report whether ``name`` looks locked from another process, and try it."""
    import locks

    lease = locks.try_acquire(name, ttl=5, using=using)
    emit(event="probe", locked=lease is None)
    if lease is not None:
        lease.release()


def probe_default(name: str) -> None:
    """As ``probe``, with this thread's default holder, and report that holder."""
    import locks
    from locks.identity import default_holder

    holder = default_holder()
    lease = locks.try_acquire(name, ttl=5)
    emit(event="probe", locked=lease is None, holder=holder)
    if lease is not None:
        lease.release()


def auto_renew_exit(name: str, ttl: float) -> None:
    """Take an auto-renewing lease and end the process without releasing it."""
    import locks

    locks.acquire(name, ttl=ttl, auto_renew=True)
    emit(event="acquired")


SCENARIOS = {
    "auto_renew_exit": lambda a: auto_renew_exit(a[0], float(a[1])),
    "contend": lambda a: contend(int(a[0]), a[1], int(a[2]), float(a[3]), *a[4:]),
    "hold": lambda a: hold(a[0], float(a[1]), float(a[2]), *a[3:]),
    "hold_on_cue": lambda a: hold_on_cue(a[0], float(a[1])),
    "acquire_only": lambda a: acquire_only(a[0], float(a[1]), *a[2:]),
    "release_as": lambda a: release_as(a[0], a[1], float(a[2])),
    "probe": lambda a: probe(*a),
    "probe_default": lambda a: probe_default(*a),
}


def run(scenarios: dict[str, Callable[[list[str]], None]]) -> None:
    """Set Django up and run the scenario named on the command line with its arguments."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    scenario, *args = sys.argv[1:]
    scenarios[scenario](args)


def main() -> None:
    run(SCENARIOS)


if __name__ == "__main__":
    main()
