"""Lock histories: each client process records what it saw as JSON lines; ``load`` merges them.

Each client process owns a :class:`Recorder` that appends two lines per operation to its
own file: a ``begin`` line before the call and an ``end`` line with the outcome after it
(an operation whose process was killed in between stays ``pending``). Times are
``time.monotonic()``, one clock for every process on the machine (time-machine does not
move it), plus the database clock's ``acquired_at``/``expires_at`` of each grant and
renewal. ``tests.history_check.check`` verifies a merged history.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

OK, BUSY, LOST, STALE, ERROR, PENDING = "ok", "busy", "lost", "stale", "error", "pending"


@dataclass
class Op:
    """One operation as a client saw it: what it asked, when (monotonic), what it got."""

    id: str
    proc: str
    op: str
    name: str
    m0: float
    m1: float | None = None
    result: str = PENDING
    holder: str | None = None
    token: int | None = None
    count: int | None = None
    ttl: float | None = None
    acquired_at: datetime | None = None
    expires_at: datetime | None = None
    error: str = ""

    @property
    def end(self) -> float:
        """When the operation surely ended (an unfinished one: never)."""
        return float("inf") if self.m1 is None else self.m1

    @property
    def uncertain(self) -> bool:
        """Whether its effect is unknown: it failed with a database error or never ended."""
        return self.result in (ERROR, PENDING)


def _describe(value: Any) -> dict[str, Any]:
    from locks import Lease

    if isinstance(value, Lease):
        return {
            "holder": value.holder,
            "token": value.token,
            "count": value.count,
            "ttl": value.ttl,
            "acquired_at": value.acquired_at.isoformat(),
            "expires_at": value.expires_at.isoformat(),
        }
    return {}


class Recorder:
    """Appends a process's operations to its own JSON-lines history file.

    Example::

        recorder = Recorder(path, proc="worker-3")
        result, lease = recorder.run("acquire", "x", lambda: locks.try_acquire("x", ttl=2))
    """

    def __init__(self, path: Path | str, proc: str | None = None) -> None:
        self.proc = proc or str(os.getpid())
        # Line-buffered: every line reaches the OS at once, so SIGKILL loses none.
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._seq = itertools.count(1)

    def _write(self, **line: Any) -> None:
        self._file.write(json.dumps(line, default=str) + "\n")

    def event(self, op: str, name: str, **details: Any) -> None:
        """Record an instant event (e.g. a fault the test injected).

        Example::

            recorder.event("kill", "*", target="worker-3")
        """
        now = time.monotonic()
        self._write(ev="begin", id=self._next(), proc=self.proc, op=op, name=name, m=now)
        self._write(ev="end", id=f"{self.proc}:{self._last}", m=now, result=OK, **details)

    def _next(self) -> str:
        self._last = next(self._seq)
        return f"{self.proc}:{self._last}"

    def run(
        self, op: str, name: str, call: Callable[[], T], *, lease: Any = None, **details: Any
    ) -> tuple[str, T | None]:
        """Run ``call`` as operation ``op`` on ``name``, record it and return (result, value).

        Lock and database errors become a result (``lost``, ``busy``, ``stale``,
        ``error``); anything else is a bug and propagates. A ``None`` from an acquire is
        ``busy``. ``lease`` (for renew/release) describes the holding after the call.

        Example::

            result, _ = recorder.run("renew", lease.name, lease.renew, lease=lease)
        """
        from django.db import Error

        import locks

        op_id = self._next()
        if lease is not None:
            details = {"holder": lease.holder, "token": lease.token, "ttl": lease.ttl, **details}
        self._write(
            ev="begin", id=op_id, proc=self.proc, op=op, name=name, m=time.monotonic(), **details
        )
        value: T | None = None
        outcome: dict[str, Any] = {}
        try:
            value = call()
        except locks.LockLost as exc:
            outcome = {"result": LOST, "error": str(exc)}
        except locks.LockBusy as exc:
            outcome = {"result": BUSY, "error": str(exc)}
        except locks.StaleToken as exc:
            outcome = {"result": STALE, "error": str(exc)}
        except (locks.LockError, Error) as exc:
            notes = " ".join(getattr(exc, "__notes__", []))
            outcome = {"result": ERROR, "error": f"{type(exc).__name__}: {exc} {notes}"}
        else:
            outcome = {"result": BUSY if value is None and op == "acquire" else OK}
            outcome.update(_describe(value if lease is None else lease))
        self._write(ev="end", id=op_id, m=time.monotonic(), **outcome)
        return outcome["result"], value

    def close(self) -> None:
        self._file.close()


_FIELDS = {f.name for f in fields(Op)}


def load(paths: Iterable[Path | str]) -> list[Op]:
    """Merge history files into operations, in the order they began.

    Example::

        ops = load(Path(tmp).glob("*.jsonl"))
    """
    ops: dict[str, Op] = {}
    for path in paths:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                if not line.endswith("\n"):
                    continue  # a torn last line of a killed process
                record = json.loads(line)
                values = {k: v for k, v in record.items() if k in _FIELDS}
                for key in ("acquired_at", "expires_at"):
                    if values.get(key):
                        values[key] = datetime.fromisoformat(values[key])
                if record["ev"] == "begin":
                    ops[record["id"]] = Op(m0=record["m"], **values)
                else:
                    op = ops[record["id"]]
                    op.m1 = record["m"]
                    for key, value in values.items():
                        setattr(op, key, value)
    return sorted(ops.values(), key=lambda op: op.m0)
