"""Lease locks: acquire, try_acquire, lock, Lease.renew/release, and the read/admin calls."""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable
from contextlib import ContextDecorator, suppress
from contextvars import ContextVar
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from asgiref.sync import iscoroutinefunction
from django.db import DatabaseError

from . import connection, validation, waiting, watchdog
from .backends import Backend, Cursor, Grant, Released, for_connection
from .conf import conf
from .exceptions import LockBusy, LockError, LockLost
from .identity import default_holder

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

logger = logging.getLogger("locks")
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

HELD, RELEASED, LOST = "held", "released", "lost"

# The run_sync calls under way in this context, one marker each, innermost last: a lease
# notes those it was made under (aio releases a lease its cancelled call took, never one it
# only returned). Markers, not a list of leases: a long call would keep every lease it made.
making: ContextVar[tuple[object, ...]] = ContextVar("locks_making", default=())

#: Seconds a blocked acquire stays in the queue of its name without reaching the head
#: before it looks at the lock itself (and queues again, at the back).
QUEUE_PATIENCE = 2.0


#: The limit on a waiter's pause grows by this factor per attempt (each pause is drawn
#: between half the limit and the limit). A waiter notices a release one pause late at
#: worst; growing by half (not doubling) keeps that in proportion to the wait so far for
#: a few more attempts before BACKOFF_MAX.
BACKOFF_GROWTH = 1.5


def _backoff(attempt: int) -> float:
    """Exponential backoff, bounded, with jitter so waiters do not retry in lockstep."""
    low, high = conf.backoff()
    cap = min(high, low * BACKOFF_GROWTH ** min(attempt, 60))
    return cap / 2 + random.uniform(0, cap / 2)


def _execute(
    alias: str,
    what: str,
    name: str,
    operation: Callable[[Backend, Cursor], T],
    deadline: float | None = None,
) -> T:
    """Run one backend operation on this thread's own connection, retrying transient errors
    (not past ``deadline``, a ``time.monotonic()`` value, if one is given)."""
    wrapper = connection.get(alias)
    backend = for_connection(wrapper)
    if what != "inspect":
        backend.check_caller(alias)
    # Read before any query, so that bad settings fail here, not only once an error occurs.
    retries = conf.TRANSIENT_RETRIES
    conf.backoff()
    for attempt in itertools.count():
        try:
            return operation(backend, connection.cursor(wrapper))
        except DatabaseError as exc:
            if (
                backend.is_transient(exc)
                and attempt < retries
                and (deadline is None or time.monotonic() < deadline)
            ):
                logger.debug("%s %r: transient error, retrying: %s", what, name, exc)
                pause = _backoff(attempt)
                if deadline is not None:
                    # Tried once more by the deadline, not a whole pause after it.
                    pause = min(pause, max(deadline - time.monotonic(), 0.0))
                time.sleep(pause)
                continue
            # A broken connection is replaced on the next call (e.g. after a server restart).
            wrapper.close_if_unusable_or_obsolete()
            exc.add_note(f"locks: while trying to {what} lock {name!r} on database {alias!r}")
            raise
        except BaseException:
            # Interrupted by something else mid-statement (a signal handler's exception,
            # Celery's soft time limit, KeyboardInterrupt): the statement may still run on
            # the server or have its result unread, and on SQLite hold the file's write
            # lock, so every later call on this connection would fail or wait. Ending the
            # session cancels or rolls back whatever was in flight.
            with suppress(Exception):
                backend.cancel(wrapper.connection)
            connection.abandon(wrapper)
            raise
    raise AssertionError("unreachable")  # pragma: no cover


def _shortfall(alias: str) -> float:
    """How much earlier than sent + ttl a lease on ``alias`` may expire (its clock's tick)."""
    return for_connection(connection.get(alias)).expiry_shortfall


def notifies(wrapper: BaseDatabaseWrapper) -> bool:
    """Whether blocked acquires on this connection's database wait for release notifications."""
    return for_connection(wrapper).supports_notify and conf.notify(wrapper.settings_dict)


def _alias(using: Any) -> str:
    return conf.DATABASE if using is None else validation.check_alias(using)


