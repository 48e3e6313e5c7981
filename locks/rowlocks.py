"""Row locks: ``SELECT ... FOR UPDATE`` on a named row (``row_lock``) or on rows (``lock_rows``)."""

from __future__ import annotations

import itertools
import logging
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ContextDecorator, ExitStack
from dataclasses import dataclass, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import DatabaseError, connections, transaction
from django.db.models import Model, QuerySet
from django.db.transaction import TransactionManagementError

from . import validation
from .backends import Backend, for_connection
from .conf import conf
from .exceptions import LockBusy, LockError

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

    from .models import RowLock

logger = logging.getLogger("locks")
_R = TypeVar("_R")
_F = TypeVar("_F", bound=Callable[..., Any])

# Reading the row again after creating it is enough unless the transaction's snapshot
# predates the row (REPEATABLE READ / SERIALIZABLE on PostgreSQL).
_ATTEMPTS = 3


@dataclass(frozen=True)
class _Wait:
    """How long to wait for a row lock; building one is where bad arguments are refused."""

    nowait: bool
    skip_locked: bool
    timeout: float | None

    @classmethod
    def build(cls, what: str, nowait: Any, skip_locked: Any, timeout: Any) -> _Wait:
        for value, argument in ((nowait, "nowait"), (skip_locked, "skip_locked")):
            if not isinstance(value, bool):
                raise TypeError(f"{what}: {argument} must be True or False, not {value!r}")
        if nowait and skip_locked:
            raise ValueError(f"{what}: nowait and skip_locked cannot be used together")
        seconds = validation.timeout_seconds(timeout)
        if seconds is not None and (nowait or skip_locked):
            raise ValueError(
                f"{what}: timeout cannot be combined with nowait or skip_locked "
                "(nowait is the same as timeout=0)"
            )
        if seconds == 0:
            # The servers read a zero lock timeout as "no limit".
            return cls(True, False, None)
        return cls(nowait, skip_locked, seconds)

    @property
    def immediate(self) -> bool:
        """Whether a held lock fails (or is skipped) at once instead of being waited for."""
        return self.nowait or self.skip_locked

    @property
    def database_wait(self) -> float | None:
        """The bound for a database whose one write lock stands in for row locks."""
        return 0.0 if self.immediate else self.timeout

    def busy(self, what: str, alias: str, backend: Backend) -> LockBusy:
        scope = "" if backend.has_row_locks else " (SQLite: a row lock is the database write lock)"
        if self.nowait:
            waited = " (nowait)"
        elif self.skip_locked:
            waited = " (skip_locked)"
        elif self.timeout is None:
            # No bound of ours: the wait was ended by the server's own setting
            # (lock_timeout, innodb_lock_wait_timeout, the SQLite busy timeout).
            waited = "; the server's lock wait limit ran out"
        else:
            waited = f"; gave up after {self.timeout:g} s"
        return LockBusy(
            f"{what} on database {alias!r} is held by another transaction{scope}{waited}"
        )


def _alias(using: Any) -> str:
    return conf.DATABASE if using is None else validation.check_alias(using)


def _exit(atomic: transaction.Atomic, failing: bool) -> None:
    """Leave the transaction (or savepoint) ``atomic`` opened: roll back if ``failing``."""
    if failing:
        atomic.__exit__(*sys.exc_info())
    else:
        atomic.__exit__(None, None, None)


class _SnapshotTooOld(LockError):
    """The row exists, but the transaction's snapshot predates it (PostgreSQL REPEATABLE
    READ or SERIALIZABLE): a transaction started after it was created can lock it."""


