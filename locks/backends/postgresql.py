"""PostgreSQL 13+: one statement per operation, decided by ``RETURNING``.

Expiry is compared with ``statement_timestamp()`` (the server's clock when the statement
arrived; ``now()`` would be the start of a transaction). Tokens come from a sequence,
drawn under a transaction-scoped advisory lock on the name so that the draw and the grant
are ordered together: a token drawn before another holder's whole hold cannot be granted
after it. ``ON CONFLICT DO UPDATE`` takes a row over only when its ``WHERE`` says so
(expired, or our own holder), so a lock granted a moment ago is never stolen.
Row locks bound their wait with ``lock_timeout``, set for the transaction only
(``SET LOCAL``) and put back as it was right after the lock is taken.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError

from .base import Backend, Cursor, Grant, wait_ms
from .libpq import PreparedCursor, plans

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor

#: First key of the two-key advisory lock namespace, so user advisory locks do not collide.
ADVISORY_NAMESPACE = 0x6C6F636B  # "lock"

ACQUIRE = f"""
INSERT INTO locks_lock AS l (name, holder, count, token, acquired_at, expires_at, note)
VALUES (
    CAST(%(name)s AS text), %(holder)s, 1,
    (SELECT nextval('locks_token_seq')
       FROM pg_advisory_xact_lock({ADVISORY_NAMESPACE}, hashtext(CAST(%(name)s AS text)))),
    statement_timestamp(), statement_timestamp() + %(ttl)s, %(note)s)
ON CONFLICT (name) DO UPDATE SET
    count = CASE WHEN l.expires_at <= statement_timestamp() THEN 1 ELSE l.count + 1 END,
    token = CASE WHEN l.expires_at <= statement_timestamp()
                 THEN EXCLUDED.token ELSE l.token END,
    acquired_at = CASE WHEN l.expires_at <= statement_timestamp()
                       THEN EXCLUDED.acquired_at ELSE l.acquired_at END,
    note = CASE WHEN l.expires_at <= statement_timestamp() THEN EXCLUDED.note ELSE l.note END,
    waiting = l.waiting AND l.expires_at > statement_timestamp(),
    holder = EXCLUDED.holder,
    expires_at = GREATEST(l.expires_at, EXCLUDED.expires_at)
WHERE l.expires_at <= statement_timestamp() OR l.holder = EXCLUDED.holder
RETURNING token, count, acquired_at, expires_at
"""

# Blocked acquires of one name queue for a session advisory lock on it (the "queue"),
# in the server's lock manager, first come first served: only the one at the head
# flags the row and waits for the release, so a release wakes one process, not all.
# The head leaves the queue in the statement that grants it the lease. Its key is a 64-bit
# hash of the name (one bigint key, seeded apart from an unseeded hashtextextended()): with
# the 32-bit hashtext() of the namespaced pair, two names whose hashes collided shared a
# queue, and a blocked acquire of a free lock waited behind the other name's waiters.
QUEUE_SEED = ADVISORY_NAMESPACE + 1


def _queue_key(name: str) -> str:
    """The SQL of the queue's advisory lock key for the name parameter ``name``."""
    return f"hashtextextended(CAST({name} AS text), {QUEUE_SEED})"


def _is_queue_lock(key: str) -> str:
    """The SQL condition that a ``pg_locks`` row is the advisory lock on the bigint ``key``
    (its high half in ``classid``, its low half in ``objid``)."""
    return (
        f"locktype = 'advisory' AND objsubid = 1"
        f" AND classid = CAST({key} >> 32 & 4294967295 AS oid)"
        f" AND objid = CAST({key} & 4294967295 AS oid)"
    )