@dataclass(frozen=True)
class _Request:
    """A validated acquire request; building one is where bad arguments are refused."""

    name: str
    ttl: float
    holder: str
    using: str
    note: str
    auto_renew: bool

    @classmethod
    def build(
        cls,
        name: Any,
        ttl: Any,
        holder: Any,
        using: Any,
        note: Any,
        auto_renew: Any,
        *,
        settings: bool = True,
    ) -> _Request:
        """Check the arguments and make the request; ``None`` takes the default.

        With ``settings=False`` no setting is read (a lock() or alock() may be built at
        import time, before ``manage.py check`` could report a bad one): ``ttl`` and
        ``using`` left out stay unset until :meth:`with_defaults` takes them, on entry.

        Example::

            _Request.build("orders:42", 30, None, None, "", False).attempt()
        """
        name = validation.check_name(name)
        if ttl is not None:
            ttl = validation.ttl_seconds(ttl)
        elif settings:
            # The setting is checked where it is read (naming it in the error), once.
            ttl = conf.DEFAULT_TTL
        holder = default_holder() if holder is None else validation.check_holder(holder)
        if validation.check_auto_renew(auto_renew) and settings:
            # Checked now, before any query: failing once the lease is taken would strand it.
            _ = conf.RENEW_FRACTION
        if using is not None or settings:
            using = _alias(using)
        note = validation.check_note(note)
        # Unset (NaN, ""), never used: with_defaults() replaces them before any attempt.
        return cls(name, math.nan if ttl is None else ttl, holder, using or "", note, auto_renew)

    def with_defaults(self, unset: frozenset[str], holder: Callable[[], str]) -> _Request:
        """This request with what its caller left out taken anew: ``holder()`` for the
        holder, the settings as they are now for ``ttl`` and ``using``.

        For a lock() or alock() object entered later than it was built (a decorated
        function, in any thread, under ``override_settings``).

        Example::

            request.with_defaults(frozenset({"holder", "ttl"}), default_holder)
        """
        changes: dict[str, Any] = {}
        if "holder" in unset:
            changes["holder"] = holder()
        if "ttl" in unset:
            changes["ttl"] = conf.DEFAULT_TTL
        if "using" in unset:
            changes["using"] = conf.DATABASE
        if self.auto_renew:
            _ = conf.RENEW_FRACTION  # as in build(): failing once the lease is taken strands it
        return replace(self, **changes)

    def attempt(self, *, yield_to_queue: bool = False) -> Lease | None:
        started = time.monotonic()
        grant = _execute(
            self.using,
            "acquire",
            self.name,
            lambda backend, cursor: backend.acquire(
                cursor,
                self.name,
                self.holder,
                self.ttl,
                self.note,
                yield_to_queue=yield_to_queue,
            ),
        )
        return None if grant is None else self._lease(grant, started)

    def _lease(self, grant: Grant, started: float) -> Lease:
        lease = Lease(
            name=self.name,
            holder=self.holder,
            token=grant.token,
            count=grant.count,
            acquired_at=grant.acquired_at,
            expires_at=grant.expires_at,
            ttl=self.ttl,
            using=self.using,
            note=self.note,
            local_deadline=started + self.ttl - _shortfall(self.using),
        )
        logger.debug("acquired %r (token %s, count %s)", self.name, grant.token, grant.count)
        if self.auto_renew:
            watchdog.watch(lease, lease._renew_interval())
        return lease

    def attempt_as_head(self, *, queued: bool = True) -> Lease | float:
        """Take the lock, or flag its row so that its release notifies; then the seconds its
        holder has left. Only where the backend :attr:`supports_notify`."""
        started = time.monotonic()
        outcome = _execute(
            self.using, "acquire", self.name,
            lambda b, cursor: b.acquire_as_head(
                cursor, self.name, self.holder, self.ttl, self.note, queued=queued
            ),
        )  # fmt: skip
        return self._lease(outcome, started) if isinstance(outcome, Grant) else outcome

    def wait(self, timeout: float | None) -> Lease:
        # The first attempt counts against the timeout: it can itself wait (SQLite's busy
        # handler, a row lock on the lock's row), and the caller's bound is the whole call.
        deadline = None if timeout is None else time.monotonic() + timeout
        queues = notifies(connection.get(self.using))
        # Blocked acquires queue (below), and a new one does not jump that queue.
        lease = self.attempt(yield_to_queue=queues and timeout != 0)
        if lease is not None:
            return lease
        if timeout == 0:
            raise LockBusy(f"lock {self.name!r} is held by another holder")
        if queues:
            listener = waiting.listener(self.using)
            woken = listener.subscribe(
                self.name,
                threading.Event(),
                wait=min(waiting.LISTEN_WAIT_SECONDS, self._time_left(deadline, timeout)),
            )
            try:
                return self._wait_queued(deadline, timeout, woken)
            finally:
                listener.unsubscribe(self.name, woken)
        return self._wait_polling(deadline, timeout)

    def _time_left(self, deadline: float | None, timeout: float | None) -> float:
        """Seconds until ``deadline`` (infinite without one); raises LockBusy once it passed."""
        if deadline is None:
            return math.inf
        left = deadline - time.monotonic()
        if left <= 0:
            raise LockBusy(
                f"lock {self.name!r} is held by another holder"
                + (f"; gave up after {timeout:g} s" if timeout else "")
            )
        return left

    def _wait_polling(self, deadline: float | None, timeout: float | None) -> Lease:
        for attempt in itertools.count():
            time.sleep(min(_backoff(attempt), self._time_left(deadline, timeout)))
            lease = self.attempt()
            if lease is not None:
                return lease
        raise AssertionError("unreachable")  # pragma: no cover

    def _enter_queue(self, patience: float) -> bool:
        return _execute(
            self.using, "wait for", self.name,
            lambda b, cursor: b.enter_queue(cursor, self.name, patience),
        )  # fmt: skip

    def _wait_queued(
        self, deadline: float | None, timeout: float | None, woken: threading.Event
    ) -> Lease:
        """Wait in the database's queue of this name's blocked acquires, then for the release.

        Only the head of the queue flags the row and wakes on its release notification, so
        a release wakes one waiter, and waiters get the lock in the order they came.
        """
        queued = False
        try:
            while True:
                if not queued:
                    queued = self._enter_queue(
                        min(QUEUE_PATIENCE, self._time_left(deadline, timeout))
                    )
                    if not queued:
                        self._time_left(deadline, timeout)
                        # The queue did not move for a while (a holder that keeps the lock
                        # long, or a stuck head): look at the lock itself, then queue again.
                        lease = self.attempt()
                        if lease is not None:
                            return lease
                        continue
                    woken.clear()  # what came before is re-read by the attempt below
                    attempt = 0
                outcome = self.attempt_as_head()
                if isinstance(outcome, Lease):
                    queued = False  # the granting statement moved the queue on
                    return outcome
                # Never sleep past the holder's expiry; backoff bounds the sleep in case a
                # notification goes missing.
                pause = min(_backoff(attempt), max(outcome, 0) + 0.001)
                attempt += 1
                woken.wait(min(pause, self._time_left(deadline, timeout)))
                woken.clear()
                self._time_left(deadline, timeout)
        finally:
            if queued:
                with suppress(DatabaseError):
                    _execute(
                        self.using, "stop waiting for", self.name,
                        lambda b, cursor: b.leave_queue(cursor, self.name),
                    )  # fmt: skip


