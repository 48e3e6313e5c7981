"""PostgreSQL's hot lock statements sent through psycopg's libpq layer (``psycopg.pq``).

An uncontended acquire and release are one short statement each, and psycopg's cursor
costs some 20 to 30 us per statement on top of the round trip: query conversion, its
prepared-statement bookkeeping, typed parameter dumping, result set-up. For the pair that
is about as much as the app's SQL adds to the bare INSERT and DELETE of a row
(docs/benchmark.md, ``python -m bench.anatomy --backend postgresql``). The
statements of the hot path are known in advance, so :class:`PreparedCursor` prepares
each once per session under a name of its own, sends its parameters as text (the server
casts them to the types it inferred when it prepared the statement) and loads the
returned row with psycopg's own loaders. It waits for the answer on the socket, as
psycopg does, so a signal handler's exception still interrupts a statement that waits
(the caller then cancels it). Every other statement goes through the psycopg cursor
underneath.
"""

from __future__ import annotations

import re
import select
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from psycopg import errors, pq
from psycopg.adapt import Transformer

_PARAMETER = re.compile(r"%\((\w+)\)s|%s")
_MICROSECOND = timedelta(microseconds=1)
_ANSWERED = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK)
# Binary results: psycopg's binary loaders are the cheaper ones, and they read timestamps
# whatever the session's DateStyle.
BINARY = pq.Format.BINARY


@dataclass(frozen=True, slots=True)
class Plan:
    """One statement as the server prepares it: ``$n`` placeholders, in what order they
    take the caller's parameters (names for a mapping, positions for a sequence)."""

    name: bytes
    sql: bytes
    keys: tuple[str, ...] | int


def plan(sql: str, name: str) -> Plan:
    """The :class:`Plan` of ``sql``, written with psycopg's ``%s`` or ``%(key)s`` placeholders.

    Example::

        plan("DELETE FROM locks_lock WHERE name = %s", "locks_break")
    """
    keys: list[str] = []
    count = 0

    def number(match: re.Match[str]) -> str:
        nonlocal count
        key = match.group(1)
        if key is None:
            count += 1
            return f"${count}"
        if key not in keys:
            keys.append(key)
        return f"${keys.index(key) + 1}"

    converted = _PARAMETER.sub(number, sql)
    if "%" in converted or (keys and count):
        raise ValueError(f"not a statement for a prepared plan: {sql!r}")
    return Plan(name.encode(), converted.encode(), tuple(keys) if keys else count)


def plans(statements: Iterable[str], prefix: str) -> dict[str, Plan]:
    """A :class:`Plan` for each statement, keyed by its SQL, named ``prefix`` and a number.

    Example::

        HOT = plans([ACQUIRE, RELEASE_LAST], "locks_")
    """
    return {sql: plan(sql, f"{prefix}{index}") for index, sql in enumerate(statements)}


class Unsendable(Exception):
    """A parameter this path does not send; psycopg's cursor takes the statement instead."""


