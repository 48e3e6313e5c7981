"""Drive a database session in another OS process (``tests.workers_rowlocks serve``)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from tests.processes import EventProcess

REPLY_TIMEOUT = 120.0


class Remote(EventProcess):
    """One worker process: ``call()`` runs a command there and returns its event."""

    def __init__(self, **env: str) -> None:
        super().__init__(
            [sys.executable, "-m", "tests.workers_rowlocks", "serve"],
            tempfile.TemporaryFile(mode="w+"),  # noqa: SIM115 - closed in close()
            env=env,
            stdin=True,
        )

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
            raise AssertionError(f"worker {self.pid} ended:\n{self.errors()}")
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