class Lease:
    """A held lease on a lock name; returned by :func:`acquire`, :func:`try_acquire`, :func:`lock`.

    Attributes: ``name``, ``holder``, ``token`` (fencing token), ``count`` (re-entries
    at grant), ``acquired_at`` and ``expires_at`` (by the database clock), ``ttl``,
    ``using``, ``note``.

    Example::

        lease = locks.acquire("orders:42", ttl=30)
        try:
            charge(order, fence=lease.token)
            lease.renew()
        finally:
            lease.release()
    """

    def __init__(
        self,
        *,
        name: str,
        holder: str,
        token: int,
        count: int,
        acquired_at: datetime,
        expires_at: datetime,
        ttl: float,
        using: str,
        note: str,
        local_deadline: float,
    ) -> None:
        self.name = name
        self.holder = holder
        self.token = token
        self.count = count
        self.acquired_at = acquired_at
        self.expires_at = expires_at
        self.ttl = ttl
        self.using = using
        self.note = note
        # Monotonic time by which the lease is surely over, measured from before the
        # acquire was sent: never later than the database's own expiry.
        self._local_deadline = local_deadline
        self._state = HELD
        # _mutex is held through a renewal's or release's statements; _state_lock only for
        # a look at the state and its change, so that the watchdog can give a lease up
        # without waiting for a slow release, and without undoing one that just ended.
        self._mutex = threading.Lock()
        self._state_lock = threading.Lock()
        # A forked child inherits this object, but the holding is the parent's.
        self._pid = os.getpid()
        # Set once a release was tried, or by _stop_renewals: the auto-renew watchdog stops
        # renewing, also when the release failed (the holder wanted it over; it expires by
        # itself then).
        self._unwatched = False
        self._made_under = making.get()

    def __repr__(self) -> str:
        return (
            f"<Lease {self.name!r} holder={self.holder!r} token={self.token} "
            f"count={self.count} {self._state}>"
        )

    @property
    def held(self) -> bool:
        """True until the lease is released or found lost (it may have expired since).

        Example::

            if lease.held:
                lease.renew()
        """
        return self._state == HELD

    @property
    def lost(self) -> bool:
        """True once a renewal (e.g. by the auto-renew watchdog) found the lease gone.

        Example::

            if lease.lost:
                rollback_work()
        """
        return self._state == LOST

    def _renew_interval(self, fraction: float | None = None) -> float:
        """Seconds between renewals: ``fraction`` (default ``RENEW_FRACTION``) of the ttl."""
        return max(self.ttl * (conf.RENEW_FRACTION if fraction is None else fraction), 0.001)

    def _stop_renewals(self) -> None:
        """Have the auto-renew watchdog leave this lease alone from now on.

        For a holding this object no longer stands for (a Celery run that retried): it
        stays held until it expires or its holder releases it.
        """
        self._unwatched = True

    def _mark_lost(self, *, if_over: bool = False) -> bool:
        """Mark a held lease lost; True if this did.

        ``if_over``: only if its local deadline passed, looked at under the state's lock, so
        that a renewal of its holder's that got through meanwhile (and moved the deadline
        under that lock) keeps it.
        """
        with self._state_lock:
            if self._state != HELD or (if_over and time.monotonic() < self._local_deadline):
                return False
            self._state = LOST
            return True

    def _refuse_if_over(self) -> None:
        if self._state == RELEASED:
            raise LockError(
                f"lease on lock {self.name!r} (token {self.token}) was already released"
            )
        if self._state == LOST:
            raise LockLost(f"lease on lock {self.name!r} (token {self.token}) was lost")

    def _refuse_in_a_child(self) -> None:
        # Before the mutex: a fork taken while the parent's watchdog renewed leaves it
        # locked in the child for good.
        if os.getpid() != self._pid:
            raise LockError(
                f"lease on lock {self.name!r} (token {self.token}) belongs to process "
                f"{self._pid}: a forked child can neither renew nor release it"
            )

    def _lost_error(self, why: str) -> LockLost:
        return LockLost(
            f"lock {self.name!r} is no longer held by {self.holder!r} "
            f"with token {self.token}: {why}"
        )

    def renew(self, ttl: float | timedelta | None = None) -> None:
        """Extend the lease to at least ``ttl`` (default: its own TTL) from now.

        Raises ``LockLost`` if it expired, was taken over, broken or reaped, or if the
        auto-renew watchdog gave it up while this renewal waited (past the time it was
        surely held; it stays lost then, even if the renewal got through).

        Example::

            for chunk in chunks:
                process(chunk)
                lease.renew()
        """
        self._renew(self.ttl if ttl is None else validation.ttl_seconds(ttl))

    def _renew(
        self, seconds: float, *, by_watchdog: bool = False, wait_until: float = math.inf
    ) -> bool:
        """:meth:`renew` for ``seconds`` already checked.

        ``by_watchdog`` (the auto-renew watchdog's renewals): nothing is done once a release
        was tried or renewals were stopped, and the renewal waits for the lock row (a
        transaction holding it, a busy SQLite file) no longer than the lease is surely ours,
        and then fails, so that the lease is given up in time (a renewal waiting on would
        leave it held long after it may have run out), nor past ``wait_until`` (a
        ``time.monotonic()`` value: when the watchdog's next lease falls due). Nor does it
        wait for the holder's own renewal or release under way, which may wait for the row
        without a bound: it returns False at once, and the watchdog looks again later
        (meanwhile it renews the other leases of the database). True otherwise.
        """
        self._refuse_in_a_child()
        if not self._mutex.acquire(blocking=not by_watchdog):
            return False
        try:
            self._refuse_if_over()
            if by_watchdog and self._unwatched:
                # Looked at again here: a release that failed (the holder wants the lease
                # over) may have ended between the watchdog's look and this renewal.
                return True
            started = time.monotonic()
            give_up = min(self._local_deadline, wait_until) if by_watchdog else None

            def extend(backend: Backend, cursor: Cursor) -> datetime | None:
                # Each try of a transient error gets what is left of the same deadline.
                wait = None if give_up is None else max(give_up - time.monotonic(), 0.0)
                return backend.renew(cursor, self.name, self.holder, self.token, seconds, wait)

            expires_at = _execute(self.using, "renew", self.name, extend, give_up)
            if expires_at is None:
                self._state = LOST
                raise self._lost_error("it expired, was taken over, broken or reaped")
            self.expires_at = expires_at
            deadline = started + seconds - _shortfall(self.using)
            with self._state_lock:
                # Under the lock of the watchdog's look at the deadline (_mark_lost): it
                # gives the lease up before the deadline moves, and this renewal sees it
                # lost, or not at all.
                self._local_deadline = max(self._local_deadline, deadline)
                given_up = self._state == LOST
            if given_up:
                # The watchdog gave the lease up while this renewal waited (it was no longer
                # surely ours), and renews it no more; whoever saw it lost may have acted on
                # that already. It stays lost, and the caller learns it now.
                raise self._lost_error("it was given up while this renewal waited")
        finally:
            self._mutex.release()
        return True

    def release(self, *, entirely: bool = False) -> None:
        """Release the lease (one re-entry of it; with ``entirely=True``, the whole holding).

        Owner-checked. Raises ``LockLost`` if the lease expired before the release, or was
        taken over, broken or reaped: the critical section was not protected to its end.
        ``entirely`` ends every re-entry of this holding at once, e.g. when a worker
        finishes a job whose lease was re-entered by several processes sharing a holder.

        Example::

            lease = locks.acquire("orders:42")
            try:
                ...
            finally:
                lease.release()
        """
        if not isinstance(entirely, bool):
            raise TypeError(f"entirely must be True or False, not {entirely!r}")
        self._refuse_in_a_child()
        with self._mutex:
            if self._state == RELEASED:
                raise LockError(
                    f"lease on lock {self.name!r} (token {self.token}) was already released"
                )
            self._unwatched = True
            outcome = _execute(
                self.using,
                "release",
                self.name,
                lambda backend, cursor: self._release_statements(backend, cursor, entirely),
            )
            with self._state_lock:
                self._state = RELEASED
        if outcome is Released.EXPIRED:
            raise self._lost_error("it expired before it was released")
        if outcome is Released.MISSING:
            raise self._lost_error("it was taken over, broken or reaped")
        logger.debug("released %r (token %s)", self.name, self.token)

    async def arenew(self, ttl: float | timedelta | None = None) -> None:
        """:meth:`renew` for asyncio code: runs in a worker thread, off the event loop.

        Example::

            await lease.arenew()
        """
        from .aio import run_sync

        await run_sync(self.renew, ttl)

    async def arelease(self, *, entirely: bool = False) -> None:
        """:meth:`release` for asyncio code: runs in a worker thread, off the event loop.

        Example::

            lease = await locks.aacquire("orders:42")
            try:
                ...
            finally:
                await lease.arelease()
        """
        from .aio import run_sync

        await run_sync(self.release, entirely=entirely)

    def _release_statements(self, backend: Backend, cursor: Cursor, entirely: bool) -> Released:
        args = (cursor, self.name, self.holder, self.token)
        if entirely:
            return backend.release_last(*args, entirely=True)
        # Try the likely case first: one statement when the lease is not re-entered.
        steps: tuple[Callable[..., Released], ...] = (backend.release_last, backend.release_reentry)
        if self.count > 1:
            steps = steps[::-1]
        while True:
            for step in steps:
                outcome = step(*args)
                if outcome is not Released.MISSING:
                    return outcome
            # Both missed: the holding is gone, or a holder shared with another process
            # re-entered or released in between, moving the count across our two statements.
            if not backend.holds(*args):
                return Released.MISSING

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _end(self, exc_type is not None)


