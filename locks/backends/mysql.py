"""MariaDB 10.6+: one ``INSERT ... ON DUPLICATE KEY UPDATE ... RETURNING`` per acquire.

MariaDB evaluates ``ON DUPLICATE KEY UPDATE`` assignments left to right against values
already updated, so the columns the conditions read (``expires_at``, ``holder``) are
assigned last, ``expires_at`` at the very end. ``RETURNING`` shows the row as the
statement left it: we won exactly when it names our holder. Tokens come from a
``SEQUENCE`` drawn while holding a row lock on one of 1024 stripes of the name space, so
a token drawn before another holder's whole hold is never granted after it.
``UTC_TIMESTAMP(6)`` is fixed for the length of a statement, so every comparison in one
statement sees the same instant. Deadlocks (1213) and lock wait timeouts (1205) roll the
statement back and are retried. MySQL (no SEQUENCE, no RETURNING) is not supported.

mysqlclient cannot prepare statements, so a session of ours that has sent a few acquires
prepares the acquire and the last release itself (``PREPARE ... FROM``) and from then on
runs them as ``EXECUTE ... USING`` the parameters: the server parses the long upsert once
per session instead of at every acquire. Not when the session opens: a session that lives
for one request and one lock would pay two round trips to save a few microseconds. A
session that could not prepare them, or lost them, sends their text.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError

from ..conf import conf
from .base import Backend, Cursor, Grant, Released

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor

logger = logging.getLogger("locks")

STRIPES = 1024
NOW = "UTC_TIMESTAMP(6)"
EXPIRED = f"expires_at <= {NOW}"

# The stripe's row lock is held to the end of the statement, so the token is drawn and
# granted (or dropped) before any other acquire of a name on that stripe draws one.
TOKEN_DRAW = f"""(SELECT NEXTVAL(locks_token_seq) FROM locks_stripe
      WHERE id = MOD(CRC32(%s), {STRIPES}) FOR UPDATE)"""

ACQUIRE = f"""
INSERT INTO locks_lock (name, holder, count, token, acquired_at, expires_at, note)
VALUES (
    %s, %s, 1,
    {TOKEN_DRAW},
    {NOW}, {NOW} + INTERVAL %s MICROSECOND, %s)
ON DUPLICATE KEY UPDATE
    count = IF({EXPIRED}, 1, IF(holder = VALUES(holder), count + 1, count)),
    token = IF({EXPIRED}, VALUES(token), token),
    acquired_at = IF({EXPIRED}, VALUES(acquired_at), acquired_at),
    note = IF({EXPIRED}, VALUES(note), note),
    holder = IF({EXPIRED}, VALUES(holder), holder),
    expires_at = IF(holder = VALUES(holder), GREATEST(expires_at, VALUES(expires_at)), expires_at)
RETURNING holder, token, count, acquired_at, expires_at
"""

RENEW = f"""
UPDATE locks_lock SET expires_at = GREATEST(expires_at, {NOW} + INTERVAL %s MICROSECOND)
WHERE name = %s AND holder = %s AND token = %s AND expires_at > {NOW}
"""

READ_EXPIRY = "SELECT expires_at FROM locks_lock WHERE name = %s AND holder = %s AND token = %s"

RELEASE_LAST = f"""
DELETE FROM locks_lock
WHERE name = %s AND holder = %s AND token = %s AND (count = 1 OR {EXPIRED} OR %s)
RETURNING expires_at > {NOW}
"""

RELEASE_REENTRY = f"""
UPDATE locks_lock SET count = count - 1
WHERE name = %s AND holder = %s AND token = %s AND count > 1 AND expires_at > {NOW}
"""

REAP = f"DELETE FROM locks_lock WHERE {EXPIRED} ORDER BY expires_at LIMIT %s"

# The uncontended pair, prepared per session (see _prepare): the statement's name, its
# text, and the EXECUTE that runs it with the same parameters as the text takes.
PREPARED = {"locks_lock_acquire": ACQUIRE, "locks_lock_release_last": RELEASE_LAST}
EXECUTE_ACQUIRE = "EXECUTE locks_lock_acquire USING %s, %s, %s, %s, %s"
EXECUTE_RELEASE_LAST = "EXECUTE locks_lock_release_last USING %s, %s, %s, %s"
#: Kept on a mysqlclient connection, so it lives as long as the session (a reconnect is a
#: new connection object without it): the acquires sent as text so far while the session
#: may prepare, True once it has prepared the pair; absent or None where it may not.
PREPARED_FLAG = "locks_prepared"
#: The acquire that prepares the pair (as psycopg prepares a query on its fifth run): the
#: two PREPAREs cost about two round trips, which the EXECUTEs save back in a few dozen
#: pairs, and most sessions that lock this often lock many more times.
PREPARE_AT = 5
#: ER_UNKNOWN_STMT_HANDLER: EXECUTE of a statement the server session does not have.
UNKNOWN_STATEMENT = 1243

TRANSIENT_CODES = frozenset({1205, 1213})  # lock wait timeout, deadlock

# The row lock, in the caller's transaction: a new row is locked by its insert, an existing
# one by the duplicate key, exclusively and only that record (the name is the primary key).
# Not a SELECT ... FOR UPDATE first: under REPEATABLE READ, one that finds no row locks the
# gap around the name until the transaction ends, and every other new name there waits.
# (One that waited for a new row whose creator rolled back is left holding that gap, as
# InnoDB turns the waiting lock into a gap lock: documented, rare.)
TAKE_ROW_LOCK = "INSERT INTO locks_rowlock (name) VALUES (%s) ON DUPLICATE KEY UPDATE name = name"
# The insert waits for a conflicting row's lock; 0 makes that wait fail at once (1205).
NO_LOCK_WAIT = "SET STATEMENT innodb_lock_wait_timeout = 0 FOR "
# Lock wait timeout (also what NOWAIT raises on MariaDB), max_statement_time, MySQL's NOWAIT.
LOCK_BUSY_CODES = frozenset({1205, 1969, 3572})
DEADLOCK = 1213


def _micros(seconds: float) -> int:
    return round(seconds * 1_000_000)


def _time_limit(seconds: float) -> str:
    """A ``SET STATEMENT`` prefix that ends the statement after ``seconds`` (at least 1 ms).

    The lock wait limit is raised past it, so that ``max_statement_time`` decides (a lock
    wait timeout would be retried as transient).
    """
    left = max(seconds, 0.001)
    return (
        f"SET STATEMENT max_statement_time = {left:.6f}, "
        f"innodb_lock_wait_timeout = {math.ceil(left) + 1} FOR "
    )


def _error_code(exc: BaseException) -> object:
    """The server's error number of a driver error (its first argument), or None."""
    args: tuple[Any, ...] = exc.args
    return args[0] if args else None


