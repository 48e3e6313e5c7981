"""The reaper task ``locks.reap_expired``: run by Celery, under a real beat, at 100,000 rows."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import locks
from locks.models import Lock
from locks.tasks import reap, reap_expired
from tests.celery_app import make_app
from tests.celery_support import (
    BROKER_URLS,
    celery_beat,
    celery_env,
    celery_worker,
    delete_queue,
    unique_queue,
    wait_until,
)
from tests.conftest import finish, read_event, spawn

pytestmark = pytest.mark.django_db(transaction=True)

OwnQueries = Callable[[], CaptureQueriesContext]
BIG = 100_000
BATCH = 1000
CHURNERS = 2
BASELINE = 300


GONE = "a-process-long-gone"
FIRST = 1_000_000
# Rows are made by the database itself from cross-joined digits: portable SQL, and far
# faster than sending 100,000 rows. Names are numbers from FIRST, as no string
# concatenation function is common to the three databases.
DIGITS = " UNION ALL ".join(f"SELECT {digit} AS n" for digit in range(10))


def expired_name(number: int) -> str:
    return str(FIRST + number)


def insert_expired(count: int) -> None:
    """``count`` expired lock rows of a long-gone holder, named FIRST, FIRST + 1, ..."""
    places = max(1, len(str(count - 1)))
    tables = " CROSS JOIN ".join(f"({DIGITS}) d{i}" for i in range(places))
    number = " + ".join(f"d{i}.n * {10**i}" for i in range(places))
    long_ago = timezone.now() - timedelta(days=1)
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO locks_lock (name, holder, count, token, acquired_at, expires_at, note) "
            f"SELECT CAST({number} + {FIRST} AS CHAR(10)), %s, 1, {number} + 1, %s, %s, '' "
            f"FROM {tables} WHERE {number} < %s",
            [GONE, adapt(long_ago - timedelta(hours=1)), adapt(long_ago), count],
        )
    assert Lock.objects.expired().filter(holder=GONE).count() == count


def left() -> int:
    """Expired rows of the long-gone holder still there (a taken-over row has a new holder)."""
    return Lock.objects.filter(holder=GONE).count()


def run_task(**kwargs: Any) -> Any:
    """Run the registered ``locks.reap_expired`` through Celery's tracer, in this process."""
    app = make_app("memory://", "reaper-tests")
    result = app.tasks["locks.reap_expired"].apply(kwargs=kwargs, throw=True)
    return result.get()


def test_reaper_task_is_registered_under_its_contract_name() -> None:
    app = make_app("memory://", "reaper-tests")
    assert app.tasks["locks.reap_expired"].name == "locks.reap_expired"
    assert reap_expired.name == "locks.reap_expired"


def test_reaper_task_deletes_expired_rows_keeps_live_ones_and_logs_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    insert_expired(25)
    live = [locks.acquire(f"live:{i}", ttl=60) for i in range(3)]
    with caplog.at_level(logging.INFO, logger="locks.tasks"):
        assert run_task() == 25
    assert left() == 0
    assert all(locks.is_locked(lease.name) for lease in live)
    assert "reaped 25 expired locks on database 'default' in 1 batches" in caplog.text
    for lease in live:
        lease.release()


def test_reaper_task_batches_by_setting_and_stops_when_the_time_budget_is_spent(
    caplog: pytest.LogCaptureFixture,
) -> None:
    insert_expired(25)
    with override_settings(LOCKS={"REAP_BATCH_SIZE": 10, "REAP_TIME_BUDGET": 0}):
        with caplog.at_level(logging.INFO, logger="locks.tasks"):
            assert run_task() == 10  # one batch, then the budget of 0 s is spent
        assert "time budget spent" in caplog.text
        assert left() == 15
    with override_settings(LOCKS={"REAP_BATCH_SIZE": 10, "REAP_TIME_BUDGET": None}):
        report = reap()
    assert (report.deleted, report.batches, report.finished) == (15, 2, True)
    assert left() == 0


@pytest.mark.parametrize(
    ("settings", "kwargs", "error", "message"),
    [
        ({"REAP_TIME_BUDGET": -1}, {}, ValueError, "LOCKS['REAP_TIME_BUDGET']: .*negative"),
        ({"REAP_TIME_BUDGET": "soon"}, {}, TypeError, "LOCKS['REAP_TIME_BUDGET']"),
        ({"REAP_BATCH_SIZE": 0}, {}, ValueError, "batch_size must be between 1"),
        ({}, {"batch_size": "many"}, TypeError, "batch_size must be an int"),
        ({}, {"time_budget": float("nan")}, ValueError, "NaN"),
        ({}, {"using": "nowhere"}, ValueError, "unknown database alias 'nowhere'"),
    ],
)
def test_bad_reaper_settings_and_arguments_fail_before_any_query(
    own_queries: OwnQueries,
    settings: dict[str, Any],
    kwargs: dict[str, Any],
    error: type[Exception],
    message: str,
) -> None:
    insert_expired(5)
    match = message.replace("[", r"\[").replace("]", r"\]")
    with (
        override_settings(LOCKS=settings),
        own_queries() as queries,
        pytest.raises(error, match=match),
    ):
        run_task(**kwargs)
    assert len(queries) == 0
    assert left() == 5


