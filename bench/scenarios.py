"""The measured loops, one per scenario, as each worker process runs them.

Times are ``time.monotonic_ns()``: one clock for every process of this machine, so a
release instant taken in one process and an acquire instant taken in another compare.

(a)/(b) acquire+release pairs on the worker's own key; the latency is one pair.
(c) 4 workers, one key, blocking acquire, a non-atomic counter update inside; the
    latency is the wait (call of the blocking acquire to its return).
(d) 2 workers pass one key back and forth; the latency of a hand-off runs from the
    instant the holder calls release to the instant the waiter's blocking acquire
    returns (so it includes the release round trip, the wake-up and the acquire).
(e) one worker reaps the expired rows with ``locks.reap_expired()`` while another runs
    (a); the latency is (a)'s pair while the reaper runs.
The floor is not a lock: for (c) one process runs the critical section serially
(INSERT, counter read, counter write, DELETE) and its wait is 3 such cycles, what a
perfectly fair lock would give 4 processes; for (d) one process times DELETE + INSERT.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

from .contenders import Contender

BLOCKING_TIMEOUT = 30.0
MAX_ERRORS = 50
HOLD_MIN, HOLD_MAX = 0.002, 0.008  # (d): how long a holder keeps the lock


@dataclass
class Shared:
    """Values shared by the workers of one measurement (multiprocessing ``RawValue``s).

    Example::

        Shared(stop=CONTEXT.RawValue("i", 0))
    """

    last_release: Any = None
    handoffs: Any = None
    stop: Any = None


@dataclass
class Outcome:
    """What one worker measured.

    Example::

        out = Outcome()
        out.lat.append(1_000_000)
    """

    lat: list[int] = field(default_factory=list)
    ops: int = 0  # completed inside the measured window
    total: int = 0  # completed at all (the counter must agree)
    statements: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    window: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def error(self, exc: BaseException) -> None:
        code = exc.args[0] if exc.args and isinstance(exc.args[0], int) else None
        name = type(exc).__name__ + (f" {code}" if code is not None else "")
        self.errors[name] = self.errors.get(name, 0) + 1
        if sum(self.errors.values()) > MAX_ERRORS:
            raise RuntimeError(f"too many errors: {self.errors}") from exc


def pairs(c: Contender, key: str, duration: float, shared: Shared) -> Outcome:
    """(a), (b) and the measured side of (e): acquire+release pairs, uncontended.

    Example::

        pairs(contender, "bench:k", 2.0, Shared())
    """
    out = Outcome()
    start = time.monotonic_ns()
    deadline = start + int(duration * 1e9)
    now = start
    while now < deadline and not (shared.stop is not None and shared.stop.value):
        try:
            handle = c.try_acquire(key)
            if handle is None:
                out.errors["busy"] = out.errors.get("busy", 0) + 1
            else:
                c.release(handle)
                out.ops += 1
        except Exception as exc:
            out.error(exc)
        end = time.monotonic_ns()
        out.lat.append(end - now)
        now = end
    out.total = out.ops
    out.window = (now - start) / 1e9
    return out


def contended(c: Contender, key: str, duration: float, shared: Shared) -> Outcome:
    """(c): blocking acquire, counter read then write, release.

    Example::

        contended(contender, "bench:shared", 2.0, Shared())
    """
    out = Outcome()
    start = time.monotonic_ns()
    deadline = start + int(duration * 1e9)
    while time.monotonic_ns() < deadline:
        began = time.monotonic_ns()
        try:
            handle = c.acquire(key, BLOCKING_TIMEOUT)
        except Exception as exc:  # Busy, or a database error that reached the caller
            out.error(exc)
            continue
        out.lat.append(time.monotonic_ns() - began)
        try:
            c.counter_set(key, c.counter_get(key) + 1)
            out.total += 1
        finally:
            c.release(handle)
        if time.monotonic_ns() <= deadline:
            out.ops += 1
    out.window = duration
    return out


def handoff(c: Contender, key: str, duration: float, shared: Shared, handle: Any) -> Outcome:
    """(d): two workers alternate; each waits for the other to take the lock before retrying.

    The first worker enters holding the lock (``handle``), the second with ``None``.

    Example::

        handoff(contender, "bench:shared", 2.0, shared, None)
    """
    out = Outcome()
    ready = time.monotonic_ns()
    deadline = ready + int(duration * 1e9)
    while not shared.stop.value:
        if handle is None:
            handle = c.acquire(key, BLOCKING_TIMEOUT)
            acquired = time.monotonic_ns()
            released = shared.last_release.value
            if released and not shared.stop.value:
                out.lat.append(acquired - released)
                out.ops += 1
            shared.handoffs.value += 1
        time.sleep(random.uniform(HOLD_MIN, HOLD_MAX))
        if time.monotonic_ns() >= deadline:
            shared.stop.value = 1
            shared.last_release.value = 0
            break
        seen = shared.handoffs.value
        shared.last_release.value = time.monotonic_ns()
        c.release(handle)
        handle = None
        while shared.handoffs.value == seen and not shared.stop.value:
            time.sleep(0.0001)
    if handle is not None:
        c.release(handle)
    out.total = out.ops
    out.window = (time.monotonic_ns() - ready) / 1e9
    return out


def floor_contended(c: Contender, key: str, duration: float, shared: Shared) -> Outcome:
    """(c) for the floor: the serial critical section; a fair lock's wait is 3 of them.

    Example::

        floor_contended(Floor("postgresql"), "bench:shared", 2.0, Shared())
    """
    out = Outcome()
    deadline = time.monotonic_ns() + int(duration * 1e9)
    while (began := time.monotonic_ns()) < deadline:
        handle = c.try_acquire(key)
        c.counter_set(key, c.counter_get(key) + 1)
        c.release(handle)
        out.lat.append(3 * (time.monotonic_ns() - began))
        out.ops += 1
    out.total = out.ops
    out.window = duration
    return out


def floor_handoff(c: Contender, key: str, duration: float, shared: Shared) -> Outcome:
    """(d) for the floor: the least a hand-off costs, one DELETE and one INSERT.

    Example::

        floor_handoff(Floor("postgresql"), "bench:shared", 2.0, Shared())
    """
    out = Outcome()
    deadline = time.monotonic_ns() + int(duration * 1e9)
    handle = c.try_acquire(key)
    while time.monotonic_ns() < deadline:
        time.sleep(random.uniform(HOLD_MIN, HOLD_MAX))
        began = time.monotonic_ns()
        c.release(handle)
        handle = c.try_acquire(key)
        out.lat.append(time.monotonic_ns() - began)
        out.ops += 1
    c.release(handle)
    out.total = out.ops
    out.window = duration
    return out


def reaper(c: Contender, shared: Shared) -> Outcome:
    """(e): ``locks.reap_expired()`` once, timed; then tell the other worker to stop.

    Example::

        reaper(App("postgresql"), shared).extra["reap_seconds"]
    """
    out = Outcome()
    began = time.monotonic_ns()
    try:
        out.extra["reaped"] = c.reap()  # type: ignore[attr-defined]  # only the app reaps
    finally:
        out.extra["reap_seconds"] = (time.monotonic_ns() - began) / 1e9
        shared.stop.value = 1
    return out