# A blocked acquire's first try yields to the queue: it takes a free lock only when no
# other acquire is queued for it (the transaction-scoped try fails while a queued session
# holds the queue's lock), except to re-enter its own live holding. Its later tries, and
# try_acquire, take a free lock whoever waits (as tryLock does in a fair Java lock).
ACQUIRE_YIELDING = (
    ACQUIRE.replace("\nVALUES (", "\nSELECT ")
    .replace("%(holder)s, 1,", "CAST(%(holder)s AS text), 1,")
    .replace(
        "+ %(ttl)s, %(note)s)\nON CONFLICT",
        f"""+ %(ttl)s, %(note)s
WHERE pg_try_advisory_xact_lock({_queue_key("%(name)s")})
   OR EXISTS (SELECT 1 FROM locks_lock WHERE name = CAST(%(name)s AS text)
              AND holder = CAST(%(holder)s AS text) AND expires_at > statement_timestamp())
ON CONFLICT""",
    )
)
# The head's attempt also flags a row it cannot take, in the same statement: its columns
# change only when it is expired or the head's own. Granted, it lets the next waiter
# to the head; that one's attempt then waits for this statement's commit (the conflict).
EXPIRED = "l.expires_at <= statement_timestamp()"
OURS = "l.holder = EXCLUDED.holder"
# A refused attempt wrote only the flag, which nobody needs after a crash (every waiter
# starts over then): its commit does not wait for the WAL to reach the disk, and so does
# not queue the holder's commits behind one more flush. A grant commits as every lock
# statement does (see SYNCHRONOUS_COMMIT).
ASYNC_IF_REFUSED = (
    "CASE WHEN holder <> %(holder)s THEN set_config('synchronous_commit', 'off', true) END"
)
_HEAD_ATTEMPT = (
    ACQUIRE[: ACQUIRE.index("ON CONFLICT")]
    + f"""ON CONFLICT (name) DO UPDATE SET
    count = CASE WHEN {EXPIRED} THEN 1 WHEN {OURS} THEN l.count + 1 ELSE l.count END,
    token = CASE WHEN {EXPIRED} THEN EXCLUDED.token ELSE l.token END,
    acquired_at = CASE WHEN {EXPIRED} THEN EXCLUDED.acquired_at ELSE l.acquired_at END,
    note = CASE WHEN {EXPIRED} THEN EXCLUDED.note ELSE l.note END,
    waiting = CASE WHEN {EXPIRED} THEN false WHEN {OURS} THEN l.waiting ELSE true END,
    holder = CASE WHEN {EXPIRED} OR {OURS} THEN EXCLUDED.holder ELSE l.holder END,
    expires_at = CASE WHEN {EXPIRED} OR {OURS}
                      THEN GREATEST(l.expires_at, EXCLUDED.expires_at) ELSE l.expires_at END
RETURNING token, count, acquired_at, expires_at, holder = %(holder)s,
    extract(epoch FROM expires_at - statement_timestamp()),
    {ASYNC_IF_REFUSED}"""
)
# An async waiter's attempt: it waits on the event loop, not in the queue (a session lock
# would stay with whichever pool thread's connection took it), so it has no queue to leave.
ACQUIRE_FLAGGING = _HEAD_ATTEMPT + "\n"
# The head of the queue's attempt: granted, it also leaves the queue.
ACQUIRE_AS_HEAD = (
    _HEAD_ATTEMPT
    + f""",
    CASE WHEN holder = %(holder)s
         THEN pg_advisory_unlock({_queue_key("%(name)s")}) END
"""
)
# The MATERIALIZED CTE runs first, so lock_timeout (this statement's only: is_local)
# bounds the wait that follows.
ENTER_QUEUE = f"""
WITH bound AS MATERIALIZED (SELECT set_config('lock_timeout', %s, true))
SELECT pg_advisory_lock({_queue_key("%s")}) FROM bound
"""
LEAVE_QUEUE = f"SELECT pg_advisory_unlock({_queue_key('%s')})"
# A statement_timeout may cancel ENTER_QUEUE just after its lock was granted, and a session
# advisory lock outlives the failed statement: give it back, if it is held, without the
# server's warning for unlocking a lock not held.
LEAVE_QUEUE_IF_ENTERED = f"""
SELECT pg_advisory_unlock(queue.key)
FROM (SELECT {_queue_key("%s")} AS key) AS queue, pg_locks
WHERE pid = pg_backend_pid() AND granted AND {_is_queue_lock("queue.key")}
"""

RENEW = """
UPDATE locks_lock SET expires_at = GREATEST(expires_at, statement_timestamp() + %s)
WHERE name = %s AND holder = %s AND token = %s AND expires_at > statement_timestamp()
RETURNING expires_at
"""
# As ENTER_QUEUE: the MATERIALIZED CTE sets lock_timeout (this statement's only) before the
# joined row reaches the UPDATE, which is where it waits for another transaction's lock.
RENEW_BOUNDED = """
WITH bound AS MATERIALIZED (SELECT set_config('lock_timeout', %s, true))
UPDATE locks_lock SET expires_at = GREATEST(expires_at, statement_timestamp() + %s)
FROM bound
WHERE name = %s AND holder = %s AND token = %s AND expires_at > statement_timestamp()
RETURNING expires_at
"""

# Release notifications: NOTIFY serialises the commits of notifying transactions, so only
# a release that a blocked acquire asked for (``waiting``) sends one.
CHANNEL = "locks_released"
NOTIFY_IF_WAITING = f"CASE WHEN waiting THEN pg_notify('{CHANNEL}', name) END"

