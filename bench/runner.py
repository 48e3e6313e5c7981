"""Runs one measurement: forks the worker processes, starts them together, collects outcomes."""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
import traceback
from dataclasses import asdict
from multiprocessing.connection import Connection
from typing import Any

from . import contenders, db, scenarios
from .scenarios import Outcome, Shared

# Fork: workers start in milliseconds with Django already set up; every connection is
# closed before forking, and each worker opens its own.
CONTEXT = multiprocessing.get_context("fork")
WORKERS = {"a": 1, "b": 4, "c": 4, "d": 2, "e": 2}
FLOOR_WORKERS = {"c": 1, "d": 1}
WARM_UP = 10  # past the fifth acquire, where a MariaDB session of the app prepares its pair


def workers_for(contender: contenders.Contender, scenario: str) -> int:
    """How many worker processes a scenario gets for this contender.

    Example::

        workers_for(build("floor/postgresql"), "c")  # 1
    """
    if contender.family == "floor":
        return FLOOR_WORKERS.get(scenario, WORKERS[scenario])
    return WORKERS[scenario]


def _lock_key(prefix: str, scenario: str, index: int) -> str:
    if scenario in "ab":
        return f"{prefix}w{index}"
    if scenario == "e":
        return f"{prefix}a"
    return f"{prefix}shared"


def _warm_up(c: contenders.Contender, prefix: str, scenario: str, index: int) -> None:
    warm = f"{prefix}warm{index}"
    for _ in range(WARM_UP):
        handle = c.try_acquire(warm)
        if handle is None:
            raise RuntimeError(f"{c.key}: warm-up lock {warm!r} is busy")
        c.release(handle)
    if scenario == "c":
        c.counter_get(f"{prefix}shared")


def _measure(
    c: contenders.Contender, scenario: str, index: int, key: str, duration: float,
    shared: Shared, handle: Any,
) -> Outcome:  # fmt: skip
    floor = c.family == "floor"
    if scenario in "ab" or (scenario == "e" and index == 1):
        return scenarios.pairs(c, key, duration, shared)
    if scenario == "e":
        return scenarios.reaper(c, shared)
    if scenario == "c":
        run = scenarios.floor_contended if floor else scenarios.contended
        return run(c, key, duration, shared)
    if floor:
        return scenarios.floor_handoff(c, key, duration, shared)
    return scenarios.handoff(c, key, duration, shared, handle)


def _worker(
    key: str, scenario: str, index: int, prefix: str, duration: float,
    shared: Shared, barrier: Any, pipe: Connection,
) -> None:  # fmt: skip
    try:
        c = contenders.build(key)
        c.open()
        _warm_up(c, prefix, scenario, index)
        lock_key = _lock_key(prefix, scenario, index)
        # (d): the first worker enters holding the lock, so the second starts out waiting.
        handle = (
            c.acquire(lock_key, 30)
            if scenario == "d" and index == 0 and c.family != "floor"
            else None
        )
        c.statements = 0
        barrier.wait(timeout=120)
        outcome = _measure(c, scenario, index, lock_key, duration, shared, handle)
        outcome.statements = c.statements
        c.close()
        pipe.send(("ok", asdict(outcome)))
    except BaseException:
        barrier.abort()  # the parent and the other workers stop waiting for this one
        pipe.send(("error", traceback.format_exc()))
    finally:
        pipe.close()


def measure(
    contender: contenders.Contender, scenario: str, prefix: str, duration: float
) -> list[dict[str, Any]]:
    """Run ``scenario`` for ``contender`` in fresh worker processes; return their outcomes.

    Example::

        outcomes = measure(build("locks/postgresql"), "c", "bench:1:3:", 2.0)
    """
    count = workers_for(contender, scenario)
    shared = Shared(
        last_release=CONTEXT.RawValue("q", 0),
        handoffs=CONTEXT.RawValue("q", 0),
        stop=CONTEXT.RawValue("i", 0),
    )
    barrier = CONTEXT.Barrier(count + 1)
    db.close_all()
    processes, pipes = [], []
    for index in range(count):
        receiver, sender = CONTEXT.Pipe(duplex=False)
        process = CONTEXT.Process(
            target=_worker,
            args=(contender.key, scenario, index, prefix, duration, shared, barrier, sender),
            daemon=True,
        )
        process.start()
        sender.close()
        processes.append(process)
        pipes.append(receiver)
    try:
        # A worker that failed to start breaks the barrier; its pipe says why.
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=120)
        results = [_receive(pipe, duration) for pipe in pipes]
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5)
    errors = [body for status, body in results if status != "ok"]
    # The worker that broke the barrier says why; the others only that it broke.
    errors.sort(key=lambda body: "BrokenBarrierError" in body)
    if errors:
        raise RuntimeError(f"{contender.key} scenario {scenario}: worker failed:\n{errors[0]}")
    return [body for _, body in results]


def _receive(pipe: Connection, duration: float) -> tuple[str, Any]:
    # A reaper of a million rows may take minutes on a loaded machine; a stuck worker
    # must still end the run.
    limit = time.monotonic() + duration + 900
    while not pipe.poll(1):
        if time.monotonic() > limit:
            return ("error", "worker gave no result in time")
    try:
        result: tuple[str, Any] = pipe.recv()
    except EOFError:
        return ("error", "worker ended without a result (crashed?)")
    return result
