"""Views guarded by lock_view, used by the decorator tests (sync, async, streaming, CBV)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.middleware.http import ConditionalGetMiddleware
from django.utils.decorators import decorator_from_middleware, method_decorator
from django.views import View

from locks.decorators import LockViewMixin, lock_view
from tests.app.models import Counter

GATE_WAIT = 120.0  # seconds a gated view waits at most for its gate file


def _entered(request: HttpRequest) -> None:
    log = request.GET.get("log")
    if log:
        with open(log, "a") as f:
            f.write(f"{request.lock_lease.token}\n")  # type: ignore[attr-defined]


def _wait_gate(request: HttpRequest) -> None:
    gate = request.GET.get("gate")
    deadline = time.monotonic() + GATE_WAIT
    while gate and not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


async def _await_gate(request: HttpRequest) -> None:
    gate = request.GET.get("gate")
    deadline = time.monotonic() + GATE_WAIT
    while gate and not Path(gate).exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)


def _lease_json(request: HttpRequest) -> JsonResponse:
    lease = request.lock_lease  # type: ignore[attr-defined]
    return JsonResponse({"name": lease.name, "token": lease.token, "holder": lease.holder})


@lock_view("gate:{name}", ttl=60)
def gated(request: HttpRequest, name: str) -> HttpResponse:
    _entered(request)
    _wait_gate(request)
    return _lease_json(request)


@lock_view("gate:{name}", ttl=60)
async def agated(request: HttpRequest, name: str) -> HttpResponse:
    _entered(request)
    await _await_gate(request)
    return _lease_json(request)


def _waiting_key(request: HttpRequest, name: str) -> str:
    # The key is computed just before the lock is tried: a marker that the wait begins.
    marker = request.GET.get("waiting")
    if marker:
        Path(marker).touch()
    return f"gate:{name}"


@lock_view(_waiting_key, ttl=60, timeout=60)
async def await_lock(request: HttpRequest, name: str) -> HttpResponse:
    """Waits (asynchronously) up to a minute for the lock instead of answering 423."""
    return _lease_json(request)


async def ping(request: HttpRequest) -> HttpResponse:
    return HttpResponse("pong")


@lock_view("key:{value}", ttl=30)
def key(request: HttpRequest, value: str) -> HttpResponse:
    return _lease_json(request)


@lock_view("user:{request.user.pk}/{slug}", ttl=30)
def per_user(request: HttpRequest, slug: str) -> HttpResponse:
    return _lease_json(request)


@lock_view("user:{request.user.pk}/{slug}", ttl=30)
async def aper_user(request: HttpRequest, slug: str) -> HttpResponse:
    """Keyed on the logged-in user: reading request.user loads it from the database."""
    return _lease_json(request)


@lock_view(lambda request, name: f"callable:{name.upper()}", ttl=30)
def by_callable(request: HttpRequest, name: str) -> HttpResponse:
    return _lease_json(request)


@lock_view("boom:{name}", ttl=30)
def boom(request: HttpRequest, name: str) -> HttpResponse:
    raise RuntimeError(f"boom {name}")


@lock_view("boom:{name}", ttl=30)
async def aboom(request: HttpRequest, name: str) -> HttpResponse:
    raise RuntimeError(f"boom {name}")


@lock_view("stream:{name}", ttl=60)
def stream(request: HttpRequest, name: str) -> StreamingHttpResponse:
    def content() -> Iterator[bytes]:
        yield b"first\n"
        _wait_gate(request)
        yield b"last\n"

    return StreamingHttpResponse(content(), content_type="text/plain")


@lock_view("stream:{name}", ttl=60)
async def astream(request: HttpRequest, name: str) -> StreamingHttpResponse:
    async def content() -> AsyncIterator[bytes]:
        yield b"first\n"
        await _await_gate(request)
        yield b"last\n"

    return StreamingHttpResponse(content(), content_type="text/plain")


@lock_view("nothing:{name}", ttl=30)
def nothing(request: HttpRequest, name: str) -> None:
    """Forgets to return its response."""


@lock_view("nothing:{name}", ttl=30)
async def anothing(request: HttpRequest, name: str) -> None:
    """Forgets to return its response."""


def _after_release(request: HttpRequest) -> HttpResponseBase:
    if request.GET.get("fail"):
        raise ValueError("the view's own error")
    if request.GET.get("stream"):
        return StreamingHttpResponse(iter([b"streamed\n"]), content_type="text/plain")
    return HttpResponse("released early\n", content_type="text/plain")


@lock_view("early:{name}", ttl=30)
def early(request: HttpRequest, name: str) -> HttpResponseBase:
    """Releases its lease itself before it answers (or fails)."""
    request.lock_lease.release()  # type: ignore[attr-defined]
    return _after_release(request)


@lock_view("early:{name}", ttl=30)
async def aearly(request: HttpRequest, name: str) -> HttpResponseBase:
    await request.lock_lease.arelease()  # type: ignore[attr-defined]
    return _after_release(request)


def _tagged_stream() -> StreamingHttpResponse:
    response = StreamingHttpResponse(iter([b"tagged\n"]), content_type="text/plain")
    response["ETag"] = '"v1"'
    return response


# A matching If-None-Match makes the middleware answer 304 with a response of its own and
# drop the view's, unsent and unclosed.
@decorator_from_middleware(ConditionalGetMiddleware)
@lock_view("etag:{name}", ttl=30)
def etag_stream(request: HttpRequest, name: str) -> StreamingHttpResponse:
    return _tagged_stream()


@decorator_from_middleware(ConditionalGetMiddleware)
@lock_view("etag:{name}", ttl=30)
async def aetag_stream(request: HttpRequest, name: str) -> StreamingHttpResponse:
    return _tagged_stream()


@lock_view("conflict:{name}", ttl=30, status=409, retry_after=7)
def conflict(request: HttpRequest, name: str) -> HttpResponse:
    return _lease_json(request)


@lock_view("template:{name}", ttl=30, template_name="locking/busy.html")
def templated(request: HttpRequest, name: str) -> HttpResponse:
    return _lease_json(request)


@lock_view("templates:{name}", ttl=30, template_name=["locking/none.html", "locking/busy.html"])
def templated_list(request: HttpRequest, name: str) -> HttpResponse:
    return _lease_json(request)


def _teapot(request: HttpRequest, name: str, retry_after: int) -> HttpResponse:
    return JsonResponse({"busy": name, "retry": retry_after}, status=418)


async def async_busy(request: HttpRequest, name: str, retry_after: int) -> HttpResponse:
    """Not a valid busy answer: lock_view calls its response builder in a worker thread."""
    return HttpResponse(status=423)


@lock_view("custom:{name}", ttl=30, response=_teapot)
def custom(request: HttpRequest, name: str) -> HttpResponse:
    return _lease_json(request)


class MixinView(LockViewMixin, View):
    lock_key = "cbv:{pk}"
    lock_ttl = 30

    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return _lease_json(request)


class AsyncMixinView(LockViewMixin, View):
    lock_key = "cbv:{pk}"
    lock_ttl = 30

    async def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return _lease_json(request)


class AsyncUserMixinView(LockViewMixin, View):
    lock_key = "user:{request.user.pk}/{slug}"
    lock_ttl = 30

    async def get(self, request: HttpRequest, slug: str) -> HttpResponse:
        return _lease_json(request)


@method_decorator(lock_view("cbv:{pk}", ttl=30), name="dispatch")
class DecoratedView(View):
    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return _lease_json(request)


class AsyncDecoratedView(View):
    @method_decorator(lock_view("cbv:{pk}", ttl=30))
    async def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return _lease_json(request)


def _bump(request: HttpRequest, pk: int) -> HttpResponse:
    """A read-modify-write: only the lock keeps two requests from losing an update."""
    counter = Counter.objects.get(pk=pk)
    counter.value += 1
    counter.save()
    if request.GET.get("rollback"):
        # Refused after the write: ATOMIC_REQUESTS rolls it back, the answer is an error.
        transaction.set_rollback(True)
        return HttpResponse(str(counter.value), status=409)
    return HttpResponse(str(counter.value))


@lock_view("bump:{pk}", ttl=30)
def bump(request: HttpRequest, pk: int) -> HttpResponse:
    return _bump(request, pk)


@lock_view("bump:{pk}", ttl=0.5)
def bump_past_ttl(request: HttpRequest, pk: int) -> HttpResponse:
    """Writes, then runs past its lease's ttl."""
    response = _bump(request, pk)
    time.sleep(0.6)
    return response


class BumpMixinView(LockViewMixin, View):
    lock_key = "bump:{pk}"
    lock_ttl = 30

    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return _bump(request, pk)
