"""Worker processes of the Celery and reaper tests: ``python -m tests.workers_celery SCENARIO``.

Each prints JSON events, one per line, on stdout.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from tests.workers import emit, run

WAIT = 120.0


def _wait_for(path: str) -> None:
    deadline = time.monotonic() + WAIT
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.002)


def delay(broker: str, queue: str, task: str, count: int, barrier: str, *args: str) -> None:
    """After the barrier file appears, call ``task.delay(*args)`` ``count`` times."""
    import tests.celery_tasks  # noqa: F401 - registers the tasks with the app
    from tests.celery_app import make_app

    app = make_app(broker, queue)
    singleton = app.tasks[task]
    with app.connection_for_write():  # connect before the barrier, not after
        emit(event="ready")
        _wait_for(barrier)
        ids = [singleton.delay(*args).id for _ in range(count)]
    emit(event="delayed", ids=ids)


def churn(names: str, baseline: int, started: str, stop: str) -> None:
    """Acquire and release leases until the stop file appears; report the latencies.

    The first ``baseline`` acquires and any others before the ``started`` file appears
    measure the machine without the reaper; the rest are measured while it runs.
    """
    import locks

    pool = names.split(",")
    before: list[float] = []
    during: list[float] = []
    failures: list[str] = []
    locks.acquire(pool[0], ttl=30, timeout=60).release()  # connect before measuring
    emit(event="ready")
    index = 0
    while not os.path.exists(stop):
        latencies = during if os.path.exists(started) else before
        name = pool[index % len(pool)]
        index += 1
        began = time.monotonic()
        try:
            lease = locks.acquire(name, ttl=30, timeout=60)
        except Exception as exc:
            failures.append(f"{name}: {exc!r}")
            continue
        latencies.append(time.monotonic() - began)
        lease.release()
        time.sleep(0.001)  # a busy application, not a loop that saturates the database
        if latencies is before and len(before) == baseline:
            emit(event="baseline")
    emit(
        event="churned",
        failures=failures,
        before=len(before),
        during=len(during),
        longest_before=max(before, default=0.0),
        longest_during=max(during, default=0.0),
    )


def reap(batch_size: int, started: str) -> None:
    """Run the reaper's batches until no expired rows are left; report each batch's time."""
    from locks.tasks import reap as run_reaper

    Path(started).touch()
    report = run_reaper(batch_size, time_budget=float("inf"))  # no budget: until done
    emit(
        event="reaped",
        deleted=report.deleted,
        batches=report.batches,
        longest_batch=report.longest_batch,
        elapsed=report.elapsed,
    )


def renewing_holder(name: str, ttl: float, stop: str) -> None:
    """Hold ``name`` with auto-renew until the stop file appears; report whether it held."""
    import locks

    lease = locks.acquire(name, ttl=ttl, timeout=30, auto_renew=True)
    emit(event="acquired", token=lease.token)
    _wait_for(stop)
    lost = lease.lost
    try:
        lease.release()
        emit(event="released", lost=lost)
    except locks.LockLost as exc:
        emit(event="released", lost=True, error=str(exc))


SCENARIOS: dict[str, Any] = {
    "delay": lambda a: delay(a[0], a[1], a[2], int(a[3]), a[4], *a[5:]),
    "churn": lambda a: churn(a[0], int(a[1]), a[2], a[3]),
    "reap": lambda a: reap(int(a[0]), a[1]),
    "renewing_holder": lambda a: renewing_holder(a[0], float(a[1]), a[2]),
}


def main() -> None:
    run(SCENARIOS)


if __name__ == "__main__":
    main()
