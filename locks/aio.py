"""The lease API for asyncio code: ``aacquire``, ``atry_acquire``, ``alock``; never blocks the loop.

Each database call runs in a worker thread (asgiref's ``sync_to_async`` with
``thread_sensitive=False``) on that thread's own autocommit connection, which is tidied up
afterwards like Django tidies its own (``CONN_MAX_AGE``). Waiting for a busy lock sleeps on
the event loop, so a waiter holds no thread; on PostgreSQL the release notification wakes
it (``locks.waiting``). The default holder is one per asyncio task, so
two tasks on one loop exclude each other like two threads do.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncContextDecorator
from datetime import timedelta
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections

from . import connection, validation, waiting
from .identity import acting_as, default_holder, unique_holder
from .leases import (
    RELEASED,
    Entered,
    Lease,
    _backoff,
    _end,
    _Request,
    function_kind,
    making,
    notifies,
    unset,
)

logger = logging.getLogger("locks")
P = ParamSpec("P")
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

_task_holders: weakref.WeakKeyDictionary[asyncio.Task[Any], str] = weakref.WeakKeyDictionary()


def task_holder() -> str:
    """Return the holder identity of the running asyncio task (one per task, like per thread).

    Outside a task (plain synchronous code) this is the thread's :func:`default_holder`.

    Example::

        async def job():
            lease = await locks.aacquire("orders:42", holder=task_holder())
    """
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    if task is None:
        return default_holder()
    holder = _task_holders.get(task)
    if holder is None:
        holder = _task_holders[task] = unique_holder("task")
    return holder


def _tidy_after(function: Callable[P, T]) -> Callable[P, T]:
    @functools.wraps(function)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return function(*args, **kwargs)
        finally:
            # Pool threads live on after the call: close their connection when Django
            # would (at once with the default CONN_MAX_AGE = 0).
            connection.close_old()

    return call


def _in_thread(function: Callable[[], T]) -> Awaitable[T]:
    """``function()`` in a worker thread, acting as the calling task's holder.

    A plain function, not a coroutine: the holder is read here, in the caller's task,
    which may not be the task that awaits the result (:func:`_attempt` runs it in one of
    its own).
    """
    call = acting_as(task_holder(), _tidy_after(function))
    return sync_to_async(call, thread_sensitive=False)()


async def run_sync(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """Run a blocking lock call in a worker thread, off the event loop.

    In that call the default holder is the calling task's (:func:`task_holder`), not the
    worker thread's, which other tasks' calls share. If the caller is cancelled (or
    times out in ``asyncio.wait_for``) while the call runs, the thread cannot be stopped
    and runs it to its end: a :class:`Lease` it returns then is released, as a lease won
    by a cancelled :func:`aacquire` is, instead of being held for nobody until its TTL.

    Only a lease the call took itself (a new grant or a re-entry, which gives back its
    own re-entry) is released so: one it merely returns, made before the call, stays its
    owner's.

    Example::

        await run_sync(lease.renew, 30)
        lease = await run_sync(locks.acquire, "orders:42", timeout=0)  # held by this task
    """
    return await _attempt(functools.partial(function, *args, **kwargs))


def _release_quietly(lease: Lease) -> None:
    try:
        lease.release()
    except Exception:
        logger.warning("could not release lock %r after its caller was cancelled", lease.name)


async def _attempt(attempt: Callable[[], T]) -> T:
    """``attempt()`` in a worker thread; if the caller is cancelled meanwhile, a lease it
    won is released.

    The attempt runs on in its worker thread whatever happens to the caller, and the
    event loop may be gone by the time it ends (``asyncio.run`` cancelling every task at
    shutdown): so whichever of the thread and the cancelled caller comes second gives the
    lease back, the thread at once, the caller in a thread of its own.
    """
    mutex = threading.Lock()
    handed: list[Lease | None] = []  # the lease the thread won, once it has finished
    abandoned = False

    def run() -> T:
        call = object()
        marked = making.set((*making.get(), call))
        try:
            result = attempt()
        finally:
            making.reset(marked)
        # Only a lease made under this very call (also by a run_sync call nested in it): an
        # older one it returns is still held by someone who knows it (the caller, before it
        # was cancelled).
        won = result if isinstance(result, Lease) and call in result._made_under else None
        with mutex:
            if not abandoned:
                handed.append(won)
                return result
        if won is not None:
            _release_quietly(won)
        return result

    # _in_thread, not run_sync: run_sync comes through here.
    future = asyncio.ensure_future(_in_thread(run))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        with mutex:
            abandoned = True
            won = handed[0] if handed else None
        if won is not None:
            threading.Thread(target=_release_quietly, args=(won,), name="locks-release").start()
        # Nobody awaits the attempt now: fetch its error (a LockBusy at the end of a wait,
        # say), or asyncio logs it as never retrieved.
        future.add_done_callback(_consume)
        raise


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class _LoopEvent:
    """An ``asyncio.Event`` that the listener's thread can set."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def set(self) -> None:
        # The listener may wake a waiter that has just left, on a loop that has closed.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self.event.set)


