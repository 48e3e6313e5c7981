"""SingletonTask without a worker: keys, options, bad input, publish failures, eager runs."""

from __future__ import annotations

import copy as copy_module
import logging
import pickle
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from celery import Celery
from celery.app.task import Context
from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded
from celery.signals import task_postrun, task_prerun, task_revoked
from django.db import OperationalError as DatabaseOperationalError
from django.db import connections
from django.db.backends.signals import connection_created
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from kombu.exceptions import OperationalError

import locks
import locks.connection
import locks.leases
import tests.celery_tasks  # noqa: F401 - registers the test tasks with every app
from locks.celery import KEY_HEADER, SingletonTask, default_key, fit_key
from locks.conf import conf
from locks.models import Lock
from tests import pgbouncer
from tests.app.models import CeleryRun
from tests.celery_app import make_app
from tests.celery_support import singleton, unique_queue
from tests.conftest import BACKEND
from tests.faults import kill_session, other_sessions
from tests.workers_reliability import SESSION_ID

pytestmark = pytest.mark.django_db(transaction=True)

OwnQueries = Callable[[], CaptureQueriesContext]


@pytest.fixture
def app() -> Iterator[Celery]:
    """An app on kombu's in-memory transport: messages stay in this process's queue."""
    app = make_app("memory://", unique_queue())
    yield app
    app.close()


def queued(app: Celery) -> int:
    """How many messages wait in the app's queue."""
    with app.connection_for_write() as connection:
        channel: Any = connection.default_channel
        return int(channel.queue_declare(app.conf.task_default_queue).message_count)


def task_of(
    app: Celery,
    name: str,
    body: Callable[..., Any],
    base: type[SingletonTask] = SingletonTask,
    **options: Any,
) -> SingletonTask:
    """``body`` as a task ``name`` of ``app`` (a ``base``) with these task options."""
    # shared=False: the task belongs to this app only, not to every app made later.
    decorate: Any = app.task
    task = decorate(base=base, name=name, shared=False, **options)(body)
    assert isinstance(task, SingletonTask)
    return task


def make_task(app: Celery, name: str, **options: Any) -> SingletonTask:
    def body(invoice_id: int, copies: int = 1, *, urgent: bool = False) -> None:
        """A task body with positional, defaulted and keyword-only arguments."""

    return task_of(app, name, body, **options)


def renewed_task(app: Celery, name: str, body: Callable[..., Any], **options: Any) -> SingletonTask:
    """As :func:`task_of`, with a ``lock_ttl`` of 2 s that auto-renew renews every 2/3 s
    while a run holds the lease (see :func:`assert_renewals_stopped`)."""
    return task_of(app, name, body, lock_ttl=2, lock_auto_renew=True, **options)


def assert_renewals_stopped(key: str) -> None:
    """The lease of ``key`` (a task of :func:`renewed_task`) is not renewed: its message
    waits in the queue, and no run holds it."""
    held = Lock.objects.get(name=key)
    time.sleep(1)
    assert Lock.objects.get(name=key).expires_at == held.expires_at


def test_duplicate_delay_returns_the_queued_run_and_publishes_nothing(app: Celery) -> None:
    task = make_task(app, "t.invoice")
    first = task.delay(42)
    assert task.delay(42).id == first.id
    assert task.apply_async((42,), {"copies": 1}).id == first.id
    assert task.delay(43).id != first.id
    assert queued(app) == 2
    lock = Lock.objects.get(holder=first.id)
    assert (lock.name, lock.count, lock.note) == (
        't.invoice:{"copies":1,"invoice_id":42,"urgent":false}',
        1,
        "celery task t.invoice",
    )


def test_default_key_is_the_same_however_the_arguments_are_spelled(app: Celery) -> None:
    task = make_task(app, "t.spelling")
    key = task.lock_name((7,))
    assert task.lock_name((7, 1)) == key
    assert task.lock_name((), {"invoice_id": 7}) == key
    assert task.lock_name([7], {"copies": 1, "urgent": False}) == key
    assert task.lock_name((7,), {"urgent": True}) != key
    assert make_task(app, "t.other").lock_name((7,)) != key


@pytest.mark.parametrize(
    "values",
    [
        (1, "1", 1.0, True, None, [1], {"1": 1}, Decimal("1"), b"1", {1}, frozenset({1})),
        ("a,b", ["a", "b"], "a\\u002cb"),
        ({"x": 1, "y": 2}, {"x": 2, "y": 1}, '{"x": 1, "y": 2}'),
    ],
)
def test_default_key_tells_apart_values_that_differ(values: tuple[Any, ...]) -> None:
    keys = {default_key("t.values", [value]) for value in values}
    assert len(keys) == len(values)


