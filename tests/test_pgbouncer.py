"""The PostgreSQL suite's second run really goes through PgBouncer in transaction pooling mode."""

from __future__ import annotations

import os

import psycopg
import pytest
from django.db import connection

import locks
import locks.connection
from tests import pgbouncer

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not pgbouncer.ENABLED,
        reason="only through PgBouncer (scripts/test runs it as the 'pgbouncer' backend)",
    ),
]


def test_lock_statements_go_through_pgbouncer_in_transaction_pooling_mode() -> None:
    port = os.environ[pgbouncer.PORT_VARIABLE]
    with locks.lock("orders:1") as lease:
        own = locks.connection.get("default")
        assert str(own.settings_dict["PORT"]) == port
        assert pgbouncer.clients(str(connection.settings_dict["NAME"])) >= 1
        assert locks.check_token("orders:1", lease.token)
    with psycopg.connect(
        host="127.0.0.1", port=int(port), user="postgres", dbname="pgbouncer", autocommit=True
    ) as admin:
        config = {row[0]: row[1] for row in admin.execute("SHOW CONFIG").fetchall()}
    assert config["pool_mode"] == "transaction"