def _session(cursor: Cursor) -> Any:
    """mysqlclient's connection under ``cursor``: Django's cursor gives it by delegation,
    DirectCursor by a property."""
    return getattr(cursor, "connection", None)


def _prepared(cursor: Cursor) -> bool:
    """Whether the session under ``cursor`` prepared the pair."""
    return getattr(_session(cursor), PREPARED_FLAG, None) is True


def _prepare(cursor: Cursor) -> bool:
    """Whether the pair is prepared on the session under ``cursor``, preparing it on the
    session's :data:`PREPARE_AT`-th acquire, where it may prepare."""
    session = _session(cursor)
    sent = getattr(session, PREPARED_FLAG, None)
    if sent is None or sent is True:
        return sent is True
    if sent + 1 < PREPARE_AT:
        setattr(session, PREPARED_FLAG, sent + 1)
        return False
    try:
        for name, sql in PREPARED.items():
            # PREPARE takes "?" for parameters; the text has no other "%s" nor "?".
            cursor.execute(f"PREPARE {name} FROM %s", [sql.replace("%s", "?")])
    except DatabaseError:
        # The server's max_prepared_stmt_count reached, say: this session keeps sending
        # the text, which works as well, only slower. (A session that died fails again
        # on the acquire's own statement, which reports it.)
        logger.debug("locks: lock statements not prepared on this session", exc_info=True)
        setattr(session, PREPARED_FLAG, None)
        return False
    setattr(session, PREPARED_FLAG, True)
    return True


def _send(cursor: Cursor, prepared: bool, execute: str, sql: str, params: list[Any]) -> None:
    """Run ``sql``; where the session ``prepared`` it, as ``execute`` (its EXECUTE), unless
    the session lost the prepared statement.

    The driver's connection outlives its server session's prepared statements when
    something resets the session under it (COM_CHANGE_USER, as a pooler or proxy does) or
    moves it to another server session: the session then sends the text for its lifetime
    rather than fail every acquire. The EXECUTE ran nothing, so the text runs once.
    """
    if not prepared:
        cursor.execute(sql, params)
        return
    try:
        cursor.execute(execute, params)
    except DatabaseError as exc:
        if _error_code(exc) != UNKNOWN_STATEMENT:
            raise
        logger.warning(
            "locks: a session lost its prepared lock statements (%s); it sends their text "
            "from now on. Behind a proxy or pooler, set LOCKS['PREPARED_STATEMENTS'] = False.",
            exc,
        )
        setattr(_session(cursor), PREPARED_FLAG, None)
        cursor.execute(sql, params)