def _end(lease: Lease, failing: bool) -> None:
    """Release at the end of a ``with`` block without masking the block's own exception."""
    # A block that released its lease itself (e.g. early, before slow cleanup) is fine; a
    # child forked inside the block leaves it too, and the lease stays its parent's.
    if lease._state == RELEASED or os.getpid() != lease._pid:
        return
    lost_meanwhile = lease.lost
    try:
        lease.release()
    except LockLost:
        if failing:
            logger.warning("lock %r was lost before the end of its block", lease.name)
            return
        raise
    except Exception as exc:
        if not failing:
            if lost_meanwhile:
                # Known lost before the release was tried (renewals that failed until the
                # lease was surely over, say, with the database down): that is what the
                # holder must learn; the release's own failure comes along as the cause.
                raise LockLost(
                    f"lock {lease.name!r} was lost while its block ran (auto-renew failed)"
                ) from exc
            raise
        # As atomic() does when its rollback fails: the block's error is the one to see.
        # The lease expires at the end of its TTL.
        logger.warning(
            "could not release lock %r after its block failed", lease.name, exc_info=True
        )
        return
    if lost_meanwhile and not failing:
        raise LockLost(f"lock {lease.name!r} was lost while its block ran (auto-renew failed)")


def acquire(
    name: str,
    *,
    ttl: float | timedelta | None = None,
    timeout: float | timedelta | None = None,
    holder: str | None = None,
    using: str | None = None,
    note: str = "",
    auto_renew: bool = False,
) -> Lease:
    """Acquire the lease on ``name``, waiting up to ``timeout`` seconds (``None``: forever).

    Re-entrant: the same holder acquiring again gets the same token and a higher count.
    Raises ``LockBusy`` when the wait runs out.

    Example::

        lease = locks.acquire("orders:42", ttl=30, timeout=5)
        try:
            ship(order)
        finally:
            lease.release()
    """
    request = _Request.build(name, ttl, holder, using, note, auto_renew)
    return request.wait(validation.timeout_seconds(timeout))


