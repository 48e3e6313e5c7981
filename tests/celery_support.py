"""Real Celery processes for the tests: start a worker or beat, wait for it, always stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, TypeVar

from celery import Celery

from locks.celery import SingletonTask
from tests.conftest import ROOT, worker_env

BROKER_URLS = {
    "redis": os.environ.get("LOCKS_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"),
    "rabbitmq": os.environ.get("LOCKS_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"),
}


def _brokers(names: str) -> dict[str, str]:
    chosen = names.replace(",", " ").split()
    unknown = sorted(set(chosen) - set(BROKER_URLS))
    if unknown or not chosen:
        raise RuntimeError(
            f"LOCKS_TEST_BROKERS must name some of {sorted(BROKER_URLS)}, not {names!r}"
        )
    return {name: BROKER_URLS[name] for name in chosen}


#: The brokers the tests that run on each broker run on: both, unless LOCKS_TEST_BROKERS
#: names fewer (scripts/test runs them on RabbitMQ too only in the runs on the three
#: databases with Django's LTS: what differs between brokers is Celery's, not the lock's
#: database's or Django's). A test of one broker's own behaviour uses BROKER_URLS.
BROKERS = _brokers(os.environ.get("LOCKS_TEST_BROKERS", " ".join(BROKER_URLS)))
START_TIMEOUT = 90.0
T = TypeVar("T")


def unique_queue() -> str:
    """A queue name no other test run uses, so no other worker takes its messages."""
    return f"locks-test-{os.getpid()}-{uuid.uuid4().hex[:10]}"


def wait_until(
    check: Callable[[], T | None],
    timeout: float = 60.0,
    what: str = "condition",
    pause: float = 0.05,
) -> T:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(pause)


class CeleryProcess:
    """A running ``celery`` command in its own process group, logging to a file."""

    def __init__(self, process: subprocess.Popen[bytes], log: Path) -> None:
        self.process = process
        self.log = log

    def text(self) -> str:
        """Everything the process logged so far."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_for_log(self, needle: str, timeout: float = START_TIMEOUT) -> None:
        """Wait until the log shows ``needle``; fail early if the process exits."""

        def seen() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"celery exited with {self.process.returncode}:\n{self.text()[-4000:]}"
                )
            return needle in self.text()

        try:
            wait_until(seen, timeout, f"{needle!r} in the celery log", pause=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n--- log ---\n{self.text()[-4000:]}") from None

    def stop(self) -> None:
        """Warm shutdown, then SIGKILL to the whole process group if it lingers."""
        if self.process.poll() is None:
            self.process.terminate()  # the main process stops its pool children itself
            with suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=20)
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # pool children, if any are left
        if self.process.poll() is None:
            self.process.wait(timeout=10)


def start_celery(args: list[str], log: Path, env: dict[str, str]) -> CeleryProcess:
    """Start ``python -m celery ARGS`` in its own process group, logging to ``log``."""
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", *args],
            env=env,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stop() reaches pool children
        )
    return CeleryProcess(process, log)


@contextmanager
def celery_worker(
    app_module: str,
    queue: str,
    log: Path,
    env: dict[str, str],
    *,
    pool: str = "prefork",
    concurrency: int = 2,
) -> Iterator[CeleryProcess]:
    """Run ``celery -A app_module worker`` on ``queue`` until the block ends."""
    worker = start_celery(
        [
            "-A",
            app_module,
            "worker",
            f"--pool={pool}",
            f"--concurrency={concurrency}",
            f"--queues={queue}",
            f"--hostname={queue}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel=INFO",
        ],
        log,
        env,
    )
    try:
        worker.wait_for_log(" ready.")
        yield worker
    finally:
        worker.stop()


@contextmanager
def celery_beat(app_module: str, workdir: Path, env: dict[str, str]) -> Iterator[CeleryProcess]:
    """Run ``celery -A app_module beat`` with its schedule and pid files in ``workdir``."""
    beat = start_celery(
        [
            "-A",
            app_module,
            "beat",
            f"--schedule={workdir / 'celerybeat-schedule'}",
            f"--pidfile={workdir / 'celerybeat.pid'}",
            "--loglevel=INFO",
        ],
        workdir / "beat.log",
        env,
    )
    try:
        beat.wait_for_log("beat: Starting")
        yield beat
    finally:
        beat.stop()


def celery_env(broker_url: str, queue: str, **extra: str) -> dict[str, str]:
    """Environment of a Celery process on this run's test database, broker and queue."""
    env = worker_env()
    env.update(LOCKS_TEST_BROKER_URL=broker_url, LOCKS_TEST_QUEUE=queue, **extra)
    return env


def singleton(app: Celery, name: str) -> SingletonTask:
    """The registered SingletonTask ``name`` of ``app``."""
    task = app.tasks[name]
    assert isinstance(task, SingletonTask)
    return task


def delete_queue(app: Celery, queue: str) -> None:
    """Remove the run's queue from the broker (best effort: it expires anyway), and on
    Redis the run's own unacked-message keys, if it has them (``visibility_timeout``)."""
    try:
        with app.connection_for_write() as connection:
            channel: Any = connection.default_channel
            channel.queue_delete(queue)
            unacked = getattr(channel, "unacked_key", "")
            if unacked.startswith(queue):
                channel.client.delete(unacked, channel.unacked_index_key, channel.unacked_mutex_key)
    except Exception:  # cleanup must not hide the test's own result
        pass