def _select_or_create(
    connection: BaseDatabaseWrapper, backend: Backend, alias: str, name: str, wait: _Wait
) -> bool:
    """Lock the row of ``name`` in the open transaction, creating the row if needed."""
    from .leases import _execute

    created_here = False
    with connection.cursor() as cursor:
        if backend.creates_row_in_transaction:
            try:
                backend.take_row_lock(cursor, name, nowait=wait.immediate)
            except DatabaseError as exc:
                if wait.skip_locked and backend.is_lock_busy(exc):
                    return False  # another transaction is creating or holding it
                raise
            return True
        for _ in range(_ATTEMPTS):
            if backend.select_row_lock(
                cursor, name, nowait=wait.nowait, skip_locked=wait.skip_locked
            ):
                return True
            # Created on the app's own autocommit connection, so other sessions see the
            # row at once and never wait for this transaction to learn that it exists.
            created = _execute(
                alias, "create", name, lambda other, own: other.insert_row_lock(own, name)
            )
            if created:
                created_here = True
            elif wait.skip_locked and (not created_here or backend.sees_row_lock(cursor, name)):
                # It existed, yet SKIP LOCKED passed it over: it is held. (A row created
                # by this call and passed over may instead be newer than the snapshot.)
                return False
    raise _SnapshotTooOld(
        f"row lock {name!r} on database {alias!r}: its row exists but this transaction cannot "
        "see it, because the transaction's snapshot is older than the row (REPEATABLE READ or "
        "SERIALIZABLE). Use READ COMMITTED, or take the row lock once before such a "
        "transaction starts so that its row exists."
    )


def _lock_row(
    connection: BaseDatabaseWrapper, backend: Backend, alias: str, name: str, wait: _Wait
) -> transaction.Atomic | None:
    """Open a transaction (or savepoint) holding the row lock; ``None`` if skipped."""
    atomic = transaction.atomic(using=alias)
    atomic.__enter__()
    try:
        with backend.bounded_wait(connection, wait.timeout):
            locked = _select_or_create(connection, backend, alias, name, wait)
    except BaseException:
        _exit(atomic, failing=True)
        raise
    if not locked:
        _exit(atomic, failing=False)
        return None
    return atomic


def _lock_database(
    connection: BaseDatabaseWrapper, backend: Backend, alias: str, name: str, wait: _Wait
) -> transaction.Atomic | None:
    """The same where there are no row locks: hold the database's write lock instead."""
    atomic = transaction.atomic(using=alias)
    try:
        with backend.bounded_wait(connection, wait.database_wait):
            # BEGIN IMMEDIATE takes the write lock here; in a deferred transaction, the
            # insert below is the first write and takes it.
            atomic.__enter__()
            try:
                with connection.cursor() as cursor:
                    backend.insert_row_lock(cursor, name)
            except BaseException:
                _exit(atomic, failing=True)
                raise
    except DatabaseError as exc:
        if wait.skip_locked and backend.is_lock_busy(exc):
            return None
        raise
    return atomic


def _take(name: str, wait: _Wait, alias: str) -> transaction.Atomic | None:
    """Take the row lock; retry a deadlock when the transaction is ours to start again."""
    from .leases import _backoff

    connection = connections[alias]
    backend = for_connection(connection)
    take = _lock_row if backend.has_row_locks else _lock_database
    # A deadlock rolls back the whole transaction; only one of our own can simply be retried
    # (not the caller's atomic block, nor the caller's manual transaction: autocommit off).
    ours = not connection.in_atomic_block and connection.get_autocommit()
    retries = conf.TRANSIENT_RETRIES if ours else 0
    deadline = None if wait.timeout is None else time.monotonic() + wait.timeout
    requested = wait
    fresh_snapshot = ours
    for attempt in itertools.count():
        try:
            return take(connection, backend, alias, name, wait)
        except _SnapshotTooOld:
            if not fresh_snapshot:
                raise
            # Our own transaction took its snapshot with the SELECT that found no row,
            # before the row was created: a new transaction sees it (once is enough).
            fresh_snapshot = False
            if deadline is not None:
                wait = replace(wait, timeout=max(deadline - time.monotonic(), 0.001))
            continue
        except DatabaseError as exc:
            if backend.is_lock_busy(exc):
                raise requested.busy(f"row lock {name!r}", alias, backend) from exc
            if backend.is_deadlock(exc) and attempt < retries:
                # On MariaDB, sessions waiting for a new row whose creator rolls back then
                # create it at once, and can deadlock.
                logger.debug("row lock %r: deadlock, retrying: %s", name, exc)
                time.sleep(_backoff(attempt))
                if deadline is not None:
                    wait = replace(wait, timeout=max(deadline - time.monotonic(), 0.001))
                continue
            exc.add_note(f"locks: while taking row lock {name!r} on database {alias!r}")
            raise
    raise AssertionError("unreachable")  # pragma: no cover