RELEASE_LAST = f"""
DELETE FROM locks_lock
WHERE name = %s AND holder = %s AND token = %s
  AND (count = 1 OR expires_at <= statement_timestamp() OR %s)
RETURNING expires_at > statement_timestamp(), {NOTIFY_IF_WAITING}
"""

BREAK = f"DELETE FROM locks_lock WHERE name = %s RETURNING {NOTIFY_IF_WAITING}"

BREAK_HOLDING = f"""
DELETE FROM locks_lock WHERE name = %s AND token = %s RETURNING {NOTIFY_IF_WAITING}
"""

BREAK_HOLDER = f"""
DELETE FROM locks_lock WHERE name = %s AND holder = %s RETURNING {NOTIFY_IF_WAITING}
"""

RELEASE_REENTRY = """
UPDATE locks_lock SET count = count - 1
WHERE name = %s AND holder = %s AND token = %s
  AND count > 1 AND expires_at > statement_timestamp()
RETURNING count
"""

# SKIP LOCKED: a row an acquire or renewal is touching right now is left for the next run.
REAP = """
DELETE FROM locks_lock WHERE name IN (
    SELECT name FROM locks_lock WHERE expires_at <= statement_timestamp()
    ORDER BY expires_at LIMIT %s FOR UPDATE SKIP LOCKED)
AND expires_at <= statement_timestamp()
"""

# A grant acknowledged under synchronous_commit=off can vanish in a crash, and the next
# holder would get the same token: lock statements always commit synchronously.
SYNCHRONOUS_COMMIT = """
SELECT set_config('synchronous_commit', 'on', false)
WHERE current_setting('synchronous_commit') = 'off'
"""

# What an uncontended acquire and release, a blocked acquire's tries and a renewal send:
# prepared through libpq by the app's own connections that prepare (see locks.backends.libpq).
HOT = plans(
    [ACQUIRE, ACQUIRE_YIELDING, ACQUIRE_AS_HEAD, ACQUIRE_FLAGGING, RENEW, RELEASE_LAST,
     RELEASE_REENTRY],
    "locks_hot_",
)  # fmt: skip

TRANSIENT_SQLSTATES = frozenset({"40001", "40P01"})  # serialization failure, deadlock

# Transaction-scoped (is_local => SET LOCAL), so it also works behind PgBouncer in
# transaction pooling mode; OFFSET 0 keeps the old value read before the new one is set.
SET_LOCK_TIMEOUT = """
SELECT old, set_config('lock_timeout', %s, true)
FROM (SELECT current_setting('lock_timeout') AS old OFFSET 0) AS previous
"""
RESTORE_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', %s, true)"
LOCK_NOT_AVAILABLE = "55P03"  # NOWAIT, or lock_timeout ran out
QUERY_CANCELED = "57014"  # statement_timeout ran out, or pg_cancel_backend()
DEADLOCK = "40P01"


def _acquire_params(name: str, holder: str, ttl: float, note: str) -> dict[str, Any]:
    return {"name": name, "holder": holder, "ttl": timedelta(seconds=ttl), "note": note}


