"""Fuzzed bad input: each call works or raises ValueError/TypeError/LockError; no stray rows."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import locks
from locks.models import Lock

pytestmark = pytest.mark.django_db(transaction=True)

Capture = Callable[[], CaptureQueriesContext]

BUSY = "fuzz:busy"  # held by another holder for the whole test
OTHER = "someone-else"
ANY = st.one_of(
    st.none(), st.booleans(), st.binary(max_size=4), st.lists(st.integers(), max_size=2)
)
NAMES = st.one_of(
    st.text(max_size=300),  # any code point: NUL, lone surrogates, emoji, right-to-left marks
    st.text(min_size=250, max_size=260),  # around the length limit
    st.sampled_from([BUSY, "fuzz:free", " ", "x\x00", "\ud800", "Å" * 255, "𝄞" * 255]),
    st.integers(),
    ANY,
)
NUMBERS = st.one_of(
    st.floats(),  # NaN, infinities, subnormals, huge
    st.integers(min_value=-(10**400), max_value=10**400),
    st.timedeltas(),
    st.decimals(allow_nan=True),
    st.fractions(),
    st.text(max_size=4),
    ANY,
)
# A wait on the busy name must end: no unbounded or long timeouts there.
SHORT_WAITS = st.one_of(
    st.floats(max_value=0.2),
    st.sampled_from([math.nan, -math.inf, -1, "0", True, 10**400, -(10**400)]),
)
HOLDERS = st.one_of(st.none(), st.text(max_size=300), st.integers(), st.just(OTHER))
USING = st.one_of(st.none(), st.sampled_from(["default", "nope", ""]), st.integers())
CALLS = st.sampled_from(["try_acquire", "acquire", "lock", "is_locked", "check_token", "break"])
EXPECTED = (ValueError, TypeError, locks.LockError)


def run(call: str, name: Any, ttl: Any, timeout: Any, holder: Any, using: Any) -> Any:
    if call == "try_acquire":
        return locks.try_acquire(name, ttl=ttl, holder=holder, using=using)
    if call == "acquire":
        return locks.acquire(name, ttl=ttl, timeout=timeout, holder=holder, using=using)
    if call == "lock":
        with locks.lock(name, ttl=ttl, timeout=timeout, holder=holder, using=using) as lease:
            assert Lock.objects.filter(name=name, token=lease.token).exists()
        return None
    if call == "is_locked":
        return locks.is_locked(name, using=using)
    if call == "check_token":
        return locks.check_token(name, ttl, using=using)
    return locks.break_lock(name, using=using) if name != BUSY else None


@given(
    call=CALLS,
    name=NAMES,
    ttl=NUMBERS,
    timeout=NUMBERS,
    wait=SHORT_WAITS,
    holder=HOLDERS,
    using=USING,
)
@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_fuzzed_arguments_work_or_fail_cleanly_and_leave_no_stray_row(
    own_queries: Capture,
    busy: locks.Lease,
    call: str,
    name: Any,
    ttl: Any,
    timeout: Any,
    wait: Any,
    holder: Any,
    using: Any,
) -> None:
    if name == BUSY:
        timeout = wait
    with own_queries() as queries:
        try:
            result = run(call, name, ttl, timeout, holder, using)
        except (ValueError, TypeError) as exc:
            # Refused before any query, with a message that says what was wrong.
            assert queries.captured_queries == [], exc
            assert str(exc)
            result = None
        except locks.LockError as exc:
            assert isinstance(name, str) and str(exc)
            result = None
    if isinstance(result, locks.Lease):
        row = Lock.objects.get(name=result.name)
        assert (row.holder, row.token) == (result.holder, result.token)
        try:
            result.release()
        except locks.LockLost:  # a TTL of a millisecond or so runs out at once
            assert result.ttl < 1
    rows = {lock.name: lock.token for lock in Lock.objects.all()}
    assert rows == {BUSY: busy.token}, "a row is left that no live lease accounts for"


@pytest.fixture
def busy() -> locks.Lease:
    return locks.acquire(BUSY, ttl=600, holder=OTHER)


@pytest.mark.parametrize("value", [10**400, -(10**400)], ids=["huge", "minus-huge"])
@pytest.mark.parametrize("argument", ["ttl", "timeout"])
def test_an_int_too_big_for_a_float_is_refused_with_a_value_error(
    own_queries: Capture, argument: str, value: int
) -> None:
    arguments: dict[str, Any] = {argument: value}
    with own_queries() as queries, pytest.raises(ValueError, match=argument):
        locks.acquire("orders:1", **arguments)
    assert queries.captured_queries == []
    assert not Lock.objects.exists()
