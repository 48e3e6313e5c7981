"""The auto-renew watchdog: one daemon thread per process and database alias renews the
auto-renewing leases held on that database."""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING

from .conf import DEFAULTS
from .exceptions import LockLost

if TYPE_CHECKING:
    from .leases import Lease

logger = logging.getLogger("locks.watchdog")


class Watchdog:
    """Renews watched leases (of one database alias) at a fraction of their TTL until they
    are released.

    It holds only weak references, so a lease dropped without release simply expires; it
    runs as a daemon thread, so it never keeps a process alive.
    """

    #: Seconds with nothing to renew after which the thread ends (the next watch starts one).
    IDLE_SECONDS = 60.0
    #: Seconds after which a lease found busy with its holder's own renewal or release is
    #: looked at again.
    BUSY_SECONDS = 0.05
    #: The least a renewal may wait for its lock row, even when another lease falls due
    #: sooner (so that one whose row is busy for a moment still gets through).
    MIN_WAIT_SECONDS = 0.05

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: list[tuple[float, int, weakref.ref[Lease]]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, lease: Lease, delay: float) -> None:
        """Renew ``lease`` ``delay`` seconds from now, and on and on."""
        with self._cond:
            heapq.heappush(
                self._queue, (time.monotonic() + delay, next(self._seq), weakref.ref(lease))
            )
            # A thread that is ending has set _thread to None under this lock first, so
            # a lease pushed meanwhile is never left to a thread that will not serve it.
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="locks-watchdog", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _next_due(self) -> weakref.ref[Lease] | None:
        from . import connection

        with self._cond:
            while True:
                if not self._queue:
                    # Nothing to renew: hang up, so an idle process holds no session
                    # (and a test database can be dropped).
                    connection.close()
                    self._cond.wait(timeout=self.IDLE_SECONDS)
                    if not self._queue:
                        self._thread = None
                        return None
                    continue
                due = self._queue[0][0] - time.monotonic()
                if due <= 0:
                    return heapq.heappop(self._queue)[2]
                self._cond.wait(timeout=due)

    def _run(self) -> None:
        from . import connection

        try:
            while True:
                ref = self._next_due()
                if ref is None:
                    return  # idle for a minute: the next watch() starts a new thread
                lease = ref()
                if lease is not None and lease.held and not lease._unwatched:
                    try:
                        self._renew(lease)
                    except Exception:
                        # Nothing may end this thread: it renews every lease of the
                        # process. A lease it can no longer look after is lost, and says so.
                        lease._mark_lost()
                        logger.exception("auto-renew of %r stopped", lease.name)
                del lease
        finally:
            connection.close()

    def _others_due(self) -> float:
        """Until when (a ``time.monotonic()`` value) a renewal may wait for its lock row:
        until the next lease in the queue falls due, MIN_WAIT_SECONDS at least.

        Its own lease's deadline alone is no bound for the others: a lease due sooner would
        wait behind it meanwhile, and expire. A renewal cut short is tried again later,
        until its own lease's deadline.
        """
        with self._cond:
            due = self._queue[0][0] if self._queue else math.inf
        return max(due, time.monotonic() + self.MIN_WAIT_SECONDS)

    def _renew(self, lease: Lease) -> None:
        wait_until = self._others_due()
        try:
            renewed = lease._renew(lease.ttl, by_watchdog=True, wait_until=wait_until)
        except LockLost as exc:
            lease._mark_lost()
            logger.warning("auto-renew: lease %r lost: %s", lease.name, exc)
            return
        except Exception as exc:
            if not lease.held:
                return  # released while its renewal was due: the release won, as it should
            # A database error, say. Nothing may escape: it would end this thread and with
            # it the renewals of every other lease. Keep trying while the lease may still
            # be ours; give up once it surely is not.
            remaining = lease._local_deadline - time.monotonic()
            if remaining > 0:
                if wait_until <= time.monotonic():
                    # Cut short for the leases due next (its row busy, most likely): no
                    # failure of the database's, and the lease is lost, with a warning, if
                    # it lasts.
                    logger.debug("auto-renew of %r cut short, retrying: %s", lease.name, exc)
                else:
                    logger.warning("auto-renew of %r failed, retrying: %s", lease.name, exc)
                self.watch(lease, min(1.0, remaining / 4))
                return
            # Looked at again under the lease's state lock: its holder's own renewal may
            # have got through since ours failed (the lease then goes on as renewed).
            if lease._mark_lost(if_over=True):
                logger.warning(
                    "auto-renew: lease %r lost, renewal kept failing: %s", lease.name, exc
                )
                return
            renewed = True
        if not renewed and lease.held and not lease._unwatched:
            # The holder's own renewal is under way, and may wait long (for the lock row,
            # for a server that does not answer): waiting for it here would leave every
            # other lease of the database unrenewed meanwhile. Look again soon; once the
            # lease is no longer surely ours, give it up as if a renewal of our own had
            # waited that long (the holder's renewal raises when it ends).
            remaining = lease._local_deadline - time.monotonic()
            if remaining > 0:
                self.watch(lease, min(self.BUSY_SECONDS, remaining))
                return
            if lease._mark_lost(if_over=True):
                logger.warning(
                    "auto-renew: lease %r lost, its holder's own renewal outlasted it",
                    lease.name,
                )
                return
            # The holder's renewal got through (or the lease was released) meanwhile.
        if lease.held and not lease._unwatched:
            try:
                delay = lease._renew_interval()
            except (TypeError, ValueError) as exc:
                # RENEW_FRACTION was changed to a bad value since the grant: keep renewing
                # at the default fraction (the system check reports the setting).
                logger.warning("auto-renew of %r: %s", lease.name, exc)
                delay = lease._renew_interval(DEFAULTS["RENEW_FRACTION"])
            self.watch(lease, delay)


# One watchdog per database alias: a renewal stuck on one database (a server that hangs,
# a long transaction holding the lock row) would otherwise hold up the renewals of the
# leases on every other database until they expire.
_watchdogs: dict[str, Watchdog] = {}


def _reset_after_fork() -> None:
    global _watchdogs
    _watchdogs = {}


os.register_at_fork(after_in_child=_reset_after_fork)


def watch(lease: Lease, delay: float) -> None:
    """Have the watchdog of ``lease.using`` renew ``lease`` in ``delay`` seconds, then
    periodically.

    Example::

        watch(lease, lease._renew_interval())
    """
    # setdefault is atomic: two threads watching their first leases on an alias at once
    # get the same watchdog.
    dog = _watchdogs.get(lease.using) or _watchdogs.setdefault(lease.using, Watchdog())
    dog.watch(lease, delay)
