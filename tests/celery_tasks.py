"""De-duplicated Celery tasks that the tests run on real workers; each run leaves a CeleryRun row.

A task that takes a ``gate`` (a file path) keeps running until the test creates that file,
so the test decides how long a run stays queued or running.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded

from locks.celery import SingletonTask

GATE_TIMEOUT = 120.0


def _record(task: Any, label: str) -> Any:
    from tests.app.models import CeleryRun

    return CeleryRun.objects.create(
        label=label, task_id=task.request.id, pid=os.getpid(), retries=task.request.retries
    )


def _wait_for(gate: str) -> None:
    deadline = time.monotonic() + GATE_TIMEOUT
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate} was never opened")
        time.sleep(0.02)


@shared_task(bind=True, base=SingletonTask, name="tests.record")
def record(self: SingletonTask, label: str, gate: str = "") -> str:
    """Record a run, wait for the gate, mark the run finished."""
    run = _record(self, label)
    if gate:
        _wait_for(gate)
    run.finished = True
    run.save(update_fields=["finished"])
    return label


@shared_task(bind=True, base=SingletonTask, name="tests.fail")
def fail(self: SingletonTask, label: str) -> None:
    """Record a run, then raise."""
    _record(self, label)
    raise RuntimeError(f"task {label} failed on purpose")


@shared_task(
    bind=True,
    base=SingletonTask,
    name="tests.retry_then_fail",
    max_retries=2,
    default_retry_delay=2,
)
def retry_then_fail(self: SingletonTask, label: str) -> None:
    """Record a run and ask for a retry, until the retries run out."""
    _record(self, label)
    raise self.retry(exc=RuntimeError(f"task {label} gave up"))


def _retry_after_gate(task: Any, label: str, gate: str) -> str:
    """Record a run; a first one with a gate waits for it (its 2 s lease may run out
    meanwhile) and then asks for a retry, which records and returns."""
    _record(task, label)
    if task.request.retries or not gate:
        return label
    _wait_for(gate)
    raise task.retry(countdown=0)


@shared_task(
    bind=True,
    base=SingletonTask,
    name="tests.retry_after_gate",
    lock_key="retry-after-gate:{label}",
    lock_ttl=2.0,
)
def retry_after_gate(self: SingletonTask, label: str, gate: str = "") -> str:
    """See :func:`_retry_after_gate`; duplicates get the queued run's result."""
    return _retry_after_gate(self, label, gate)


@shared_task(
    bind=True,
    base=SingletonTask,
    name="tests.retry_after_gate_or_raise",
    lock_key="retry-after-gate:{label}",
    lock_ttl=2.0,
    on_duplicate="raise",
)
def retry_after_gate_or_raise(self: SingletonTask, label: str, gate: str = "") -> str:
    """See :func:`_retry_after_gate`; duplicates raise."""
    return _retry_after_gate(self, label, gate)


@shared_task(bind=True, base=SingletonTask, name="tests.retry_without_throw")
def retry_without_throw(self: SingletonTask, label: str) -> str:
    """Record a run; the first queues its retry (in 5 s) with ``throw=False`` and goes on."""
    run = _record(self, label)
    if not self.request.retries:
        self.retry(countdown=5, throw=False)
    run.finished = True
    run.save(update_fields=["finished"])
    return label


@shared_task(bind=True, base=SingletonTask, name="tests.hang", lock_ttl=2.0)
def hang(self: SingletonTask, label: str, gate: str) -> None:
    """Record a run and wait for the gate (the test kills the worker process meanwhile)."""
    _record(self, label)
    _wait_for(gate)


@shared_task(
    bind=True, base=SingletonTask, name="tests.hang_acks_late", acks_late=True, lock_ttl=60.0
)
def hang_acks_late(self: SingletonTask, label: str, gate: str) -> None:
    """Like ``record``, acknowledged only when the run ends: a run whose worker dies is
    redelivered. The lease (60 s) outlives the wait for the redelivery."""
    run = _record(self, label)
    _wait_for(gate)
    run.finished = True
    run.save(update_fields=["finished"])


@shared_task(
    bind=True,
    base=SingletonTask,
    name="tests.record_or_raise",
    on_duplicate="raise",
    lock_key="report:{report_id}",
)
def record_or_raise(self: SingletonTask, report_id: int, gate: str = "") -> None:
    """Like ``record``, keyed by report id only, raising on duplicates."""
    run = _record(self, f"report:{report_id}")
    if gate:
        _wait_for(gate)
    run.finished = True
    run.save(update_fields=["finished"])


@shared_task(
    bind=True,
    base=SingletonTask,
    name="tests.record_renewed",
    lock_ttl=2.0,
    lock_auto_renew=True,
)
def record_renewed(self: SingletonTask, label: str, gate: str) -> None:
    """Like ``record``, with a 2 s lock that the run keeps renewing."""
    run = _record(self, label)
    _wait_for(gate)
    run.finished = True
    run.save(update_fields=["finished"])


@shared_task(bind=True, base=SingletonTask, name="tests.walk")
def walk(self: SingletonTask, label: str, depth: int, gate: str = "") -> None:
    """Recurse ``depth`` levels by calling the task function directly, then run like
    ``record`` at the top level (the only one with a gate)."""
    if depth:
        walk(label, depth - 1)
    if not gate:
        return
    run = _record(self, label)
    _wait_for(gate)
    run.finished = True
    run.save(update_fields=["finished"])


@shared_task(bind=True, base=SingletonTask, name="tests.replace_self", lock_key="replace:{label}")
def replace_self(self: SingletonTask, label: str, times: int) -> None:
    """Record a run, then replace it ``times`` times by a run of the same key."""
    _record(self, label)
    if times:
        raise self.replace(self.s(label, times - 1))


@shared_task(bind=True, base=SingletonTask, name="tests.replace_by_record")
def replace_by_record(self: SingletonTask, label: str, gate: str = "") -> None:
    """Replace the run by a run of ``record(label, gate)`` (another task, so another key)."""
    raise self.replace(record.si(label, gate))


@shared_task(bind=True, base=SingletonTask, name="tests.survive_signal", lock_ttl=60.0)
def survive_signal(self: SingletonTask, label: str, gate: str) -> None:
    """Like ``record``, but a soft time limit (SIGUSR1) is caught and the run goes on to its
    end, as a run that cleans up does; a ``<label>:caught`` row says it was."""
    run = _record(self, label)
    try:
        _wait_for(gate)
    except SoftTimeLimitExceeded:
        _record(self, f"{label}:caught")
        _wait_for(gate)
    run.finished = True
    run.save(update_fields=["finished"])
