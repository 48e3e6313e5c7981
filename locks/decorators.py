"""View decorator and mixin: one request at a time per lock key, the others get 423 Locked."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from contextvars import ContextVar
from datetime import timedelta
from typing import Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction, sync_to_async
from django.db import connections, transaction
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase, StreamingHttpResponse
from django.shortcuts import render

from . import validation
from .aio import _wait, run_sync, task_holder
from .exceptions import LockBusy, LockLost
from .keys import check_key_template, fit_name, lock_key
from .leases import RELEASED, Lease, _alias, _end, _execute, _Request

logger = logging.getLogger("locks.decorators")
V = TypeVar("V", bound=Callable[..., Any])
KeyType = str | Callable[..., str]
BusyResponse = Callable[[HttpRequest, str, int], HttpResponseBase]

__all__ = ["LockViewMixin", "ViewLock", "lock_key", "lock_view"]


class ViewLock:
    """The options of one :func:`lock_view` (or :class:`LockViewMixin`) and the code to apply them.

    Example::

        guard = ViewLock("invoice:{pk}", ttl=30)
        response = guard.run(view, request, (), {"pk": 42})
    """

    def __init__(
        self,
        key: KeyType,
        *,
        ttl: float | timedelta | None = None,
        timeout: float | timedelta | None = 0,
        using: str | None = None,
        note: str | None = None,
        auto_renew: bool = False,
        status: int = 423,
        response: BusyResponse | None = None,
        template_name: str | Sequence[str] | None = None,
        retry_after: int | None = None,
    ) -> None:
        if not callable(key):
            check_key_template(key)
        # The arguments are checked now, at import time of the view, not at its first
        # request. The settings they leave to (DATABASE, DEFAULT_TTL, RENEW_FRACTION) are
        # read per request: a bad one raised here would break importing the URLconf, and
        # manage.py check (which imports it) with a traceback before it could report it.
        if ttl is not None:
            validation.ttl_seconds(ttl)
        if using is not None:
            validation.check_alias(using)
        validation.check_auto_renew(auto_renew)
        self.key = key
        self.ttl = ttl
        self.timeout = validation.timeout_seconds(timeout)
        self.using = using
        self.note = None if note is None else validation.check_note(note)
        self.auto_renew = auto_renew
        self.status = _check_status(status)
        checked: Any = response  # typed; checked for callers without types
        if checked is not None and (not callable(checked) or iscoroutinefunction(checked)):
            # Called in a worker thread for async views too: a coroutine would never run.
            raise TypeError(
                "lock_view response must be a plain callable returning a response, "
                f"not {response!r}"
            )
        self.response = response
        names: Any = template_name  # typed; checked for callers without types
        if isinstance(names, str):
            names = [names]
        # One name, or a list or tuple of names to try in turn, as render() takes.
        if names is not None and not (
            isinstance(names, list | tuple)
            and names
            and all(isinstance(name, str) and name for name in names)
        ):
            raise TypeError(
                "lock_view template_name must be a template's name or a list of them, "
                f"not {template_name!r}"
            )
        self.template_name = template_name
        self.retry_after = _check_retry_after(retry_after)

    def name_for(self, request: HttpRequest, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The lock name for one request."""
        if callable(self.key):
            name = self.key(request, *args, **kwargs)
            if not isinstance(name, str):
                raise TypeError(f"lock_view key callable returned {name!r}, not a str")
            return validation.check_name(fit_name(name))
        return lock_key(self.key, *args, **{**kwargs, "request": request})

    def _request(self, name: str, holder: str, request: HttpRequest, view: Any) -> _Request:
        note = self.note
        if note is None:
            owner = getattr(view, "__self__", None)  # a class-based view's bound dispatch
            what = type(owner).__qualname__ if owner is not None else _label(view)
            note = f"{what} {request.method} {request.path}".replace("\x00", "")
        note = note[: validation.MAX_NOTE_LENGTH]
        return _Request.build(name, self.ttl, holder, self.using, note, self.auto_renew)

    # --- synchronous views -------------------------------------------------------------

    def run(
        self,
        view: Callable[..., Any],
        request: HttpRequest,
        args: Any,
        kwargs: Any,
        *,
        non_atomic: Iterable[str] | None = None,
    ) -> HttpResponseBase:
        """Run a synchronous view under the lease, or answer busy.

        With ``non_atomic`` (the aliases the view is exempt from ATOMIC_REQUESTS for), the
        request's transactions, which Django was told to leave to this call, are opened
        and committed here, inside the lease: the next holder sees this one's writes.
        """
        _refuse_event_loop(view)
        name = self.name_for(request, args, kwargs)
        attempt = self._request(name, _thread_holder(), request, view)
        try:
            lease = attempt.wait(self.timeout)
        except LockBusy:
            return self._busy(request, name, self._retry_after(name))
        outer = _enter(request, lease)
        try:
            return _run_locked(view, request, args, kwargs, lease, non_atomic)
        finally:
            _leave(request, outer)

    def _retry_after(self, name: str) -> int:
        if self.retry_after is not None:
            return self.retry_after
        alias = _alias(self.using)
        left = _execute(alias, "inspect", name, lambda backend, c: backend.remaining(c, name))
        return max(1, math.ceil(left or 0))

    def _busy(self, request: HttpRequest, name: str, retry_after: int) -> HttpResponseBase:
        logger.info("lock_view: lock %r is busy; answering %s", name, self.status)
        if self.response is not None:
            response = self.response(request, name, retry_after)
        elif self.template_name is not None:
            context = {"lock_name": name, "retry_after": retry_after}
            response = render(request, self.template_name, context, status=self.status)
        else:
            response = HttpResponse(
                f"This resource is busy with another request; retry after {retry_after} seconds.\n",
                status=self.status,
                content_type="text/plain; charset=utf-8",
            )
        if not response.has_header("Retry-After"):
            response["Retry-After"] = str(retry_after)
        return response

    # --- asynchronous views ------------------------------------------------------------

    async def arun(
        self, view: Callable[..., Any], request: HttpRequest, args: Any, kwargs: Any
    ) -> HttpResponseBase:
        """Run an ``async def`` view under the lease, or answer busy, off the event loop."""
        # In a worker thread: a key like "export:{request.user.pk}" loads the lazy user
        # (session, then user row) from the database, which Django refuses on the loop.
        name = await sync_to_async(self.name_for)(request, args, kwargs)
        attempt = self._request(name, task_holder(), request, view)
        try:
            lease = await _wait(attempt, self.timeout)
        except LockBusy:
            retry_after = await run_sync(self._retry_after, name)
            return await sync_to_async(self._busy)(request, name, retry_after)
        outer = _enter(request, lease)
        try:
            try:
                response = await view(request, *args, **kwargs)
                if callable(getattr(response, "render", None)) and not response.is_rendered:
                    response = await sync_to_async(response.render)()
                # Whatever the view returned (None too, which Django then refuses), the
                # lease is released or handed to the streaming content. Django refuses
                # ATOMIC_REQUESTS for async views; but one called (async_to_sync) from a
                # sync locked view writes in that view's transaction, which releases this
                # lease after its commit.
                if getattr(response, "streaming", False):
                    return _hand_over(lease, response)
                enclosing = _enclosing.get()
                if enclosing is not None:
                    enclosing.append(lease)
                    return cast(HttpResponseBase, response)
            except BaseException:
                await asyncio.shield(run_sync(_end, lease, True))
                raise
            await asyncio.shield(run_sync(_end, lease, False))
            return cast(HttpResponseBase, response)
        finally:
            _leave(request, outer)


