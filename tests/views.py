"""Views used by the tests."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

import locks


def acquire_then_fail(request: HttpRequest) -> HttpResponse:
    """Take a lease inside the request, then fail so ATOMIC_REQUESTS rolls back."""
    locks.acquire(request.GET["name"], holder=request.GET["holder"], ttl=30)
    raise RuntimeError("the view fails after taking the lease")


def acquire_and_release(request: HttpRequest) -> HttpResponse:
    """Take and release a lease inside the request."""
    with locks.lock(request.GET["name"]) as lease:
        return HttpResponse(str(lease.token))
