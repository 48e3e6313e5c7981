"""Celery tasks of the demo: a de-duplicated invoice e-mail that the web demo can enqueue."""

from __future__ import annotations

import logging
import time

from celery import shared_task

from locks.celery import SingletonTask

logger = logging.getLogger("project.tasks")

#: How long "sending" takes: long enough to click the button again and see no second run.
SEND_SECONDS = 3.0


@shared_task(base=SingletonTask, lock_key="invoice-email:{invoice_id}", lock_ttl=600)
def send_invoice_email(invoice_id: int) -> str:
    """Pretend to render and e-mail invoice ``invoice_id``; runs once per invoice at a time.

    While one e-mail for an invoice is queued or being sent, another ``delay()`` for the
    same invoice enqueues nothing and returns the queued run's ``AsyncResult``.

    Example::

        result = send_invoice_email.delay(42)
        assert send_invoice_email.delay(42).id == result.id
    """
    logger.info(
        "sending the e-mail of invoice %s (lock 'invoice-email:%s')", invoice_id, invoice_id
    )
    time.sleep(SEND_SECONDS)
    return f"invoice {invoice_id} e-mailed"
