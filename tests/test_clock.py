"""The database clock decides expiry: moving the app server's clock changes nothing."""

from __future__ import annotations

import io
import json
import time
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection
from django.test import Client

import locks
from locks.backends import for_connection
from tests.test_admin import cells

pytestmark = pytest.mark.django_db(transaction=True)


def database_now() -> datetime:
    with connection.cursor() as cursor:
        return for_connection(connection).now(cursor)


@pytest.mark.parametrize("shift", [timedelta(hours=2), timedelta(hours=-2)])
def test_app_clock_skew_changes_nothing_about_who_holds_what(shift: timedelta) -> None:
    with time_machine.travel(datetime.now(UTC) + shift, tick=True):
        assert abs(datetime.now(UTC) - database_now()) > timedelta(hours=1)
        lease = locks.acquire("orders:1", ttl=1.0, holder="alice")
        # The expiry is the database's now + ttl, not the app server's.
        assert abs(lease.expires_at - (database_now() + timedelta(seconds=1))) < timedelta(
            seconds=1
        )
        assert locks.is_locked("orders:1")
        assert locks.try_acquire("orders:1", holder="bob") is None
        assert locks.check_token("orders:1", lease.token)
        time.sleep(1.2)  # real time: time-machine does not move time.sleep
        assert not locks.is_locked("orders:1")
        successor = locks.acquire("orders:1", holder="bob", timeout=0)
        assert successor.token > lease.token
        with pytest.raises(locks.LockLost):
            lease.release()
        successor.release()


def test_a_lease_taken_with_a_fast_clock_is_respected_with_a_slow_one() -> None:
    with time_machine.travel(datetime.now(UTC) + timedelta(hours=2), tick=True):
        lease = locks.acquire("orders:1", ttl=30, holder="alice")
    with time_machine.travel(datetime.now(UTC) - timedelta(hours=2), tick=True):
        assert locks.try_acquire("orders:1", holder="bob") is None
        lease.renew()
        lease.release()


@pytest.mark.parametrize("shift", [timedelta(hours=2), timedelta(hours=-2)])
def test_what_the_admin_the_command_and_lock_view_show_follows_the_database_clock(
    shift: timedelta,
) -> None:
    locks.acquire("gate:t", ttl=40, holder="alice")
    locks.acquire("orders:old", ttl=0.05, holder="bob")
    time.sleep(0.2)
    User.objects.create_superuser("root", password="pw")
    client = Client()
    client.force_login(User.objects.get(username="root"))
    with time_machine.travel(datetime.now(UTC) + shift, tick=True):
        out = io.StringIO()
        call_command("locks", "list", "--json", "--all", stdout=out)
        rows = {row["name"]: row for row in json.loads(out.getvalue())}
        assert rows["gate:t"]["state"] == "held" and 0 < rows["gate:t"]["expires_in"] <= 40
        assert rows["orders:old"]["state"] == "expired" and rows["orders:old"]["expires_in"] < 0

        html = client.get("/admin/locks/lock/").content.decode()
        assert cells(html, "state") == ["expired", "held"]  # newest first
        left = [float(value) for value in cells(html, "expires_in")]
        assert left[0] < 0 < left[1] <= 40

        response = client.get("/locking/gated/t/")
        assert response.status_code == 423
        assert 1 <= int(response["Retry-After"]) <= 40
