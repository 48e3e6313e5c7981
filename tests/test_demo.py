"""The demo's contention command runs end to end on a fresh SQLite file, as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BACKEND, ROOT


@pytest.mark.skipif(BACKEND != "sqlite", reason="the demo runs on SQLite, whatever the suite")
def test_contention_demo_verifies_mutual_exclusion(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
    }
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "-v0"], env=env, cwd=ROOT, check=True, timeout=120)
    result = subprocess.run(
        [*manage, "contention_demo", "--workers", "3", "--rounds", "10"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "critical sections done: 30 / 30" in result.stdout
    assert "counter in the shared file: 30 (expected 30)" in result.stdout
    assert "overlaps found: 0" in result.stdout
    assert "tokens rising in hold order: yes" in result.stdout
    assert "worker 2 holds it: token" in result.stdout
