"""Tokens keep rising across a restart of the database server, and the app recovers."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from django.db import InterfaceError, OperationalError, connections

import locks

pytestmark = pytest.mark.django_db(transaction=True)


def wait_for_port(port: int, up: bool, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                if up:
                    return
        except OSError:
            if not up:
                return
        time.sleep(0.2)
    raise AssertionError(f"port {port} did not go {'up' if up else 'down'} in {seconds} s")


def restart_server(backend: str, *, crash: bool = False) -> None:
    """Restart the real server (or, for SQLite, drop every connection to the file).

    ``crash``: the server stops without writing anything more to disk (PostgreSQL's
    immediate shutdown, SIGKILL for MariaDB) and recovers from its log when it starts.
    """
    if backend == "postgresql":
        version = sorted(os.listdir("/etc/postgresql"))[-1]
        mode = ["-m", "immediate"] if crash else []
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", *mode, version, "main", "restart"],
            check=True,
            timeout=120,
        )
        wait_for_port(5432, up=True)
    elif backend == "mariadb":
        if crash:
            subprocess.run(["pkill", "-KILL", "-x", "mariadbd"], check=True, timeout=60)
        else:
            subprocess.run(
                ["mariadb-admin", "-h127.0.0.1", "-uroot", "shutdown"], check=True, timeout=120
            )
        wait_for_port(3306, up=False)
        # start-stop-daemon --oknodo does nothing while the old process is still exiting.
        deadline = time.monotonic() + 120
        while subprocess.run(["pgrep", "-x", "mariadbd"], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, "mariadbd did not exit"
            time.sleep(0.2)
        subprocess.run(
            [
                "start-stop-daemon",
                "--start",
                "--oknodo",
                "--background",
                "--exec",
                "/usr/sbin/mariadbd",
            ],
            check=True,
            timeout=60,
        )
        wait_for_port(3306, up=True)
        deadline = time.monotonic() + 60
        while (
            subprocess.run(
                ["mariadb-admin", "-h127.0.0.1", "-uroot", "ping"], capture_output=True
            ).returncode
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
    else:
        connections.close_all()
        locks.connection.close()
        assert Path(str(connections["default"].settings_dict["NAME"])).exists()


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "crash"])
def test_tokens_keep_rising_across_a_server_restart(backend: str, crash: bool) -> None:
    if crash and backend == "sqlite":
        pytest.skip("SQLite has no server to crash (holders killed by SIGKILL: test_faults)")
    tokens = []
    for _ in range(3):
        with locks.lock("orders:1") as lease:
            tokens.append(lease.token)
    # Granted (committed and answered) right before the server goes down.
    held = locks.acquire("orders:2", ttl=300)

    restart_server(backend, crash=crash)
    connections.close_all()  # Django's own connection of this test is stale too

    # The app's own connection is stale: at most one call fails, then it reconnects
    # without restarting the process.
    failures = 0
    deadline = time.monotonic() + 60
    while True:
        try:
            lease = locks.acquire("orders:1", timeout=0)
            break
        except (OperationalError, InterfaceError):
            failures += 1
            assert time.monotonic() < deadline, "the app did not recover"
            time.sleep(0.5)
    assert failures <= 1
    assert lease.token > max(tokens), (tokens, lease.token)
    lease.release()
    # The lease taken before the restart survived it (it was committed), a crash too.
    assert locks.check_token("orders:2", held.token)
    assert lease.token > held.token
    held.release()