def try_acquire(
    name: str,
    *,
    ttl: float | timedelta | None = None,
    holder: str | None = None,
    using: str | None = None,
    note: str = "",
    auto_renew: bool = False,
) -> Lease | None:
    """Make one attempt to acquire ``name``; return the lease, or ``None`` if it is held.

    Example::

        lease = locks.try_acquire("reports:nightly", ttl=600)
        if lease is None:
            return  # another worker is on it
    """
    return _Request.build(name, ttl, holder, using, note, auto_renew).attempt()


# The leases that lock()/alock() objects hold for this thread or asyncio task, innermost
# last. Not a stack per object: one object may be shared (a module-level guard, a decorated
# function) and entered in many threads and tasks at once, and each must release its own
# lease, never one that another thread or task of the same object took over. Threads start
# with an empty context and tasks with a copy of their creator's, so each sees only what it
# entered itself. One variable for all objects: contexts keep every variable set in them.
_entered: ContextVar[tuple[tuple[object, Lease], ...]] = ContextVar("locks_entered", default=())


class Entered:
    """The leases a lock()/alock() object holds, each released where it was taken.

    Example::

        self._push(lease)  # in __enter__, once the lease is held
        lease = self._pop()  # in __exit__, before releasing it
    """

    def __init__(self) -> None:
        self._held: list[Lease] = []  # in every thread and task, in the order taken

    def _push(self, lease: Lease) -> None:
        self._held.append(lease)
        _entered.set((*_entered.get(), (self, lease)))

    def _pop(self) -> Lease:
        entered = _entered.get()
        for index in range(len(entered) - 1, -1, -1):
            if entered[index][0] is self:
                lease = entered[index][1]
                _entered.set(entered[:index] + entered[index + 1 :])
                break
        else:
            # A block that ends in another thread than it began in (a generator resumed
            # elsewhere) finds nothing here. Guess only when the guess cannot be another
            # thread's holding: every lease left is one holding (holder and token).
            if len({(held.holder, held.token) for held in self._held}) != 1:
                raise LockError(
                    "a lock() block ended in another thread or task than it began in while "
                    "the same lock object holds other holdings: it cannot tell which one is "
                    "this block's, so it released none (this block's lease runs out)"
                )
            lease = self._held[-1]
        if not any(held is lease for held in self._held):
            # A block of the same holding that ended in another thread took this one's
            # entry: give back one of the holding's that are left.
            same = (lease.holder, lease.token)
            lease = next((h for h in reversed(self._held) if (h.holder, h.token) == same), lease)
        if any(held is lease for held in self._held):
            self._held.remove(lease)
        return lease