async def _wait(request: _Request, timeout: float | None) -> Lease:
    deadline = None if timeout is None else time.monotonic() + timeout
    # Read before the first attempt, as a sync acquire does: a bad NOTIFY setting fails
    # here, before any grant, not only once a wait is needed.
    notified = notifies(connections[request.using])
    lease = await _attempt(request.attempt)
    if lease is not None:
        return lease
    request._time_left(deadline, timeout)  # with timeout=0, that one attempt was all
    if notified:
        return await _wait_notified(request, timeout, deadline)
    for attempt in itertools.count():
        await asyncio.sleep(min(_backoff(attempt), request._time_left(deadline, timeout)))
        lease = await _attempt(request.attempt)
        if lease is not None:
            return lease
    raise AssertionError("unreachable")  # pragma: no cover


async def _wait_notified(request: _Request, timeout: float | None, deadline: float | None) -> Lease:
    """Wait for the release notification, as a sync waiter does, but not in the queue: a
    place in it is a session lock, which would stay on one pool thread's connection."""
    listener = waiting.listener(request.using)
    woken = listener.subscribe(request.name, _LoopEvent(), wait=0)
    try:
        left = request._time_left(deadline, timeout)
        await run_sync(listener.wait_listening, min(waiting.LISTEN_WAIT_SECONDS, left))
        for attempt in itertools.count():
            woken.event.clear()  # what came before is re-read by the attempt below
            outcome = await _attempt(functools.partial(request.attempt_as_head, queued=False))
            if isinstance(outcome, Lease):
                return outcome
            # Never past the holder's expiry; backoff in case a notification goes missing.
            left = request._time_left(deadline, timeout)
            pause = min(_backoff(attempt), max(outcome, 0) + 0.001, left)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.event.wait(), pause)
    finally:
        listener.unsubscribe(request.name, woken)
    raise AssertionError("unreachable")  # pragma: no cover


def _build(name: Any, ttl: Any, holder: Any, using: Any, note: Any, auto_renew: Any) -> _Request:
    return _Request.build(
        name, ttl, task_holder() if holder is None else holder, using, note, auto_renew
    )


async def aacquire(
    name: str,
    *,
    ttl: float | timedelta | None = None,
    timeout: float | timedelta | None = None,
    holder: str | None = None,
    using: str | None = None,
    note: str = "",
    auto_renew: bool = False,
) -> Lease:
    """Acquire the lease on ``name`` without blocking the event loop; see :func:`locks.acquire`.

    Waits up to ``timeout`` seconds (``None``: forever) and raises ``LockBusy`` when it runs
    out. The default holder is the running task's, so tasks exclude each other.

    Example::

        lease = await locks.aacquire("orders:42", ttl=30, timeout=5)
        try:
            await ship(order)
        finally:
            await lease.arelease()
    """
    request = _build(name, ttl, holder, using, note, auto_renew)
    return await _wait(request, validation.timeout_seconds(timeout))


