"""Celery app of the tests: ``celery -A tests.celery_app worker`` with the broker from the env.

Environment:
    LOCKS_TEST_BROKER_URL: broker (default ``memory://``).
    LOCKS_TEST_QUEUE: the one queue this run's producers and workers use, unique per test
        run so that other checkouts' workers on the same broker never take its messages.
    LOCKS_TEST_BEAT_INTERVAL: seconds between ``locks.reap_expired`` runs under beat.
    LOCKS_TEST_REMOTE_CONTROL: ``1`` lets the worker obey broadcasts (``revoke``), on a
        control exchange of the run's own.
    LOCKS_TEST_VISIBILITY_TIMEOUT: Redis only: seconds after which an unacknowledged
        message goes back to the queue (the run's own unacked keys, swept every second).
    LOCKS_TEST_RESULT_BACKEND: a result backend URL (default: none, nothing stored).
"""

from __future__ import annotations

import os

from celery import Celery
from kombu import Exchange, Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

EXCHANGE = "locks-tests"


def make_app(
    broker_url: str,
    queue: str,
    beat_interval: float | None = None,
    *,
    remote_control: bool = False,
    visibility_timeout: float | None = None,
    result_backend: str | None = None,
) -> Celery:
    """A Celery app on ``broker_url`` whose tasks all go through ``queue``.

    ``remote_control``: the worker obeys broadcasts such as ``revoke`` sent on the control
    exchange named after ``queue``, which no other test run sends to.
    ``visibility_timeout`` (Redis): an unacknowledged message is redelivered that many
    seconds after its delivery. The unacked messages are kept under keys named after
    ``queue``: a worker sweeping the shared default keys with so short a timeout would
    redeliver other test runs' messages that are still running.
    ``result_backend``: where runs store their state and result (results expire in ten
    minutes), for tests of what the backend reports.
    """
    app = Celery("tests", broker=broker_url, set_as_current=False)
    app.conf.update(
        include=["locks.tasks", "tests.celery_tasks"],
        task_default_queue=queue,
        # One exchange for every test run; RabbitMQ deletes a run's queue ten minutes after
        # its last use, so test runs leave nothing behind.
        task_queues=[Queue(queue, Exchange(EXCHANGE), routing_key=queue, expires=600)],
        task_default_exchange=EXCHANGE,
        task_default_routing_key=queue,
        result_backend=result_backend,
        result_expires=600,
        worker_prefetch_multiplier=1,
        # Another checkout's broadcast (e.g. a shutdown) must not reach this run's worker:
        # none by default, and only those on this run's own control exchange if asked.
        worker_enable_remote_control=remote_control,
        control_exchange=f"{queue}-control" if remote_control else "celery",
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        timezone="UTC",
    )
    if visibility_timeout is not None:
        app.conf.broker_transport_options = {
            "visibility_timeout": visibility_timeout,
            "unacked_key": f"{queue}.unacked",
            "unacked_index_key": f"{queue}.unacked_index",
            "unacked_mutex_key": f"{queue}.unacked_mutex",
            # A worker killed during a sweep leaves the sweep's mutex for this long.
            "unacked_mutex_expire": 2,
            # Sweep for messages past their visibility timeout every second (default:
            # every 100 s), and at once when a worker starts.
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        }
    if beat_interval is not None:
        app.conf.beat_schedule = {
            "locks-reap-expired": {"task": "locks.reap_expired", "schedule": beat_interval},
        }
    return app


_interval = os.environ.get("LOCKS_TEST_BEAT_INTERVAL")
_visibility = os.environ.get("LOCKS_TEST_VISIBILITY_TIMEOUT")
app = make_app(
    os.environ.get("LOCKS_TEST_BROKER_URL", "memory://"),
    os.environ.get("LOCKS_TEST_QUEUE", "locks-tests"),
    float(_interval) if _interval else None,
    remote_control=os.environ.get("LOCKS_TEST_REMOTE_CONTROL") == "1",
    visibility_timeout=float(_visibility) if _visibility else None,
    result_backend=os.environ.get("LOCKS_TEST_RESULT_BACKEND") or None,
)
