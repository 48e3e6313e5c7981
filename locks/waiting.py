"""How a blocked acquire waits: woken by the server on release where it can, else backoff.

On PostgreSQL one daemon thread per process and alias LISTENs on one connection and wakes
the waiters of the released name. Blocked sync acquires queue in the server first (see
``_Request._wait_queued``), so of them only the head of a name's queue flags the row
(``waiting``) for the release to send a notification; async waiters, which do not queue,
flag it too (``locks.aio``). Every wait is also bounded
(backoff, and never past the holder's expiry), so a lost notification or a listener that
cannot connect only cost latency; behind a transaction pooler (which drops LISTEN) the
app does not listen at all (``LOCKS["NOTIFY"]``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Protocol, TypeVar

from . import connection
from .backends import for_connection

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("locks.waiting")

#: A listener with no waiters hangs up after this many seconds.
IDLE_SECONDS = 10.0
#: A new waiter waits at most this long (and never past its own timeout) for LISTEN.
LISTEN_WAIT_SECONDS = 1.0


class Wakeable(Protocol):
    """What a waiter gives the listener to be woken with: a ``threading.Event``, say."""

    def set(self) -> None: ...


W = TypeVar("W", bound=Wakeable)


class Listener:
    """One LISTEN connection of this process for one database alias."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self._mutex = threading.Lock()
        self._waiters: dict[str, set[Wakeable]] = {}
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def subscribe(self, name: str, event: W, *, wait: float = LISTEN_WAIT_SECONDS) -> W:
        """Set ``event`` whenever ``name`` is released (or notifications were lost).

        Returns ``event``. Blocks until the listener listens, for ``wait`` seconds at most
        (see :meth:`wait_listening`).
        """
        with self._mutex:
            self._waiters.setdefault(name, set()).add(event)
            if self._thread is None or not self._thread.is_alive():
                self._stop.clear()
                # Each thread its own flag: an idle thread on its way out clears its own,
                # not the one of the thread that replaces it (which may already listen).
                self._ready = threading.Event()
                self._thread = threading.Thread(
                    target=self._run,
                    args=(self._ready,),
                    name=f"locks-listener-{self.alias}",
                    daemon=True,
                )
                self._thread.start()
        try:
            self.wait_listening(wait)
        except BaseException:
            # Interrupted in the wait (a signal handler's exception, a soft time limit): the
            # caller never gets the event to unsubscribe, and a subscription left behind
            # would keep the listener (its thread, its connection) for good.
            self.unsubscribe(name, event)
            raise
        return event

    def wait_listening(self, timeout: float) -> None:
        """Block until LISTEN runs, for ``timeout`` seconds at most.

        The flag a waiter sets next only helps once it does; if it cannot, the waiters'
        bounded waits take over.
        """
        self._ready.wait(timeout)

    def unsubscribe(self, name: str, event: Wakeable) -> None:
        with self._mutex:
            events = self._waiters.get(name)
            if events is not None:
                events.discard(event)
                if not events:
                    del self._waiters[name]

    def stop(self) -> None:
        """Hang up and end the thread (tests, shutdown)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5)

    def _wake(self, name: str | None) -> None:
        with self._mutex:
            events = (
                [e for group in self._waiters.values() for e in group]
                if name is None
                else list(self._waiters.get(name, ()))
            )
        for event in events:
            event.set()

    def _run(self, ready: threading.Event) -> None:
        idle_since = time.monotonic()
        while not self._stop.is_set():
            # Not the alias's ORM settings: with AUTOCOMMIT = False the LISTEN would wait
            # for a commit, and from Django's pool it would hold a slot while anyone waits.
            wrapper = connection.session(self.alias)
            try:
                self._listen(wrapper, ready)
                # Releases may have gone unnoticed while there was no LISTEN.
                self._wake(None)
                self._serve(wrapper, idle_since)
                return
            except Exception as exc:
                logger.warning("release notifications on %r unavailable: %s", self.alias, exc)
                # A database that stays unreachable must not keep a thread of a process
                # that no longer waits for anything.
                still = self._idle_since(idle_since)
                if still is None:
                    return
                idle_since = still
                self._stop.wait(1.0)
            finally:
                ready.clear()
                wrapper.close()

    def _listen(self, wrapper: BaseDatabaseWrapper, ready: threading.Event) -> None:
        wrapper.ensure_connection()
        for_connection(wrapper).listen(wrapper.connection)
        ready.set()

    def _serve(self, wrapper: BaseDatabaseWrapper, idle_since: float) -> None:
        backend = for_connection(wrapper)
        while not self._stop.is_set():
            for name in backend.notifications(wrapper.connection, 0.5):
                self._wake(name)
            still = self._idle_since(idle_since)
            if still is None:
                return
            idle_since = still

    def _idle_since(self, since: float) -> float | None:
        """When the waiters last went (now, while there are some); None once the thread
        is to end, having had none for :data:`IDLE_SECONDS`."""
        with self._mutex:
            if self._waiters:
                return time.monotonic()
            if time.monotonic() - since > IDLE_SECONDS:
                # Under the mutex: a subscribe from now on starts a new thread.
                self._thread = None
                return None
            return since


_listeners: dict[str, Listener] = {}
_listeners_mutex = threading.Lock()


def listener(alias: str) -> Listener:
    """This process's listener for ``alias``.

    Example::

        event = listener("default").subscribe("orders:42", threading.Event())
    """
    with _listeners_mutex:
        found = _listeners.get(alias)
        if found is None:
            found = _listeners[alias] = Listener(alias)
        return found


def stop_listeners() -> None:
    """Hang up every listener of this process (for example before its database is dropped).

    Example::

        locks.waiting.stop_listeners()
    """
    with _listeners_mutex:
        found = list(_listeners.values())
        _listeners.clear()
    for each in found:
        each.stop()


def _forget_after_fork() -> None:
    # The parent's listener threads do not exist in the child; their sockets are not ours.
    # (Nor is the mutex, which another thread of the parent may have held at the fork.)
    global _listeners_mutex
    _listeners.clear()
    _listeners_mutex = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