def test_default_key_is_stable_for_sets_and_dicts_in_any_order() -> None:
    assert default_key("t", [{3, 1, 2}]) == default_key("t", [{2, 3, 1}])
    assert default_key("t", {"b": 1, "a": 2}) == default_key("t", {"a": 2, "b": 1})


def test_long_keys_are_hashed_into_a_stable_name_of_at_most_255_characters(app: Celery) -> None:
    task = make_task(app, "t.long")
    key = task.lock_name(("x" * 1000,))
    assert len(key) <= 255
    assert key.startswith('t.long:{"copies":1,"invoice_id":"xxx')
    assert ":sha256:" in key
    assert task.lock_name(("x" * 1000,)) == key
    assert task.lock_name(("x" * 999 + "y",)) != key
    assert fit_key("short") == "short"
    task.delay("x" * 1000)
    assert Lock.objects.get().name == key


@pytest.mark.parametrize("bad", ["\x00", "\ud800"], ids=["nul", "lone-surrogate"])
@pytest.mark.parametrize("length", [10, 400], ids=["short", "hashed"])
def test_a_key_with_a_character_no_name_may_hold_is_refused_also_when_long(
    app: Celery, own_queries: OwnQueries, bad: str, length: int
) -> None:
    task = make_task(app, "t.badkey", lock_key=lambda *args, **kwargs: "k" * length + bad)
    with own_queries() as queries, pytest.raises(ValueError, match=r"NUL|not valid Unicode"):
        task.delay(1)
    assert len(queries) == 0
    assert not Lock.objects.exists()
    assert queued(app) == 0


def test_lock_key_as_format_string_callable_or_static_method(app: Celery) -> None:
    formatted = make_task(app, "t.format", lock_key="invoice:{invoice_id}:{0}")
    assert formatted.lock_name((5,)) == "invoice:5:5"
    assert formatted.lock_name((), {"invoice_id": 5}) == "invoice:5:5"

    called = make_task(app, "t.callable", lock_key=lambda invoice_id, **kw: f"inv:{invoice_id}")
    assert called.lock_name((6,), {"copies": 2}) == "inv:6"

    class ByInvoice(SingletonTask):
        @staticmethod
        def lock_key(invoice_id: int, copies: int = 1) -> str:
            return f"by-invoice:{invoice_id}"

    def print_invoice(invoice_id: int, copies: int = 1) -> None:
        """Print copies of an invoice."""

    subclassed = task_of(app, "t.subclass", print_invoice, ByInvoice)
    assert subclassed.lock_name((8, 3)) == "by-invoice:8"
    first = subclassed.delay(8, 3)
    assert subclassed.delay(8, 4).id == first.id  # same key: copies is not part of it


def _unprintable() -> object:
    return object()


@pytest.mark.parametrize(
    ("options", "args", "error", "message"),
    [
        ({"lock_ttl": -1}, (1,), ValueError, "t.bad.*lock_ttl.*at least"),
        ({"lock_ttl": float("nan")}, (1,), ValueError, "lock_ttl.*finite"),
        ({"lock_ttl": "soon"}, (1,), TypeError, "lock_ttl.*number of seconds"),
        ({"lock_ttl": 10**9}, (1,), ValueError, "absurd"),
        ({"on_duplicate": "ignore"}, (1,), ValueError, "on_duplicate must be 'return' or"),
        ({"lock_auto_renew": "yes"}, (1,), TypeError, "lock_auto_renew must be True or False"),
        ({"lock_using": "nowhere"}, (1,), ValueError, "unknown database alias 'nowhere'"),
        ({"lock_key": lambda *a, **k: 42}, (1,), TypeError, "returned 42; it must return a str"),
        ({"lock_key": "x:{missing}"}, (1,), ValueError, "refers to 'missing'"),
        ({"lock_key": ""}, (1,), ValueError, "must not be empty"),
        ({"lock_key": "a\x00{0}"}, (1,), ValueError, "must not contain NUL"),
        ({"lock_key": 3}, (1,), TypeError, "must be None, a format string or a callable"),
        ({}, (1, 2, 3), TypeError, "called with bad arguments"),
        ({}, "12", TypeError, "args must be a list or tuple"),
        ({}, (_unprintable(),), TypeError, "no stable text form.*give the task a lock_key"),
        ({}, ({1: 1, "a": 2},), TypeError, "cannot build a lock key"),
    ],
)
def test_bad_options_and_arguments_fail_before_any_query_and_enqueue_nothing(
    app: Celery,
    own_queries: OwnQueries,
    options: dict[str, Any],
    args: Any,
    error: type[Exception],
    message: str,
) -> None:
    task = make_task(app, "t.bad", **options)
    with own_queries() as queries, pytest.raises(error, match=message):
        task.apply_async(args)
    assert len(queries) == 0
    assert not Lock.objects.exists()
    assert queued(app) == 0


