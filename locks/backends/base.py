"""What every vendor backend provides: one conditional statement per state change."""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor

#: The longest lock wait PostgreSQL's ``lock_timeout`` and SQLite's ``busy_timeout`` take,
#: in milliseconds (a signed 32-bit int, some 24.8 days). PostgreSQL refuses more; SQLite
#: silently takes it as 0, i.e. no wait at all. Longer timeouts wait this long.
MAX_WAIT_MS = 2**31 - 1


def wait_ms(timeout: float) -> int:
    """``timeout`` seconds as a lock wait in whole milliseconds: at least 1, at most MAX_WAIT_MS.

    Example::

        wait_ms(0.0001)  # 1: both databases read 0 as "no limit" or "no wait"
    """
    return min(max(1, math.ceil(timeout * 1000)), MAX_WAIT_MS)


class Cursor(Protocol):
    """What the backends use of a cursor: Django's own, or the app's DirectCursor."""

    def execute(self, sql: str, params: Any = None) -> Any: ...

    def fetchone(self) -> Any: ...

    @property
    def rowcount(self) -> int: ...


@dataclass(frozen=True, slots=True)
class Grant:
    """What the database answered to a successful acquire."""

    token: int
    count: int
    acquired_at: datetime
    expires_at: datetime


class Released(enum.Enum):
    """Outcome of one release statement."""

    DONE = "done"  # the holding ended (row deleted) or one re-entry was undone
    EXPIRED = "expired"  # the row was ours but had expired: deleted, and the caller lost it
    MISSING = "missing"  # no row of ours matched that statement


