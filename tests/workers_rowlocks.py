"""A database session in another OS process, driven step by step over stdin.

``python -m tests.workers_rowlocks serve`` reads one JSON command per line, e.g.
``{"op": "hold", "name": "a", "nowait": true}``, runs it and prints one JSON event per
command on stdout: ``{"event": "hold", "ok": true, ...}``, or ``"ok": false`` with the
exception's ``error`` (class name) and ``message``. Every event has ``elapsed``
(seconds the command took) and ``at`` (wall clock when it finished).
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import ExitStack
from typing import Any

import django

from tests.workers import emit


class Session:
    """The commands: each returns a dict that goes into its event."""

    def __init__(self) -> None:
        self.held = ExitStack()
        self.leases: dict[str, Any] = {}
        self.notes: dict[int, Any] = {}

    def hold(
        self,
        name: str,
        nowait: bool = False,
        skip_locked: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Take a row lock and keep its transaction open until ``commit``."""
        import locks

        row = self.held.enter_context(
            locks.row_lock(name, nowait=nowait, skip_locked=skip_locked, timeout=timeout)
        )
        return {"locked": row is not None}

    def lock_after_pause(self, name: str, gate: str, write_first: str = "") -> dict[str, Any]:
        """Take and release row_lock(name), stopping before its row is created until ``gate``
        exists (a file); prints a ``paused`` event when it stops.

        ``write_first``: in Django's manual transaction mode (autocommit off), first create
        an Item of that name; the event tells whether the transaction still has it after
        the row lock (then it is rolled back)."""
        from django.db import connection

        import locks
        from tests.app.models import Item

        if write_first:
            connection.set_autocommit(False)
            try:
                Item.objects.create(name=write_first)
                locked = self.lock_after_pause(name, gate)
                return {**locked, "kept": Item.objects.filter(name=write_first).exists()}
            finally:
                connection.rollback()
                connection.set_autocommit(True)

        paused = False

        def pause(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            nonlocal paused
            if not paused and "INSERT" in sql and "locks_rowlock" in sql:
                paused = True
                emit(event="paused")
                while not os.path.exists(gate):
                    time.sleep(0.01)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(pause), locks.row_lock(name) as row:
            return {"locked": row is not None}

    def hold_rows(
        self,
        pks: list[int],
        nowait: bool = False,
        skip_locked: bool = False,
        on_queryset: bool = False,
    ) -> dict[str, Any]:
        """Open a transaction, lock these Item rows and keep it open until ``commit``.

        ``on_queryset``: ``nowait`` and ``skip_locked`` go to the queryset's own
        ``select_for_update()`` instead of to ``lock_rows()``."""
        from django.db import transaction

        import locks
        from tests.app.models import Item

        self.held.enter_context(transaction.atomic())
        rows = Item.objects.filter(pk__in=pks).order_by("pk")
        if on_queryset:
            rows = rows.select_for_update(nowait=nowait, skip_locked=skip_locked)
            locked = locks.lock_rows(rows)
        else:
            locked = locks.lock_rows(rows, nowait=nowait, skip_locked=skip_locked)
        return {"pks": [row.pk for row in locked]}

    def options(self) -> dict[str, Any]:
        """The database OPTIONS this worker runs with."""
        from django.db import connection

        return {"options": connection.settings_dict.get("OPTIONS", {})}

    def commit(self, delay: float = 0.0) -> dict[str, Any]:
        """Wait ``delay`` seconds, then end the open transactions (commit)."""
        time.sleep(delay)
        committing_at = time.time()
        self.held.close()
        return {"committing_at": committing_at}

    def increment_each(self, names: list[str]) -> dict[str, Any]:
        """For each name: under row_lock(name), a non-atomic read-modify-write of its Counter."""
        import locks
        from tests.app.models import Counter

        for name in names:
            with locks.row_lock(name):
                counter = Counter.objects.get(name=name)
                counter.value += 1  # deliberately not F(): a second holder would lose updates
                counter.save(update_fields=["value"])
        return {}

    def acquire(self, name: str, ttl: float, auto_renew: bool = False) -> dict[str, Any]:
        """Take a lease (kept until the process ends)."""
        import locks

        lease = locks.acquire(name, ttl=ttl, timeout=30, auto_renew=auto_renew)
        self.leases[name] = lease
        return {"token": lease.token}

    def try_acquire(self, name: str, ttl: float = 5) -> dict[str, Any]:
        """One attempt at a lease, released at once if granted (a probe that never waits)."""
        import locks

        lease = locks.try_acquire(name, ttl=ttl)
        if lease is not None:
            lease.release()
        return {"acquired": lease is not None}

    def check_token(self, name: str, token: int) -> dict[str, Any]:
        import locks

        return {"live": locks.check_token(name, token)}

    def fenced_save(self, pk: int, data: str, token: int) -> dict[str, Any]:
        """Load a FencedRecord, change it, and save it with a fencing token."""
        from tests.app.models import FencedRecord

        record = FencedRecord.objects.get(pk=pk)
        record.data = data
        record.save(fence=token)
        return {"fence": record.fence}

    def fenced_delete(self, pk: int, token: int) -> dict[str, Any]:
        """Load a FencedRecord and delete it with a fencing token."""
        from tests.app.models import FencedRecord

        deleted, _ = FencedRecord.objects.get(pk=pk).delete(fence=token)
        return {"deleted": deleted}

    def fenced_insert(self, pk: int, key: str, data: str, token: int) -> dict[str, Any]:
        """Insert a FencedRecord anew with this primary key and fencing token."""
        from tests.app.models import FencedRecord

        record = FencedRecord(pk=pk, key=key, data=data)
        record.save(fence=token, force_insert=True)
        return {"fence": record.fence}

    def create_record(self, key: str, data: str) -> dict[str, Any]:
        """Create a FencedRecord with a plain (unfenced) save."""
        from tests.app.models import FencedRecord

        return {"pk": FencedRecord.objects.create(key=key, data=data).pk}

    def load(self, pk: int) -> dict[str, Any]:
        """Load a VersionedNote and keep this copy."""
        from tests.app.models import VersionedNote

        self.notes[pk] = VersionedNote.objects.get(pk=pk)
        return {"version": self.notes[pk].version}

    def append(self, pk: int, text: str, reload: bool = False) -> dict[str, Any]:
        """Append to the kept copy's body and save it (after reloading it, if asked)."""
        note = self.notes[pk]
        if reload:
            note.refresh_from_db()
        note.body += text
        note.save()
        return {"version": note.version}


def serve() -> None:
    session = Session()
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        if op == "exit":
            break
        started = time.monotonic()
        try:
            result = getattr(session, op)(**command)
        except Exception as exc:
            emit(
                event=op,
                ok=False,
                error=type(exc).__name__,
                message=str(exc),
                elapsed=time.monotonic() - started,
                at=time.time(),
            )
        else:
            emit(event=op, ok=True, elapsed=time.monotonic() - started, at=time.time(), **result)


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    scenario, *_ = sys.argv[1:]
    if scenario != "serve":
        raise SystemExit(f"unknown scenario {scenario!r}")
    serve()


if __name__ == "__main__":
    main()