def test_bad_task_lock_ttl_setting_names_the_setting(app: Celery, own_queries: OwnQueries) -> None:
    task = make_task(app, "t.setting")
    with (
        override_settings(LOCKS={"TASK_LOCK_TTL": 0}),
        own_queries() as queries,
        pytest.raises(ValueError, match=r"LOCKS\['TASK_LOCK_TTL'\]: ttl must be at least"),
    ):
        task.delay(1)
    assert len(queries) == 0
    assert not Lock.objects.exists()
    assert queued(app) == 0


def test_lock_ttl_defaults_to_the_task_lock_ttl_setting(app: Celery) -> None:
    with override_settings(LOCKS={"TASK_LOCK_TTL": 120}):
        make_task(app, "t.default-ttl").delay(1)
    make_task(app, "t.own-ttl", lock_ttl=timedelta(minutes=5)).delay(1)
    lengths = {
        lock.name.split(":")[0]: (lock.expires_at - lock.acquired_at).total_seconds()
        for lock in Lock.objects.all()
    }
    assert lengths == {"t.default-ttl": pytest.approx(120), "t.own-ttl": pytest.approx(300)}


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:1/0", "amqp://guest:guest@127.0.0.1:1//"], ids=["redis", "amqp"]
)
def test_publish_failure_releases_the_lock_it_took(url: str) -> None:
    app = make_app(url, unique_queue())
    # No broker listens on port 1; kombu should give up at once rather than retry for 6 s.
    app.conf.broker_transport_options = {"max_retries": 1, "interval_start": 0}
    task = make_task(app, "t.unpublished")
    with pytest.raises(OperationalError):
        task.apply_async((1,), retry=False)
    assert not Lock.objects.exists()  # the key is free again for the next call
    app.close()


def test_key_held_by_a_plain_lease_is_refused_even_in_return_mode(app: Celery) -> None:
    task = make_task(app, "t.shared", lock_key="invoice:{invoice_id}")
    with (
        locks.lock("invoice:9", ttl=30) as lease,
        pytest.raises(locks.DuplicateTask, match="which is not a queued task") as caught,
    ):
        task.delay(9)
    assert caught.value.task_id is None
    assert caught.value.name == "invoice:9"
    assert isinstance(caught.value, locks.LockBusy)
    assert not lease.lost
    assert queued(app) == 0


def test_eager_run_takes_and_releases_the_lock(app: Celery) -> None:
    app.conf.task_always_eager = True
    record = singleton(app, "tests.record")
    result = record.delay("eager")
    assert result.get() == "eager"
    run = CeleryRun.objects.get(label="eager")
    assert (run.task_id, run.finished) == (result.id, True)
    assert not Lock.objects.exists()