class RowLockContext(ContextDecorator):
    """What :func:`row_lock` returns: a context manager (and decorator) holding a row lock.

    Example::

        with locks.row_lock("orders:42", nowait=True) as row:
            ...
    """

    def __init__(self, name: str, wait: _Wait, using: str | None) -> None:
        self.name = name
        # None: LOCKS["DATABASE"] when entered, not when built (a function decorated at
        # import time runs under the settings of each call, override_settings too).
        self.using = using
        self._wait = wait
        # The transaction of the block each thread is in. One object may be shared (a
        # module-level guard) and entered by several threads at once, each holding the
        # lock in its own connection's transaction, and each must end its own.
        self._entered = threading.local()

    def _held(self) -> transaction.Atomic | None:
        """The transaction (or savepoint) holding the lock for this thread's block, if any."""
        atomic: transaction.Atomic | None = getattr(self._entered, "atomic", None)
        return atomic

    def _recreate_cm(self) -> RowLockContext:
        # Used as a decorator, each call (in any thread) gets its own transaction.
        return RowLockContext(self.name, self._wait, self.using)

    def __call__(self, func: _F) -> _F:
        """Decorate ``func``: each call runs holding the row lock, in its own transaction."""
        from .leases import function_kind

        # Calling one of these only makes a coroutine or generator: the transaction, and
        # the row lock with it, would end before the body ran, which then runs unlocked.
        kind = function_kind(func)
        if kind is not None:
            raise TypeError(
                f"@locks.row_lock({self.name!r}) on {getattr(func, '__qualname__', func)!r}, "
                f"{'an' if kind[0] == 'a' else 'a'} {kind} function, would hold the row lock "
                f"only while the call makes the {kind}, not while it runs: hold the row lock "
                f"inside it (with locks.row_lock(...))"
            )
        if self._wait.skip_locked:
            # A skipped lock is told to the block by ``None``; a decorated function never
            # sees it, and would run without the lock while another transaction holds it.
            raise TypeError(
                f"@locks.row_lock({self.name!r}, skip_locked=True) on "
                f"{getattr(func, '__qualname__', func)!r}: the function would also run when "
                "the lock is skipped, without it. Use `with locks.row_lock(..., "
                "skip_locked=True) as row:` and return when row is None"
            )
        return super().__call__(func)

    def __enter__(self) -> RowLock | None:
        from .models import RowLock

        if self._held() is not None:
            raise LockError(f"row lock {self.name!r} is already held by this context manager")
        alias = _alias(self.using)
        self._entered.atomic = _take(self.name, self._wait, alias)
        if self._entered.atomic is None:
            logger.debug("row lock %r is held elsewhere: skipped", self.name)
            return None
        logger.debug("took row lock %r on database %r", self.name, alias)
        return RowLock.from_db(alias, ["name"], [self.name])

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        atomic, self._entered.atomic = self._held(), None
        if atomic is not None:
            atomic.__exit__(exc_type, exc, tb)
            logger.debug("released row lock %r", self.name)


def row_lock(
    name: str,
    *,
    nowait: bool = False,
    skip_locked: bool = False,
    timeout: float | None = None,
    using: str | None = None,
) -> RowLockContext:
    """Hold an exclusive row lock on ``name`` for a ``with`` block, in a transaction.

    Opens ``transaction.atomic(using=...)`` on Django's connection to the locks database
    (``LOCKS["DATABASE"]``), makes sure a row for ``name`` exists and takes ``SELECT ...
    FOR UPDATE`` on it (on MariaDB, one ``INSERT ... ON DUPLICATE KEY UPDATE`` does both
    and, but for one race, locks no gap next to the name). Writes made in the block on that
    database commit or roll back together with it. The lock ends with the transaction: when
    the block ends, or, in an outer ``atomic`` block (where this is a savepoint), when the
    outer transaction ends; and when the client dies. The block gets the locked ``RowLock``
    row.

    ``nowait=True`` raises ``LockBusy`` at once if another transaction holds it;
    ``timeout=s`` waits at most ``s`` seconds, then raises ``LockBusy``; ``skip_locked=True``
    does not wait either but runs the block with ``None`` (and no transaction of its own),
    as ``select_for_update(skip_locked=True)`` returns no rows (so, as a decorator, which
    would run the function either way, ``skip_locked=True`` is a ``TypeError``). Without
    these, it waits as long as the server allows. On SQLite, which has no row locks, the
    lock is the whole database's write lock. Arguments are checked here, before any query.

    Example::

        with locks.row_lock("orders:42", timeout=5):
            order = Order.objects.get(pk=42)
            order.state = "shipped"
            order.save()

        with locks.row_lock("reports:nightly", skip_locked=True) as row:
            if row is None:
                return  # another worker has it
            build_report()
    """
    name = validation.check_name(name)
    wait = _Wait.build(f"row lock {name!r}", nowait, skip_locked, timeout)
    # The setting is read when entered: a bad one raised here would break importing the
    # module of a decorated function (and manage.py check, which reports it as locks.E002).
    return RowLockContext(name, wait, None if using is None else validation.check_alias(using))


