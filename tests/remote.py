"""Drive a database session in another OS process (``tests.workers_rowlocks serve``)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.conftest import ROOT, worker_env

REPLY_TIMEOUT = 120.0


class Remote:
    """One worker process: ``call()`` runs a command there and returns its event."""

    def __init__(self, **env: str) -> None:
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.workers_rowlocks", "serve"],
            env={**worker_env(), **env},
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
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

    def send(self, op: str, **args: Any) -> None:
        """Start a command without waiting for it (read its event with ``reply()``)."""
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.process.stdin.flush()

    def reply(self, timeout: float = REPLY_TIMEOUT) -> dict[str, Any]:
        """The next event; fails with the worker's stderr if it ended or took too long."""
        try:
            event = self._events.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"worker {self.pid}: no reply in {timeout} s") from None
        if event is None:
            self._stderr.seek(0)
            raise AssertionError(f"worker {self.pid} ended:\n{self._stderr.read()}")
        return event

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        """Run a command and return its event."""
        self.send(op, **args)
        return self.reply()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        os.kill(self.pid, sig)
        if sig == signal.SIGKILL:
            self.process.wait(timeout=30)

    def close(self) -> None:
        if self.process.poll() is None:
            try:
                os.kill(self.pid, signal.SIGCONT)  # in case a test stopped it
                self.send("exit")
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self._stderr.close()


@contextmanager
def remotes() -> Iterator[Callable[..., Remote]]:
    """Start worker sessions on demand (keywords: extra environment); all end with the block."""
    started: list[Remote] = []

    def start(**env: str) -> Remote:
        remote = Remote(**env)
        started.append(remote)
        return remote

    try:
        yield start
    finally:
        for remote in started:
            remote.close()
