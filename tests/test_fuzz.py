"""Fuzzed bad input: each call works or raises ValueError/TypeError/LockError; no stray rows."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta
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
ARGUMENTS = ("name", "ttl", "timeout", "holder", "using")
ANY = st.one_of(
    st.none(), st.booleans(), st.binary(max_size=4), st.lists(st.integers(), max_size=2)
)
EVERY_CHARACTER = st.characters(exclude_categories=())  # lone surrogates too
VALID_TEXT = st.text(min_size=1, max_size=255).filter(lambda text: "\x00" not in text)
VALID = {
    "name": st.one_of(VALID_TEXT, st.sampled_from([BUSY, " ", "Å" * 255, "𝄞" * 255])),
    "ttl": st.one_of(
        st.floats(min_value=0.001, max_value=3600),
        st.integers(min_value=1, max_value=3600),
        st.timedeltas(min_value=timedelta(milliseconds=1), max_value=timedelta(hours=1)),
    ),
    "timeout": st.one_of(st.floats(min_value=0, max_value=0.2), st.just(0)),
    "holder": st.one_of(st.none(), VALID_TEXT, st.just(OTHER)),
    "using": st.sampled_from([None, "default"]),
}
NUMBERS = st.one_of(
    st.floats(),  # NaN, infinities, subnormals, huge
    st.integers(min_value=-(10**400), max_value=10**400),
    st.timedeltas(),
    st.decimals(allow_nan=True),
    st.fractions(),
    st.text(max_size=4),
    ANY,
)
FUZZED = {
    "name": st.one_of(
        st.text(EVERY_CHARACTER, max_size=300),  # NUL, lone surrogates, emoji, RTL marks
        st.text(min_size=250, max_size=260),  # around the length limit
        st.sampled_from(["", "x\x00", "\ud800", "Å" * 256]),
        st.integers(),
        ANY,
    ),
    "ttl": NUMBERS,
    # A wait on the busy name must end: no unbounded or long timeouts there.
    "timeout": st.one_of(
        st.floats(max_value=0.2),
        st.sampled_from([math.nan, -math.inf, -1, "0", True, 10**400, -(10**400)]),
        st.decimals(allow_nan=True),
        ANY.filter(lambda value: value is not None),
    ),
    "holder": st.one_of(st.text(EVERY_CHARACTER, max_size=300), st.integers(), ANY),
    "using": st.one_of(st.text(max_size=8), st.integers(), ANY),
}
CALLS = st.sampled_from(["try_acquire", "acquire", "lock", "is_locked", "check_token", "break"])


def run(call: str, arguments: dict[str, Any]) -> Any:
    name, ttl, using = arguments["name"], arguments["ttl"], arguments["using"]
    waiting = {key: arguments[key] for key in ("ttl", "timeout", "holder", "using")}
    if call == "try_acquire":
        return locks.try_acquire(name, ttl=ttl, holder=arguments["holder"], using=using)
    if call == "acquire":
        return locks.acquire(name, **waiting)
    if call == "lock":
        with locks.lock(name, **waiting) as lease:
            assert Lock.objects.filter(name=name, token=lease.token).exists()
        return None
    if call == "is_locked":
        return locks.is_locked(name, using=using)
    if call == "check_token":
        return locks.check_token(name, ttl, using=using)
    return locks.break_lock(name, using=using) if name != BUSY else None


@given(call=CALLS, fuzzed=st.sets(st.sampled_from(ARGUMENTS), max_size=2), data=st.data())
@settings(
    max_examples=400,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_fuzzed_arguments_work_or_fail_cleanly_and_leave_no_stray_row(
    own_queries: Capture, busy: locks.Lease, call: str, fuzzed: set[str], data: st.DataObject
) -> None:
    arguments = {
        key: data.draw(FUZZED[key] if key in fuzzed else VALID[key], label=key) for key in ARGUMENTS
    }
    if call == "check_token" and "ttl" not in fuzzed:
        arguments["ttl"] = data.draw(st.integers(min_value=1, max_value=2**62), label="token")
    with own_queries() as queries:
        try:
            result = run(call, arguments)
        except (ValueError, TypeError) as exc:
            # Refused before any query, with a message; only ever for a fuzzed argument.
            assert fuzzed, exc
            assert queries.captured_queries == [], exc
            assert str(exc)
            result = None
        except locks.LockError as exc:
            assert str(exc)
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
