"""Celery tasks of the locks app: the reaper, registered as ``locks.reap_expired``."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task

from . import leases, validation
from .conf import conf
from .leases import ReapReport

logger = logging.getLogger("locks.tasks")

__all__ = ["ReapReport", "reap", "reap_expired"]  # ReapReport: made by leases.reap_batches


def reap(
    batch_size: int | None = None,
    *,
    using: str | None = None,
    time_budget: float | timedelta | None = None,
) -> ReapReport:
    """Delete expired lock rows batch by batch until none are left or the budget is spent.

    ``batch_size`` defaults to ``LOCKS["REAP_BATCH_SIZE"]`` and ``time_budget`` (seconds)
    to ``LOCKS["REAP_TIME_BUDGET"]``. Each batch is one conditional DELETE judged by the
    database clock, as in :func:`locks.reap_expired`, so a lease renewed a moment ago
    survives. On SQLite, where waiting writers poll, it pauses after each batch as long as
    the batch held the file's write lock.
    Arguments are checked before any query.

    Example::

        report = reap(batch_size=500, time_budget=10)
        print(f"{report.deleted} rows in {report.batches} batches")
    """
    # conf checks a setting as it reads it (its error names the setting); arguments here.
    size = conf.REAP_BATCH_SIZE if batch_size is None else validation.check_batch_size(batch_size)
    budget = (
        conf.REAP_TIME_BUDGET if time_budget is None else validation.timeout_seconds(time_budget)
    )
    alias = conf.DATABASE if using is None else validation.check_alias(using)
    return leases.reap_batches(size, alias, budget)


@shared_task(name="locks.reap_expired", ignore_result=False)
def reap_expired(
    batch_size: int | None = None, time_budget: float | None = None, using: str | None = None
) -> int:
    """Celery task ``locks.reap_expired``: delete expired lock rows; return how many went.

    Schedule it with Celery beat (exactly one beat process); two runs at the same time are
    safe, each batch deletes only rows that are expired at that moment.

    Example::

        CELERY_BEAT_SCHEDULE = {
            "locks-reap-expired": {"task": "locks.reap_expired", "schedule": 60.0},
        }
    """
    report = reap(batch_size, using=using, time_budget=time_budget)
    logger.log(
        logging.INFO if report.finished else logging.WARNING,
        "reaped %d expired locks on database %r in %d batches, %.3f s (longest batch %.3f s)%s",
        report.deleted,
        report.database,
        report.batches,
        report.elapsed,
        report.longest_batch,
        "" if report.finished else "; time budget spent, expired rows may be left",
    )
    return report.deleted
