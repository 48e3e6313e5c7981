"""SQLite 3.35+: one ``INSERT ... ON CONFLICT ... RETURNING`` per acquire.

SQLite allows one writer per database file, so each statement runs alone; a busy file
is waited for (the connection's busy timeout) and retried. Its clock ticks in
milliseconds; times are stored as UTC text in Django's layout with six digits, so they
compare correctly as text. Tokens come from a one-row high-water table that a trigger
raises whenever a token is written, so a token is never handed out twice, also after the
row is deleted. There are no row locks here: ``row_lock`` and ``lock_rows`` take the
database's single write lock for the caller's transaction instead, and bound their wait
with ``PRAGMA busy_timeout``, put back as it was right after.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext, suppress
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections

from ..exceptions import LockError
from .base import Backend, Cursor, Grant, wait_ms

SYNCHRONOUS_FULL = 2  # PRAGMA synchronous: 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA
#: Seconds between a reaper batch's tries for the file's write lock, and for how long it
#: tries so before it waits in SQLite's busy handler.
REAP_POLL = 0.001
REAP_POLLING = 0.1

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor

# "%%" because Django turns "%s" placeholders into "?" with the % operator.
NOW = "(strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now') || '000')"
LATER = "(strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %(ttl)s) || '000')"
EXPIRED = f"expires_at <= {NOW}"

ACQUIRE = f"""
INSERT INTO locks_lock (name, holder, count, token, acquired_at, expires_at, note)
VALUES (%(name)s, %(holder)s, 1, (SELECT value + 1 FROM locks_sequence), {NOW}, {LATER}, %(note)s)
ON CONFLICT (name) DO UPDATE SET
    count = CASE WHEN {EXPIRED} THEN 1 ELSE count + 1 END,
    token = CASE WHEN {EXPIRED} THEN excluded.token ELSE token END,
    acquired_at = CASE WHEN {EXPIRED} THEN excluded.acquired_at ELSE acquired_at END,
    note = CASE WHEN {EXPIRED} THEN excluded.note ELSE note END,
    holder = excluded.holder,
    expires_at = max(expires_at, excluded.expires_at)
WHERE {EXPIRED} OR holder = excluded.holder
RETURNING token, count, acquired_at, expires_at
"""

RENEW = f"""
UPDATE locks_lock SET expires_at = max(expires_at, {LATER})
WHERE name = %(name)s AND holder = %(holder)s AND token = %(token)s AND expires_at > {NOW}
RETURNING expires_at
"""

RELEASE_LAST = f"""
DELETE FROM locks_lock
WHERE name = %s AND holder = %s AND token = %s AND (count = 1 OR {EXPIRED} OR %s)
RETURNING expires_at > {NOW}
"""

RELEASE_REENTRY = f"""
UPDATE locks_lock SET count = count - 1
WHERE name = %s AND holder = %s AND token = %s AND count > 1 AND expires_at > {NOW}
RETURNING count
"""

REAP = f"""
DELETE FROM locks_lock WHERE name IN (
    SELECT name FROM locks_lock WHERE {EXPIRED} ORDER BY expires_at LIMIT %s)
AND {EXPIRED}
"""

EXTRAS = [
    "CREATE TABLE IF NOT EXISTS locks_sequence ("
    " id INTEGER NOT NULL PRIMARY KEY CHECK (id = 1), value INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO locks_sequence (id, value) VALUES (1, 0)",
    "CREATE TRIGGER IF NOT EXISTS locks_token_on_insert AFTER INSERT ON locks_lock BEGIN"
    " UPDATE locks_sequence SET value = NEW.token WHERE value < NEW.token; END",
    "CREATE TRIGGER IF NOT EXISTS locks_token_on_update AFTER UPDATE OF token ON locks_lock"
    " BEGIN UPDATE locks_sequence SET value = NEW.token WHERE value < NEW.token; END",
]

# Any write statement takes the file's write lock for the transaction, even one that
# changes no row: on the queryset's own table, which is in the database it reads.
TAKE_WRITE_LOCK = "UPDATE {table} SET {column} = {column} WHERE 0"


def _modifier(ttl: float) -> str:
    return f"+{ttl:.6f} seconds"


def _read_busy_timeout(cursor: Cursor) -> int:
    """The connection's busy timeout, in milliseconds."""
    cursor.execute("PRAGMA busy_timeout")
    return int(cursor.fetchone()[0])


def _set_busy_timeout(cursor: Cursor, ms: int) -> None:
    cursor.execute(f"PRAGMA busy_timeout = {int(ms)}")


@contextmanager
def _busy_timeout_of(cursor: Cursor, ms: int) -> Iterator[int]:
    """The connection's busy timeout set to ``ms`` for the block, which gets the old one.

    A connection setting, not a transactional one: put back in every case, for the
    statements that follow.
    """
    old = _read_busy_timeout(cursor)
    _set_busy_timeout(cursor, ms)
    try:
        yield old
    finally:
        _set_busy_timeout(cursor, old)