def test_celery_beat_reaps_expired_rows_while_live_ones_survive(tmp_path: Path) -> None:
    insert_expired(3 * BATCH + 17)
    steady = locks.acquire("live:steady", ttl=120)
    stop = tmp_path / "stop"
    # A holder with a 3 s lease renewed every second: often within milliseconds
    # of expiring, never expired.
    holder = spawn("renewing_holder", "live:renewed", 3.0, stop, module="tests.workers_celery")
    assert read_event(holder)["event"] == "acquired"
    url, queue = BROKER_URLS["redis"], unique_queue()
    env = celery_env(url, queue, LOCKS_TEST_BEAT_INTERVAL="0.5")
    try:
        with (
            celery_worker(
                "tests.celery_app", queue, tmp_path / "worker.log", env, pool="solo"
            ) as w,
            celery_beat("tests.celery_app", tmp_path, env) as beat,
        ):
            wait_until(lambda: left() == 0, timeout=90, what="beat to reap the expired rows")
            # Let beat run the reaper a few more times while the renewed lease lives on.
            wait_until(
                lambda: w.text().count("Task locks.reap_expired[") >= 8,
                timeout=90,
                what="eight reaper runs",
            )
            assert "Sending due task locks-reap-expired (locks.reap_expired)" in beat.text()
            assert "succeeded in" in w.text()
            assert locks.is_locked("live:renewed")
    finally:
        stop.touch()
        delete_queue(make_app(url, queue), queue)
    assert finish(holder)[-1] == {"event": "released", "lost": False}
    assert locks.is_locked("live:steady")
    steady.release()


def test_reaping_100k_rows_never_blocks_an_acquire_longer_than_a_batch(
    tmp_path: Path, backend: str
) -> None:
    # SQLite has one writer per file, and its busy handler polls with growing sleeps instead
    # of queueing: two acquiring processes starve each other for 0.1-1 s with no reaper at
    # all. There one acquiring process isolates what the reaper adds.
    churners = 1 if backend == "sqlite" else CHURNERS
    insert_expired(BIG)
    stop, started = tmp_path / "stop", tmp_path / "started"
    processes = []
    for w in range(churners):
        # Own names, plus expired rows the reaper is deleting (taken over or inserted anew).
        names = [f"churn:{w}:{k}" for k in range(5)]
        names += [expired_name(w * 5 + k) for k in range(5)]
        processes.append(
            spawn("churn", ",".join(names), BASELINE, started, stop, module="tests.workers_celery")
        )
    try:
        for churner in processes:
            assert read_event(churner)["event"] == "ready"
        for churner in processes:
            assert read_event(churner)["event"] == "baseline"
        reaper = spawn("reap", BATCH, started, module="tests.workers_celery")
        report = finish(reaper, 240)[-1]
    finally:
        stop.touch()
    stats = [finish(churner, 60)[-1] for churner in processes]

    assert report["event"] == "reaped"
    assert BIG - 5 * churners <= report["deleted"] <= BIG
    assert report["batches"] >= BIG // BATCH
    assert left() == 0
    assert [stat["failures"] for stat in stats] == [[]] * churners
    assert all(stat["during"] > 0 for stat in stats)
    # While the reaper runs, an acquire waits at most for the batch in progress, then gets
    # in during the reaper's pause. On top comes what acquires wait with no reaper at all
    # (a loaded machine), measured before the reaper started.
    noise = max(stat["longest_before"] for stat in stats)
    longest = max(stat["longest_during"] for stat in stats)
    print(
        f"longest acquire {longest:.4f} s (before the reaper {noise:.4f} s); longest batch "
        f"{report['longest_batch']:.4f} s; reaped in {report['elapsed']:.2f} s, "
        f"{report['batches']} batches; acquires during {[s['during'] for s in stats]}"
    )
    # SQLite's busy handler sleeps in growing steps (1, 2, 5, 10, 15, 20, 25 ms...), so a
    # waiting acquire may notice the reaper's pause a step late, at each of the two
    # batches it may wait for (one CI run overshot a one-step allowance by 28 ms).
    busy_step = 0.1 if backend == "sqlite" else 0.0
    assert longest <= noise + report["longest_batch"] * 2 + busy_step


def test_reaper_task_arguments_override_the_settings_and_an_unfinished_run_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    insert_expired(25)
    with caplog.at_level(logging.INFO, logger="locks.tasks"):
        assert run_task(batch_size=10, time_budget=0) == 10  # one batch of 10, budget spent
        assert left() == 15
        assert run_task(batch_size=10) == 15  # LOCKS["REAP_TIME_BUDGET"] of 30 s
    assert left() == 0
    levels = [r.levelname for r in caplog.records if r.name == "locks.tasks"]
    assert levels == ["WARNING", "INFO"], "a run that left expired rows says so as a warning"


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_reaper_task_reaps_the_database_it_is_given() -> None:
    for name in ("other:1", "other:2"):
        locks.acquire(name, ttl=0.05, holder=GONE, using="other")
    locks.acquire("default:1", ttl=0.05, holder=GONE)
    wait_until(lambda: not locks.is_locked("default:1"), what="the rows to expire")
    assert run_task(using="other") == 2
    assert not Lock.objects.using("other").exists()
    assert list(Lock.objects.values_list("name", flat=True)) == ["default:1"]
