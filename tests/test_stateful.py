"""A hypothesis state machine drives leases of several holders and checks them against a model."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from django.db import connection
from hypothesis import HealthCheck, assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

import locks
from locks.backends import for_connection
from locks.models import Lock

pytestmark = pytest.mark.django_db(transaction=True)

NAMES = ("a", "b")
HOLDERS = ("h0", "h1", "h2")
SHORT, LONG = 0.2, 60.0  # seconds; a short lease is expired on purpose by waiting it out
#: No step starts while a lease is this close to expiring: it is waited out first, so a
#: lease never expires in the middle of a step (a step that takes longer is discarded).
MARGIN = timedelta(seconds=0.1)
#: The greatest token each name was granted, across examples: tokens never go back.
GRANTED: dict[str, int] = {}

# Which leases are live or held depends on the real clock, and hypothesis requires the
# same earlier choices to lead to the same kinds of choices (or it fails the run as
# flaky). So no rule has a precondition, and rules draw from fixed ranges: a name, a
# holder, or a number that picks among whatever leases the state has (none: a no-op).
PICK = st.integers(0, 63)


def picked(pick: int, leases: list[locks.Lease]) -> locks.Lease | None:
    return leases[pick % len(leases)] if leases else None


@dataclass
class Row:
    """The model of one lock row."""

    holder: str
    token: int
    count: int
    expires_at: datetime


def database_now() -> datetime:
    with connection.cursor() as cursor:
        return for_connection(connection).now(cursor)


class LeaseMachine(RuleBasedStateMachine):
    """Acquire, re-enter, renew, release, expire, reap and break, by three holders."""

    def __init__(self) -> None:
        super().__init__()
        Lock.objects.all().delete()
        self.rows: dict[str, Row] = {}
        self.leases: list[locks.Lease] = []
        self.state: dict[int, str] = {}  # id(lease) -> held / lost / released
        self.began = database_now()

    # --- time -----------------------------------------------------------------------
    def settle(self) -> None:
        """Wait out leases about to expire; then every lease is surely live or expired."""
        now = database_now()
        soon = [r.expires_at for r in self.rows.values() if now < r.expires_at <= now + MARGIN]
        if soon:
            time.sleep((max(soon) - now).total_seconds() + 0.005)
            now = database_now()
        self.began = now

    def live(self, row: Row | None) -> bool:
        return row is not None and row.expires_at > self.began

    def confirm(self) -> None:
        """Discard the example if a lease expired while the step ran (a slow machine)."""
        ended = database_now()
        assume(not any(self.began < r.expires_at <= ended for r in self.rows.values()))

    # --- rules ----------------------------------------------------------------------
    @rule(holder=st.sampled_from(HOLDERS), name=st.sampled_from(NAMES), short=st.booleans())
    def acquire(self, holder: str, name: str, short: bool) -> None:
        self.try_acquire(holder, name, short)

    @rule(name=st.sampled_from(NAMES), short=st.booleans())
    def reenter(self, name: str, short: bool) -> None:
        row = self.rows.get(name)
        if row is not None:
            self.try_acquire(row.holder, name, short)

    @rule(name=st.sampled_from(NAMES), holder=st.sampled_from(HOLDERS), short=st.booleans())
    def contend(self, name: str, holder: str, short: bool) -> None:
        row = self.rows.get(name)
        if row is None:
            return
        if holder == row.holder:
            holder = HOLDERS[(HOLDERS.index(holder) + 1) % len(HOLDERS)]
        self.try_acquire(holder, name, short)

    def try_acquire(self, holder: str, name: str, short: bool) -> None:
        self.settle()
        lease = locks.try_acquire(name, ttl=SHORT if short else LONG, holder=holder)
        self.confirm()
        row = self.rows.get(name)
        if self.live(row) and row is not None and row.holder != holder:
            assert lease is None
            return
        assert lease is not None
        if self.live(row) and row is not None:  # re-entry: same token, one more count
            assert (lease.token, lease.count) == (row.token, row.count + 1)
            assert lease.expires_at >= row.expires_at
            row.count, row.expires_at = lease.count, lease.expires_at
        else:  # free or expired: a fresh holding with a greater token
            assert lease.count == 1
            assert lease.token > GRANTED.get(name, 0)
            GRANTED[name] = lease.token
            self.rows[name] = Row(holder, lease.token, 1, lease.expires_at)
        self.leases.append(lease)
        self.state[id(lease)] = "held"

    def held(self) -> list[locks.Lease]:
        return [lease for lease in self.leases if self.state[id(lease)] == "held"]

    def ours(self, lease: locks.Lease) -> Row | None:
        row = self.rows.get(lease.name)
        return row if row is not None and row.token == lease.token else None

    @rule(pick=PICK)
    def renew(self, pick: int) -> None:
        if lease := picked(pick, self.held()):
            self.renew_one(lease)

    @rule(pick=PICK)
    def renew_any(self, pick: int) -> None:
        if lease := picked(pick, self.leases):
            self.renew_one(lease)

    def renew_one(self, lease: locks.Lease) -> None:
        self.settle()
        state, row = self.state[id(lease)], self.ours(lease)
        if state == "released":
            with pytest.raises(locks.LockError, match="already released") as raised:
                lease.renew()
            assert not isinstance(raised.value, locks.LockLost)
        elif state == "held" and self.live(row) and row is not None:
            lease.renew()
            assert lease.expires_at >= row.expires_at
            row.expires_at = lease.expires_at
        else:
            with pytest.raises(locks.LockLost):
                lease.renew()
            self.state[id(lease)] = "lost"
        self.confirm()

    @rule(pick=PICK)
    def release(self, pick: int) -> None:
        if lease := picked(pick, self.held()):
            self.release_one(lease)

    @rule(pick=PICK)
    def release_any(self, pick: int) -> None:
        if lease := picked(pick, self.leases):
            self.release_one(lease)

    def release_one(self, lease: locks.Lease) -> None:
        self.settle()
        state, row = self.state[id(lease)], self.ours(lease)
        if state == "released":
            with pytest.raises(locks.LockError, match="already released"):
                lease.release()
        elif row is not None and self.live(row):
            lease.release()
            row.count -= 1
            if row.count == 0:
                del self.rows[lease.name]
        else:  # expired (its row goes) or taken over, broken, reaped
            with pytest.raises(locks.LockLost):
                lease.release()
            if row is not None:
                del self.rows[lease.name]
        self.state[id(lease)] = "released"
        self.confirm()

    @rule(name=st.sampled_from(NAMES))
    def expire(self, name: str) -> None:
        row = self.rows.get(name)
        if row is None or row.expires_at - self.began >= timedelta(seconds=1):
            return  # a long lease: not worth the wait
        while (now := database_now()) <= row.expires_at:
            time.sleep(0.02)
        self.began = now

    @rule()
    def reap(self) -> None:
        self.settle()
        expired = [name for name, row in self.rows.items() if not self.live(row)]
        assert locks.reap_expired() == len(expired)
        for name in expired:
            del self.rows[name]
        self.confirm()

    @rule(name=st.sampled_from(NAMES))
    def break_lock(self, name: str) -> None:
        assert locks.break_lock(name) == (name in self.rows)
        self.rows.pop(name, None)

    @rule(name=st.sampled_from(NAMES))
    def inspect(self, name: str) -> None:
        self.settle()
        row = self.rows.get(name)
        assert locks.is_locked(name) == self.live(row)
        if row is not None:
            assert locks.check_token(name, row.token) == self.live(row)
            assert not locks.check_token(name, row.token + 1)
        self.confirm()

    @invariant()
    def table_matches_the_model(self) -> None:
        table = {lock.name: (lock.holder, lock.token, lock.count) for lock in Lock.objects.all()}
        assert table == {n: (r.holder, r.token, r.count) for n, r in self.rows.items()}


def test_random_lease_operations_agree_with_the_model() -> None:
    run_state_machine_as_test(
        LeaseMachine,
        settings=settings(
            max_examples=40,
            stateful_step_count=50,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow],
        ),
    )