def _text(value: Any, encoding: str) -> bytes | None:
    """A parameter in PostgreSQL's text input format; None (NULL) stays None."""
    if isinstance(value, str):
        # libpq would end the parameter at a NUL; psycopg refuses it with a clear error.
        if "\x00" in value:
            raise Unsendable(value)
        return value.encode(encoding)
    if value is None:
        return None
    if isinstance(value, bool):
        return b"t" if value else b"f"
    if isinstance(value, int):
        return b"%d" % value
    if isinstance(value, timedelta):
        return b"%d microseconds" % (value // _MICROSECOND)
    raise Unsendable(value)


class PreparedCursor:
    """Runs the statements of ``hot`` prepared through libpq, the rest through ``cursor``.

    Takes and gives what a psycopg cursor does for the app's statements: ``execute`` with
    ``%s`` or ``%(key)s`` parameters, then ``fetchone`` and ``rowcount``.

    Example::

        cursor = PreparedCursor(psycopg_cursor, plans([ACQUIRE, RELEASE_LAST], "locks_"))
        cursor.execute(RELEASE_LAST, ["orders:42", "worker-1", 17, False])
        cursor.fetchone()
    """

    __slots__ = (
        "_cursor", "_encoding", "_hot", "_loader", "_pgconn", "_prepared", "_result", "_row"
    )  # fmt: skip

    def __init__(self, cursor: Any, hot: dict[str, Plan]) -> None:
        self._cursor = cursor
        self._pgconn = cursor.connection.pgconn
        # Read once: the app's own sessions never change their client_encoding.
        self._encoding = cursor.connection.info.encoding
        self._hot = hot
        self._prepared: set[bytes] = set()
        self._result: pq.abc.PGresult | None = None
        self._row = 0
        self._loader = Transformer(cursor.connection)

    def execute(self, sql: str, params: Any = None) -> Any:
        """Run one statement; a driver error comes out as psycopg's own."""
        found = self._hot.get(sql)
        self._result = None
        if found is None or params is None:
            return self._cursor.execute(sql, params)
        try:
            values = self._values(found, params)
        except Unsendable:
            return self._cursor.execute(sql, params)
        result = self._result = self._run(found, values)
        self._row = 0
        self._loader.set_pgresult(result)
        return self

    def fetchone(self) -> Any:
        """The next row of the last statement's result, or ``None``."""
        result = self._result
        if result is None:
            return self._cursor.fetchone()
        if self._row >= result.ntuples:
            return None
        self._row += 1
        return self._loader.load_row(self._row - 1, tuple)

    @property
    def rowcount(self) -> int:
        """Rows the last statement changed or returned."""
        if self._result is None:
            return int(self._cursor.rowcount)
        tuples = self._result.command_tuples
        return -1 if tuples is None else tuples

    @property
    def connection(self) -> Any:
        """The psycopg connection underneath."""
        return self._cursor.connection

    def close(self) -> None:
        """Close the psycopg cursor underneath."""
        self._result = None
        self._cursor.close()

    def _values(self, found: Plan, params: Any) -> list[bytes | None]:
        """The parameters in ``$n`` order as text; raises :class:`Unsendable` to leave the
        statement to psycopg."""
        encoding = self._encoding
        if isinstance(found.keys, int):
            if len(params) != found.keys:
                raise Unsendable(params)
            return [_text(value, encoding) for value in params]
        return [_text(params[key], encoding) for key in found.keys]

    def _run(self, found: Plan, values: list[bytes | None]) -> pq.abc.PGresult:
        pgconn = self._pgconn
        if found.name not in self._prepared:
            self._prepare(found)
        try:
            pgconn.send_query_prepared(found.name, values, result_format=BINARY)
            return self._answer()
        except errors.InvalidSqlStatementName:  # 26000: "prepared statement does not exist"
            # A DEALLOCATE ALL or DISCARD ALL dropped the session's statements: prepare
            # again, once.
            self._prepare(found)
            pgconn.send_query_prepared(found.name, values, result_format=BINARY)
            return self._answer()

    def _prepare(self, found: Plan) -> None:
        self._pgconn.send_prepare(found.name, found.sql)
        # Prepared already by an earlier cursor on the same session (a name stands for one
        # statement).
        with suppress(errors.DuplicatePreparedStatement):
            self._answer()
        self._prepared.add(found.name)

    def _answer(self) -> pq.abc.PGresult:
        """Wait on the socket for the last result of what was sent; raise it if an error."""
        pgconn = self._pgconn
        socket = pgconn.socket
        while pgconn.flush():
            select.select([socket], [socket], [])
            pgconn.consume_input()
        results: list[pq.abc.PGresult] = []
        while True:
            pgconn.consume_input()
            while not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:
                    return self._checked(results)
                results.append(result)
            # In Python, not in C, so that a signal's handler runs and may interrupt.
            select.select([socket], [], [])

    def _checked(self, results: list[pq.abc.PGresult]) -> pq.abc.PGresult:
        for result in results:
            if result.status not in _ANSWERED:
                raise errors.error_from_result(result, encoding=self._encoding)
        if not results:
            raise errors.InternalError("the server sent no result")
        return results[-1]