def _check_status(status: Any) -> int:
    if isinstance(status, bool) or not isinstance(status, int):
        raise TypeError(f"lock_view status must be an int, not {status!r}")
    if not 400 <= status < 600:
        raise ValueError(f"lock_view status must be an HTTP error status (4xx/5xx), not {status}")
    return int(status)


def _check_retry_after(retry_after: Any) -> int | None:
    if retry_after is None:
        return None
    return validation.check_count(retry_after, "lock_view retry_after (seconds)")


def _label(view: Any) -> str:
    return str(getattr(view, "__qualname__", None) or type(view).__qualname__)


def _thread_holder() -> str:
    from .identity import default_holder

    return default_holder()


def _on_event_loop() -> bool:
    """Whether this thread runs an asyncio event loop right now."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _refuse_event_loop(view: Any) -> None:
    # A bound dispatch() (method_decorator passes it in a partial) of an async class-based
    # view returns a coroutine: under WSGI no event loop runs yet, but the lease would
    # end before the handler even started.
    owner = getattr(getattr(view, "func", view), "__self__", None)
    if not getattr(owner, "view_is_async", False) and not _on_event_loop():
        return
    raise TypeError(
        f"lock_view: {_label(view)!r} is synchronous but serves an async view or runs "
        "inside an event loop (e.g. method_decorator on dispatch() of an async class-based "
        "view), so the lease would not cover the handler; use LockViewMixin, or decorate "
        "the async handler (get, post) itself"
    )


_NO_LEASE = object()


def _enter(request: HttpRequest, lease: Lease) -> Any:
    """Give the view its lease in ``request.lock_lease``; return what was there before."""
    outer = getattr(request, "lock_lease", _NO_LEASE)
    request.lock_lease = lease  # type: ignore[attr-defined]
    return outer


def _leave(request: HttpRequest, outer: Any) -> None:
    # A locked view called by another one (a re-entry of the same key, or another key)
    # must leave the caller its own lease, not the re-entry it just released. The
    # outermost view's lease stays, released, for middleware that logs its token.
    if outer is not _NO_LEASE:
        request.lock_lease = outer  # type: ignore[attr-defined]


class _AtomicHere(set[str]):
    """A locked view's ``_non_atomic_requests``: Django leaves every transaction to it.

    Django's handler wraps a view in ``atomic()`` for each alias with ATOMIC_REQUESTS
    that is not in this set, outside the view, so its commit would come after the lease's
    release and the next request could read the data as it was (a lost update). This set
    says every alias is in it; its members are the aliases truly exempt
    (``transaction.non_atomic_requests``, which adds to it, over the decorator or under
    it), and the lock opens the others' blocks itself, inside the lease.
    """

    def __contains__(self, alias: object) -> bool:
        return True


def _mark_atomic_here(view: Any) -> _AtomicHere:
    marker = _AtomicHere(getattr(view, "_non_atomic_requests", ()))
    view._non_atomic_requests = marker
    return marker


#: The leases of locked views run inside an enclosing locked view's request
#: transactions (stacked decorators, or one locked view calling another): released by
#: that view once its transactions have ended.
_enclosing: ContextVar[list[Lease] | None] = ContextVar("locks_view_enclosing", default=None)


def _exempt(request: HttpRequest, non_atomic: Iterable[str]) -> set[str]:
    """The aliases the request is exempt from ATOMIC_REQUESTS for."""
    # Iterated, not asked with "in": an _AtomicHere answers yes to every alias. The view
    # Django resolved carries exemptions made where the URL names it as well.
    resolved = getattr(getattr(request, "resolver_match", None), "func", None)
    return {*iter(non_atomic), *iter(getattr(resolved, "_non_atomic_requests", ()))}


def _in_transaction(connection: Any) -> bool:
    """Whether ``connection`` is in an atomic block other than a test case's (never commits)."""
    return connection.in_atomic_block and any(
        not getattr(block, "_from_testcase", False) for block in connection.atomic_blocks
    )