def _unwrapped(func: Any) -> Any:
    """``func`` without the staticmethods and partials around it: what they call."""
    while isinstance(func, staticmethod | functools.partial):
        func = func.__func__ if isinstance(func, staticmethod) else func.func
    return func


def call_target(func: Any) -> Any:
    """What runs when ``func`` is called: a staticmethod's or partial's function, an
    object's ``__call__`` (also one a staticmethod or partial wraps).

    Example::

        call_target(staticmethod(job)) is job  # True
    """
    func = _unwrapped(func)
    if callable(func) and not (inspect.isroutine(func) or isinstance(func, type)):
        return type(func).__call__
    return func


def function_kind(func: Any) -> str | None:
    """What calling ``func`` makes, when not its result: a coroutine or a generator.

    Looks through a staticmethod, a partial and an object's ``__call__``, which decorators
    otherwise take for plain functions and hold their lock around the making only.

    Example::

        function_kind(agen)  # 'async generator'
    """
    target = call_target(func)
    # Asked of the object (and what a staticmethod or partial wraps) first: some mark
    # themselves (AsyncMock, asgiref's markcoroutinefunction) rather than their __call__.
    if any(iscoroutinefunction(each) for each in (func, _unwrapped(func), target)):
        return "coroutine"
    if inspect.isasyncgenfunction(target):
        return "async generator"
    return "generator" if inspect.isgeneratorfunction(target) else None