def test_eager_failing_run_propagates_without_a_publish_warning(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    app.conf.task_always_eager = True
    app.conf.task_eager_propagates = True
    fail = singleton(app, "tests.fail")
    with (
        caplog.at_level(logging.DEBUG, logger="locks"),
        pytest.raises(RuntimeError, match="task eager-fail failed on purpose"),
    ):
        fail.delay("eager-fail")
    assert CeleryRun.objects.get(label="eager-fail").finished is False
    assert not Lock.objects.exists()
    warnings = [r for r in caplog.records if r.name.startswith("locks") and r.levelno >= 30]
    assert warnings == [], [r.getMessage() for r in warnings]


def test_eager_call_refused_by_celerys_argument_check_releases_the_lock(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    app.conf.task_always_eager = True
    # A callable key does not bind the arguments, so Celery's own check refuses them,
    # after the lock was taken and before any run.
    task = make_task(app, "t.eager-bad-arguments", lock_key=lambda *args, **kwargs: "eager:bad")
    with (
        caplog.at_level(logging.DEBUG, logger="locks"),
        pytest.raises(TypeError),
    ):
        task.apply_async((1, 2, 3))
    assert not Lock.objects.exists()
    assert not [r for r in caplog.records if r.name.startswith("locks") and r.levelno >= 30]


def test_key_travels_in_a_message_header_for_the_worker_and_retries(app: Celery) -> None:
    task = make_task(app, "t.header")
    result = task.delay(1)
    with app.connection_for_write() as connection:
        message = connection.SimpleQueue(app.conf.task_default_queue).get(timeout=5)
        assert message.headers["id"] == result.id
        assert message.headers[KEY_HEADER] == task.lock_name((1,))
        message.ack()


def test_direct_call_inside_an_eager_run_takes_no_lease_and_keeps_the_runs(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    app.conf.task_always_eager = True
    holdings: list[list[tuple[str, int]]] = []

    def walk(depth: int) -> None:
        """Recurse by calling the task function itself, then note who holds what."""
        if depth:
            task(depth - 1)
        holdings.append(list(Lock.objects.values_list("holder", "count")))

    task = task_of(app, "t.walk", walk, lock_key="walk")
    with caplog.at_level(logging.DEBUG, logger="locks"):
        result = task.delay(2)
    # Every level, the innermost first, still sees the eager run's own holding: the
    # enqueue and the run's entry, nothing taken or released by the direct calls.
    assert holdings == [[(result.id, 2)]] * 3
    assert not Lock.objects.exists()
    assert not [r for r in caplog.records if r.name.startswith("locks") and r.levelno >= 30]


def test_enqueue_under_the_task_id_of_a_queued_run_is_a_duplicate(app: Celery) -> None:
    task = make_task(app, "t.same-id")
    assert task.apply_async((42,), task_id="inv-42").id == "inv-42"
    assert task.apply_async((42,), task_id="inv-42").id == "inv-42"
    assert queued(app) == 1
    lock = Lock.objects.get()
    assert (lock.holder, lock.count) == ("inv-42", 1)  # the duplicate gave its re-entry back

    raising = make_task(app, "t.same-id-raise", on_duplicate="raise")
    raising.apply_async((7,), task_id="inv-7")
    with pytest.raises(locks.DuplicateTask, match="already queued or running as inv-7") as caught:
        raising.apply_async((7,), task_id="inv-7")
    assert (caught.value.task_id, caught.value.name) == ("inv-7", raising.lock_name((7,)))
    assert queued(app) == 2
    assert Lock.objects.get(holder="inv-7").count == 1


@pytest.mark.parametrize("serializer", ["json", "pickle"])
def test_duplicate_task_survives_a_result_backend_pickling_and_copying(serializer: str) -> None:
    # A run that enqueues another singleton run and lets DuplicateTask out fails with it:
    # the result backend stores it, and whoever waits for the result must get it back
    # whole, to be caught as locks.DuplicateTask, as any process that pickles it must.
    app = Celery("tests", set_as_current=False)
    app.conf.update(
        result_backend="cache+memory://",
        result_serializer=serializer,
        result_accept_content=[serializer],
    )
    error = locks.DuplicateTask("already queued as t-1", name="invoice:42", task_id="t-1")
    # The in-memory cache is the process's: one result id per serializer.
    app.backend.mark_as_failure(f"t-2-{serializer}", error)
    stored = app.AsyncResult(f"t-2-{serializer}").result
    for again in (stored, pickle.loads(pickle.dumps(error)), copy_module.copy(error)):
        assert isinstance(again, locks.DuplicateTask)
        assert (str(again), again.name, again.task_id) == (str(error), "invoice:42", "t-1")
    app.close()


def revoke(task: SingletonTask, task_id: str, key: str, signum: int | None = None) -> None:
    """Send the worker's ``task_revoked`` signal as Celery does, with the message's context:
    for a message dropped unrun, or with ``signum`` for a run sent that signal."""
    task_revoked.send(
        sender=task,
        request=Context({"id": task_id, KEY_HEADER: key}),
        terminated=signum is not None,
        signum=signum,
        expired=signum is None,
    )


@pytest.mark.parametrize(
    ("signum", "remapped", "released"),
    [
        (signal.SIGKILL, False, True),
        (signal.SIGTERM, False, True),
        (signal.SIGTERM, True, False),  # REMAP_SIGTERM: the run may catch it
        (signal.SIGUSR1, False, False),  # a soft time limit, which the run may catch
        (signal.SIGINT, False, False),
    ],
)
def test_revoke_terminating_a_run_frees_its_key_only_if_the_signal_surely_ends_it(
    app: Celery, monkeypatch: pytest.MonkeyPatch, signum: int, remapped: bool, released: bool
) -> None:
    if remapped:
        monkeypatch.setenv("REMAP_SIGTERM", "SIGQUIT")
    task = make_task(app, "t.terminated")
    sent = task.delay(1)
    revoke(task, sent.id, task.lock_name((1,)), signum=signum)
    assert Lock.objects.filter(holder=sent.id).exists() is not released


@pytest.mark.parametrize(
    "when",
    [
        lambda later: {"countdown": 120},
        lambda later: {"eta": later},
        lambda later: {"eta": later.replace(tzinfo=None)},  # read as UTC, the app's zone
        lambda later: {"eta": later.isoformat()},
    ],
    ids=["countdown", "eta", "naive-eta", "eta-text"],
)
def test_a_run_held_back_by_countdown_or_eta_keeps_its_key_until_it_may_start(
    app: Celery, when: Callable[[datetime], dict[str, Any]]
) -> None:
    task = make_task(app, "t.later", lock_ttl=10)
    sent = task.apply_async((1,), **when(datetime.now(UTC) + timedelta(seconds=120)))
    held = Lock.objects.get(holder=sent.id)
    # 10 s of lock_ttl from when it may start (in 120 s), not from when it was sent.
    assert (held.expires_at - held.acquired_at).total_seconds() == pytest.approx(130, abs=2)
    assert task.delay(1).id == sent.id  # a minute on, still a duplicate
    assert queued(app) == 1


@contextmanager
def as_message(
    task: SingletonTask, task_id: str, args: tuple[Any, ...], key: str | None = None
) -> Iterator[None]:
    """Within it, ``task`` called here runs as a worker runs the message ``task_id``: a
    request with that id, ``args`` and the key header (``args``' key unless ``key``)."""
    header = task.lock_name(args) if key is None else key
    task.push_request(id=task_id, args=args, kwargs={}, headers={KEY_HEADER: header})
    task.request.called_directly = False
    try:
        yield
    finally:
        task.pop_request()


def run_in_process(task: SingletonTask, *args: Any) -> None:
    """Run ``task`` here as a worker would: a request with an id and the key header."""
    with as_message(task, f"run-{time.monotonic_ns()}", args), suppress(Retry, OperationalError):
        task(*args)


def test_a_retry_stops_the_auto_renewal_of_the_runs_lease(app: Celery) -> None:
    # No run holds the lease while the retry waits in the queue: renewing it on would keep
    # the key taken for as long as this worker process lives, whatever becomes of the retry.
    def body(self: SingletonTask, n: int) -> None:
        raise self.retry(countdown=0, max_retries=3)

    task = task_of(
        app,
        "t.retry-renewed",
        body,
        bind=True,
        lock_ttl=1,
        lock_auto_renew=True,
    )
    run_in_process(task, 1)
    assert queued(app) == 1  # the retry
    key = task.lock_name((1,))
    assert locks.is_locked(key)
    deadline = time.monotonic() + 10
    while locks.is_locked(key) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not locks.is_locked(key), "the lease was renewed on after the retry"


def test_a_run_that_sends_a_run_of_its_own_key_sends_a_duplicate_of_itself(app: Celery) -> None:
    # The key is the run's until the run ends: a run of the same key sent from inside it
    # (to run again later, say) is the run's own duplicate, and is not queued. Sent from
    # after_return(), which the worker calls once the run has released its lease, it is.
    sent: dict[str, Any] = {}

    class Again(SingletonTask):
        def after_return(self, *args: Any, **kwargs: Any) -> None:
            sent["after"] = self.apply_async((1,), countdown=60)

    def body(self: SingletonTask, n: int) -> None:
        sent["inside"] = self.apply_async((n,), countdown=60)

    task = task_of(app, "t.again", body, Again, bind=True)
    run = task.apply((1,))  # a run as the worker runs it, here: after_return included
    assert sent["inside"].id == run.id
    assert sent["after"].id != run.id
    assert queued(app) == 1
    assert Lock.objects.get(name=task.lock_name((1,))).holder == sent["after"].id
    refused = task_of(app, "t.again-or-raise", body, bind=True, on_duplicate="raise").apply((1,))
    assert isinstance(refused.result, locks.DuplicateTask)
    assert refused.result.task_id == refused.id


def test_a_run_that_goes_on_after_a_retry_without_throw_keeps_its_key_for_the_retry(
    app: Celery,
) -> None:
    # self.retry(throw=False) queues the retry under the run's task id and returns; the run
    # then ends as it will. A freed key would let a duplicate be queued beside the retry,
    # and the retry's run would then be skipped as the duplicate, its caller left waiting.
    def body(self: SingletonTask, n: int) -> str:
        self.retry(countdown=0, throw=False)
        return "went on"

    task = renewed_task(app, "t.retry-no-throw", body, bind=True)
    first = task.delay(1)
    key = task.lock_name((1,))
    with as_message(task, first.id, (1,)):
        assert task(1) == "went on"
    assert Lock.objects.get(name=key).holder == first.id
    assert task.delay(1).id == first.id  # a duplicate of the queued retry
    assert queued(app) == 2  # the first message and the retry, no third
    assert_renewals_stopped(key)
    # Eager, such a retry is not run at all: the run's end frees its key.
    assert task.apply((2,)).get() == "went on"
    assert not locks.is_locked(task.lock_name((2,)))
    assert queued(app) == 2


@pytest.mark.parametrize(
    ("requeue", "acks_late", "kept"),
    [(True, True, True), (True, False, False), (False, True, False)],
    ids=["requeued", "requeue-but-acked-at-start", "not-requeued"],
)
def test_a_run_rejected_with_requeue_keeps_its_key_like_a_retry(
    app: Celery, requeue: bool, acks_late: bool, kept: bool
) -> None:
    # Reject(requeue=True) puts the message back in the queue under the same task id: a
    # freed key would let a duplicate in beside it. Without acks_late the message was
    # acknowledged when the run began and nothing goes back, so the key is freed.
    def body(n: int) -> None:
        raise Reject("not now", requeue=requeue)

    task = renewed_task(app, "t.reject", body, acks_late=acks_late)
    first = task.delay(1)
    key = task.lock_name((1,))
    with as_message(task, first.id, (1,)), pytest.raises(Reject):
        task(1)
    assert locks.is_locked(key) is kept
    if kept:
        assert task.delay(1).id == first.id  # a duplicate of the requeued message
        assert Lock.objects.get(name=key).holder == first.id
        assert_renewals_stopped(key)
    else:
        assert task.delay(1).id != first.id
    assert queued(app) == (2 if not kept else 1)


@pytest.mark.parametrize(("requeue", "kept"), [(True, True), (False, False)], ids=str)
def test_a_run_that_rejects_with_another_tasks_duplicate_as_reason_is_rejected(
    app: Celery, requeue: bool, kept: bool
) -> None:
    # A run may give its turn back when a task it sends is queued already, with that
    # DuplicateTask as the Reject's reason. Only a retry's refused re-send is the run's own
    # DuplicateTask; this Reject must stay one (requeued with acks_late, its key kept).
    other = make_task(app, "t.other-queued", on_duplicate="raise")
    other.delay(7)

    def body(n: int) -> None:
        try:
            other.delay(7)
        except locks.DuplicateTask as exc:
            raise Reject(exc, requeue=requeue) from exc

    task = task_of(app, "t.reject-dup", body, acks_late=True)
    first = task.delay(1)
    key = task.lock_name((1,))
    with as_message(task, first.id, (1,)), pytest.raises(Reject) as rejected:
        task(1)
    assert isinstance(getattr(rejected.value, "reason", None), locks.DuplicateTask)
    assert locks.is_locked(key) is kept


@pytest.mark.parametrize(
    "url", ["redis://127.0.0.1:1/0", "amqp://guest:guest@127.0.0.1:1//"], ids=["redis", "amqp"]
)
def test_a_replacement_that_cannot_be_sent_leaves_no_lease_behind(url: str) -> None:
    app = make_app(url, unique_queue())
    app.conf.broker_transport_options = {"max_retries": 1, "interval_start": 0}

    def body(self: SingletonTask, n: int) -> None:
        raise self.replace(self.signature((n,), retry=False))

    task = task_of(app, "t.replaced", body, bind=True)
    run_in_process(task, 1)
    assert not Lock.objects.exists()  # the run failed, and its end released the key
    app.close()


def test_revoke_frees_its_own_key_in_one_statement(app: Celery, own_queries: OwnQueries) -> None:
    task = make_task(app, "t.revoked")
    sent = task.delay(1)
    locks.acquire(task.lock_name((1,)), holder=sent.id)  # a re-entry: all of it goes
    with own_queries() as queries:
        revoke(task, sent.id, task.lock_name((1,)))
    assert len(queries) == 1, [q["sql"][:60] for q in queries.captured_queries]
    assert not Lock.objects.exists()


def test_revoke_of_a_free_key_takes_nothing(app: Celery, own_queries: OwnQueries) -> None:
    # The lease is gone already (broken, reaped). Taking the key even for a moment would
    # refuse a message sent in that moment as a duplicate.
    task = make_task(app, "t.revoked")
    key = task.lock_name((1,))
    before = locks.acquire(key)
    before.release()
    with own_queries() as queries:
        revoke(task, "gone-task-id", key)
    assert len(queries) == 1, [q["sql"][:60] for q in queries.captured_queries]
    assert queries.captured_queries[0]["sql"].lstrip().upper().startswith("DELETE")
    after = locks.acquire(key)
    assert after.token == before.token + 1  # no grant in between
    after.release()


@pytest.mark.skipif(BACKEND == "sqlite", reason="SQLite: a missing table is an OperationalError")
def test_a_revoke_whose_release_fails_on_a_working_connection_does_not_try_again(
    app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    # Only a connection the server ended is worth a second try on a new one: a statement
    # the database refuses (here its table is gone: ProgrammingError) is refused again.
    task = make_task(app, "t.revoked-refused")
    sent = task.delay(1)
    locks.connection.get(conf.DATABASE).ensure_connection()
    opened: list[object] = []

    def count(sender: Any, connection: Any, **kwargs: Any) -> None:
        if getattr(connection, "locks_own", False):
            opened.append(connection)

    with connections["default"].cursor() as cursor:
        cursor.execute("ALTER TABLE locks_lock RENAME TO locks_lock_away")
    connection_created.connect(count)
    try:
        with caplog.at_level(logging.ERROR, "locks.celery"):
            revoke(task, sent.id, task.lock_name((1,)))
    finally:
        connection_created.disconnect(count)
        with connections["default"].cursor() as cursor:
            cursor.execute("ALTER TABLE locks_lock_away RENAME TO locks_lock")
    assert opened == [], "it tried again on a new connection"
    assert f"task t.revoked-refused[{sent.id}] was revoked, but freeing lock" in caplog.text
    assert "locks_lock" in caplog.text  # the database's own word on the missing table
    assert Lock.objects.filter(holder=sent.id).exists()  # it expires by its TTL


def test_revoke_leaves_another_holders_lease_alone(app: Celery) -> None:
    task = make_task(app, "t.revoked")
    key = task.lock_name((1,))
    lease = locks.acquire(key, holder="someone-else", ttl=60)
    revoke(task, "revoked-task-id", key)
    held = Lock.objects.get(name=key)
    assert (held.holder, held.token, held.count) == ("someone-else", lease.token, 1)
    lease.release()


def run_message(task: SingletonTask, task_id: str, *args: Any) -> None:
    """Run the message ``task_id`` of ``task`` here as a worker runs it: its id, its key."""
    with as_message(task, task_id, args):
        task(*args)


def assert_key_free_after_failed_run(task: SingletonTask, failed_id: str) -> None:
    """Nothing is queued or running under ``failed_id``: its key must be free again."""
    key = task.lock_name((1,))
    held = Lock.objects.filter(name=key).first()
    again = task.delay(1)
    assert held is None and again.id != failed_id, (
        f"the failed run {failed_id} keeps {key!r} until {held and held.expires_at}; "
        f"delay() is refused as its duplicate: {again.id}"
    )


@pytest.mark.parametrize(
    "error",
    [DatabaseOperationalError("server closed the connection"), SoftTimeLimitExceeded()],
    ids=["database-error", "soft-time-limit"],
)
def test_a_run_that_fails_to_begin_frees_its_key(
    app: Celery, monkeypatch: pytest.MonkeyPatch, error: BaseException
) -> None:
    # Its message was taken off the queue, and the run never began: kept, the enqueue's
    # lease would refuse every delay() for lock_ttl as a duplicate of a run that is gone.
    task = make_task(app, "t.entry-fails", lock_ttl=3600)
    sent = task.delay(1)

    def failing(*args: Any, **kwargs: Any) -> None:
        raise error

    with monkeypatch.context() as patched:
        patched.setattr(locks.leases, "try_acquire", failing)
        with pytest.raises(type(error)):
            run_message(task, sent.id, 1)
    assert_key_free_after_failed_run(task, sent.id)


def test_a_run_that_fails_to_begin_keeps_its_error_when_freeing_fails_too(
    app: Celery, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    task = make_task(app, "t.entry-fails-twice", lock_ttl=3600)
    sent = task.delay(1)

    def failing(*args: Any, **kwargs: Any) -> None:
        raise DatabaseOperationalError("the database is gone")

    with monkeypatch.context() as patched:
        patched.setattr(locks.leases, "try_acquire", failing)
        patched.setattr(locks.leases, "release_holding", failing)
        with (
            caplog.at_level(logging.ERROR, "locks.celery"),
            pytest.raises(DatabaseOperationalError, match="the database is gone"),
        ):
            run_message(task, sent.id, 1)
    assert "failed to begin, and freeing its lock failed too" in caplog.text
    assert Lock.objects.get(name=task.lock_name((1,))).holder == sent.id  # expires by TTL


@pytest.mark.skipif(
    BACKEND != "postgresql" or pgbouncer.ENABLED,
    reason="terminates a PostgreSQL session (ours, not PgBouncer's)",
)
def test_a_run_whose_lock_connection_the_server_ended_frees_its_key(app: Celery) -> None:
    # A database restart, a failover or an idle-session timeout, as an idle worker sees it.
    task = make_task(app, "t.connection-ended", lock_ttl=3600)
    sent = task.delay(1)
    own = locks.connection.get(conf.DATABASE)
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [own.connection.info.backend_pid])
    with pytest.raises(DatabaseOperationalError):
        run_message(task, sent.id, 1)
    assert_key_free_after_failed_run(task, sent.id)


@pytest.mark.skipif(BACKEND != "mariadb", reason="MariaDB's wait_timeout")
def test_a_run_whose_lock_connection_idled_past_wait_timeout_frees_its_key(app: Celery) -> None:
    # A worker idle longer than the server's wait_timeout (8 h by default; 1 s here).
    task = make_task(app, "t.wait-timeout", lock_ttl=3600)
    sent = task.delay(1)
    with locks.connection.get(conf.DATABASE).cursor() as cursor:
        cursor.execute("SET SESSION wait_timeout = 1")
    time.sleep(2.5)
    with pytest.raises(DatabaseOperationalError):
        run_message(task, sent.id, 1)
    assert_key_free_after_failed_run(task, sent.id)


@pytest.mark.skipif(
    BACKEND == "sqlite" or pgbouncer.ENABLED,
    reason="ends a server session of the app's own: PostgreSQL and MariaDB",
)
@pytest.mark.parametrize("max_age", [0, None], ids=["closed-each-time", "persistent"])
def test_a_revoke_after_the_main_process_lock_connection_ended_frees_its_key(
    app: Celery, max_age: int | None
) -> None:
    # task_revoked runs in the worker's main process, which runs no task: no prerun or
    # postrun closes its lock connection. A first revoke opens it; the server ends it
    # while the worker idles (a restart, a failover, wait_timeout); then a second revoke.
    # A persistent connection without health checks is only found dead by the release.
    task = make_task(app, "t.revoked-idle", lock_ttl=3600)
    first, second = task.delay(1), task.delay(2)
    own = locks.connection.get(conf.DATABASE)
    own.close()
    saved = own.settings_dict["CONN_MAX_AGE"]
    own.settings_dict["CONN_MAX_AGE"] = max_age
    try:
        revoke(task, first.id, task.lock_name((1,)))
        assert not Lock.objects.filter(holder=first.id).exists()
        assert (own.connection is None) == (max_age == 0)
        if own.connection is not None:  # still open after the first revoke: end its session
            with own.cursor() as cursor:
                cursor.execute(SESSION_ID[own.vendor])
                (session,) = cursor.fetchone()
            kill_session(session)
            deadline = time.monotonic() + 10
            while session in other_sessions():
                assert time.monotonic() < deadline, "the session did not end"
                time.sleep(0.05)
        revoke(task, second.id, task.lock_name((2,)))
    finally:
        own.close()
        own.settings_dict["CONN_MAX_AGE"] = saved
    held = Lock.objects.filter(holder=second.id).values_list("expires_at", flat=True).first()
    assert held is None, f"the revoked {second.id} keeps its key until {held}"


@pytest.mark.parametrize(
    ("eager", "closed"), [(False, True), (True, False)], ids=["worker", "eager"]
)
@pytest.mark.parametrize("signal_", [task_prerun, task_postrun], ids=["prerun", "postrun"])
def test_a_worker_closes_old_lock_connections_around_each_task(
    app: Celery, signal_: Any, eager: bool, closed: bool
) -> None:
    # As Celery's Django fixup does for Django's connections (CONN_MAX_AGE = 0 here):
    # a connection the server dropped while the worker idled is not the next run's.
    task = make_task(app, "t.recycled")
    own = locks.connection.get(conf.DATABASE)
    own.ensure_connection()
    assert own.settings_dict["CONN_MAX_AGE"] == 0
    task.push_request(id="recycled-task-id", is_eager=eager)
    try:
        signal_.send(sender=task, task_id="recycled-task-id", task=task, args=(), kwargs={})
    finally:
        task.pop_request()
    assert (own.connection is None) is closed


def test_a_run_holds_the_key_its_message_header_names_however_its_arguments_arrive(
    app: Celery,
) -> None:
    # A serializer may hand the worker the arguments in another form (a datetime as ISO
    # text, say): a key made anew from them would miss the lease the enqueue took, which
    # would then turn duplicates away for lock_ttl after the run ended.
    during: list[list[tuple[str, str, int]]] = []

    def body(when: Any) -> None:
        during.append(list(Lock.objects.order_by("name").values_list("name", "holder", "count")))

    task = task_of(app, "t.header-key", body, lock_key=lambda when: f"at:{when}")
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    sent = task.delay(when)
    key = task.lock_name((when,))
    arrived = when.isoformat()
    assert task.lock_name((arrived,)) != key
    with as_message(task, sent.id, (arrived,), key=key):
        task(arrived)
    assert during == [[(key, sent.id, 2)]], "the run re-entered the enqueue's lease"
    assert not Lock.objects.exists()


def test_a_run_that_replaces_itself_keeps_its_key_taken_for_the_replacement(app: Celery) -> None:
    # The replacement goes out under the run's task id and the same key: between the end
    # of the run and the start of the replacement's run, the key must stay taken, or a
    # delay() in that gap enqueues a second run beside the replacement.
    def body(self: SingletonTask, n: int) -> None:
        raise self.replace(self.signature((n,)))

    task = task_of(app, "t.replace-self", body, bind=True)
    sent = task.delay(1)
    key = task.lock_name((1,))
    with as_message(task, sent.id, (1,)), pytest.raises(Ignore):
        task(1)
    assert Lock.objects.get(name=key).holder == sent.id
    assert task.delay(1).id == sent.id, "a duplicate of the replacement"
    assert queued(app) == 2  # the first message (still unacknowledged here) and the replacement