def _call(view: Callable[..., Any], request: HttpRequest, args: Any, kwargs: Any) -> Any:
    response = view(request, *args, **kwargs)
    if callable(getattr(response, "render", None)) and not response.is_rendered:
        # Rendered under the lease: a failing template must not leave it behind.
        response = response.render()
    return response


def _run_locked(
    view: Callable[..., Any],
    request: HttpRequest,
    args: Any,
    kwargs: Any,
    lease: Lease,
    non_atomic: Iterable[str] | None,
) -> HttpResponseBase:
    """Run the view under ``lease``; release it once the view's writes are committed."""
    # Transactions open around this call: an enclosing locked view's, Django's where it
    # does not see this view's mark (method_decorator on get(), a decorator without
    # functools.wraps), or the caller's. (A connection never built is in none.)
    outside = [c.alias for c in connections.all(initialized_only=True) if _in_transaction(c)]
    own: list[str] = []
    if non_atomic is not None:
        exempt = _exempt(request, non_atomic)
        own = [
            alias
            for alias, settings in connections.settings.items()
            if settings.get("ATOMIC_REQUESTS") and alias not in exempt and alias not in outside
        ]
    inner: list[Lease] = []  # locked views run inside this one's own transactions
    token = _enclosing.set(inner) if own else None
    try:
        with ExitStack() as blocks:
            # In a transaction opened outside, a savepoint: a failing view's writes are
            # rolled back before its lease is released.
            for alias in (*outside, *own):
                blocks.enter_context(transaction.atomic(using=alias))
            response = _call(view, request, args, kwargs)
            if outside or own:
                for held in (lease, *inner):
                    _refuse_commit_unless_held(held)
    except BaseException:
        for held in reversed(inner):
            _end(held, True)
        _end(lease, True)
        raise
    finally:
        if token is not None:
            _enclosing.reset(token)
    for held in reversed(inner):
        _release_done(held, "its transaction")
    if not outside or getattr(response, "streaming", False):
        return _hand_over(lease, response)
    enclosing = _enclosing.get()
    if enclosing is not None:
        enclosing.append(lease)  # released by the enclosing locked view after its commit
    else:
        _release_after_commits(lease, outside)
    return cast(HttpResponseBase, response)


