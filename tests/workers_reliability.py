"""Lock clients for the fault tests: ``python -m tests.workers_reliability SCENARIO ARGS``.

Every scenario records what it does in a history file (``tests.history.Recorder``) and
prints JSON events on stdout for the test to follow. Fenced writes go to one
``FencedRecord`` per lock name (``key`` = the name), created by the test beforehand.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import django
import time_machine

from tests.workers import emit

T = TypeVar("T")

#: Test-only SQL that tells a connection's server session; the vendor branch is here only.
SESSION_ID = {"postgresql": "SELECT pg_backend_pid()", "mysql": "SELECT CONNECTION_ID()"}


def wait_for(gate: str, seconds: float = 120) -> None:
    """Wait until the file ``gate`` exists (the test's go-ahead)."""
    deadline = time.monotonic() + seconds
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise SystemExit(f"gate {gate} never opened")
        time.sleep(0.02)


def own_session_id() -> int:
    """The server session id of this thread's own lock connection."""
    import locks.connection
    from locks.conf import conf

    wrapper = locks.connection.get(conf.DATABASE)
    with wrapper.cursor() as cursor:
        cursor.execute(SESSION_ID[wrapper.vendor])
        return int(cursor.fetchone()[0])


class Client:
    """A lock client that records every operation (and fenced write) it makes."""

    def __init__(self, history: str, proc: str, seed: int = 0) -> None:
        from tests.history import Recorder

        self.proc = proc
        self.recorder = Recorder(Path(history) / f"{proc}.jsonl", proc=proc)
        self.rng = random.Random(seed)
        self.pks: dict[str, int] = {}

    def write(self, name: str, token: int) -> str:
        """Fenced write of the name's record with ``token``; returns the outcome."""
        from tests.app.models import FencedRecord

        def save() -> None:
            if name not in self.pks:
                self.pks[name] = FencedRecord.objects.get(key=name).pk
            record = FencedRecord(pk=self.pks[name], key=name, data=f"{self.proc}:{token}")
            record.save(fence=token, update_fields=["data"])

        return self.run("write", name, save, token=token)[0]

    def run(
        self, op: str, name: str, call: Callable[[], T], **details: Any
    ) -> tuple[str, T | None]:
        """Record one operation; after a database error, drop Django's broken connections
        (as Django does between requests; the lease engine replaces its own by itself)."""
        from django.db import close_old_connections

        from tests.history import ERROR

        result, value = self.recorder.run(op, name, call, **details)
        if result == ERROR:
            close_old_connections()
        return result, value


def hold(args: argparse.Namespace) -> None:
    """Acquire, write, report ``held``; at the gate write, renew and release, reporting each."""
    import locks

    client = Client(args.history, args.proc)
    run = client.run
    if args.session:
        emit(event="session", session=own_session_id())
    result, lease = run(
        "acquire",
        args.name,
        lambda: locks.acquire(args.name, ttl=args.ttl, timeout=60, auto_renew=args.auto_renew),
    )
    if lease is None:
        emit(event="not_acquired", result=result, errors=_errors(args))
        return
    wrote = client.write(args.name, lease.token)
    emit(event="held", token=lease.token, expires_at=lease.expires_at, wrote=wrote)
    wait_for(args.gate)
    outcome: dict[str, Any] = {"lost_flag": lease.lost}
    steps: list[tuple[str, Callable[[], str]]] = [
        ("write", lambda: client.write(args.name, lease.token)),
        ("renew", lambda: run("renew", args.name, lease.renew, lease=lease)[0]),
        ("renew_again", lambda: run("renew", args.name, lease.renew, lease=lease)[0]),
        ("release", lambda: run("release", args.name, lease.release, lease=lease)[0]),
    ]
    for step, call in steps:
        if step in args.steps.split(","):
            outcome[step] = call()
    emit(event="after", errors=_errors(args), **outcome)


def _errors(args: argparse.Namespace) -> list[str]:
    """The database errors this process recorded, as the client saw them."""
    from tests.history import ERROR, load

    ops = load([Path(args.history) / f"{args.proc}.jsonl"])
    return [op.error for op in ops if op.result == ERROR]


def row_hold(args: argparse.Namespace) -> None:
    """Hold ``row_lock(name)`` and show signs of life until the gate opens (or a SIGKILL)."""
    import locks

    client = Client(args.history, args.proc)
    begun = time.monotonic()
    with locks.row_lock(args.name, timeout=60):
        client.recorder.event("row_lock", args.name, waited=time.monotonic() - begun)
        emit(event="held")
        while not os.path.exists(args.gate):
            client.recorder.event("row_hold", args.name)
            time.sleep(0.05)
        client.recorder.event("row_unlock", args.name)
    emit(event="released")


TTLS = (0.2, 0.5, 1.0, 2.0)


def one_round(client: Client, name: str, breaks: float, late: float = 0.1) -> int:
    """One round on ``name``, mostly acquire-write-release, sometimes worse; returns ops."""
    import locks
    from tests.history import ERROR

    rng, run = client.rng, client.run
    roll = rng.random()
    if roll < breaks:
        run("break", name, lambda: locks.break_lock(name))
        return 1
    if roll < breaks + 0.02:
        run("reap", "*", lambda: locks.reap_expired(batch_size=20))
        return 1
    ttl, timeout = rng.choice(TTLS), rng.choice((0, 0.05, 0.3))
    result, lease = run("acquire", name, lambda: locks.acquire(name, ttl=ttl, timeout=timeout))
    if lease is None:
        # A database error (the server is down?) gets a longer pause before the retry.
        time.sleep(rng.uniform(0.05, 0.2) if result == ERROR else rng.uniform(0, 0.02))
        return 1
    client.write(name, lease.token)
    style = rng.random()
    if style < late / 2:
        return 2  # abandoned: the lease has to expire on its own
    if style < late:
        time.sleep(ttl * 1.3)  # overstayed: the writes and the release come too late
    else:
        if rng.random() < 0.2:
            _, inner = run("acquire", name, lambda: locks.acquire(name, ttl=ttl, timeout=0))
            if inner is not None:
                run("release", name, inner.release, lease=inner)
        time.sleep(rng.uniform(0, ttl / 3))
        if rng.random() < 0.3:
            run("renew", name, lease.renew, lease=lease)
    client.write(name, lease.token)
    run("release", name, lease.release, lease=lease)
    return 6


def contend(args: argparse.Namespace) -> None:
    """Random lease operations on a few names until the stop file or the deadline."""
    client = Client(args.history, args.proc, args.seed)
    names = [f"{args.prefix}{i}" for i in range(args.names)]
    deadline = time.monotonic() + args.seconds
    skew = timedelta(seconds=args.skew)
    # Only the app's clock moves: time.monotonic() (the histories' clock) does not.
    travel = time_machine.travel(datetime.now(UTC) + skew, tick=True) if args.skew else None
    done = 0
    with travel or nullcontext():
        while time.monotonic() < deadline and not os.path.exists(args.stop):
            done += one_round(client, client.rng.choice(names), args.breaks, args.late)
        emit(event="done", proc=args.proc, ops=done, app_clock=datetime.now(UTC))


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="python -m tests.workers_reliability")
    sub = main.add_subparsers(dest="scenario", required=True)
    for name, func in (("hold", hold), ("row_hold", row_hold), ("contend", contend)):
        one = sub.add_parser(name)
        one.set_defaults(func=func)
        one.add_argument("--history", required=True)
        one.add_argument("--proc", required=True)
    holding = sub.choices["hold"]
    holding.add_argument("--name", required=True)
    holding.add_argument("--ttl", type=float, default=1.0)
    holding.add_argument("--gate", required=True)
    holding.add_argument("--steps", default="write,renew,release")
    holding.add_argument("--auto-renew", action="store_true")
    holding.add_argument("--session", action="store_true", help="report the own session id")
    rows = sub.choices["row_hold"]
    rows.add_argument("--name", required=True)
    rows.add_argument("--gate", required=True)
    many = sub.choices["contend"]
    many.add_argument("--prefix", default="n")
    many.add_argument("--names", type=int, default=3)
    many.add_argument("--seconds", type=float, default=10)
    many.add_argument("--stop", default="/nonexistent")
    many.add_argument("--seed", type=int, default=0)
    many.add_argument("--skew", type=float, default=0.0, help="app clock offset, seconds")
    many.add_argument("--breaks", type=float, default=0.01, help="share of rounds that break")
    many.add_argument("--late", type=float, default=0.1, help="share abandoned or overstayed")
    return main


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    args = parser().parse_args(sys.argv[1:])
    args.func(args)


if __name__ == "__main__":
    main()
