"""scripts/demo: sets up non-interactively, serves the demo page, and stops everything on Ctrl-C.

The demo gets a database of its own on the backend under test, through DATABASE_URL as a user
would give it: a SQLite file, or a fresh database on the PostgreSQL or MariaDB server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from tests import pgbouncer
from tests.conftest import BACKEND, ROOT
from tests.settings import CHECKOUT
from tests.test_admin_browser import CHROMIUM, CHROMIUM_ARGS, SCREENSHOTS, TIMEOUT_MS

pytestmark = pytest.mark.skipif(
    pgbouncer.ENABLED,
    reason="the demo connects to PostgreSQL directly, not through the pooler: the postgresql "
    "pass runs the same demo on the same server",
)

DEMO = str(ROOT / "scripts" / "demo")


DEMO_DB = f"test_locks_{CHECKOUT}_demo"


def _server_sql(statement: str) -> None:
    if BACKEND == "postgresql":
        command = ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-c"]
    else:
        command = ["mariadb", "--protocol=tcp", "-h", "127.0.0.1", "-u", "root", "-e"]
    subprocess.run([*command, statement], check=True, capture_output=True, timeout=120)


@pytest.fixture
def demo_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCKS_TEST", "DJANGO_"))}
    # The broker's folder and beat's schedule of this run alone: scripts/test may run the
    # suite on two backends at once, each with a demo.
    env["CELERY_FS_DIR"] = str(tmp_path / "celery-fs")
    env["CELERY_BEAT_SCHEDULE_FILENAME"] = str(tmp_path / "celerybeat-schedule")
    if BACKEND == "sqlite":
        env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'demo.sqlite3'}"
        yield env
        return
    if BACKEND == "postgresql":
        drop = f'DROP DATABASE IF EXISTS "{DEMO_DB}" WITH (FORCE)'
        create = f'CREATE DATABASE "{DEMO_DB}"'
        env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:5432/{DEMO_DB}"
    else:
        drop = f"DROP DATABASE IF EXISTS `{DEMO_DB}`"
        create = f"CREATE DATABASE `{DEMO_DB}` CHARACTER SET utf8mb4"
        env["DATABASE_URL"] = f"mysql://root@127.0.0.1:3306/{DEMO_DB}?charset=utf8mb4"
    _server_sql(drop)
    _server_sql(create)
    try:
        yield env
    finally:
        _server_sql(drop)


def test_demo_setup_runs_without_a_terminal_and_prints_a_working_login(
    demo_env: dict[str, str],
) -> None:
    runs = [
        ("Created", ["--", "--workers", "2", "--rounds", "5"]),  # with the contention demo
        ("Updated", ["--no-contention"]),  # a second run keeps working
    ]
    for verb, options in runs:
        done = subprocess.run(
            [DEMO, "--no-server", *options],
            env=demo_env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr
        assert f"{verb} superuser. Admin login: admin / locks-demo" in done.stdout
        assert ("verified: mutual exclusion held" in done.stdout) == (verb == "Created")
    check = (
        "import django; django.setup()\n"
        "from django.contrib.auth import authenticate\n"
        "user = authenticate(username='admin', password='locks-demo')\n"
        "print(bool(user and user.is_superuser and user.is_staff))\n"
    )
    login = subprocess.run(
        [sys.executable, "-c", check],
        cwd=ROOT,
        env={**demo_env, "DJANGO_SETTINGS_MODULE": "project.settings"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert login.stdout.strip() == "True", login.stderr


def test_demo_refuses_unknown_options(demo_env: dict[str, str]) -> None:
    done = subprocess.run([DEMO, "--bogus"], env=demo_env, capture_output=True, text=True)
    assert done.returncode == 1 and "unknown option '--bogus'" in done.stderr


def test_demo_help_prints_its_usage_and_nothing_else() -> None:
    done = subprocess.run([DEMO, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    # The header comment as the user reads it: no shell directives, nothing of the code.
    assert lines[0].startswith("Run the demo:"), lines[:2]
    assert "Usage: scripts/demo [--no-server]" in done.stdout
    assert lines[-1] == "Ctrl-C stops everything it started."
    assert not any("shellcheck" in line or line.startswith("#") for line in lines)


#: The guarded view's work time in the demo under test: long enough that all five requests
#: of the button are answered while the first one works, even on a loaded machine.
REPORT_SECONDS = 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _status(url: str) -> tuple[int, str | None]:
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, response.headers.get("Retry-After")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Retry-After")


def _click_through_the_page(url: str, log: Path) -> None:
    """The page's button fires five requests at once: one 200, four 423; the table updates."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.goto(f"{url}/demo/")
        page.click("#fire")
        expect(page.locator("#locks")).to_contain_text("demo:report")
        # Every request answered; a 423 after the first request's hold would be a 200.
        expect(page.locator("#results li", has_text="waiting")).to_have_count(0, timeout=60_000)
        answers = page.locator("#results li").all_inner_texts()
        statuses = sorted(answer.split()[2] for answer in answers)
        tail = log.read_text(errors="replace")[-4000:]
        assert statuses == ["200", "423", "423", "423", "423"], f"{answers}\n{tail}"
        expect(page.locator("#results li.s423").first).to_contain_text("Retry-After")
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / "06-demo-page.png"), full_page=True)
        browser.close()


@pytest.fixture
def running_demo(
    demo_env: dict[str, str], tmp_path: Path
) -> Iterator[tuple[str, subprocess.Popen[str], Path]]:
    port = _free_port()
    log = tmp_path / "demo.log"
    # Its web server's request log, shown if the page test fails.
    with log.open("w") as output:
        demo = subprocess.Popen(
            [DEMO, "--no-contention", "--port", str(port)],
            env={**demo_env, "DEMO_REPORT_SECONDS": str(REPORT_SECONDS)},
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group, like a terminal's foreground job
        )
    try:
        yield f"http://127.0.0.1:{port}", demo, log
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()


def test_demo_serves_the_page_and_ctrl_c_stops_everything(
    running_demo: tuple[str, subprocess.Popen[str], Path],
) -> None:
    url, demo, log = running_demo
    deadline = time.monotonic() + 180
    while True:
        assert demo.poll() is None, "scripts/demo exited early"
        try:
            if _status(f"{url}/demo/")[0] == 200:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "the demo page never came up"
        time.sleep(0.5)

    with urllib.request.urlopen(f"{url}/demo/locks.json", timeout=60) as response:
        assert "locks" in json.load(response)
    _click_through_the_page(url, log)

    os.killpg(demo.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    demo.wait(timeout=120)
    deadline = time.monotonic() + 60
    while True:  # the web server and the Celery worker went with it
        try:
            os.killpg(demo.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "processes of the demo outlived Ctrl-C"
        time.sleep(0.2)