def _release_after_commits(lease: Lease, aliases: Sequence[str]) -> None:
    """Release ``lease`` once the transactions open on ``aliases`` have all committed.

    A rollback drops the callback: the lease then runs out at the end of its ttl.
    """
    left = len(aliases)
    mutex = threading.Lock()

    def committed() -> None:
        nonlocal left
        with mutex:
            left -= 1
            last = left == 0
        if last:
            _release_done(lease, "its transaction")

    for alias in aliases:
        transaction.on_commit(committed, using=alias, robust=True)


def _refuse_commit_unless_held(lease: Lease) -> None:
    """Raise LockLost, so the request's writes roll back, unless the lease surely holds."""
    if lease._state == RELEASED or lease.count > 1:
        # Released by the view itself (before slow work that needs no lock), or a
        # re-entry, for which the holding it re-entered is the one that counts.
        return
    # The local deadline is counted from before the grant, so up to it the lease holds
    # by the database clock too; no statement is needed to know.
    if lease.lost or time.monotonic() >= lease._local_deadline:
        raise LockLost(
            f"lock {lease.name!r} was lost (or ran out) before the request's writes "
            "committed; they are rolled back"
        )


def _hand_over(lease: Lease, response: Any) -> HttpResponseBase:
    """Release now, or for a streaming response once its content is sent or it is closed."""
    if not getattr(response, "streaming", False):
        _end(lease, False)
        return cast(HttpResponseBase, response)
    release = _ResponseRelease(lease)
    streaming = cast(StreamingHttpResponse, response)
    # The content as the view gave it: streaming_content would wrap it in a reference back
    # to the response, and that cycle would keep a dropped response (below) uncollected.
    content = getattr(streaming, "_iterator", None)
    if content is None:
        content = streaming.streaming_content
    # Django registers the wrapper's close() with the response, and servers close every
    # response at its end: the lease is released even if the content is never iterated.
    if streaming.is_async:
        streaming.streaming_content = _AsyncStream(cast(AsyncIterator[bytes], content), release)
    else:
        streaming.streaming_content = _SyncStream(cast(Iterator[bytes], content), release)
    # A middleware may answer with another response instead (ConditionalGetMiddleware's
    # 304, say) and drop this one unclosed: then the lease goes when this one is collected.
    release.finalizer = weakref.finalize(streaming, release.when_dropped)
    release.finalizer.atexit = False  # type: ignore[misc]  # a property typeshed misses
    return streaming


def _release_done(lease: Lease, after: str) -> None:
    """Release a lease whose work is past recall (``after``: its response, its commit).

    Too late to refuse anything: a lost lease, or a release that fails, is only logged
    (Django's close() and robust on_commit callbacks would swallow the error unsaid).
    """
    try:
        _end(lease, False)
    except LockLost:
        logger.error("lock %r was lost before %s ended", lease.name, after)
    except Exception:
        logger.warning(
            "could not release lock %r after %s; it expires at the end of its ttl",
            lease.name,
            after,
            exc_info=True,
        )


class _ResponseRelease:
    """Releases a lease handed to a streaming response, once, whoever comes first."""

    finalizer: weakref.finalize[Any, Any] | None = None

    def __init__(self, lease: Lease) -> None:
        self._lease: Lease | None = lease
        self._mutex = threading.Lock()

    def __call__(self) -> None:
        with self._mutex:
            lease, self._lease = self._lease, None
        if lease is None:
            return
        if self.finalizer is not None:
            self.finalizer.detach()
        _release_done(lease, "its response")

    def when_dropped(self) -> None:
        if self._lease is None:
            return
        logger.warning(
            "lock %r: its response was dropped unsent and unclosed (replaced by a "
            "middleware?); releasing it",
            self._lease.name,
        )
        if _on_event_loop():
            # Collected on an event loop, where Django refuses database calls.
            threading.Thread(target=self, name="locks-stream-release", daemon=True).start()
        else:
            self()


class _SyncStream:
    def __init__(self, content: Iterator[bytes], release: _ResponseRelease) -> None:
        self._content = content
        self._release = release

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._content
        finally:
            self._release()

    def close(self) -> None:
        try:
            close = getattr(self._content, "close", None)
            if close is not None:
                close()
        finally:
            self._release()


