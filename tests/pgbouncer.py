"""PgBouncer in transaction pooling mode before the test PostgreSQL (LOCKS_TEST_PGBOUNCER=1).

The test databases are created and dropped directly on PostgreSQL (``DROP DATABASE``
fails while the pooler keeps server connections to it); every test then runs through
PgBouncer: the pytest process once :func:`through_pgbouncer` has pointed its connections
at the pooler, and worker processes from the start (``LOCKS_TEST_PGBOUNCER_PORT``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connections

ENABLED = bool(os.environ.get("LOCKS_TEST_PGBOUNCER"))
PORT_VARIABLE = "LOCKS_TEST_PGBOUNCER_PORT"

INI = """\
[databases]
* = host={host} port={server_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory}/users.txt
admin_users = {user}
pool_mode = transaction
max_client_conn = 2000
default_pool_size = 40
server_reset_query =
# Check a pooled server connection before every use: after a server restart the pool
# still holds dead connections, and the default (30 s) would hand them to the next client.
server_check_delay = 0
ignore_startup_parameters = extra_float_digits
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PgBouncer did not start:\n{log.read_text()}") from None
            time.sleep(0.1)


@contextmanager
def running(server_host: str, server_port: str, user: str) -> Iterator[int]:
    """Run PgBouncer on a free loopback port for the block; yields the port.

    Example::

        with running("127.0.0.1", "5432", "postgres") as port:
            ...
    """
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    directory = Path(tempfile.mkdtemp(prefix="locks-pgbouncer-"))
    # PgBouncer refuses to run as root; it drops to the postgres account, which must read
    # its configuration.
    directory.chmod(0o755)
    port = free_port()
    ini = directory / "pgbouncer.ini"
    ini.write_text(
        INI.format(
            host=server_host, server_port=server_port, port=port, directory=directory, user=user
        )
    )
    (directory / "users.txt").write_text(f'"{user}" ""\n')
    for path in (ini, directory / "users.txt"):
        path.chmod(0o644)
    log = directory / "pgbouncer.log"
    as_user = ["-u", "postgres"] if os.geteuid() == 0 else []
    with open(log, "wb") as out:
        process = subprocess.Popen([binary, *as_user, str(ini)], stdout=out, stderr=out)
    try:
        _wait_for(port, process, log)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)
        shutil.rmtree(directory, ignore_errors=True)


def clients(database: str) -> int:
    """How many client connections PgBouncer has open to ``database`` (its admin console).

    Example::

        assert clients("test_locks_pgb_abc123_default") == 1
    """
    import psycopg

    settings = connections.settings["default"]
    with psycopg.connect(
        host="127.0.0.1",
        port=int(os.environ[PORT_VARIABLE]),
        user=str(settings["USER"]),
        dbname="pgbouncer",
        autocommit=True,
    ) as admin:
        rows = admin.execute("SHOW CLIENTS").fetchall()
    return sum(row[2] == database for row in rows)


def _point_at(port: str) -> None:
    for alias in connections:
        connections[alias].close()
        connections.settings[alias]["PORT"] = port


@pytest.fixture(scope="session", autouse=True)
def through_pgbouncer(request: pytest.FixtureRequest) -> Iterator[int | None]:
    """With ``LOCKS_TEST_PGBOUNCER=1``: create the test databases, then run every test
    through a PgBouncer started for the session (transaction pooling)."""
    if not ENABLED:
        yield None
        return
    request.getfixturevalue("django_db_setup")
    settings = connections.settings["default"]
    direct = str(settings["PORT"])
    with running(str(settings["HOST"]), direct, str(settings["USER"])) as port:
        os.environ[PORT_VARIABLE] = str(port)
        _point_at(str(port))
        try:
            yield port
        finally:
            _point_at(direct)
            del os.environ[PORT_VARIABLE]
