"""Soak run: lock clients in several processes under random faults, checked for violations.

Usage (``LOCKS_TEST_BACKEND`` picks the database, as for the tests)::

    python -m tests.soak --seconds 180 --processes 8 --names 100

It creates its own test database, runs ``tests.workers_reliability contend`` in every
process (acquire, fenced writes, re-entry, renewal, release, abandoned and overstayed
leases, reaping, the odd break), and meanwhile injects random faults: SIGSTOP/SIGCONT of
a process for up to 2.5 s (longer than most of its leases), SIGKILL of a process (a new
one takes its place), and, on a database server, ending a random session from the
server side. At the end the history checker checks every process's history; the
command prints operations done, faults injected and violations, and exits 1 on any.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import django

if TYPE_CHECKING:
    from tests.history_check import Report

FAULTS = ("stop", "kill", "session")


@dataclass
class SoakResult:
    """What a soak run did and found."""

    seconds: float
    processes: int
    names: int
    ops: int
    faults: Counter[str]
    report: Report

    @property
    def violations(self) -> list[str]:
        return self.report.violations

    def summary(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 1),
            "processes": self.processes,
            "names": self.names,
            "operations": self.ops,
            "faults": dict(self.faults),
            "violations": len(self.violations),
        }


class _Fleet:
    """The worker processes, replaced as they are killed."""

    def __init__(self, history: Path, names: int, seconds: float, rng: random.Random) -> None:
        self.history, self.names, self.seconds, self.rng = history, names, seconds, rng
        self.stop = history / "stop"
        self.serial = itertools.count()
        self.live: list[Any] = []
        self.dead: list[Any] = []

    def spawn(self) -> None:
        from tests.faults import Worker

        args = ["--prefix", "soak", "--names", self.names, "--seconds", self.seconds + 120]
        args += ["--stop", self.stop, "--seed", self.rng.randrange(2**31), "--breaks", 0.002]
        proc = f"w{next(self.serial)}"
        self.live.append(Worker(self.history, proc, "contend", *args))

    def inject(self, fault: str) -> str:
        """Inject one fault into a random process (or session); return its target."""
        from django.db import DatabaseError, close_old_connections

        from tests.faults import kill_session, other_sessions

        victim = self.rng.choice(self.live)
        if fault == "stop":
            victim.send(signal.SIGSTOP)
            time.sleep(self.rng.uniform(0.2, 2.5))
            victim.send(signal.SIGCONT)
        elif fault == "kill":
            victim.send(signal.SIGKILL)
            self.live.remove(victim)
            self.dead.append(victim)
            self.spawn()
        else:
            try:
                session = self.rng.choice(other_sessions() or [0])
                if session:
                    kill_session(session)
            except DatabaseError as exc:  # the server restarted under us (another test?)
                close_old_connections()
                return f"none: {exc}"
            return f"session {session}"
        return str(victim.proc)

    def finish(self) -> None:
        self.stop.touch()
        for worker in self.live:
            worker.finish()
        for worker in self.dead:
            worker.close()


def soak(
    history: Path,
    *,
    processes: int,
    names: int,
    seconds: float,
    seed: int,
    faults: tuple[str, ...],
    min_faults: int = 0,
) -> SoakResult:
    """Run the soak in ``history`` (a directory) against the configured test database.

    It lasts ``seconds``, and longer if need be to inject ``min_faults`` faults (a run of
    long SIGSTOPs injects few).

    Example::

        result = soak(tmp, processes=4, names=12, seconds=15, seed=1, faults=("stop", "kill"))
        assert not result.violations
    """
    from django.db import close_old_connections

    from locks.models import Lock
    from tests.app.models import FencedRecord
    from tests.history import Recorder, load
    from tests.history_check import check

    rng = random.Random(seed)
    FencedRecord.objects.bulk_create([FencedRecord(key=f"soak{i}") for i in range(names)])
    fleet = _Fleet(history, names, seconds, rng)
    injector = Recorder(history / "injector.jsonl", proc="injector")
    counts: Counter[str] = Counter()
    began = time.monotonic()
    try:
        for _ in range(processes):
            fleet.spawn()
        # Bounded: the workers run for seconds + 120, and the test asserts the count.
        while (
            time.monotonic() - began < seconds or sum(counts.values()) < min_faults
        ) and time.monotonic() - began < seconds + 60:
            time.sleep(rng.uniform(0.3, 1.0))
            fault = rng.choice(faults)
            target = fleet.inject(fault)
            injector.event(fault, "*", target=target)
            counts[fault] += not target.startswith("none")
        fleet.finish()
    finally:
        for worker in fleet.live + fleet.dead:
            worker.close()
    close_old_connections()  # in case the server restarted meanwhile
    ops = [op for op in load(sorted(history.glob("*.jsonl"))) if op.proc != "injector"]
    report = check(ops, list(Lock.objects.values_list("name", "token")))
    return SoakResult(time.monotonic() - began, processes, names, len(ops), counts, report)


def _own_test_databases() -> None:
    """Give the soak its own test database names, apart from a test run's."""
    from django.conf import settings

    for database in settings.DATABASES.values():
        test = database.setdefault("TEST", {})
        name = str(test.get("NAME") or database["NAME"])
        test["NAME"] = (
            name.replace(".sqlite3", "_soak.sqlite3") if "sqlite" in name else name + "_soak"
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--names", type=int, default=100)
    parser.add_argument("--seed", type=int, default=random.randrange(2**31))
    parser.add_argument("--history", help="keep the histories in this directory")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    _own_test_databases()
    old = setup_databases(verbosity=0, interactive=False)
    history = Path(args.history or tempfile.mkdtemp(prefix="locks-soak-"))
    history.mkdir(parents=True, exist_ok=True)
    faults = FAULTS if connection.vendor != "sqlite" else FAULTS[:2]
    try:
        result = soak(
            history,
            processes=args.processes,
            names=args.names,
            seconds=args.seconds,
            seed=args.seed,
            faults=faults,
        )
    finally:
        import locks.connection

        locks.connection.close()
        teardown_databases(old, verbosity=0)
    print(json.dumps({"backend": connection.vendor, "seed": args.seed, **result.summary()}))
    for violation in result.violations[:50]:
        print(violation)
    print(f"histories: {history}")
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