async def atry_acquire(
    name: str,
    *,
    ttl: float | timedelta | None = None,
    holder: str | None = None,
    using: str | None = None,
    note: str = "",
    auto_renew: bool = False,
) -> Lease | None:
    """Make one attempt at ``name`` off the event loop; the lease, or ``None`` if it is held.

    Example::

        lease = await locks.atry_acquire("reports:nightly", ttl=600)
        if lease is None:
            return
    """
    return await _attempt(_build(name, ttl, holder, using, note, auto_renew).attempt)


class AsyncLockContext(Entered, AbstractAsyncContextManager[Lease], AsyncContextDecorator):
    """What :func:`alock` returns: an async context manager (and decorator) holding a lease."""

    def __init__(self, request: _Request, timeout: float | None, unset: frozenset[str]) -> None:
        super().__init__()
        self._request = request
        self._timeout = timeout
        # Arguments left to their defaults, taken on entry (see LockContext): the holder
        # is the entering task's, the settings those of the moment.
        self._unset = unset

    def _recreate_cm(self) -> AsyncLockContext:
        # Used as a decorator, each call gets its own lease (and its own task's holder).
        return AsyncLockContext(self._request, self._timeout, self._unset)

    def __call__(self, func: F) -> F:
        # The decorator awaits what the call returns, under the lock: anything but a
        # coroutine function would take the lock and then fail (an async generator is not
        # awaitable) or run a plain function's body on the event loop. Refused here, at
        # decoration time, as @locks.lock() refuses generator functions.
        kind = function_kind(func)
        if kind != "coroutine":
            name = getattr(func, "__qualname__", func)
            if kind is not None:
                raise TypeError(
                    f"@locks.alock() on {name!r}, {'an' if kind[0] == 'a' else 'a'} {kind} "
                    f"function, cannot hold the lock while it runs: the call only makes the "
                    f"{kind}; hold the lock inside it (async with locks.alock(...), or "
                    "with locks.lock(...) in a generator)"
                )
            raise TypeError(
                f"@locks.alock() decorates async def functions, and {name!r} is not one: "
                "use @locks.lock() on a plain function"
            )
        return super().__call__(func)

    async def __aenter__(self) -> Lease:
        request = self._request.with_defaults(self._unset, task_holder)
        lease = await _wait(request, self._timeout)
        self._push(lease)
        return lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = self._pop()
        if lease._state != RELEASED:  # as _end checks, but without a trip to a thread
            # Shielded: a cancelled block still releases (the thread would finish it anyway).
            await asyncio.shield(run_sync(_end, lease, exc_type is not None))


def alock(
    name: str,
    *,
    ttl: float | timedelta | None = None,
    timeout: float | timedelta | None = None,
    holder: str | None = None,
    using: str | None = None,
    note: str = "",
    auto_renew: bool = False,
) -> AsyncLockContext:
    """Hold the lease on ``name`` for an ``async with`` block (or a decorated coroutine).

    The async twin of :func:`locks.lock`: arguments are checked here, before any query;
    the lease is released when the block ends, also when it raises or is cancelled, and
    ``LockLost`` is raised at the end if the lease was lost meanwhile.

    Example::

        async with locks.alock("orders:42", ttl=30, timeout=5) as lease:
            await ship(order, fence=lease.token)
    """
    # No setting read here, as lock(): the entering task's holder and settings are taken.
    request = _Request.build(name, ttl, holder, using, note, auto_renew, settings=False)
    return AsyncLockContext(request, validation.timeout_seconds(timeout), unset(ttl, holder, using))


__all__ = [
    "AsyncLockContext",
    "aacquire",
    "alock",
    "atry_acquire",
    "run_sync",
    "task_holder",
]