class PostgreSQLBackend(Backend):
    vendor = "postgresql"
    NOW = "statement_timestamp()"
    RELEASE_LAST = RELEASE_LAST
    RELEASE_REENTRY = RELEASE_REENTRY
    REAP = REAP
    supports_notify = True

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
        params = _acquire_params(name, holder, ttl, note)
        cursor.execute(ACQUIRE_YIELDING if yield_to_queue else ACQUIRE, params)
        return self.grant(cursor.fetchone())

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
        sql = ACQUIRE_AS_HEAD if queued else ACQUIRE_FLAGGING
        cursor.execute(sql, _acquire_params(name, holder, ttl, note))
        row = cursor.fetchone()
        if row[4]:
            grant = self.grant(row)
            assert grant is not None
            return grant
        return float(row[5])

    def enter_queue(self, cursor: Cursor, name: str, timeout: float) -> bool:
        try:
            cursor.execute(ENTER_QUEUE, [f"{wait_ms(timeout)}ms", name])
        except DatabaseError as exc:
            if self.is_lock_busy(exc):
                return False
            # A database's or role's statement_timeout shorter than the wait ends it the
            # same way as lock_timeout: not queued yet, and the caller looks at the lock.
            if getattr(exc.__cause__, "sqlstate", None) == QUERY_CANCELED:
                cursor.execute(LEAVE_QUEUE_IF_ENTERED, [name])
                return False
            raise
        return True

    def leave_queue(self, cursor: Cursor, name: str) -> None:
        cursor.execute(LEAVE_QUEUE, [name])

    def renew(
        self,
        cursor: Cursor,
        name: str,
        holder: str,
        token: int,
        ttl: float,
        wait: float | None = None,
    ) -> datetime | None:
        params: list[Any] = [timedelta(seconds=ttl), name, holder, token]
        if wait is None:
            cursor.execute(RENEW, params)
        else:
            cursor.execute(RENEW_BOUNDED, [f"{wait_ms(wait)}ms", *params])
        row = cursor.fetchone()
        return None if row is None else self.to_datetime(row[0])

    def break_lock(self, cursor: Cursor, name: str) -> bool:
        cursor.execute(BREAK, [name])
        return cursor.fetchone() is not None

    def break_holding(self, cursor: Cursor, name: str, token: int) -> bool:
        cursor.execute(BREAK_HOLDING, [name, token])
        return cursor.fetchone() is not None

    def break_holder(self, cursor: Cursor, name: str, holder: str) -> bool:
        cursor.execute(BREAK_HOLDER, [name, holder])
        return cursor.fetchone() is not None

    def listen(self, raw: Any) -> None:
        raw.execute(f"LISTEN {CHANNEL}")

    def notifications(self, raw: Any, timeout: float) -> Iterator[str]:
        for notify in raw.notifies(timeout=timeout):
            yield notify.payload

    def cancel(self, raw: Any) -> None:
        if raw is not None:
            raw.cancel_safe(timeout=5.0)

    def is_transient(self, exc: BaseException) -> bool:
        return getattr(exc.__cause__, "sqlstate", None) in TRANSIENT_SQLSTATES

    def session_settings(self, settings_dict: dict[str, Any]) -> dict[str, Any]:
        options = settings_dict.get("OPTIONS", {})
        if "pool" not in options:
            return settings_dict
        # Django keeps one pool per alias (OPTIONS["pool"]). Drawn from it, a lock call of a
        # thread whose ORM connection is checked out would need a second slot, and wait
        # for the pool's timeout when there is none; and the first of our connections to
        # open would make the pool, with our connect options for every ORM connection.
        options = {key: value for key, value in options.items() if key != "pool"}
        return {**settings_dict, "OPTIONS": options}

    def own_settings(self, settings_dict: dict[str, Any]) -> dict[str, Any]:
        from ..conf import conf

        if not conf.prepared_statements(settings_dict):
            return settings_dict
        # Django binds client-side by default, so the server would parse and plan every
        # lock statement anew; bound on the server and prepared on first use, it does that
        # once per session. (prepare_threshold=0: psycopg prepares at the first execute.)
        options = {
            **settings_dict.get("OPTIONS", {}),
            "server_side_binding": True,
            "prepare_threshold": 0,
        }
        return {**settings_dict, "OPTIONS": options}

    def driver_cursor(self, cursor: Any) -> Any:
        from ..conf import conf

        if not conf.prepared_statements(cursor.db.settings_dict):
            return cursor.cursor
        return PreparedCursor(cursor.cursor, HOT)

    def on_connect(self, connection: BaseDatabaseWrapper) -> None:
        with connection.cursor() as cursor:
            cursor.execute(SYNCHRONOUS_COMMIT)

    def create_extras(self, schema_editor: BaseDatabaseSchemaEditor) -> None:
        schema_editor.execute("CREATE SEQUENCE IF NOT EXISTS locks_token_seq")

    def drop_extras(self, schema_editor: BaseDatabaseSchemaEditor) -> None:
        schema_editor.execute("DROP SEQUENCE IF EXISTS locks_token_seq")

    def name_db_parameters(self, connection: BaseDatabaseWrapper) -> dict[str, Any]:
        return {}

    @contextmanager
    def _lock_timeout(self, connection: BaseDatabaseWrapper, timeout: float) -> Iterator[None]:
        with connection.cursor() as cursor:
            cursor.execute(SET_LOCK_TIMEOUT, [f"{wait_ms(timeout)}ms"])
            old = cursor.fetchone()[0]
        # On an error the transaction is aborted and no statement can run; its rollback
        # (or the savepoint's) undoes the SET LOCAL.
        yield
        with connection.cursor() as cursor:
            cursor.execute(RESTORE_LOCK_TIMEOUT, [old])

    def bounded_wait(
        self, connection: BaseDatabaseWrapper, timeout: float | None
    ) -> AbstractContextManager[None]:
        return nullcontext() if timeout is None else self._lock_timeout(connection, timeout)

    def is_lock_busy(self, exc: BaseException) -> bool:
        return getattr(exc.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE

    def is_deadlock(self, exc: BaseException) -> bool:
        return getattr(exc.__cause__, "sqlstate", None) == DEADLOCK

    def lock_wait_settings(self, connection: BaseDatabaseWrapper) -> dict[str, str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('lock_timeout')")
            return {"lock_timeout": str(cursor.fetchone()[0])}