def _same_file(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


class SQLiteBackend(Backend):
    vendor = "sqlite"
    NOW = NOW
    RELEASE_LAST = RELEASE_LAST
    RELEASE_REENTRY = RELEASE_REENTRY
    REAP = REAP
    has_row_locks = False
    # 'now' is truncated to the millisecond (up to 1 ms early), and the ttl modifier is
    # rounded to one (up to 0.5 ms short).
    expiry_shortfall = 0.0015

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
        params: dict[str, Any] = {
            "name": name,
            "holder": holder,
            "ttl": _modifier(ttl),
            "note": note,
        }
        cursor.execute(ACQUIRE, params)
        return self.grant(cursor.fetchone())

    def renew(
        self,
        cursor: Cursor,
        name: str,
        holder: str,
        token: int,
        ttl: float,
        wait: float | None = None,
    ) -> datetime | None:
        params: dict[str, Any] = {
            "name": name,
            "holder": holder,
            "token": token,
            "ttl": _modifier(ttl),
        }
        with nullcontext() if wait is None else _busy_timeout_of(cursor, wait_ms(wait)):
            cursor.execute(RENEW, params)
            row = cursor.fetchone()
        return None if row is None else self.to_datetime(row[0])

    def reap(self, cursor: Cursor, batch_size: int) -> tuple[int, float]:
        # SQLite's busy handler sleeps longer at each try, up to 100 ms. Beside a steady
        # stream of acquires, whose short writes leave the file free for moments, a batch
        # so slept through most of them: 200,000 rows took 70 s beside the benchmark's (a),
        # each batch waiting up to seconds; tried every millisecond, 4.3 s. A file still
        # busy after REAP_POLLING is in a long transaction: wait for it as SQLite does, up
        # to the connection's busy timeout. Only the time held, from the write lock to the
        # commit, is the batch's, and what the reaper pauses for.
        waiting_since = time.monotonic()
        with _busy_timeout_of(cursor, 0) as timeout_ms:
            polling_until = waiting_since + min(timeout_ms / 1000, REAP_POLLING)
            while time.monotonic() < polling_until:
                try:
                    cursor.execute("BEGIN IMMEDIATE")
                    break
                except DatabaseError as exc:
                    if not self.is_transient(exc):
                        raise
                time.sleep(REAP_POLL)
            else:
                waited_ms = round((time.monotonic() - waiting_since) * 1000)
                _set_busy_timeout(cursor, max(timeout_ms - waited_ms, 0))
                cursor.execute("BEGIN IMMEDIATE")
        began = time.monotonic()
        try:
            cursor.execute(REAP, [batch_size])
            count = int(cursor.rowcount)
            cursor.execute("COMMIT")
        except DatabaseError:
            # Some errors end the transaction by themselves; others leave it open.
            with suppress(DatabaseError):
                cursor.execute("ROLLBACK")
            raise
        return count, time.monotonic() - began

    def is_transient(self, exc: BaseException) -> bool:
        message = str(exc)
        return "database is locked" in message or "database table is locked" in message

    def check_caller(self, alias: str) -> None:
        target = str(connections.settings[alias]["NAME"])
        for connection in connections.all(initialized_only=True):
            raw = connection.connection
            if (
                connection.vendor == "sqlite"
                and raw is not None
                and raw.in_transaction
                and _same_file(str(connection.settings_dict["NAME"]), target)
            ):
                raise LockError(
                    f"a lease call on SQLite database {alias!r} cannot run while this thread's "
                    f"transaction on the same file (connection {connection.alias!r}) is open: "
                    "SQLite allows one writer per file, so it would wait for itself. Keep "
                    "lock calls outside transaction.atomic() (and ATOMIC_REQUESTS), or point "
                    'LOCKS = {"DATABASE": "locks"} at an alias with its own SQLite file.'
                )

    def create_extras(self, schema_editor: BaseDatabaseSchemaEditor) -> None:
        for statement in EXTRAS:
            schema_editor.execute(statement)

    def drop_extras(self, schema_editor: BaseDatabaseSchemaEditor) -> None:
        schema_editor.execute("DROP TRIGGER IF EXISTS locks_token_on_update")
        schema_editor.execute("DROP TRIGGER IF EXISTS locks_token_on_insert")
        schema_editor.execute("DROP TABLE IF EXISTS locks_sequence")

    def on_connect(self, connection: BaseDatabaseWrapper) -> None:
        # Below FULL (synchronous=NORMAL, a common companion of WAL), a commit is not yet
        # on disk when it returns: an OS crash or power loss can take back an acknowledged
        # grant and its token, and the next holder would get the same token again. The
        # setting is per connection: only the app's own commit this way.
        with connection.cursor() as cursor:
            cursor.execute("PRAGMA synchronous")
            if int(cursor.fetchone()[0]) < SYNCHRONOUS_FULL:
                cursor.execute(f"PRAGMA synchronous = {SYNCHRONOUS_FULL}")

    def take_write_lock(self, cursor: Cursor, table: str, column: str) -> None:
        cursor.execute(TAKE_WRITE_LOCK.format(table=table, column=column))

    @contextmanager
    def _busy_timeout(self, connection: BaseDatabaseWrapper, timeout: float) -> Iterator[None]:
        # Not one cursor for the whole block: the caller's work may close the connection,
        # and the setting is then put back on the one that replaces it.
        with connection.cursor() as cursor:
            old = _read_busy_timeout(cursor)
            _set_busy_timeout(cursor, wait_ms(timeout))
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                _set_busy_timeout(cursor, old)

    def bounded_wait(
        self, connection: BaseDatabaseWrapper, timeout: float | None
    ) -> AbstractContextManager[None]:
        return nullcontext() if timeout is None else self._busy_timeout(connection, timeout)

    def is_lock_busy(self, exc: BaseException) -> bool:
        return self.is_transient(exc)

    def lock_wait_settings(self, connection: BaseDatabaseWrapper) -> dict[str, str]:
        with connection.cursor() as cursor:
            return {"busy_timeout": str(_read_busy_timeout(cursor))}

    # The busy handler retries with growing sleeps: a waiting writer does not queue.
    writers_poll = True