class Backend:
    """Vendor SQL for the lease engine. Subclasses fill in the statements.

    Every method takes an open cursor on the app's own autocommit connection and runs
    one statement whose own result decides the outcome (no read-then-write).
    """

    vendor = ""
    #: The owner-checked DELETE of a holding's last re-entry (or of an expired one),
    #: returning whether it was still live; the UPDATE undoing one re-entry; the DELETE
    #: of one reaper batch.
    RELEASE_LAST = ""
    RELEASE_REENTRY = ""
    REAP = ""
    #: SQL expression for the database server's current time, as stored in the table
    #: (written for a parametrised query: a literal "%" is "%%").
    NOW = ""
    #: Seconds by which an expiry written for ``ttl`` may fall short of the server's time
    #: when the statement arrived plus ``ttl`` (a coarse clock, a rounded ttl): the local
    #: deadline of a lease is kept this much earlier, so it never outlasts the row's.
    expiry_shortfall = 0.0
    #: Whether row locks (SELECT ... FOR UPDATE) exist on this database.
    has_row_locks = True
    #: Whether blocked acquires can be woken by the server when a lock is released.
    supports_notify = False

    def acquire(
        self,
        cursor: Cursor,
        name: str,
        holder: str,
        ttl: float,
        note: str,
        *,
        yield_to_queue: bool = False,
    ) -> Grant | None:
        """Insert, take over an expired row, or re-enter; ``None`` if another holder has it.

        ``yield_to_queue``: a free lock is not taken while another acquire is queued for it
        (:meth:`enter_queue`), unless to re-enter. Only matters where :attr:`supports_notify`.
        """
        raise NotImplementedError

    def renew(
        self,
        cursor: Cursor,
        name: str,
        holder: str,
        token: int,
        ttl: float,
        wait: float | None = None,
    ) -> datetime | None:
        """Extend a live holding to at least now + ttl; ``None`` if it is not ours or expired.

        ``wait`` bounds, in seconds, how long the statement waits for the row (another
        transaction holding it) or the database; past it the database's error is raised.
        ``None`` keeps the server's own limit.
        """
        raise NotImplementedError

    def grant(self, row: Sequence[Any] | None) -> Grant | None:
        """The Grant in a RETURNING row of (token, count, acquired_at, expires_at)."""
        if row is None:
            return None
        return Grant(row[0], row[1], self.to_datetime(row[2]), self.to_datetime(row[3]))

    def release_last(
        self, cursor: Cursor, name: str, holder: str, token: int, entirely: bool = False
    ) -> Released:
        """Delete our row if it is the last re-entry, if it expired, or if ``entirely``."""
        cursor.execute(self.RELEASE_LAST, [name, holder, token, entirely])
        row = cursor.fetchone()
        if row is None:
            return Released.MISSING
        return Released.DONE if row[0] else Released.EXPIRED

    def release_reentry(self, cursor: Cursor, name: str, holder: str, token: int) -> Released:
        """Undo one re-entry of a live holding that has more than one."""
        cursor.execute(self.RELEASE_REENTRY, [name, holder, token])
        return Released.MISSING if cursor.fetchone() is None else Released.DONE

    def is_locked(self, cursor: Cursor, name: str) -> bool:
        cursor.execute(
            f"SELECT 1 FROM locks_lock WHERE name = %s AND expires_at > {self.NOW}", [name]
        )
        return cursor.fetchone() is not None

    def holds(self, cursor: Cursor, name: str, holder: str, token: int) -> bool:
        """Whether ``holder``'s grant ``token`` of ``name`` is live (a read, no change)."""
        cursor.execute(
            "SELECT 1 FROM locks_lock WHERE name = %s AND holder = %s AND token = %s "
            f"AND expires_at > {self.NOW}",
            [name, holder, token],
        )
        return cursor.fetchone() is not None

    def check_token(self, cursor: Cursor, name: str, token: int) -> bool:
        cursor.execute(
            f"SELECT 1 FROM locks_lock WHERE name = %s AND token = %s AND expires_at > {self.NOW}",
            [name, token],
        )
        return cursor.fetchone() is not None

    def break_lock(self, cursor: Cursor, name: str) -> bool:
        cursor.execute("DELETE FROM locks_lock WHERE name = %s", [name])
        return bool(cursor.rowcount)

    def break_holding(self, cursor: Cursor, name: str, token: int) -> bool:
        """Delete the row of ``name`` only while it is still the holding with ``token``.

        A token names one holding (one holder, its re-entries): a lock re-acquired since
        the caller looked has another token and is left alone.
        """
        cursor.execute("DELETE FROM locks_lock WHERE name = %s AND token = %s", [name, token])
        return bool(cursor.rowcount)

    def break_holder(self, cursor: Cursor, name: str, holder: str) -> bool:
        """Delete the row of ``name`` only while ``holder`` has it, live or expired.

        One statement, so a holding taken over since (another holder) is never touched
        and a free name is never taken, not even for a moment.
        """
        cursor.execute("DELETE FROM locks_lock WHERE name = %s AND holder = %s", [name, holder])
        return bool(cursor.rowcount)

    def remaining(self, cursor: Cursor, name: str) -> float | None:
        """Seconds until the row of ``name`` expires by the database clock; ``None``: no row."""
        cursor.execute(f"SELECT expires_at, {self.NOW} FROM locks_lock WHERE name = %s", [name])
        row = cursor.fetchone()
        if row is None:
            return None
        return (self.to_datetime(row[0]) - self.to_datetime(row[1])).total_seconds()

    def enter_queue(self, cursor: Cursor, name: str, timeout: float) -> bool:
        """Wait up to ``timeout`` s to be the first of this session's blocked acquires of
        ``name``; False if the time ran out. Only where :attr:`supports_notify`."""
        raise NotImplementedError

    def acquire_as_head(
        self,
        cursor: Cursor,
        name: str,
        holder: str,
        ttl: float,
        note: str,
        *,
        queued: bool = True,
    ) -> Grant | float:
        """The head of the queue's attempt: granted, the Grant (and the queue moves on);
        refused, the row is flagged for a release notification and the answer is the
        seconds the holder's lease has left. ``queued=False``: the same for a waiter that
        is not in the queue (an async one), which leaves the queue alone."""
        raise NotImplementedError

    def leave_queue(self, cursor: Cursor, name: str) -> None:
        """Give the head of the queue of ``name`` to the next blocked acquire."""
        raise NotImplementedError

    def listen(self, raw: Any) -> None:
        """Subscribe a raw driver connection to release notifications."""
        raise NotImplementedError

    def notifications(self, raw: Any, timeout: float) -> Iterator[str]:
        """Names released since the last call, waiting at most ``timeout`` seconds."""
        raise NotImplementedError

    def reap(self, cursor: Cursor, batch_size: int) -> tuple[int, float]:
        """Delete at most ``batch_size`` expired rows in one statement.

        Returns how many went and for how many seconds the batch held what a writer
        waits for: here the statement's own time, waits for row locks included.
        """
        began = time.monotonic()
        cursor.execute(self.REAP, [batch_size])
        return int(cursor.rowcount), time.monotonic() - began

    def now(self, cursor: Cursor) -> datetime:
        """The database server's clock."""
        cursor.execute(f"SELECT {self.NOW}", [])
        return self.to_datetime(cursor.fetchone()[0])

    def to_datetime(self, value: Any) -> datetime:
        """Convert a timestamp read by raw SQL into an aware UTC datetime."""
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        assert isinstance(value, datetime)
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)

    def is_transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` left nothing written, so the same statement may simply run again."""
        return False

    def check_caller(self, alias: str) -> None:
        """Raise if a lock statement on ``alias`` would deadlock with the caller's transaction."""

    def session_settings(self, settings_dict: dict[str, Any]) -> dict[str, Any]:
        """The alias's settings less what Django shares between the alias's connections.

        Every connection of the app's own (lock statements, release notifications) is a
        session apart from the ORM's, so it must not draw from, or set up, anything the
        ORM's connections share.
        """
        return settings_dict

    def own_settings(self, settings_dict: dict[str, Any]) -> dict[str, Any]:
        """The settings of the app's own connections, made from the alias's settings."""
        return settings_dict

    def on_connect(self, connection: BaseDatabaseWrapper) -> None:
        """Prepare a freshly opened connection of the app's own."""

    def cancel(self, raw: Any) -> None:
        """Cancel the statement in flight on driver connection ``raw``, if the driver can.

        For a call interrupted while its statement runs on (closing the connection alone
        would leave the server to notice the missing client only when it answers).
        """

    def driver_cursor(self, cursor: Any) -> Any:
        """The cursor under a Django cursor that lock statements can use directly.

        It must take the same SQL and parameters; driver errors are translated by the
        caller (see ``locks.connection.DirectCursor``).
        """
        return cursor.cursor

    def name_db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        """What makes names and holders exact (case- and space-sensitive), on top of
        :meth:`text_db_parameters`."""
        return {}

    def text_db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        """Column type that holds any Unicode text (notes), whatever the database default."""
        return {}

    def create_extras(self, schema_editor: BaseDatabaseSchemaEditor) -> None:
        """Create what the models cannot say: the token sequence, triggers."""

    def drop_extras(self, schema_editor: BaseDatabaseSchemaEditor) -> None:
        """Undo :meth:`create_extras`."""

    # --- row locks (``SELECT ... FOR UPDATE``; see locks/rowlocks.py) ----------------------

    #: Whether the row lock is taken by one statement inside the caller's transaction that
    #: also creates a missing row (:meth:`take_row_lock`), rather than by a locking read
    #: (:meth:`select_row_lock`) with the missing row created on the app's own connection.
    creates_row_in_transaction = False

    def select_row_lock(
        self, cursor: Cursor, name: str, *, nowait: bool, skip_locked: bool
    ) -> bool:
        """Lock the row of ``name`` for the current transaction; False if none was locked.

        False means the row does not exist, or (``skip_locked``) another transaction holds it.
        """
        suffix = " NOWAIT" if nowait else " SKIP LOCKED" if skip_locked else ""
        cursor.execute(f"SELECT name FROM locks_rowlock WHERE name = %s FOR UPDATE{suffix}", [name])
        return cursor.fetchone() is not None

    def sees_row_lock(self, cursor: Cursor, name: str) -> bool:
        """Whether the current transaction sees the row of ``name`` (a read, no lock)."""
        cursor.execute("SELECT 1 FROM locks_rowlock WHERE name = %s", [name])
        return cursor.fetchone() is not None

    def take_row_lock(self, cursor: Cursor, name: str, *, nowait: bool) -> None:
        """Lock the row of ``name`` for the current transaction, creating it if missing, in
        one statement. Only where :attr:`creates_row_in_transaction`.

        With ``nowait``, a row that another transaction holds or is inserting fails at once
        (a lock-busy error).
        """
        raise NotImplementedError

    def insert_row_lock(self, cursor: Cursor, name: str) -> bool:
        """Create the row of ``name`` unless it exists; True if this statement created it.

        Safe when many sessions create the same row at once.
        """
        cursor.execute(
            "INSERT INTO locks_rowlock (name) VALUES (%s) ON CONFLICT (name) DO NOTHING "
            "RETURNING 1",
            [name],
        )
        return cursor.fetchone() is not None

    def take_write_lock(self, cursor: Cursor, table: str, column: str) -> None:
        """Take the database's write lock for the current transaction, writing nothing.

        Only for databases without row locks, where it stands in for them. ``table`` and
        ``column`` (quoted) name a table of that database and one of its columns.
        """

    def bounded_wait(
        self, connection: BaseDatabaseWrapper, timeout: float | None
    ) -> AbstractContextManager[None]:
        """Make lock waits of statements on ``connection`` in this scope end after ``timeout`` s.

        Leaves the session's settings as they were. If the scope raises, the caller must
        roll back the transaction or savepoint it runs in (a failed lock wait may have
        aborted it). ``None`` keeps the server's own limit.
        """
        return nullcontext()

    def is_lock_busy(self, exc: BaseException) -> bool:
        """Whether ``exc`` says a lock wait gave up: NOWAIT, a lock timeout, a busy database."""
        return False

    def is_deadlock(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a deadlock, which rolled back the whole transaction."""
        return False

    def lock_wait_settings(self, connection: BaseDatabaseWrapper) -> dict[str, str]:
        """The session settings :meth:`bounded_wait` may touch, as they are now."""
        return {}

    def live_holding(self, cursor: Cursor, name: str) -> tuple[str, str] | None:
        """Holder and note of ``name`` if its lease is live by the database clock."""
        cursor.execute(
            f"SELECT holder, note FROM locks_lock WHERE name = %s AND expires_at > {self.NOW}",
            [name],
        )
        row = cursor.fetchone()
        return None if row is None else (str(row[0]), str(row[1]))

    #: Whether a writer waiting for the database polls (SQLite's busy handler) instead of
    #: queueing for a lock: a bulk job must then pause between statements to let it in.
    writers_poll = False