class LockContext(Entered, ContextDecorator):
    """What :func:`lock` returns: a context manager (and decorator) that holds a lease."""

    def __init__(self, request: _Request, timeout: float | None, unset: frozenset[str]) -> None:
        super().__init__()
        self._request = request
        self._timeout = timeout
        # Arguments left to their defaults, taken on entry: the holder is the entering
        # thread's, not the building one's (a function decorated at import time runs in
        # many threads, and in forked children), and the settings are read when used.
        self._unset = unset

    def _recreate_cm(self) -> LockContext:
        # Used as a decorator, each call (in any thread) gets its own lease.
        return LockContext(self._request, self._timeout, self._unset)

    def __call__(self, func: F) -> F:
        # Calling one of these only makes a coroutine or generator: the lock would be
        # held for that, and released before the body ran.
        kind = function_kind(func)
        if kind is not None:
            raise TypeError(
                f"@locks.lock() on {getattr(func, '__qualname__', func)!r}, "
                f"{'an' if kind[0] == 'a' else 'a'} {kind} function, would hold the lock "
                f"only while the call makes the {kind}, not while it runs: use "
                "@locks.alock() on async def, or hold the lock inside the generator"
            )
        return super().__call__(func)

    def __enter__(self) -> Lease:
        request = self._request.with_defaults(self._unset, default_holder)
        lease = request.wait(self._timeout)
        self._push(lease)
        return lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _end(self._pop(), exc_type is not None)


def lock(
    name: str,
    *,
    ttl: float | timedelta | None = None,
    timeout: float | timedelta | None = None,
    holder: str | None = None,
    using: str | None = None,
    note: str = "",
    auto_renew: bool = False,
) -> LockContext:
    """Hold the lease on ``name`` for a ``with`` block (or a decorated function).

    With ``auto_renew=True`` a watchdog renews the lease every third of its TTL; if it
    finds the lease lost, the block raises ``LockLost`` when it ends. Arguments are
    checked here, before any query.

    Example::

        with locks.lock("orders:42", ttl=30, timeout=5) as lease:
            ship(order, fence=lease.token)

        @locks.lock("reports:nightly", ttl=60, auto_renew=True)
        def nightly_report(): ...
    """
    request = _Request.build(name, ttl, holder, using, note, auto_renew, settings=False)
    return LockContext(request, validation.timeout_seconds(timeout), unset(ttl, holder, using))


def unset(ttl: Any, holder: Any, using: Any) -> frozenset[str]:
    """Which of these arguments the caller left to their defaults (None).

    Example::

        unset(30, None, None)  # frozenset({"holder", "using"})
    """
    given = {"ttl": ttl, "holder": holder, "using": using}
    return frozenset(key for key, value in given.items() if value is None)


def is_locked(name: str, *, using: str | None = None) -> bool:
    """Whether ``name`` has a live (unexpired) holder, by the database clock.

    Example::

        if locks.is_locked("orders:42"):
            return "busy"
    """
    name = validation.check_name(name)
    return _execute(
        _alias(using), "inspect", name, lambda backend, cursor: backend.is_locked(cursor, name)
    )


