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


def test_the_pooled_alias_turns_notify_and_prepared_statements_off_by_itself() -> None:
    # tests/settings.py sets only what Django asks for behind PgBouncer
    # (DISABLE_SERVER_SIDE_CURSORS), and no LOCKS setting at all.
    from locks.conf import conf

    own = locks.connection.get("default")
    assert not conf.notify(own.settings_dict)
    assert not conf.prepared_statements(own.settings_dict)
    assert own.settings_dict["OPTIONS"].get("server_side_binding") is not True
    for round_ in range(5):  # statements that a pooler would mix up if they were prepared
        with locks.lock(f"orders:{round_}") as lease:
            lease.renew()
        locks.acquire("orders:x", timeout=1, holder=f"h{round_}").release()