class MySQLBackend(Backend):
    vendor = "mysql"
    NOW = NOW
    RELEASE_LAST = RELEASE_LAST
    RELEASE_REENTRY = RELEASE_REENTRY
    REAP = REAP

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
        params = [name, holder, name, _micros(ttl), note]
        _send(cursor, _prepare(cursor), EXECUTE_ACQUIRE, ACQUIRE, params)
        row = cursor.fetchone()
        # RETURNING shows the row as the statement left it: ours only if we won.
        return None if row is None or row[0] != holder else self.grant(row[1:])

    def renew(
        self,
        cursor: Cursor,
        name: str,
        holder: str,
        token: int,
        ttl: float,
        wait: float | None = None,
    ) -> datetime | None:
        # Our sessions count matched rows (CLIENT.FOUND_ROWS, see own_settings): 1 = still ours.
        bound = "" if wait is None else _time_limit(wait)
        cursor.execute(bound + RENEW, [_micros(ttl), name, holder, token])
        if not cursor.rowcount:
            return None
        cursor.execute(READ_EXPIRY, [name, holder, token])
        row = cursor.fetchone()
        return None if row is None else self.to_datetime(row[0])

    def own_settings(self, settings_dict: dict[str, Any]) -> dict[str, Any]:
        """Our sessions count matched rows (``CLIENT.FOUND_ROWS``), whatever ``OPTIONS`` say.

        renew() reads "still ours" from the row count, and a renew that leaves the expiry
        as it is (a shorter TTL) changes no row. Django sets FOUND_ROWS by default, but an
        ``OPTIONS["client_flag"]`` of the alias's replaces the default: add it back.
        """
        from MySQLdb.constants import CLIENT

        options = dict(settings_dict.get("OPTIONS") or {})
        options["client_flag"] = int(options.get("client_flag", 0)) | CLIENT.FOUND_ROWS
        return {**settings_dict, "OPTIONS": options}

    def release_last(
        self, cursor: Cursor, name: str, holder: str, token: int, entirely: bool = False
    ) -> Released:
        params = [name, holder, token, entirely]
        _send(cursor, _prepared(cursor), EXECUTE_RELEASE_LAST, RELEASE_LAST, params)
        row = cursor.fetchone()
        if row is None:
            return Released.MISSING
        return Released.DONE if row[0] else Released.EXPIRED

    def on_connect(self, connection: BaseDatabaseWrapper) -> None:
        """Let a new session of ours prepare the uncontended pair, unless told not to.

        Behind a pooler that hands one client's statements to several server sessions, a
        statement prepared on one would be unknown on the next (``PREPARED_STATEMENTS``).
        """
        if conf.prepared_statements(connection.settings_dict):
            setattr(connection.connection, PREPARED_FLAG, 0)

    def release_reentry(self, cursor: Cursor, name: str, holder: str, token: int) -> Released:
        cursor.execute(RELEASE_REENTRY, [name, holder, token])
        return Released.DONE if cursor.rowcount else Released.MISSING

    def driver_cursor(self, cursor: Any) -> Any:
        # Under Django's MySQL cursor, which only re-labels a few constraint errors that
        # lock statements cannot raise.
        return cursor.cursor.cursor

    def is_transient(self, exc: BaseException) -> bool:
        return _error_code(exc) in TRANSIENT_CODES

    def text_db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        return {"type": "varchar(255) CHARACTER SET utf8mb4"}

    def name_db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        # On top of the text's utf8mb4 type. Binary and NO PAD: "Lock" != "lock" and
        # "a" != "a ", as on the other databases.
        return {"collation": "utf8mb4_nopad_bin"}

    def create_extras(self, schema_editor: BaseDatabaseSchemaEditor) -> None:
        schema_editor.execute("CREATE SEQUENCE IF NOT EXISTS locks_token_seq")
        schema_editor.execute(
            "CREATE TABLE IF NOT EXISTS locks_stripe (id INT NOT NULL PRIMARY KEY) ENGINE=InnoDB"
        )
        schema_editor.execute(
            f"INSERT IGNORE INTO locks_stripe (id) SELECT seq FROM seq_0_to_{STRIPES - 1}"
        )

    def drop_extras(self, schema_editor: BaseDatabaseSchemaEditor) -> None:
        schema_editor.execute("DROP TABLE IF EXISTS locks_stripe")
        schema_editor.execute("DROP SEQUENCE IF EXISTS locks_token_seq")

    creates_row_in_transaction = True

    def take_row_lock(self, cursor: Cursor, name: str, *, nowait: bool) -> None:
        cursor.execute((NO_LOCK_WAIT if nowait else "") + TAKE_ROW_LOCK, [name])

    @contextmanager
    def _statement_deadline(
        self, connection: BaseDatabaseWrapper, timeout: float
    ) -> Iterator[None]:
        deadline = time.monotonic() + timeout

        def bound(
            execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
        ) -> Any:
            # Every statement in the scope gets what is left of one deadline.
            prefix = _time_limit(deadline - time.monotonic())
            return execute(prefix + sql, params, many, context)

        with connection.execute_wrapper(bound):
            yield

    def bounded_wait(
        self, connection: BaseDatabaseWrapper, timeout: float | None
    ) -> AbstractContextManager[None]:
        return nullcontext() if timeout is None else self._statement_deadline(connection, timeout)

    def is_lock_busy(self, exc: BaseException) -> bool:
        return _error_code(exc) in LOCK_BUSY_CODES

    def is_deadlock(self, exc: BaseException) -> bool:
        return _error_code(exc) == DEADLOCK

    def lock_wait_settings(self, connection: BaseDatabaseWrapper) -> dict[str, str]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT @@session.innodb_lock_wait_timeout, @@session.max_statement_time"
            )
            wait, statement = cursor.fetchone()
        return {"innodb_lock_wait_timeout": str(wait), "max_statement_time": str(statement)}