def check_token(name: str, token: int, *, using: str | None = None) -> bool:
    """Whether ``token`` is the live holder's token of ``name`` (Chubby's CheckSequencer).

    Example::

        if not locks.check_token("orders:42", request_token):
            raise PermissionDenied("stale lock holder")
    """
    name = validation.check_name(name)
    token = validation.check_token(token)
    return _execute(
        _alias(using),
        "inspect",
        name,
        lambda backend, cursor: backend.check_token(cursor, name, token),
    )


def break_lock(name: str, *, using: str | None = None, token: int | None = None) -> bool:
    """Delete the lock row of ``name`` whoever holds it; True if a row went.

    The holder learns of it as ``LockLost`` on its next renew or release, and the next
    holder's token is greater than the broken one's. With ``token``, only that holding is
    broken: a lock re-acquired since the caller looked (new token) is left alone.

    Example::

        locks.break_lock("orders:42")
        locks.break_lock("orders:42", token=shown.token)  # only the holding that was shown
    """
    name = validation.check_name(name)
    if token is None:
        broken = _execute(
            _alias(using), "break", name, lambda backend, cursor: backend.break_lock(cursor, name)
        )
    else:
        shown = validation.check_token(token)
        broken = _execute(
            _alias(using),
            "break",
            name,
            lambda backend, cursor: backend.break_holding(cursor, name, shown),
        )
    if broken:
        logger.warning("broke lock %r%s", name, "" if token is None else f" (token {token})")
    return broken


def release_holding(name: str, holder: str, alias: str) -> bool:
    """Delete ``holder``'s holding of ``name`` with all its re-entries; True if it went.

    For a holder that has no Lease object to release with (a revoked Celery message): one
    statement, and a name that is free or another holder's now is left as it is.
    """
    gone = _execute(
        alias, "release", name, lambda backend, cursor: backend.break_holder(cursor, name, holder)
    )
    if gone:
        logger.debug("released lock %r held by %r", name, holder)
    return gone


def reap_expired(
    batch_size: int | None = None, *, using: str | None = None, time_budget: float | None = None
) -> int:
    """Delete expired lock rows in batches of ``batch_size``; return how many went.

    Each batch is one conditional DELETE judged by the database clock, so a lease renewed
    a moment ago is never deleted. Stops when a batch comes back short, or when
    ``time_budget`` seconds have been spent. On SQLite it pauses after each batch as long
    as the batch held the file's write lock, so that acquires get in between.

    Example::

        deleted = locks.reap_expired(batch_size=1000)
    """
    size = conf.REAP_BATCH_SIZE if batch_size is None else validation.check_batch_size(batch_size)
    budget = validation.timeout_seconds(time_budget)
    alias = _alias(using)
    total = reap_batches(size, alias, budget).deleted
    logger.info("reaped %d expired locks on database %r", total, alias)
    return total


@dataclass(frozen=True)
class ReapReport:
    """What one reaper run did: rows deleted, batches run, and how long they took.

    Example::

        report = locks.tasks.reap(batch_size=1000, time_budget=30)
        report.deleted, report.batches, report.longest_batch
    """

    deleted: int
    batches: int
    longest_batch: float  # seconds one batch held what writers wait for (SQLite: the file)
    elapsed: float
    database: str
    finished: bool  # False when the time budget ran out with expired rows possibly left


def reap_batches(size: int, alias: str, budget: float | None) -> ReapReport:
    """The reaper's loop, for arguments already checked: every way of reaping runs this.

    Example::

        reap_batches(1000, "default", 30.0).deleted
    """
    began = time.monotonic()
    deadline = None if budget is None else began + budget
    deleted = batches = 0
    longest = 0.0
    while True:
        count, held, writers_poll = _execute(
            alias,
            "reap",
            "*",
            lambda backend, cursor: (*backend.reap(cursor, size), backend.writers_poll),
        )
        # The longest batch is about how long an acquire may wait for the reaper.
        longest = max(longest, held)
        deleted += count
        batches += 1
        finished = count < size
        pause = held if writers_poll else 0.0
        if finished or (deadline is not None and time.monotonic() + pause >= deadline):
            elapsed = time.monotonic() - began
            return ReapReport(deleted, batches, longest, elapsed, alias, finished)
        # Where waiting writers poll rather than queue (SQLite), leave the database to them
        # as long as the batch held it, or an acquire could wait through many batches.
        time.sleep(pause)
