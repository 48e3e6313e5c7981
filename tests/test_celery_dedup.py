"""SingletonTask on a real ``celery worker`` process, on Redis and on RabbitMQ."""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, chain, chord, group
from django.db import connections

import locks
import locks.connection
import tests.celery_tasks  # noqa: F401 - registers the test tasks with every app
from locks.celery import KEY_HEADER
from locks.conf import conf
from locks.models import Lock
from tests import pgbouncer
from tests.app.models import CeleryRun
from tests.celery_app import make_app
from tests.celery_support import (
    BROKER_URLS,
    BROKERS,
    CeleryProcess,
    celery_env,
    celery_worker,
    delete_queue,
    singleton,
    unique_queue,
    wait_until,
)
from tests.conftest import BACKEND, finish, read_event, spawn

pytestmark = pytest.mark.django_db(transaction=True)

PRODUCERS = 4
DELAYS_EACH = 5


@dataclass
class Worker:
    """A running worker and the app the test process enqueues with."""

    broker: str
    url: str
    queue: str
    app: Celery
    process: CeleryProcess

    def received(self, task: str) -> list[str]:
        """Ids of the ``task`` messages the worker has received so far, in order."""
        return re.findall(rf"Task {re.escape(task)}\[([0-9a-f-]+)\] received", self.process.text())


@pytest.fixture(scope="module", params=sorted(BROKERS))
def worker(
    request: pytest.FixtureRequest,
    django_db_setup: None,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Worker]:
    """One prefork worker (2 processes) per broker, on this run's own queue.

    It obeys ``revoke`` broadcasts, on a control exchange of this run's own.
    """
    broker = request.param
    url, queue = BROKERS[broker], unique_queue()
    app = make_app(url, queue, remote_control=True)
    log = tmp_path_factory.mktemp(f"celery-{broker}") / "worker.log"
    env = celery_env(url, queue, LOCKS_TEST_REMOTE_CONTROL="1")
    try:
        with celery_worker("tests.celery_app", queue, log, env) as process:
            yield Worker(broker, url, queue, app, process)
    finally:
        delete_queue(app, queue)


def finished_runs(label: str) -> int:
    return CeleryRun.objects.filter(label=label, finished=True).count()


def drain(worker: Worker, tmp_path: Path) -> None:
    """Wait until the worker has taken every message sent before now (the queue is FIFO)."""
    sentinel = singleton(worker.app, "tests.record").delay(f"sentinel-{tmp_path.name}")
    wait_until(lambda: finished_runs(f"sentinel-{tmp_path.name}"), what="the sentinel task")
    wait_until(lambda: sentinel.id in worker.received("tests.record"), what="its log line")


def test_twenty_concurrent_delays_from_several_processes_run_once(
    worker: Worker, tmp_path: Path
) -> None:
    barrier, gate = tmp_path / "go", tmp_path / "gate"
    producers = [
        spawn(
            "delay",
            worker.url,
            worker.queue,
            "tests.record",
            DELAYS_EACH,
            barrier,
            "same",
            gate,
            module="tests.workers_celery",
        )
        for _ in range(PRODUCERS)
    ]
    for producer in producers:
        assert read_event(producer)["event"] == "ready"
    barrier.touch()
    ids = [task_id for p in producers for e in finish(p, 120) for task_id in e.get("ids", [])]

    # Every call got the AsyncResult of the one queued run: nothing else was published.
    assert len(ids) == PRODUCERS * DELAYS_EACH
    assert len(set(ids)) == 1, f"{len(set(ids))} runs were enqueued"
    run = wait_until(lambda: CeleryRun.objects.filter(label="same").first(), what="the run")
    assert run.task_id == ids[0]
    assert locks.is_locked(Lock.objects.get(holder=ids[0]).name)
    gate.touch()
    wait_until(lambda: finished_runs("same"), what="the run to finish")
    wait_until(lambda: not Lock.objects.filter(holder=ids[0]).exists(), what="the release")
    drain(worker, tmp_path)
    assert list(CeleryRun.objects.filter(label="same").values_list("task_id", flat=True)) == [
        ids[0]
    ]
    assert ids[0] in worker.received("tests.record")
    assert not set(ids) - set(worker.received("tests.record"))