def lock_rows(
    queryset: QuerySet[Any, _R],
    *,
    nowait: bool = False,
    skip_locked: bool = False,
    timeout: float | None = None,
) -> list[_R]:
    """Lock the rows of ``queryset`` with ``SELECT ... FOR UPDATE``; return them.

    Must run inside ``transaction.atomic()`` on the queryset's database: the locks last
    until that transaction ends. ``nowait``, ``timeout`` and ``skip_locked`` work as in
    :func:`row_lock`; ``skip_locked`` leaves out the rows other transactions hold. With
    ``nowait`` or ``timeout``, a ``LockBusy`` leaves the transaction usable (the attempt
    runs in a savepoint); without them, a wait cut short by the server's own limit ends
    as any failed statement does (on PostgreSQL the transaction is aborted). ``nowait``,
    ``skip_locked``, ``of`` and ``no_key`` given to the queryset's ``select_for_update()``
    are kept (``nowait`` and ``skip_locked`` as if given here: a combination refused here
    is refused then too). On SQLite the database's write lock stands in for the row locks.

    Example::

        with transaction.atomic():
            (order,) = locks.lock_rows(Order.objects.filter(pk=42), timeout=5)
            order.state = "paid"
            order.save()
    """
    if not isinstance(queryset, QuerySet):
        raise TypeError(f"lock_rows() needs a QuerySet, not {type(queryset).__name__}")
    what = f"row locks on {queryset.model._meta.label} rows"
    wait = _Wait.build(what, nowait, skip_locked, timeout)
    # What the queryset's own select_for_update() asked for is kept (select_for_update
    # resets it): nowait= and skip_locked= count as if given here, so that a wait asked
    # not to happen never does, and of= and no_key= are passed on.
    query = queryset.query
    if query.select_for_update_nowait or query.select_for_update_skip_locked:
        wait = _Wait.build(
            f"{what} (with the queryset's select_for_update() flags)",
            nowait or query.select_for_update_nowait,
            skip_locked or query.select_for_update_skip_locked,
            timeout,
        )
    locking = queryset.select_for_update(
        nowait=wait.nowait,
        skip_locked=wait.skip_locked,
        of=query.select_for_update_of,
        no_key=query.select_for_no_key_update,
    )
    alias = locking.db
    connection = connections[alias]
    if not connection.in_atomic_block:
        raise TransactionManagementError(
            f"{what}: lock_rows() must run inside transaction.atomic(using={alias!r}); "
            "row locks last until the transaction ends"
        )
    backend = for_connection(connection)
    try:
        with ExitStack() as scope:
            if wait.nowait or wait.timeout is not None:
                # A failed lock wait aborts a PostgreSQL transaction; keep the caller's.
                scope.enter_context(transaction.atomic(using=alias))
            if backend.has_row_locks:
                scope.enter_context(backend.bounded_wait(connection, wait.timeout))
                return list(locking)
            if not _take_write_lock(connection, backend, wait, queryset.model):
                return []
            return list(locking)
    except DatabaseError as exc:
        if backend.is_lock_busy(exc):
            raise wait.busy(what, alias, backend) from exc
        raise
    raise AssertionError("unreachable")  # pragma: no cover


def _take_write_lock(
    connection: BaseDatabaseWrapper, backend: Backend, wait: _Wait, model: type[Model]
) -> bool:
    """Take the database's write lock for :func:`lock_rows`; False if skipped as busy."""
    quote = connection.ops.quote_name
    table, column = quote(model._meta.db_table), quote(model._meta.pk.column)
    try:
        with backend.bounded_wait(connection, wait.database_wait), connection.cursor() as cursor:
            backend.take_write_lock(cursor, table, column)
    except DatabaseError as exc:
        if wait.skip_locked and backend.is_lock_busy(exc):
            return False
        raise
    return True
