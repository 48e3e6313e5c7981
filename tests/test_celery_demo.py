"""The demo's worker and beat on the filesystem transport and SQLite, with nothing to start."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.celery_support import start_celery, wait_until
from tests.conftest import ROOT

# The demo's commands, as docs/celery.md gives them.
WORKER = ["-A", "project", "worker", "--loglevel=INFO", "--concurrency=2"]
BEAT = ["-A", "project", "beat", "--loglevel=INFO"]

ENQUEUE = """
import locks
from project.tasks import send_invoice_email
first, second = send_invoice_email.delay(7), send_invoice_email.delay(7)
print("ids", first.id, second.id)
locks.try_acquire("demo:expired", ttl=0.001)
locks.try_acquire("demo:live", ttl=600)
"""


def demo_env(tmp_path: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("LOCKS_TEST_", "CELERY_", "DJANGO_", "DATABASE_"))
    }
    env.update(
        DJANGO_SETTINGS_MODULE="project.settings",
        DATABASE_URL=f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        CELERY_FS_DIR=str(tmp_path / "celery-fs"),
        LOCKS_REAP_INTERVAL="1",
        PYTHONPATH=str(ROOT),
    )
    return env


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def lock_names(database: Path) -> set[str]:
    with sqlite3.connect(database) as connection:
        return {name for (name,) in connection.execute("SELECT name FROM locks_lock")}


@pytest.mark.skipif(
    os.environ.get("LOCKS_TEST_BACKEND", "sqlite") != "sqlite",
    reason="the demo runs on its own SQLite file, not on the backend under test: "
    "it is checked once, in the sqlite pass",
)
def test_demo_worker_and_beat_run_on_the_filesystem_transport_and_sqlite(tmp_path: Path) -> None:
    env = demo_env(tmp_path)
    manage(env, "migrate", "--noinput")
    worker = start_celery(WORKER, tmp_path / "worker.log", env)
    beat = start_celery(
        [*BEAT, f"--schedule={tmp_path / 'celerybeat-schedule'}"], tmp_path / "beat.log", env
    )
    try:
        worker.wait_for_log(" ready.")
        beat.wait_for_log("beat: Starting")
        ids = manage(env, "shell", "-c", ENQUEUE).split("ids ")[1].split()
        assert ids[0] == ids[1]  # the second delay() found the first one queued

        wait_until(
            lambda: "'invoice 7 e-mailed'" in worker.text(), timeout=90, what="the e-mail task"
        )
        assert worker.text().count("Task project.tasks.send_invoice_email[") == 2  # in, done
        assert f"send_invoice_email[{ids[0]}] received" in worker.text()
        assert "invoice-email:7" not in lock_names(tmp_path / "demo.sqlite3")

        # Beat sends the reaper every second: the expired lock goes, the live one stays.
        wait_until(
            lambda: "demo:expired" not in lock_names(tmp_path / "demo.sqlite3"),
            timeout=90,
            what="beat's reaper run",
        )
        assert "demo:live" in lock_names(tmp_path / "demo.sqlite3")
        assert "Sending due task locks-reap-expired (locks.reap_expired)" in beat.text()
    finally:
        beat.stop()
        worker.stop()