def test_different_arguments_run_in_parallel(worker: Worker, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    record = singleton(worker.app, "tests.record")
    first, second = record.delay("par-a", str(gate)), record.delay("par-b", str(gate))
    assert first.id != second.id
    # Both runs started while the gate is still closed: they run at the same time.
    wait_until(
        lambda: CeleryRun.objects.filter(label__startswith="par-").count() == 2,
        what="both runs to start",
    )
    assert not CeleryRun.objects.filter(finished=True).exists()
    assert Lock.objects.filter(holder__in=[first.id, second.id]).count() == 2
    gate.touch()
    wait_until(lambda: finished_runs("par-a") + finished_runs("par-b") == 2, what="both")
    wait_until(lambda: not Lock.objects.exists(), what="both locks to be released")


def test_task_that_raises_releases_its_lock(worker: Worker) -> None:
    fail = singleton(worker.app, "tests.fail")
    key = fail.lock_name(("boom",))
    first = fail.delay("boom")
    wait_until(lambda: CeleryRun.objects.filter(task_id=first.id).exists(), what="the run")
    wait_until(lambda: not Lock.objects.filter(name=key).exists(), what="the release")
    # The worker logs the failure after the run (and its release) ended.
    wait_until(lambda: "failed on purpose" in worker.process.text(), what="the failure log")

    second = fail.delay("boom")
    assert second.id != first.id
    wait_until(lambda: CeleryRun.objects.filter(task_id=second.id).exists(), what="a new run")


def test_retry_keeps_the_lock_and_the_final_retry_failure_releases_it(worker: Worker) -> None:
    task = singleton(worker.app, "tests.retry_then_fail")
    key = task.lock_name(("again",))
    first = task.delay("again")
    wait_until(lambda: CeleryRun.objects.filter(task_id=first.id).exists(), what="the run")
    # Between the attempts the retry is queued under the same task id, holding the lock.
    assert task.delay("again").id == first.id
    wait_until(lambda: CeleryRun.objects.filter(task_id=first.id).count() == 3, what="two retries")
    wait_until(lambda: not Lock.objects.filter(name=key).exists(), what="the release")
    retries = CeleryRun.objects.filter(label="again").values_list("task_id", "retries")
    assert sorted(retries) == [(first.id, 0), (first.id, 1), (first.id, 2)]
    assert task.delay("again").id != first.id


def test_worker_killed_mid_task_leaves_a_lock_that_expires_by_its_ttl(
    worker: Worker, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    hang = singleton(worker.app, "tests.hang")
    key = hang.lock_name(("doomed", str(gate)))
    first = hang.delay("doomed", str(gate))
    run = wait_until(lambda: CeleryRun.objects.filter(task_id=first.id).first(), what="run")
    os.kill(run.pid, signal.SIGKILL)
    wait_until(lambda: "SIGKILL" in worker.process.text(), what="the worker to notice")

    # The dead run's lock outlives it and still turns duplicates away ...
    assert Lock.objects.filter(name=key, holder=first.id).exists()
    # ... until its TTL (2 s, from the start of the run) runs out.
    wait_until(lambda: not locks.is_locked(key), timeout=30, what="the lock to expire")
    second = hang.delay("doomed", str(gate))
    assert second.id != first.id
    rerun = wait_until(lambda: CeleryRun.objects.filter(task_id=second.id).first(), what="rerun")
    assert rerun.pid != run.pid
    gate.touch()
    wait_until(lambda: not Lock.objects.filter(name=key).exists(), what="the release")


def test_worker_skips_a_duplicate_sent_around_apply_async(worker: Worker, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    key = singleton(worker.app, "tests.record").lock_name(("bypass", str(gate)))
    # send_task publishes without SingletonTask.apply_async, so no lock is taken for them.
    sent = [worker.app.send_task("tests.record", ("bypass", str(gate))) for _ in range(2)]
    wait_until(lambda: "skipping task tests.record" in worker.process.text(), what="a skip")
    wait_until(lambda: CeleryRun.objects.filter(label="bypass").exists(), what="the run")
    runs = list(CeleryRun.objects.filter(label="bypass").values_list("task_id", flat=True))
    assert len(runs) == 1
    skipped = next(result.id for result in sent if result.id != runs[0])
    assert f"skipping task tests.record[{skipped}]: lock {key!r} is held by {runs[0]}" in (
        worker.process.text()
    )
    gate.touch()
    wait_until(lambda: finished_runs("bypass"), what="the run to finish")
    wait_until(lambda: not Lock.objects.filter(name=key).exists(), what="the release")
    assert CeleryRun.objects.filter(label="bypass").count() == 1


def test_on_duplicate_raise_refuses_and_enqueues_nothing(worker: Worker, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    task = singleton(worker.app, "tests.record_or_raise")
    first = task.delay(7, str(gate))
    with pytest.raises(locks.DuplicateTask, match="already queued or running") as caught:
        task.delay(report_id=7)  # another spelling of the same key: "report:{report_id}"
    assert caught.value.task_id == first.id
    assert caught.value.name == "report:7"
    wait_until(lambda: CeleryRun.objects.filter(task_id=first.id).exists(), what="the run")
    gate.touch()
    wait_until(lambda: not Lock.objects.filter(name="report:7").exists(), what="the release")
    drain(worker, tmp_path)
    assert worker.received("tests.record_or_raise") == [first.id]


def test_auto_renew_keeps_the_lock_of_a_run_that_outlasts_its_ttl(
    worker: Worker, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    task = singleton(worker.app, "tests.record_renewed")
    key = task.lock_name(("long", str(gate)))
    first = task.delay("long", str(gate))
    wait_until(lambda: CeleryRun.objects.filter(task_id=first.id).exists(), what="the run")
    granted = Lock.objects.get(name=key)
    outlived = time.monotonic() + 5.0  # two and a half TTLs of 2 s
    wait_until(lambda: time.monotonic() > outlived, what="the TTL to pass twice")
    # The worker's watchdog renewed the lease: still the same holding, still deduplicating.
    renewed = Lock.objects.get(name=key)
    assert (renewed.holder, renewed.token) == (first.id, granted.token)
    assert renewed.expires_at > granted.expires_at
    assert locks.is_locked(key)
    assert task.delay("long", str(gate)).id == first.id
    gate.touch()
    wait_until(lambda: not Lock.objects.filter(name=key).exists(), what="the release")


def test_direct_call_inside_a_run_keeps_the_runs_lock(worker: Worker, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    walk = singleton(worker.app, "tests.walk")
    key = walk.lock_name(("walk", 2, str(gate)))
    first = walk.delay("walk", 2, str(gate))
    # The run called itself directly twice before it recorded itself and waits.
    wait_until(lambda: CeleryRun.objects.filter(task_id=first.id).exists(), what="the run")
    assert Lock.objects.filter(name=key).values_list("holder", "count").get() == (first.id, 2)
    assert walk.delay("walk", 2, str(gate)).id == first.id
    gate.touch()
    wait_until(lambda: finished_runs("walk"), what="the run to finish")
    wait_until(lambda: not Lock.objects.filter(name=key).exists(), what="the release")
    drain(worker, tmp_path)
    assert worker.received("tests.walk") == [first.id]
    assert f"task tests.walk[{first.id}] ended, but lock" not in worker.process.text()


def test_a_run_that_replaces_itself_hands_its_lock_to_the_replacement(
    worker: Worker, tmp_path: Path
) -> None:
    task = singleton(worker.app, "tests.replace_self")
    key = task.lock_name(("handover", 1))
    first = task.delay("handover", 1)
    runs = CeleryRun.objects.filter(label="handover")
    wait_until(lambda: runs.count() == 2, what="the replacement's run")
    wait_until(lambda: not Lock.objects.filter(name=key).exists(), what="the release")
    drain(worker, tmp_path)
    assert list(runs.values_list("task_id", flat=True)) == [first.id, first.id]
    log = worker.process.text()  # the module's worker: other tests' lines are there too
    assert f"task tests.replace_self[{first.id}] ended, but lock" not in log
    assert f"skipping task tests.replace_self[{first.id}]" not in log


def test_enqueue_under_the_task_id_of_a_running_run_is_a_duplicate(
    worker: Worker, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    record = singleton(worker.app, "tests.record")
    key = record.lock_name(("same-id", str(gate)))
    task_id = str(uuid.uuid4())  # chosen by the caller, as with apply_async(task_id=...)
    record.apply_async(("same-id", str(gate)), task_id=task_id)
    wait_until(lambda: CeleryRun.objects.filter(task_id=task_id).exists(), what="the run")
    assert record.apply_async(("same-id", str(gate)), task_id=task_id).id == task_id
    # The run's holding, its count unchanged: the refused enqueue gave its re-entry back.
    assert Lock.objects.filter(name=key).values_list("holder", "count").get() == (task_id, 2)
    gate.touch()
    wait_until(lambda: finished_runs("same-id"), what="the run to finish")
    wait_until(lambda: not Lock.objects.filter(name=key).exists(), what="the release")
    drain(worker, tmp_path)
    assert worker.received("tests.record").count(task_id) == 1
    assert CeleryRun.objects.filter(label="same-id").count() == 1


def test_expired_message_dropped_by_the_worker_releases_its_lock(
    worker: Worker, tmp_path: Path
) -> None:
    record = singleton(worker.app, "tests.record")
    key = record.lock_name(("expired",))
    first = record.apply_async(("expired",), expires=datetime.now(UTC) - timedelta(seconds=1))
    assert locks.is_locked(key)
    # Freed within seconds, not after lock_ttl (an hour).
    wait_until(lambda: not locks.is_locked(key), timeout=30, what="the release")
    assert f"Discarding revoked task: tests.record[{first.id}]" in worker.process.text()
    second = record.delay("expired")
    assert second.id != first.id
    wait_until(lambda: finished_runs("expired"), what="the new run")
    assert not CeleryRun.objects.filter(task_id=first.id).exists()


def test_message_revoked_before_it_runs_releases_its_lock(worker: Worker) -> None:
    record = singleton(worker.app, "tests.record")
    key = record.lock_name(("revoked",))
    # The countdown keeps the message waiting in the worker until the revoke has arrived.
    first = record.apply_async(("revoked",), countdown=2)
    first.revoke()
    wait_until(lambda: not locks.is_locked(key), timeout=30, what="the release")
    assert f"Discarding revoked task: tests.record[{first.id}]" in worker.process.text()
    assert record.delay("revoked").id != first.id
    wait_until(lambda: finished_runs("revoked"), what="the new run")
    assert not CeleryRun.objects.filter(task_id=first.id).exists()


def test_run_terminated_by_revoke_releases_its_lock(worker: Worker, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    hang = singleton(worker.app, "tests.record")
    key = hang.lock_name(("terminated", str(gate)))
    first = hang.delay("terminated", str(gate))
    wait_until(lambda: CeleryRun.objects.filter(task_id=first.id).exists(), what="the run")
    first.revoke(terminate=True, signal="SIGKILL")
    wait_until(lambda: not locks.is_locked(key), timeout=30, what="the release")
    assert not CeleryRun.objects.filter(task_id=first.id, finished=True).exists()
    second = hang.delay("terminated", str(gate))
    assert second.id != first.id
    gate.touch()
    wait_until(lambda: finished_runs("terminated"), what="the new run")
    wait_until(lambda: not Lock.objects.filter(name=key).exists(), what="its release")


def test_run_sent_a_signal_it_survives_keeps_its_lock_until_it_ends(
    worker: Worker, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    task = singleton(worker.app, "tests.survive_signal")
    key = task.lock_name(("survivor", str(gate)))
    first = task.delay("survivor", str(gate))
    wait_until(lambda: CeleryRun.objects.filter(task_id=first.id).exists(), what="the run")
    first.revoke(terminate=True, signal="SIGUSR1")
    wait_until(lambda: CeleryRun.objects.filter(label="survivor:caught").exists(), what="the catch")
    wait_until(lambda: f"{first.id}] was sent signal" in worker.process.text(), what="the revoke")
    # The run goes on: its key must still turn a second run away.
    assert Lock.objects.filter(name=key, holder=first.id).exists()
    assert task.delay("survivor", str(gate)).id == first.id
    gate.touch()
    wait_until(lambda: finished_runs("survivor"), what="the run's end")
    wait_until(lambda: not Lock.objects.filter(name=key).exists(), what="its release")
    assert CeleryRun.objects.filter(label="survivor").count() == 1


def test_a_run_in_a_chain_that_replaces_itself_hands_over_and_the_chain_goes_on(
    worker: Worker,
) -> None:
    replace_self = singleton(worker.app, "tests.replace_self")
    record = singleton(worker.app, "tests.record")
    workflow = chain(replace_self.si("chained", 1), record.si("after-replace"))
    workflow.apply_async()
    wait_until(lambda: finished_runs("after-replace"), what="the rest of the chain")
    assert CeleryRun.objects.filter(label="chained").count() == 2
    wait_until(lambda: not Lock.objects.exists(), what="every release")


@pytest.fixture(scope="module")
def results_worker(
    django_db_setup: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    """A prefork worker on Redis that stores its runs' states in Redis (a result backend)."""
    url, queue = BROKER_URLS["redis"], unique_queue()
    app = make_app(url, queue, result_backend=url)
    log = tmp_path_factory.mktemp("celery-results") / "worker.log"
    env = celery_env(url, queue, LOCKS_TEST_RESULT_BACKEND=url)
    try:
        with celery_worker("tests.celery_app", queue, log, env) as process:
            yield Worker("redis", url, queue, app, process)
    finally:
        delete_queue(app, queue)


def test_a_run_skipped_as_a_duplicate_stays_pending_in_the_result_backend(
    results_worker: Worker, tmp_path: Path
) -> None:
    # The worker ends the skipped run with Ignore (its state IGNORED, in the worker only):
    # Celery stores nothing for it, so the result backend knows it no more than an id
    # never sent. Its result.get() would wait for ever.
    worker, gate = results_worker, tmp_path / "gate"
    sent = [worker.app.send_task("tests.record", ("pending", str(gate))) for _ in range(2)]
    wait_until(lambda: CeleryRun.objects.filter(label="pending").exists(), what="the run")
    (ran,) = CeleryRun.objects.filter(label="pending").values_list("task_id", flat=True)
    skipped = next(result for result in sent if result.id != ran)
    wait_until(lambda: f"skipping task tests.record[{skipped.id}]" in worker.process.text())
    gate.touch()
    wait_until(lambda: finished_runs("pending"), what="the run to finish")
    done = next(result for result in sent if result.id == ran)
    assert done.get(timeout=30) == "pending"
    assert (done.state, skipped.state) == ("SUCCESS", "PENDING")
    assert skipped.result is None


@dataclass
class HeldRun:
    """A run of ``tests.record`` queued and held at its gate (see :func:`held_run`)."""

    record: Any  # the task, as a SingletonTask of the worker's app
    first: Any  # the held run's AsyncResult
    args: tuple[str, str]  # its arguments, (label, gate): a duplicate's too


@contextmanager
def held_run(worker: Worker, tmp_path: Path, label: str) -> Iterator[HeldRun]:
    """A run of ``tests.record(label, gate)`` queued and held at its gate while the block
    sends duplicates of it; then it goes on. It ran once, and every lease was released."""
    gate = tmp_path / "gate"
    record = singleton(worker.app, "tests.record")
    held = HeldRun(record, record.delay(label, str(gate)), (label, str(gate)))
    try:
        yield held
    finally:
        gate.touch()  # a failed block too: a run left waiting would stall the next tests
    assert held.first.get(timeout=60) == label
    drain(worker, tmp_path)
    assert CeleryRun.objects.filter(label=label).count() == 1
    wait_until(lambda: not Lock.objects.exists(), what="every release")


def test_a_chain_whose_first_task_is_a_duplicate_raises_instead_of_vanishing(
    results_worker: Worker, tmp_path: Path
) -> None:
    # "return" mode answers a duplicate with the queued run's result; but that run is not
    # followed by the rest of this chain, which would be dropped unsent while the caller
    # waits on the chain's result for ever. The caller is told instead, in either mode.
    with held_run(results_worker, tmp_path, "chained-dup") as held:
        workflow = chain(held.record.si(*held.args), held.record.si("after-dup"))
        with pytest.raises(locks.DuplicateTask, match="the rest of its chain") as caught:
            workflow.apply_async()
        assert caught.value.task_id == held.first.id
    assert results_worker.received("tests.record").count(held.first.id) == 1
    assert not CeleryRun.objects.filter(label="after-dup").exists()


@pytest.mark.parametrize("option", ["link", "link_error"])
def test_a_duplicate_sent_with_callbacks_raises_instead_of_dropping_them(
    results_worker: Worker, tmp_path: Path, option: str
) -> None:
    # As with a chain: the queued run that "return" mode would answer with does not call
    # this send's callbacks, which would never run. The caller is told instead.
    with held_run(results_worker, tmp_path, "linked-dup") as held:
        callback: dict[str, Any] = {option: held.record.si(f"after-{option}")}
        with pytest.raises(locks.DuplicateTask, match=f"not sent either: its {option} callbacks"):
            held.record.apply_async(held.args, **callback)
    assert results_worker.received("tests.record").count(held.first.id) == 1
    assert not CeleryRun.objects.filter(label=f"after-{option}").exists()


def test_a_duplicate_in_a_chord_header_raises_instead_of_dropping_the_body(
    results_worker: Worker, tmp_path: Path
) -> None:
    # A header task carries the chord's body (Celery's options["chord"]): the body runs
    # when every header task has reported. The queued run that "return" mode would answer
    # with reports to no chord, so the body would never run, and the caller would wait
    # on the chord's result for ever. The caller is told instead.
    with held_run(results_worker, tmp_path, "chord-dup") as held:
        header = [held.record.si(*held.args), held.record.si("chord-other")]
        with pytest.raises(
            locks.DuplicateTask, match="not sent either: its chord's body"
        ) as caught:
            chord(header)(held.record.si("chord-body"))
        assert caught.value.task_id == held.first.id
    assert results_worker.received("tests.record").count(held.first.id) == 1
    assert not CeleryRun.objects.filter(label__in=["chord-other", "chord-body"]).exists()


def test_a_duplicate_later_in_a_chord_header_raises_after_the_members_before_it_went_out(
    results_worker: Worker, tmp_path: Path
) -> None:
    # Celery sends a chord's header tasks one by one: those before the duplicate are
    # queued by the time it raises, and they run, but the chord's body never does (it
    # waits for the whole header). The caller is told, as in the test above.
    with held_run(results_worker, tmp_path, "chord-late-dup") as held:
        header = [held.record.si("chord-before"), held.record.si(*held.args)]
        with pytest.raises(locks.DuplicateTask, match="not sent either: its chord's body"):
            chord(header)(held.record.si("chord-late-body"))
        wait_until(lambda: finished_runs("chord-before"), what="the member sent before it")
    drain(results_worker, tmp_path)
    assert not CeleryRun.objects.filter(label="chord-late-body").exists()


def test_a_duplicate_in_a_group_raises_instead_of_leaving_the_groups_result_waiting(
    results_worker: Worker, tmp_path: Path
) -> None:
    # A group's result is made of the ids its tasks were given before they are sent: a
    # duplicate answered with another run's result is never sent under its id, and the
    # group's result would wait for it for ever. The caller is told instead.
    with held_run(results_worker, tmp_path, "group-dup") as held:
        members = group(held.record.si(*held.args), held.record.si("group-other"))
        with pytest.raises(
            locks.DuplicateTask, match="not sent either: its group's result"
        ) as caught:
            members.apply_async()
        assert caught.value.task_id == held.first.id
    assert results_worker.received("tests.record").count(held.first.id) == 1


def test_a_duplicate_among_a_runs_link_callbacks_is_answered_as_a_lone_callback_is(
    results_worker: Worker, tmp_path: Path
) -> None:
    # Celery sends a finished run's link callbacks, when there are several, as a group:
    # its result goes to no one, so a duplicate among them is answered with the queued
    # run's result, as one callback alone is, not refused (which failed the run that had
    # succeeded, and left the callbacks after it unsent).
    with held_run(results_worker, tmp_path, "links-dup") as held:
        callbacks = [held.record.si(*held.args), held.record.si("links-other")]
        parent = held.record.apply_async(("links-parent",), link=callbacks)
        assert parent.get(timeout=60) == "links-parent"
        wait_until(lambda: finished_runs("links-other"), what="the other callback")


def test_a_duplicate_errback_leaves_the_runs_own_failure_alone(
    results_worker: Worker, tmp_path: Path
) -> None:
    # Celery sends a failed run's task errbacks as a group whose result goes to no one:
    # a duplicate errback is answered with the queued run's result, and the run's failure
    # stays its own error (it was replaced by DuplicateTask).
    with held_run(results_worker, tmp_path, "errback-dup") as held:
        failing = singleton(results_worker.app, "tests.fail").apply_async(
            ("errback-parent",), link_error=held.record.si(*held.args)
        )
        with pytest.raises(RuntimeError, match="failed on purpose"):
            failing.get(timeout=60)
        # The worker stores the failure before it sends the errbacks, and logs it after:
        # the held run must go on holding its key until the errback has been answered.
        logged = f"Task tests.fail[{failing.id}] raised unexpected"
        wait_until(lambda: logged in results_worker.process.text(), what="the errbacks sent")
    assert "DuplicateTask" not in results_worker.process.text()


def test_a_duplicate_at_the_end_of_a_chain_fails_the_task_before_it(
    results_worker: Worker, tmp_path: Path
) -> None:
    # The chain's result is its last task's, under the id the chain gave it: answered with
    # another run's result, that id would stay PENDING for ever. The worker's sending of
    # it fails instead, as in the middle of a chain.
    before_id = str(uuid.uuid4())
    with held_run(results_worker, tmp_path, "end-dup") as held:
        before = held.record.si("end-before").set(task_id=before_id)
        chain(before, held.record.si(*held.args)).apply_async()
        result = results_worker.app.AsyncResult(before_id)
        with pytest.raises(locks.DuplicateTask, match="not sent either: the end of its chain"):
            result.get(timeout=60)
        assert result.state == "FAILURE"


def test_a_run_replaced_by_another_task_gets_the_replacements_result(
    results_worker: Worker,
) -> None:
    # The run releases its lease before the replacement (another task, another key) goes
    # out; its end must not release it a second time, which raised and failed the run.
    replacer = singleton(results_worker.app, "tests.replace_by_record")
    result = replacer.delay("replaced-other")
    assert result.get(timeout=30) == "replaced-other"
    assert finished_runs("replaced-other") == 1
    wait_until(lambda: not Lock.objects.exists(), what="every release")
    assert "already released" not in results_worker.process.text()


def test_a_run_replaced_by_a_duplicate_fails_instead_of_leaving_its_result_waiting(
    results_worker: Worker, tmp_path: Path
) -> None:
    # self.replace(sig) sends sig under the run's own task id, and the run ends there: its
    # caller waits on that id. Answered with the queued run's result, the replacement is
    # not sent, and that id would stay PENDING for ever. The run fails instead.
    with held_run(results_worker, tmp_path, "replaced-dup") as held:
        replacer = singleton(results_worker.app, "tests.replace_by_record")
        result = replacer.delay(*held.args)
        with pytest.raises(
            locks.DuplicateTask, match="not sent either: the result of the task it replaces"
        ):
            result.get(timeout=30)
        assert result.state == "FAILURE"
    assert results_worker.received("tests.record").count(held.first.id) == 1


@pytest.mark.parametrize(
    "name", ["tests.retry_after_gate", "tests.retry_after_gate_or_raise"], ids=["return", "raise"]
)
def test_a_retry_whose_key_another_run_took_fails_instead_of_leaving_its_result_waiting(
    results_worker: Worker, tmp_path: Path, name: str
) -> None:
    # A run that outlived its lease (no auto-renew) and then retries finds its key taken
    # by another run. Its retry goes out under its own task id, which its caller waits on:
    # another run's result cannot stand for it, nor can the retry be sent beside that run.
    # The run fails with DuplicateTask in either mode, and its caller is told.
    task, gate = singleton(results_worker.app, name), tmp_path / "gate"
    label = f"retry-taken-{name}"
    key = task.lock_name((label,))
    first = task.delay(label, str(gate))
    wait_until(lambda: CeleryRun.objects.filter(task_id=first.id).exists(), what="the run")
    wait_until(lambda: not locks.is_locked(key), timeout=30, what="its lease to run out")
    # Queued for a few seconds, so its lease (2 s + the countdown) outlasts the retry.
    other = task.apply_async((label,), countdown=4)
    assert other.id != first.id
    gate.touch()
    refused = rf"running as {other.id} .*; not sent either: the retry of its run"
    with pytest.raises(locks.DuplicateTask, match=refused):
        first.get(timeout=30)
    assert first.state == "FAILURE"
    assert other.get(timeout=30) == label
    assert sorted(CeleryRun.objects.filter(label=label).values_list("task_id", "retries")) == (
        sorted([(first.id, 0), (other.id, 0)])
    )
    wait_until(lambda: not Lock.objects.exists(), what="every release")


def test_a_run_that_goes_on_after_queuing_its_retry_leaves_the_key_to_the_retry(
    results_worker: Worker,
) -> None:
    # self.retry(throw=False) queues the retry under the run's task id, and the run goes
    # on to its end. The key stays the retry's: a duplicate sent while the retry waits
    # gets its id, and is not queued beside it (the retry would then be skipped).
    task, label = singleton(results_worker.app, "tests.retry_without_throw"), "no-throw"
    first = task.delay(label)
    # Logged once the run has ended, past the release of a run that keeps no lease.
    ended = f"Task tests.retry_without_throw[{first.id}] succeeded"
    wait_until(lambda: ended in results_worker.process.text(), what="the first run's end")
    assert task.delay(label).id == first.id  # the retry is due in 5 s
    wait_until(lambda: finished_runs(label) == 2, what="the retry")
    wait_until(lambda: not Lock.objects.exists(), what="every release")
    assert sorted(CeleryRun.objects.filter(label=label).values_list("task_id", "retries")) == (
        [(first.id, 0), (first.id, 1)]
    )


def test_a_run_that_outlived_its_lease_logs_a_warning_when_it_ends(
    results_worker: Worker, tmp_path: Path
) -> None:
    # A run longer than lock_ttl (without auto-renew) was not protected to its end: a
    # duplicate ran beside it. Its end finds the lease gone; the user must hear of it.
    worker, gate = results_worker, tmp_path / "gate"
    hang = singleton(worker.app, "tests.hang")
    key = hang.lock_name(("outlived", str(gate)))
    first = hang.delay("outlived", str(gate))
    wait_until(lambda: CeleryRun.objects.filter(task_id=first.id).exists(), what="the run")
    wait_until(lambda: not locks.is_locked(key), timeout=30, what="its lease to run out")
    second = hang.delay("outlived", str(gate))
    assert second.id != first.id
    wait_until(lambda: CeleryRun.objects.filter(task_id=second.id).exists(), what="the other")
    gate.touch()
    assert (first.get(timeout=30), second.get(timeout=30)) == (None, None)
    warned = re.compile(
        rf"WARNING/\S+\] task tests\.hang\[{first.id}\] ended, but lock "
        rf"{re.escape(repr(key))} was no longer its own: .*taken over"
    )
    wait_until(lambda: warned.search(worker.process.text()), what="the warning")
    wait_until(lambda: not Lock.objects.exists(), what="every release")
    assert f"tests.hang[{second.id}] ended, but" not in worker.process.text()


def test_a_chain_of_one_duplicate_task_is_answered_as_the_task_alone_is(
    results_worker: Worker, tmp_path: Path
) -> None:
    # A chain of one task is sent with an empty rest of the chain, as the worker sends a
    # chain's last task; but its caller gets that task's own result, so "return" mode
    # answers it with the queued run's, as it answers the task sent alone.
    with held_run(results_worker, tmp_path, "lone-chain") as held:
        again = chain(held.record.si(*held.args)).apply_async()
        assert again.id == held.first.id


def test_a_duplicate_later_in_a_chain_ends_the_chain_as_a_failure_of_the_task_before_it(
    results_worker: Worker, tmp_path: Path
) -> None:
    # The worker sends a chain's next task when the one before it succeeds. A duplicate
    # there (its key taken meanwhile) cannot be sent with the rest of the chain: the
    # sending fails, and Celery records that as the failure of the task that sent it, as
    # when the broker cannot take the next task; the rest of the chain does not run.
    before_id = str(uuid.uuid4())
    with held_run(results_worker, tmp_path, "mid-dup") as held:
        workflow = chain(
            held.record.si("mid-before").set(task_id=before_id),
            held.record.si(*held.args),
            held.record.si("mid-after"),
        )
        workflow.apply_async()
        before = results_worker.app.AsyncResult(before_id)
        with pytest.raises(locks.DuplicateTask, match="the rest of its chain"):
            before.get(timeout=60)
        assert before.state == "FAILURE"
        assert finished_runs("mid-before") == 1
    assert not CeleryRun.objects.filter(label="mid-after").exists()


def test_a_retry_of_a_singleton_task_in_a_chain_is_enqueued_with_the_chain(
    worker: Worker,
) -> None:
    # A retry is sent with the rest of the chain too (Celery's options["chain"]): it is
    # the run's own re-enqueue, not a duplicate refused for carrying a chain.
    task = singleton(worker.app, "tests.retry_then_fail")
    key = task.lock_name(("chain-retry",))
    chain(task.si("chain-retry"), singleton(worker.app, "tests.record").si("never")).delay()
    wait_until(
        lambda: CeleryRun.objects.filter(label="chain-retry").count() == 3, what="two retries"
    )
    wait_until(lambda: not Lock.objects.filter(name=key).exists(), what="the release")
    assert sorted(
        CeleryRun.objects.filter(label="chain-retry").values_list("retries", flat=True)
    ) == [0, 1, 2]
    assert not CeleryRun.objects.filter(label="never").exists()


def test_a_chain_link_sent_again_under_its_own_task_id_is_not_refused(
    worker: Worker, tmp_path: Path
) -> None:
    # The worker sends a chain's next task, with the rest of the chain, under the id the
    # chain gave it; a message redelivered after that (acks_late) sends it again. Queued
    # or running under that very id, it went out with its chain: the second send is the
    # same message, answered as any re-send under a queued id is, not a DuplicateTask.
    gate = tmp_path / "gate"
    record = singleton(worker.app, "tests.record")
    link_id = str(uuid.uuid4())
    rest = [record.si("resent-after")]
    sent = record.si("resent", str(gate)).set(task_id=link_id).apply_async(chain=rest)
    again = record.si("resent", str(gate)).set(task_id=link_id).apply_async(chain=rest)
    assert (sent.id, again.id) == (link_id, link_id)
    gate.touch()
    wait_until(lambda: finished_runs("resent-after"), what="the rest of the chain")
    drain(worker, tmp_path)
    assert worker.received("tests.record").count(link_id) == 1
    assert CeleryRun.objects.filter(label="resent").count() == 1
    assert CeleryRun.objects.filter(label="resent-after").count() == 1
    wait_until(lambda: not Lock.objects.exists(), what="every release")


def test_revoked_message_leaves_a_lock_that_another_holder_took_alone(
    worker: Worker, tmp_path: Path
) -> None:
    with locks.lock("revoked:taken", ttl=60) as lease:
        # Sent around apply_async, so it carries the key but never held it.
        sent = worker.app.send_task(
            "tests.record",
            ("taken",),
            headers={KEY_HEADER: "revoked:taken"},
            expires=datetime.now(UTC) - timedelta(seconds=1),
        )
        drain(worker, tmp_path)
        assert f"Discarding revoked task: tests.record[{sent.id}]" in worker.process.text()
        held = Lock.objects.get(name="revoked:taken")
        assert (held.holder, held.token, held.count) == (lease.holder, lease.token, 1)
        lease.renew()
    assert not CeleryRun.objects.filter(label="taken").exists()


# Redis redelivers an unacknowledged message this many seconds after its delivery; the
# run is killed well before that, so the dead worker never restores its own message.
VISIBILITY_TIMEOUT = 3.0


@pytest.mark.parametrize("broker", sorted(BROKERS))
def test_acks_late_run_redelivered_after_its_worker_died_reenters_its_lease(
    broker: str, tmp_path: Path
) -> None:
    url, queue = BROKERS[broker], unique_queue()
    # RabbitMQ requeues an unacked message as soon as its consumer's connection closes;
    # Redis only once the visibility timeout has passed.
    visibility = VISIBILITY_TIMEOUT if broker == "redis" else None
    app = make_app(url, queue, visibility_timeout=visibility)
    extra = {"LOCKS_TEST_VISIBILITY_TIMEOUT": str(visibility)} if visibility else {}
    env = celery_env(url, queue, **extra)
    gate = tmp_path / "gate"
    task = singleton(app, "tests.hang_acks_late")
    key = task.lock_name(("redelivered", str(gate)))
    try:
        with celery_worker(
            "tests.celery_app", queue, tmp_path / "first.log", env, concurrency=1
        ) as process:
            first_worker = Worker(broker, url, queue, app, process)
            first = task.delay("redelivered", str(gate))
            killed = wait_until(
                lambda: CeleryRun.objects.filter(task_id=first.id).first(), what="the run"
            )
            # The whole worker dies mid-run, pool and main process: nobody acks the message.
            os.killpg(process.process.pid, signal.SIGKILL)
            process.process.wait(timeout=10)
        assert first_worker.received("tests.hang_acks_late") == [first.id]
        held = Lock.objects.get(name=key)
        assert (held.holder, held.count) == (first.id, 2)  # the enqueue and the dead run

        # The lease is the original task id's: a new delay() is still a duplicate.
        assert task.delay("redelivered", str(gate)).id == first.id
        assert Lock.objects.filter(name=key).values_list("holder", "count").get() == (first.id, 2)

        with celery_worker(
            "tests.celery_app", queue, tmp_path / "second.log", env, concurrency=1
        ) as process:
            second_worker = Worker(broker, url, queue, app, process)
            skipped = f"skipping task tests.hang_acks_late[{first.id}]"

            def redelivered_run() -> CeleryRun | None:
                assert skipped not in process.text(), process.text()[-2000:]
                return CeleryRun.objects.filter(task_id=first.id).exclude(pk=killed.pk).first()

            rerun = wait_until(redelivered_run, timeout=30, what="the redelivered run")
            assert rerun.pid != killed.pid
            # The redelivered run re-entered the very lease the enqueue took, renewed.
            entered = Lock.objects.get(name=key)
            assert (entered.holder, entered.token, entered.count) == (first.id, held.token, 3)
            assert entered.expires_at > held.expires_at
            assert task.delay("redelivered", str(gate)).id == first.id
            gate.touch()
            wait_until(lambda: finished_runs("redelivered"), what="the run to finish")
            wait_until(lambda: not Lock.objects.filter(name=key).exists(), what="the release")
            # Nothing else was enqueued: the new worker received the one message, once.
            drain(second_worker, tmp_path)
            assert second_worker.received("tests.hang_acks_late") == [first.id]
            assert skipped not in process.text()
        runs = CeleryRun.objects.filter(label="redelivered").order_by("pk")
        assert list(runs.values_list("task_id", "finished")) == [
            (first.id, False),
            (first.id, True),
        ]
    finally:
        delete_queue(app, queue)


@pytest.mark.skipif(
    BACKEND != "postgresql" or pgbouncer.ENABLED,
    reason="terminates PostgreSQL sessions (the server's, not PgBouncer's)",
)
def test_first_run_after_the_database_dropped_the_workers_sessions_runs(tmp_path: Path) -> None:
    # A database restart, a failover or an idle-session timeout, as an idle worker sees
    # it: its lock connection is dead before the next run begins. Its own worker, since
    # the module's would lose the sessions its main process keeps for revokes, and one
    # that keeps its connections between tasks (with CONN_MAX_AGE = 0 each task's end
    # closes them, and there is nothing left to drop).
    url, queue = BROKER_URLS["redis"], unique_queue()
    app = make_app(url, queue)
    env = celery_env(url, queue, LOCKS_TEST_PERSISTENT_CONNECTIONS="1")
    try:
        with celery_worker(
            "tests.celery_app", queue, tmp_path / "worker.log", env, concurrency=1
        ) as process:
            record = singleton(app, "tests.record")
            record.delay("warm")
            wait_until(lambda: finished_runs("warm"), what="the first run")
            # Every session of this test database but this process's own two: the worker's.
            own = locks.connection.get(conf.DATABASE)
            own.ensure_connection()
            with connections["default"].cursor() as cursor:
                cursor.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND pid <> %s",
                    [own.connection.info.backend_pid],
                )
                assert cursor.fetchone()[0] >= 1
            sent = record.delay("after")
            wait_until(
                lambda: finished_runs("after") or f"[{sent.id}] raised" in process.text(),
                what="the run to end",
            )
            assert finished_runs("after") == 1, process.text()[-2000:]
            wait_until(lambda: not Lock.objects.filter(holder=sent.id).exists(), what="release")
            assert record.delay("after").id != sent.id
    finally:
        delete_queue(app, queue)
