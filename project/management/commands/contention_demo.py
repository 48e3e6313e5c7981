"""Several OS processes take turns on one lock; the command verifies they never overlapped."""

from __future__ import annotations

import itertools
import json
import queue
import random
import subprocess
import sys
import tempfile
import threading
import time
from argparse import SUPPRESS as _SUPPRESS
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from tqdm import tqdm

import locks


class Command(BaseCommand):
    help = (
        "Start several OS processes that share one lock name. Inside the lock each one "
        "does a deliberately unsafe read-modify-write of a counter kept in a plain file; "
        "the summary checks the count, that no two holds overlapped, and that fencing "
        "tokens rose in hold order."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--workers", type=int, default=4, help="processes (default 4)")
        parser.add_argument("--rounds", type=int, default=25, help="critical sections each")
        parser.add_argument("--name", default="demo:counter", help="the lock name")
        parser.add_argument("--ttl", type=float, default=10.0, help="lease length, seconds")
        parser.add_argument("--worker", type=int, help=_SUPPRESS)
        parser.add_argument("--state", help=_SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        if options["worker"] is not None:
            _work(options)
            return
        if options["workers"] < 1 or options["rounds"] < 1:
            raise CommandError("--workers and --rounds must be at least 1")
        with tempfile.TemporaryDirectory(prefix="locks-demo-") as state:
            holds = self._run(options, Path(state))
            counter = int((Path(state) / "counter").read_text())
        self._summarise(options, holds, counter)

    def _run(self, options: dict[str, Any], state: Path) -> list[dict[str, Any]]:
        (state / "counter").write_text("0")
        total = options["workers"] * options["rounds"]
        self.stdout.write(
            f"{options['workers']} processes x {options['rounds']} critical sections "
            f"on lock {options['name']!r} (database {settings.DATABASES['default']['NAME']})"
        )
        events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        processes = [_spawn(options, state, number) for number in range(options["workers"])]
        readers = [
            threading.Thread(target=_relay, args=(process, events), daemon=True)
            for process in processes
        ]
        for reader in readers:
            reader.start()
        holds: list[dict[str, Any]] = []
        finished = 0
        with tqdm(total=total, unit="hold", file=sys.stdout, dynamic_ncols=True) as bar:
            while finished < len(processes):
                event = events.get()
                if event is None:
                    finished += 1
                    continue
                holds.append(event)
                bar.write(
                    f"worker {event['worker']} holds it: token {event['token']}, "
                    f"holder {event['holder']}"
                )
                bar.update(1)
        failed = [p.args for p in processes if p.wait() != 0]
        if failed:
            raise CommandError(f"{len(failed)} worker process(es) failed; see their errors above")
        return holds

    def _summarise(
        self, options: dict[str, Any], holds: list[dict[str, Any]], counter: int
    ) -> None:
        expected = options["workers"] * options["rounds"]
        holds.sort(key=lambda hold: hold["started"])
        overlaps = sum(
            1 for before, after in itertools.pairwise(holds) if after["started"] < before["ended"]
        )
        tokens = [hold["token"] for hold in holds]
        rising = all(a < b for a, b in itertools.pairwise(tokens))
        self.stdout.write("")
        self.stdout.write(f"critical sections done: {len(holds)} / {expected}")
        self.stdout.write(f"counter in the shared file: {counter} (expected {expected})")
        self.stdout.write(f"overlaps found: {overlaps}")
        self.stdout.write(
            f"tokens rising in hold order: {'yes' if rising else 'NO'} "
            f"({tokens[0] if tokens else '-'} .. {tokens[-1] if tokens else '-'})"
        )
        if len(holds) != expected or counter != expected or overlaps or not rising:
            raise CommandError("verification FAILED: the lock did not exclude")
        self.stdout.write(self.style.SUCCESS("verified: mutual exclusion held"))


def _spawn(options: dict[str, Any], state: Path, number: int) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "django", "contention_demo",
        "--settings", str(settings.SETTINGS_MODULE),
        "--worker", str(number), "--state", str(state),
        "--rounds", str(options["rounds"]), "--name", options["name"],
        "--ttl", str(options["ttl"]),
    ]  # fmt: skip
    return subprocess.Popen(command, cwd=settings.BASE_DIR, stdout=subprocess.PIPE, text=True)


def _relay(process: subprocess.Popen[str], events: queue.Queue[dict[str, Any] | None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("{"):
            events.put(json.loads(line))
    events.put(None)


def _work(options: dict[str, Any]) -> None:
    """One worker process: critical sections on the shared file, one JSON line each."""
    counter = Path(options["state"]) / "counter"
    for _ in range(options["rounds"]):
        with locks.lock(options["name"], ttl=options["ttl"], timeout=120) as lease:
            started = time.monotonic_ns()  # one clock for all processes of this machine
            value = int(counter.read_text())
            time.sleep(random.uniform(0, 0.003))  # widen the window a second holder would hit
            counter.write_text(str(value + 1))
            ended = time.monotonic_ns()
        hold = {
            "worker": options["worker"],
            "holder": lease.holder,
            "token": lease.token,
            "started": started,
            "ended": ended,
        }
        print(json.dumps(hold), flush=True)
