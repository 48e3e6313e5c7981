"""A worker process whose JSON events (one per stdout line) a thread collects as they come."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from typing import IO, Any

from tests.conftest import ROOT, worker_env


class EventProcess:
    """Start ``command`` with the test environment; its events queue up in ``_events``.

    The queue ends with ``None`` when the process closes its stdout. Subclasses say what
    the events mean (``tests.faults.Worker``, ``tests.remote.Remote``).

    Example::

        process = EventProcess([sys.executable, "-m", "tests.workers", "probe", "x"], log)
        event = process._events.get(timeout=60)
    """

    def __init__(
        self,
        command: list[str],
        stderr: IO[str],
        *,
        env: dict[str, str] | None = None,
        stdin: bool = False,
    ) -> None:
        self._stderr = stderr
        self.process = subprocess.Popen(
            command,
            env={**worker_env(), **(env or {})},
            cwd=ROOT,
            stdin=subprocess.PIPE if stdin else None,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        self.pid = self.process.pid
        self._events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self._events.put(json.loads(line))
        self._events.put(None)  # the process ended

    def errors(self) -> str:
        """What the process wrote on stderr so far."""
        self._stderr.seek(0)
        return self._stderr.read()
