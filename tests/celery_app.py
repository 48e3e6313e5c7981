"""Celery app of the tests: ``celery -A tests.celery_app worker`` with the broker from the env.

Environment:
    LOCKS_TEST_BROKER_URL: broker (default ``memory://``).
    LOCKS_TEST_QUEUE: the one queue this run's producers and workers use, unique per test
        run so that other checkouts' workers on the same broker never take its messages.
    LOCKS_TEST_BEAT_INTERVAL: seconds between ``locks.reap_expired`` runs under beat.
"""

from __future__ import annotations

import os

from celery import Celery
from kombu import Exchange, Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

EXCHANGE = "locks-tests"


def make_app(broker_url: str, queue: str, beat_interval: float | None = None) -> Celery:
    """A Celery app on ``broker_url`` whose tasks all go through ``queue``."""
    app = Celery("tests", broker=broker_url, set_as_current=False)
    app.conf.update(
        include=["locks.tasks", "tests.celery_tasks"],
        task_default_queue=queue,
        # One exchange for every test run; RabbitMQ deletes a run's queue ten minutes after
        # its last use, so test runs leave nothing behind.
        task_queues=[Queue(queue, Exchange(EXCHANGE), routing_key=queue, expires=600)],
        task_default_exchange=EXCHANGE,
        task_default_routing_key=queue,
        result_backend=None,
        worker_prefetch_multiplier=1,
        # Another checkout's broadcast (e.g. a shutdown) must not reach this run's worker.
        worker_enable_remote_control=False,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        timezone="UTC",
    )
    if beat_interval is not None:
        app.conf.beat_schedule = {
            "locks-reap-expired": {"task": "locks.reap_expired", "schedule": beat_interval},
        }
    return app


_interval = os.environ.get("LOCKS_TEST_BEAT_INTERVAL")
app = make_app(
    os.environ.get("LOCKS_TEST_BROKER_URL", "memory://"),
    os.environ.get("LOCKS_TEST_QUEUE", "locks-tests"),
    float(_interval) if _interval else None,
)