class _AsyncStream:
    def __init__(self, content: AsyncIterator[bytes], release: _ResponseRelease) -> None:
        self._content = content
        self._release = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self._content:
                yield part
        finally:
            await asyncio.shield(run_sync(self._release))

    def close(self) -> None:
        # Django calls close() from a worker thread (ASGI) or the WSGI thread.
        self._release()


def lock_view(
    key: KeyType,
    *,
    ttl: float | timedelta | None = None,
    timeout: float | timedelta | None = 0,
    using: str | None = None,
    note: str | None = None,
    auto_renew: bool = False,
    status: int = 423,
    response: BusyResponse | None = None,
    template_name: str | Sequence[str] | None = None,
    retry_after: int | None = None,
) -> Callable[[V], V]:
    """Run the view under the lease ``key``; while another request holds it, answer 423.

    ``key`` is a template filled from the URL kwargs and ``request`` (each value encoded,
    see :func:`lock_key`; over-long keys are hashed), or a callable
    ``(request, *args, **kwargs) -> str``. The lease is released when the view returns or
    raises; for a streaming response, once the content is sent. The busy answer has status
    ``status`` and a ``Retry-After`` header (``retry_after`` seconds; by default until the
    holder's lease expires by the database clock); ``template_name`` renders a template
    with ``lock_name`` and ``retry_after``, ``response(request, name, retry_after)`` builds
    any response. Works on ``def`` and ``async def`` views. The view finds its lease in
    ``request.lock_lease``.

    Example::

        @lock_view("invoice:{pk}", ttl=30)
        def send_invoice(request, pk): ...

        @lock_view("user:{request.user.pk}", status=409, template_name="busy.html")
        async def export(request): ...
    """
    guard = ViewLock(
        key,
        ttl=ttl,
        timeout=timeout,
        using=using,
        note=note,
        auto_renew=auto_renew,
        status=status,
        response=response,
        template_name=template_name,
        retry_after=retry_after,
    )

    def decorate(view: V) -> V:
        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                return await guard.arun(view, request, args, kwargs)

            return cast(V, async_wrapper)

        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            return guard.run(view, request, args, kwargs, non_atomic=non_atomic)

        # Not for async views: Django refuses ATOMIC_REQUESTS for them, as it should.
        non_atomic = _mark_atomic_here(wrapper)
        return cast(V, wrapper)

    return decorate


class LockViewMixin:
    """Class-based view mixin: ``dispatch`` runs under the lease ``lock_key``.

    Options are class attributes named like :func:`lock_view`'s arguments with a
    ``lock_`` prefix (``lock_response`` is a method ``(self, request, name, retry_after)``);
    override :meth:`get_view_lock` to decide per request. Works for sync and async views.

    Example::

        class InvoiceView(LockViewMixin, UpdateView):
            lock_key = "invoice:{pk}"
            lock_ttl = 30
    """

    lock_key: KeyType | None = None
    lock_ttl: float | timedelta | None = None
    lock_timeout: float | timedelta | None = 0
    lock_using: str | None = None
    lock_note: str | None = None
    lock_auto_renew = False
    lock_status = 423
    lock_response: BusyResponse | None = None
    lock_template_name: str | Sequence[str] | None = None
    lock_retry_after: int | None = None

    def get_view_lock(self) -> ViewLock:
        """The :class:`ViewLock` this view uses (built from the ``lock_*`` attributes)."""
        if self.lock_key is None:
            raise TypeError(f"{type(self).__name__} needs a lock_key (LockViewMixin)")
        return ViewLock(
            self.lock_key,
            ttl=self.lock_ttl,
            timeout=self.lock_timeout,
            using=self.lock_using,
            note=self.lock_note,
            auto_renew=self.lock_auto_renew,
            status=self.lock_status,
            response=self.lock_response,
            template_name=self.lock_template_name,
            retry_after=self.lock_retry_after,
        )

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        guard = self.get_view_lock()
        handler = super().dispatch  # type: ignore[misc]
        if getattr(self, "view_is_async", False):
            return guard.arun(handler, request, args, kwargs)
        exempt = getattr(type(self).dispatch, "_non_atomic_requests", ())
        return guard.run(handler, request, args, kwargs, non_atomic=exempt)

    @classmethod
    def as_view(cls, **initkwargs: Any) -> Any:
        """Django's ``as_view()``; a sync view's request transactions run inside the lease.

        Example::

            path("invoices/<int:pk>/", InvoiceView.as_view())
        """
        view = super().as_view(**initkwargs)  # type: ignore[misc]
        if not getattr(cls, "view_is_async", False):
            _mark_atomic_here(view)
        return view
