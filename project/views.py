"""Demo pages: a slow view guarded by lock_view, a de-duplicated task button, a live lock table."""

from __future__ import annotations

import os
import time

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from locks.decorators import lock_view
from locks.models import DatabaseNow, Lock
from project.tasks import send_invoice_email

#: How long the guarded report view works while holding its lock (DEMO_REPORT_SECONDS).
REPORT_SECONDS = float(os.environ.get("DEMO_REPORT_SECONDS") or 3.0)


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    """The demo page."""
    return render(request, "demo/index.html", {"report_seconds": REPORT_SECONDS})


@lock_view("demo:report", ttl=REPORT_SECONDS + 10)
def report(request: HttpRequest) -> HttpResponse:
    """Takes a few seconds; concurrent requests get 423 Locked with Retry-After meanwhile."""
    time.sleep(REPORT_SECONDS)
    lease = request.lock_lease  # type: ignore[attr-defined]
    return JsonResponse({"ok": True, "lock": lease.name, "token": lease.token})


@require_POST
def enqueue(request: HttpRequest) -> HttpResponse:
    """Enqueue the de-duplicated invoice e-mail task (a worker runs it)."""
    try:
        invoice_id = int(request.POST.get("invoice_id", "1"))
    except ValueError:
        return JsonResponse({"error": "invoice_id must be a whole number"}, status=400)
    result = send_invoice_email.delay(invoice_id)
    return JsonResponse({"task_id": str(result.id), "invoice_id": invoice_id}, status=202)


@require_GET
def lock_table(request: HttpRequest) -> HttpResponse:
    """Current lock rows as JSON, with seconds left by the database clock (polled by the page)."""
    rows = []
    queryset = Lock.objects.annotate(db_now=DatabaseNow()).order_by("-acquired_at", "-token")
    for lock in queryset[:100]:
        left = (lock.expires_at - lock.db_now).total_seconds()  # type: ignore[attr-defined]
        rows.append(
            {
                "name": lock.name,
                "holder": lock.holder,
                "count": lock.count,
                "token": lock.token,
                "expires_in": round(left, 1),
                "state": "held" if left > 0 else "expired",
                "note": lock.note,
            }
        )
    return JsonResponse({"locks": rows})
