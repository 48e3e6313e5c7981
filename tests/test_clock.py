"""The database clock decides expiry: moving the app server's clock changes nothing."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection

import locks
from locks.backends import for_connection

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
