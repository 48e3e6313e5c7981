"""Celery app of the tests: ``celery -A tests.celery_app worker`` with the broker from the env.

Environment:
    LOCKS_TEST_BROKER_URL: broker (default ``memory://``).
    LOCKS_TEST_QUEUE: the one queue this run's producers and workers use, unique per test
        run so that other checkouts' workers on the same broker never take its messages.
    LOCKS_TEST_BEAT_INTERVAL: seconds between ``locks.reap_expired`` runs under beat.
    LOCKS_TEST_REMOTE_CONTROL: ``1`` lets the worker obey broadcasts (``revoke``), on a
        control exchange of the run's own.
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
) -> Celery:
    """A Celery app on ``broker_url`` whose tasks all go through ``queue``.

    ``remote_control``: the worker obeys broadcasts such as ``revoke`` sent on the control
    exchange named after ``queue``, which no other test run sends to.
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
        result_backend=None,
        worker_prefetch_multiplier=1,
        # Another checkout's broadcast (e.g. a shutdown) must not reach this run's worker:
        # none by default, and only those on this run's own control exchange if asked.
        worker_enable_remote_control=remote_control,
        control_exchange=f"{queue}-control" if remote_control else "celery",
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
    remote_control=os.environ.get("LOCKS_TEST_REMOTE_CONTROL") == "1",
)
