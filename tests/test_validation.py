"""Bad input gets a clear error before any query runs, and nothing is written."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

import locks
from locks.decorators import lock_view
from locks.models import Lock

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])

BAD_NAMES = [
    ("", ValueError, "must not be empty"),
    (42, TypeError, "must be a str"),
    (None, TypeError, "must be a str"),
    (b"orders:1", TypeError, "must be a str"),
    ("orders\x00:1", ValueError, "NUL"),
    ("x" * 256, ValueError, "the limit is 255"),
    ("\ud800", ValueError, "not valid Unicode"),
]
BAD_TTLS = [
    (0, ValueError, "at least"),
    (-5, ValueError, "at least"),
    (0.0001, ValueError, "at least"),
    (math.nan, ValueError, "finite"),
    (math.inf, ValueError, "finite"),
    (-math.inf, ValueError, "finite"),
    (10**9, ValueError, "absurd"),
    (True, TypeError, "number of seconds"),
    ("30", TypeError, "number of seconds"),
]
BAD_TIMEOUTS = [
    (-1, ValueError, "negative"),
    (-math.inf, ValueError, "negative"),
    (math.nan, ValueError, "NaN"),
    (10**9, ValueError, "absurd"),
    (False, TypeError, "number of seconds"),
    ("5", TypeError, "number of seconds"),
]
BAD_HOLDERS = [
    ("", ValueError, "must not be empty"),
    (7, TypeError, "must be a str"),
    ("a\x00b", ValueError, "NUL"),
    ("h" * 256, ValueError, "the limit is 255"),
]
BAD_NOTES = [(7, TypeError, "must be a str"), ("n" * 256, ValueError, "the limit is 255")]
BAD_ALIASES = [("nope", ValueError, "unknown database alias"), (3, TypeError, "alias")]


@pytest.fixture
def nothing_happens(own_queries: Callable[[], CaptureQueriesContext]) -> Iterator[None]:
    """The call under test runs no statement and leaves both lock tables empty."""
    with own_queries() as queries:
        yield
    assert queries.captured_queries == []
    assert Lock.objects.count() == 0
    assert Lock.objects.using("other").count() == 0


def acquiring_calls(**kwargs: Any) -> list[Callable[[], object]]:
    name = kwargs.pop("name", "orders:1")
    return [
        lambda: locks.acquire(name, **kwargs),
        lambda: locks.try_acquire(name, **{k: v for k, v in kwargs.items() if k != "timeout"}),
        lambda: locks.lock(name, **kwargs),
    ]


def expect(error: type[Exception], message: str, calls: list[Callable[[], object]]) -> None:
    for call in calls:
        with pytest.raises(error, match=message):
            call()


@pytest.mark.parametrize(("name", "error", "message"), BAD_NAMES)
@pytest.mark.usefixtures("nothing_happens")
def test_bad_names_are_refused(name: Any, error: type[Exception], message: str) -> None:
    expect(error, message, acquiring_calls(name=name))
    expect(
        error,
        message,
        [
            lambda: locks.is_locked(name),
            lambda: locks.check_token(name, 1),
            lambda: locks.break_lock(name),
        ],
    )


@pytest.mark.parametrize(("ttl", "error", "message"), BAD_TTLS)
@pytest.mark.usefixtures("nothing_happens")
def test_bad_ttls_are_refused(ttl: Any, error: type[Exception], message: str) -> None:
    expect(error, message, acquiring_calls(ttl=ttl))


@pytest.mark.parametrize(("timeout", "error", "message"), BAD_TIMEOUTS)
@pytest.mark.usefixtures("nothing_happens")
def test_bad_timeouts_are_refused(timeout: Any, error: type[Exception], message: str) -> None:
    expect(error, message, [lambda: locks.acquire("o", timeout=timeout)])
    expect(error, message, [lambda: locks.lock("o", timeout=timeout)])


@pytest.mark.parametrize(("holder", "error", "message"), BAD_HOLDERS)
@pytest.mark.usefixtures("nothing_happens")
def test_bad_holders_are_refused(holder: Any, error: type[Exception], message: str) -> None:
    expect(error, message, acquiring_calls(holder=holder))


@pytest.mark.parametrize(("note", "error", "message"), BAD_NOTES)
@pytest.mark.usefixtures("nothing_happens")
def test_bad_notes_are_refused(note: Any, error: type[Exception], message: str) -> None:
    expect(error, message, acquiring_calls(note=note))


@pytest.mark.parametrize(("using", "error", "message"), BAD_ALIASES)
@pytest.mark.usefixtures("nothing_happens")
def test_bad_aliases_are_refused(using: Any, error: type[Exception], message: str) -> None:
    expect(error, message, acquiring_calls(using=using))
    expect(error, message, [lambda: locks.is_locked("o", using=using)])
    expect(error, message, [lambda: locks.reap_expired(using=using)])


@pytest.mark.parametrize(
    ("token", "error"), [("1", TypeError), (True, TypeError), (0, ValueError), (2**63, ValueError)]
)
@pytest.mark.usefixtures("nothing_happens")
def test_bad_tokens_are_refused(token: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="token"):
        locks.check_token("orders:1", token)


@pytest.mark.parametrize(
    ("batch_size", "error"),
    [(0, ValueError), (-1, ValueError), (True, TypeError), (10**7, ValueError)],
)
@pytest.mark.usefixtures("nothing_happens")
def test_bad_batch_sizes_are_refused(batch_size: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="batch_size"):
        locks.reap_expired(batch_size=batch_size)


@pytest.mark.usefixtures("nothing_happens")
def test_bad_auto_renew_and_bad_renew_ttl_are_refused() -> None:
    with pytest.raises(TypeError, match="auto_renew"):
        locks.lock("orders:1", auto_renew="yes")  # type: ignore[arg-type]
    # lock_view refuses it where it decorates, not at the view's first request.
    with pytest.raises(TypeError, match="auto_renew must be True or False, not 1"):
        lock_view("orders:1", auto_renew=1)  # type: ignore[arg-type]


def test_bad_renew_ttl_changes_nothing(own_queries: Callable[[], CaptureQueriesContext]) -> None:
    lease = locks.acquire("orders:1", ttl=30)
    before = Lock.objects.get(name="orders:1").expires_at
    with own_queries() as queries, pytest.raises(ValueError, match="ttl"):
        lease.renew(ttl=-1)
    assert queries.captured_queries == []
    assert Lock.objects.get(name="orders:1").expires_at == before
    lease.release()


def test_infinite_timeout_means_wait_without_limit() -> None:
    with locks.lock("orders:1", timeout=math.inf) as lease:
        assert lease.held


@pytest.mark.parametrize("entirely", ["no", 1, None])
def test_release_with_entirely_not_a_bool_is_refused_and_releases_nothing(
    entirely: Any, own_queries: Callable[[], CaptureQueriesContext]
) -> None:
    outer = locks.acquire("orders:1")
    inner = locks.acquire("orders:1")
    with own_queries() as queries, pytest.raises(TypeError, match="entirely"):
        inner.release(entirely=entirely)
    assert queries.captured_queries == []
    assert Lock.objects.get(name="orders:1").count == 2
    inner.release()
    outer.release()


def test_a_bad_renew_fraction_set_after_lock_was_built_fails_before_any_grant() -> None:
    guard = locks.lock("orders:1", ttl=5, auto_renew=True)
    with (
        override_settings(LOCKS={"RENEW_FRACTION": 1}),
        pytest.raises(ValueError, match="RENEW_FRACTION"),
        guard,
    ):
        pass
    assert not Lock.objects.exists()  # no lease left that nothing could release
