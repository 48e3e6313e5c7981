"""lock_view on a live server: one request at a time per key, 423 for the others, release."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast
from unittest.mock import ANY
from urllib.parse import quote

import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import User
from django.core.handlers.base import BaseHandler
from django.db import connection, connections, transaction
from django.db.models import F
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.test import AsyncClient, Client, RequestFactory, override_settings
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View
from django.views.decorators.cache import cache_page
from hypothesis import given
from hypothesis import strategies as st

import locks
from locks import decorators, leases, validation
from locks.aio import run_sync
from locks.decorators import LockViewMixin, lock_key, lock_view
from locks.keys import encode_value, fit_name
from locks.models import Lock
from tests import views_locking
from tests.app.models import Counter
from tests.conftest import finish, spawn

OTHER = "test-process-other-holder"  # a holder that is not the live server's request thread


def http(url: str, timeout: float = 60) -> tuple[int, Any, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


def wait_until(condition: Any, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def held() -> Iterator[Any]:
    """Hold lock names as another holder for the length of a test."""
    leases: list[locks.Lease] = []

    def hold(name: str, ttl: float = 30) -> locks.Lease:
        lease = locks.acquire(name, ttl=ttl, timeout=0, holder=OTHER)
        leases.append(lease)
        return lease

    yield hold
    for lease in leases:
        if lease.held:
            lease.release()


# --- keys ----------------------------------------------------------------------------------


def test_lock_key_percent_encodes_every_value_character_but_letters_and_digits() -> None:
    assert lock_key("invoice:{pk}", pk=42) == "invoice:42"
    assert lock_key("file:{path}", path="a/b:c") == "file:a%2Fb%3Ac"
    assert lock_key("user:{name}", name="Jürgen") == "user:J%C3%BCrgen"
    assert lock_key("x:{v}", v="100%-_.~") == "x:100%25%2D%5F%2E%7E"
    assert lock_key("report-{year}-{month}", year=2024, month="05") == "report-2024-05"
    # One field followed by letters is unambiguous: the literal after it is fixed.
    assert lock_key("export:{pk}csv", pk=7) == "export:7csv"
    assert lock_key("{pk}v2", pk="1v") == "1vv2"


@given(
    a=st.tuples(st.text(max_size=8), st.text(max_size=8)),
    b=st.tuples(st.text(max_size=8), st.text(max_size=8)),
)
def test_different_values_never_make_the_same_key(a: tuple[str, str], b: tuple[str, str]) -> None:
    for template in ("t:{0}-{1}", "{0}/{1}", "{0}:x{1}"):
        same = lock_key(template, *a) == lock_key(template, *b)
        assert same == (a == b), (template, a, b)


def test_long_keys_are_hashed_to_fit_and_keep_a_readable_prefix() -> None:
    short = lock_key("doc:{v}", v="x" * 240)
    assert short == "doc:" + "x" * 240
    one, two = lock_key("doc:{v}", v="x" * 400), lock_key("doc:{v}", v="x" * 399 + "y")
    assert len(one) == len(two) == 255
    assert one != two
    assert one.startswith("doc:xxxx") and "~" in one
    # A hashed name is always 255 long, a kept one shorter: the two kinds never meet.
    assert len(fit_name("a" * 254)) == 254 and len(fit_name("a" * 255)) == 255
    assert fit_name("a" * 255) != "a" * 255


@pytest.mark.parametrize(
    ("template", "error"),
    [
        ("{a}{b}", ValueError),  # "1"+"23" would be "12"+"3"
        ("{a}x{b}", ValueError),  # a letter cannot separate encoded values
        ("{a}%{b}", ValueError),
        ("x:{a", ValueError),
        ("", ValueError),
        ("a\x00{b}", ValueError),
        ("{a:{b}}", ValueError),
        ("doc:\ud800{a}", ValueError),  # a lone surrogate: no text a database can store
        # What format() refuses only once it fills the key, at every request (a 500).
        ("doc:{a!z}", ValueError),  # no such conversion
        ("doc:{}:{0}", ValueError),  # automatic and manual field numbering mixed
        ("doc:{0}:{}", ValueError),
        ("doc:{.pk}", ValueError),  # the keyword "", which no view gets
        ("doc:{[0]}", ValueError),
        (42, TypeError),
    ],
)
def test_bad_key_templates_are_refused_when_decorating(template: Any, error: type) -> None:
    with pytest.raises(error, match=r"lock_view key|expected"):
        lock_view(template)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"ttl": 0}, ValueError),
        ({"ttl": float("nan")}, ValueError),
        ({"timeout": -1}, ValueError),
        ({"status": 200}, ValueError),
        ({"status": "423"}, TypeError),
        ({"retry_after": -1}, ValueError),
        ({"retry_after": 1.5}, TypeError),
        ({"using": "nope"}, ValueError),
        ({"note": "x" * 300}, ValueError),
        ({"response": "busy.html"}, TypeError),
        ({"response": views_locking.async_busy}, TypeError),
        ({"template_name": 5}, TypeError),
        ({"template_name": ""}, TypeError),
        ({"template_name": []}, TypeError),
        ({"template_name": ["busy.html", 5]}, TypeError),
    ],
)
def test_bad_options_are_refused_when_decorating_and_touch_nothing(
    options: dict[str, Any], error: type
) -> None:
    with pytest.raises(error):
        lock_view("k:{pk}", **options)
    assert not Lock.objects.exists()


@pytest.mark.parametrize(
    ("template", "key"),
    [("doc:{0[1]}:{}", "doc:b:ab"), ("doc:{}:{0[1]}", "doc:ab:b"), ("doc:{0.pk}:{}", "doc:7:7")],
)
def test_numbered_fields_with_an_attribute_or_index_mix_with_automatic_ones(
    template: str, key: str
) -> None:
    # lock_key fills keys with string.Formatter, which counts only a bare "{0}" as manual
    # numbering: these fill fine at every request, and must not be refused when decorating.
    value = "ab" if "[" in template else type("Row", (str,), {"pk": 7})("7")
    assert lock_key(template, value) == key
    lock_view(template)


@pytest.mark.parametrize("bad", ["\x00", "\ud800"], ids=["nul", "lone-surrogate"])
def test_a_character_refused_in_a_short_key_is_refused_in_a_long_one(bad: str) -> None:
    # Not hashed away past the kept prefix of a long key.
    for key in ("doc:" + bad, "doc:" + "x" * 300 + bad):
        with pytest.raises(ValueError, match=r"NUL|not valid Unicode"):
            validation.check_name(fit_name(key))


def test_missing_key_field_names_the_field() -> None:
    with pytest.raises(ValueError, match="'pk'"):
        lock_key("invoice:{pk}", id=1)


# --- live server ----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_from_processes_one_runs_the_others_get_423(
    live_server: Any, tmp_path: Path
) -> None:
    gate, log = tmp_path / "gate", tmp_path / "log"
    url = f"{live_server.url}/locking/gated/report/?gate={gate}&log={log}"
    workers = [spawn("get", url, module="tests.workers_django") for _ in range(4)]
    try:
        # Three finish with 423 while the one inside waits at its gate, however slow they start.
        assert wait_until(lambda: sum(w.poll() is not None for w in workers) >= 3, 120)
        assert locks.is_locked("gate:report")
    finally:
        gate.touch()
    responses = [finish(w)[0] for w in workers]

    statuses = sorted(r["status"] for r in responses)
    assert statuses == [200, 423, 423, 423]
    for busy in (r for r in responses if r["status"] == 423):
        assert 1 <= int(busy["retry_after"]) <= 60
    assert len(log.read_text().split()) == 1, "exactly one request ran the view"
    assert wait_until(lambda: not locks.is_locked("gate:report"), 30)


TRICKY = [":", "a:b", "a%3Ab", "a/b", "a%2Fb", "ü", "%C3%BC", "x" * 300, "x" * 299 + "y", "a-b"]


@pytest.mark.django_db(transaction=True)
def test_tricky_keys_neither_collide_nor_fail(live_server: Any, held: Any) -> None:
    names = []
    for value in TRICKY:
        status, _, body = http(f"{live_server.url}/locking/key/{quote(value, safe='')}/")
        assert status == 200, (value, body)
        name = json.loads(body)["name"]
        assert name == lock_key("key:{value}", value=value)
        names.append(name)
    assert len(set(names)) == len(TRICKY)
    assert not Lock.objects.exists(), "every lease was released"

    # Holding one of them makes exactly that one busy.
    held(lock_key("key:{value}", value="a:b"))
    statuses = {v: http(f"{live_server.url}/locking/key/{quote(v, safe='')}/")[0] for v in TRICKY}
    assert statuses.pop("a:b") == 423
    assert set(statuses.values()) == {200}


@pytest.mark.django_db(transaction=True)
def test_lease_is_released_when_the_view_raises(live_server: Any) -> None:
    for _ in range(2):  # the second request would get 423 if the first left the lease behind
        status, _, _ = http(f"{live_server.url}/locking/boom/x/")
        assert status == 500
    assert not locks.is_locked("boom:x")
    assert not Lock.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_lease_is_released_when_the_view_forgets_its_response(live_server: Any, kind: str) -> None:
    prefix = "a" if kind == "async" else ""
    for _ in range(2):  # Django refuses None with a 500; the second would be 423 if leaked
        assert http(f"{live_server.url}/locking/{prefix}nothing/x/")[0] == 500
    assert not Lock.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_view_may_release_its_lease_itself(live_server: Any, kind: str) -> None:
    url = f"{live_server.url}/locking/{'a' if kind == 'async' else ''}early/x/"
    assert http(url) == (200, ANY, b"released early\n")
    assert http(url + "?stream=1")[::2] == (200, b"streamed\n")
    assert not Lock.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_view_that_released_its_lease_and_failed_shows_its_own_error(kind: str) -> None:
    request = RequestFactory().get("/early/x/", {"fail": "1"})
    with pytest.raises(ValueError, match="the view's own error"):
        if kind == "async":
            asyncio.run(views_locking.aearly(request, name="x"))
        else:
            views_locking.early(request, name="x")
    assert not Lock.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_streaming_response_dropped_by_a_middleware_releases_its_lease(
    live_server: Any, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"{live_server.url}/locking/{'a' if kind == 'async' else ''}etag/x/"
    assert http(url)[::2] == (200, b"tagged\n")
    assert not locks.is_locked("etag:x")
    # ConditionalGetMiddleware answers 304 itself and drops the view's streaming response.
    request = urllib.request.Request(url, headers={"If-None-Match": '"v1"'})
    for _ in range(2):  # the second would get 423 if the first left its lease behind
        try:
            urllib.request.urlopen(request, timeout=60)
        except urllib.error.HTTPError as exc:
            assert exc.code == 304
        else:
            raise AssertionError("expected 304 Not Modified")
        assert wait_until(lambda: not locks.is_locked("etag:x"), 15)
    assert "dropped unsent" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_streaming_response_holds_the_lease_until_the_stream_ends(
    live_server: Any, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    with urllib.request.urlopen(f"{live_server.url}/locking/stream/s/?gate={gate}") as response:
        assert response.readline() == b"first\n"
        # The view has returned, the body is half sent: the lease must still be held.
        assert locks.is_locked("stream:s")
        assert http(f"{live_server.url}/locking/stream/s/")[0] == 423
        gate.touch()
        assert response.read() == b"last\n"
    assert wait_until(lambda: not locks.is_locked("stream:s"), 30)
    assert not Lock.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_busy_answer_is_configurable(live_server: Any, held: Any) -> None:
    for name in ("conflict:c", "template:c", "templates:c", "custom:c"):
        held(name)
    status, headers, _ = http(f"{live_server.url}/locking/conflict/c/")
    assert (status, headers["Retry-After"]) == (409, "7")
    status, headers, body = http(f"{live_server.url}/locking/template/c/")
    assert status == 423 and b"Lock template:c is busy" in body
    status, _, body = http(f"{live_server.url}/locking/templates/c/")  # the first that exists
    assert status == 423 and b"Lock templates:c is busy" in body
    assert 1 <= int(headers["Retry-After"]) <= 30
    status, headers, body = http(f"{live_server.url}/locking/custom/c/")
    assert status == 418 and json.loads(body)["busy"] == "custom:c"
    assert headers["Retry-After"] == str(json.loads(body)["retry"])


@pytest.mark.django_db(transaction=True)
def test_retry_after_is_the_holders_time_left_by_the_database_clock(
    live_server: Any, held: Any
) -> None:
    held("gate:t", ttl=40)
    status, headers, body = http(f"{live_server.url}/locking/gated/t/")
    assert status == 423
    assert b"retry after" in body
    assert 1 <= int(headers["Retry-After"]) <= 40


@pytest.mark.django_db(transaction=True)
def test_callable_and_request_keys(live_server: Any, held: Any) -> None:
    status, _, body = http(f"{live_server.url}/locking/callable/abc/")
    assert (status, json.loads(body)["name"]) == (200, "callable:ABC")
    status, _, body = http(f"{live_server.url}/locking/user/s-1/")
    assert (status, json.loads(body)["name"]) == (200, "user:None/s%2D1")  # anonymous user
    held("callable:ABC")
    assert http(f"{live_server.url}/locking/callable/abc/")[0] == 423


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("path", ["auser", "cbv/auser"], ids=["decorator", "mixin"])
def test_async_view_keyed_on_the_logged_in_user_builds_its_key_off_the_event_loop(
    path: str,
) -> None:
    # request.user is lazy: the key loads the session and the user from the database,
    # which Django refuses to do on the event loop (SynchronousOnlyOperation).
    user = User.objects.create_user("ada", password="pw")
    name = f"user:{user.pk}/report"

    async def main() -> tuple[tuple[int, str], int]:
        client = AsyncClient()
        try:
            await client.aforce_login(user)
            free = await client.get(f"/locking/{path}/report/")
            other = await run_sync(locks.acquire, name, ttl=30, timeout=0, holder=OTHER)
            try:
                busy = await client.get(f"/locking/{path}/report/")
            finally:
                await other.arelease()
        finally:
            # Sessions and users were loaded in asgiref's worker thread, on its own Django
            # connection: left open, it keeps the server from dropping the test database.
            await sync_to_async(connections.close_all)()
        return (free.status_code, json.loads(free.content)["name"]), busy.status_code

    free, busy = asyncio.run(main())
    assert free == (200, name), "the lease inside the view carries the user's pk"
    assert busy == 423, "a request while the user's lock is held elsewhere is refused"
    assert not locks.is_locked(name)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["mixin", "amixin", "decorated", "adecorated"])
def test_class_based_views(live_server: Any, held: Any, kind: str) -> None:
    url = f"{live_server.url}/locking/cbv/{kind}/7/"
    status, _, body = http(url)
    assert (status, json.loads(body)["name"]) == (200, "cbv:7")
    assert not locks.is_locked("cbv:7")
    held("cbv:7")
    status, headers, _ = http(url)
    assert status == 423 and int(headers["Retry-After"]) >= 1
    assert http(f"{live_server.url}/locking/cbv/{kind}/8/")[0] == 200


def test_sync_lock_view_inside_an_event_loop_says_what_to_do() -> None:
    @method_decorator(lock_view("cbv:{pk}"), name="dispatch")
    class Wrong(View):
        async def get(self, request: Any, pk: int) -> Any:  # pragma: no cover
            raise AssertionError("must not run")

    async def call() -> Any:
        view: Any = Wrong.as_view()
        return await view(RequestFactory().get("/"), pk=1)

    with pytest.raises(TypeError, match="LockViewMixin"):
        asyncio.run(call())


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("held", [False, True], ids=["free", "held"])
def test_sync_lock_view_on_an_async_views_dispatch_under_wsgi_says_what_to_do(
    held: bool,
) -> None:
    # Under WSGI no event loop runs when dispatch() is called; it returns the coroutine
    # of the async handler, which would run after the lease ended (or, busy, the 423
    # would be awaited as if it were that coroutine).
    @method_decorator(lock_view("cbv:{pk}", ttl=30), name="dispatch")
    class Wrong(View):
        async def get(self, request: Any, pk: int) -> Any:  # pragma: no cover
            raise AssertionError("must not run")

    other = locks.acquire("cbv:1", ttl=30, holder=OTHER) if held else None
    with pytest.raises(TypeError, match="LockViewMixin"):
        Wrong.as_view()(RequestFactory().get("/"), pk=1)
    assert Lock.objects.filter(name="cbv:1").count() == int(held)
    if other is not None:
        other.release()


def test_mixin_without_key_is_a_clear_error() -> None:
    class NoKey(LockViewMixin, View):
        pass

    with pytest.raises(TypeError, match="lock_key"):
        NoKey.as_view()(RequestFactory().get("/"))


def test_encode_value_output_is_letters_digits_and_escapes_only() -> None:
    assert set(encode_value("a-b_c.d~e f/g:h%ü")) <= set(
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789%"
    )


# --- transactions: the lease outlasts the request's writes ------------------------------------


@pytest.fixture
def locks_apart(backend: str) -> Iterator[str]:
    """Where leases go while a request's transaction is open on "default".

    SQLite allows one writer per file: there the locks get a file of their own, the
    documented setup for ATOMIC_REQUESTS; on a server database they stay on "default".
    """
    if backend == "sqlite":
        with override_settings(LOCKS={"DATABASE": "other"}):
            yield "other"
    else:
        yield "default"


def handle(path: str) -> HttpResponseBase:
    """Run a GET through Django's handler and middleware, as a server does, unclosed."""
    handler = BaseHandler()
    handler.load_middleware()
    return handler.get_response(RequestFactory().get(path))


BUMP_VIEWS = ["decorated", "mixin"]


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.usefixtures("atomic_requests")
@pytest.mark.parametrize("kind", BUMP_VIEWS)
def test_under_atomic_requests_the_next_holder_sees_the_committed_write(
    kind: str, locks_apart: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = Counter.objects.create(name="c")
    seen_by_next_holder: list[int] = []
    real_end = leases._end

    def end_then_next_request(lease: locks.Lease, failing: bool) -> None:
        real_end(lease, failing)

        # The lock is free: the next request takes it, then reads the counter.
        def next_request() -> None:
            try:
                with locks.lock(lease.name, ttl=30, timeout=0, holder=OTHER):
                    seen_by_next_holder.append(Counter.objects.get(pk=counter.pk).value)
            finally:
                connection.close()

        thread = threading.Thread(target=next_request)
        thread.start()
        thread.join()

    monkeypatch.setattr(decorators, "_end", end_then_next_request)
    response = Client().get(f"/locking/bump/{kind}/{counter.pk}/")
    assert (response.status_code, response.content) == (200, b"1")
    assert seen_by_next_holder == [1], "the lock was released before the write committed"


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.usefixtures("atomic_requests")
@pytest.mark.parametrize("outcome", ["commit", "rollback"])
@pytest.mark.parametrize("kind", BUMP_VIEWS)
def test_under_atomic_requests_the_transaction_ends_inside_the_lease(
    kind: str, outcome: str, locks_apart: str, caplog: pytest.LogCaptureFixture
) -> None:
    counter = Counter.objects.create(name="c")
    query = "?rollback=1" if outcome == "rollback" else ""
    response = handle(f"/locking/bump/{kind}/{counter.pk}/{query}")
    assert response.status_code == (409 if outcome == "rollback" else 200)
    # Committed (or rolled back) and released by the time the handler answers, before
    # the server sends the answer and closes it.
    assert Counter.objects.get(pk=counter.pk).value == (0 if outcome == "rollback" else 1)
    assert not locks.is_locked(f"bump:{counter.pk}")
    response.close()
    for _ in range(3):
        assert Client().get(f"/locking/bump/{kind}/{counter.pk}/{query}").status_code in (200, 409)
    assert not Lock.objects.using(locks_apart).exists()
    assert Counter.objects.get(pk=counter.pk).value == (0 if outcome == "rollback" else 4)
    assert "dropped unsent" not in caplog.text


def _in_atomic(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    return HttpResponse(str(connection.in_atomic_block))


class InAtomicMixinView(LockViewMixin, View):
    lock_key = "exempt"
    lock_ttl = 30

    def get(self, request: HttpRequest) -> HttpResponse:
        return _in_atomic(request)


@method_decorator(lock_view("exempt", ttl=30), name="dispatch")
class InAtomicDispatchView(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return _in_atomic(request)


@method_decorator(lock_view("exempt", ttl=30), name="dispatch")
@method_decorator(transaction.non_atomic_requests, name="dispatch")
class ExemptDispatchView(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return _in_atomic(request)


@method_decorator(transaction.non_atomic_requests, name="dispatch")
class ExemptMixinView(InAtomicMixinView):
    pass


class LockedGetView(View):
    @method_decorator(lock_view("exempt", ttl=30))
    def get(self, request: HttpRequest) -> HttpResponse:
        return _in_atomic(request)


def _no_wraps(view: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        return view(request, *args, **kwargs)

    return wrapper


_locked = lock_view("exempt", ttl=30)(_in_atomic)
_inner_other_key = lock_view("exempt:inner", ttl=30)(_in_atomic)
_non_atomic = transaction.non_atomic_requests
urlpatterns = [
    path("function/", _locked),
    path("function/under/", lock_view("exempt", ttl=30)(_non_atomic(_in_atomic))),
    path("function/over/", _non_atomic(lock_view("exempt", ttl=30)(_in_atomic))),
    path("mixin/", InAtomicMixinView.as_view()),
    path("mixin/dispatch/", ExemptMixinView.as_view()),
    path("mixin/url/", _non_atomic(InAtomicMixinView.as_view())),
    path("dispatch/", InAtomicDispatchView.as_view()),
    path("dispatch/under/", ExemptDispatchView.as_view()),
    # Django's own block outside the lock: released at its commit instead.
    path("outside/get/", LockedGetView.as_view()),
    path("outside/no-wraps/", _no_wraps(_locked)),
    path("outside/atomic/", transaction.atomic(_locked)),
    # Locked views inside a locked view's transaction: released after its commit.
    path("nested/", lock_view("exempt", ttl=30)(lambda request: _inner_other_key(request))),
    path("stacked/", lock_view("exempt", ttl=30)(_inner_other_key)),
]


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.usefixtures("atomic_requests", "locks_apart")
@override_settings(ROOT_URLCONF=__name__)
@pytest.mark.parametrize(
    ("url", "atomic"),
    [
        ("function/", b"True"),
        ("function/under/", b"False"),
        ("function/over/", b"False"),
        ("mixin/", b"True"),
        ("mixin/dispatch/", b"False"),
        ("mixin/url/", b"False"),
        ("dispatch/", b"True"),
        ("dispatch/under/", b"False"),
    ],
)
def test_a_locked_view_exempt_from_atomic_requests_runs_without_a_transaction(
    url: str, atomic: bytes
) -> None:
    response = handle(f"/{url}")
    assert cast(HttpResponse, response).content == atomic
    assert not Lock.objects.exists()


@pytest.fixture
def releases(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, set[str]]]:
    """Each lease lock_view releases: its name, and the aliases in a transaction then."""
    seen: list[tuple[str, set[str]]] = []
    real_end = leases._end

    def end(lease: locks.Lease, failing: bool) -> None:
        open_ = {alias for alias in ("default", "other") if connections[alias].in_atomic_block}
        seen.append((lease.name, open_))
        real_end(lease, failing)

    monkeypatch.setattr(decorators, "_end", end)
    return seen


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.usefixtures("atomic_requests", "locks_apart")
@override_settings(ROOT_URLCONF=__name__)
@pytest.mark.parametrize(
    "url",
    [
        "function/",
        "mixin/",
        "dispatch/",
        "outside/get/",
        "outside/no-wraps/",
        "outside/atomic/",
        "nested/",
        "stacked/",
    ],
)
def test_under_atomic_requests_every_lease_outlasts_the_requests_transaction(
    url: str, releases: list[tuple[str, set[str]]]
) -> None:
    response = handle(f"/{url}")
    assert cast(HttpResponse, response).content == b"True"
    assert releases and all("default" not in open_ for _, open_ in releases), releases
    assert not Lock.objects.exists()


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.usefixtures("atomic_requests", "locks_apart")
def test_a_reentry_past_its_own_ttl_under_a_live_holding_commits() -> None:
    @lock_view("reentered", ttl=0.3)
    def inner(request: HttpRequest) -> HttpResponse:
        time.sleep(0.5)
        return HttpResponse("inner")

    @lock_view("reentered", ttl=30)
    def outer(request: HttpRequest) -> HttpResponse:
        return inner(request)

    handler = BaseHandler()
    handler.load_middleware()
    response = handler.make_view_atomic(outer)(RequestFactory().get("/"))
    assert cast(HttpResponse, response).content == b"inner"
    assert not locks.is_locked("reentered")


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.usefixtures("atomic_requests", "locks_apart")
@override_settings(
    CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
    MIDDLEWARE=[
        "django.middleware.cache.UpdateCacheMiddleware",
        "django.middleware.http.ConditionalGetMiddleware",
        "django.middleware.cache.FetchFromCacheMiddleware",
    ],
)
def test_under_atomic_requests_cached_and_not_modified_responses_release_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    counter = Counter.objects.create(name="c")
    cached = cache_page(60)(lock_view("cached:{pk}", ttl=30)(views_locking._bump))
    first = cached(RequestFactory().get("/cached/"), pk=counter.pk)
    assert first.status_code == 200
    assert not locks.is_locked(f"cached:{counter.pk}")
    # A response the cache pickled, then a 304 that replaces the view's own.
    response = Client().get(f"/locking/bump/decorated/{counter.pk}/")
    assert response.status_code == 200
    again = Client().get(
        f"/locking/bump/decorated/{counter.pk}/", HTTP_IF_NONE_MATCH=response.get("ETag", "*")
    )
    assert again.status_code in (200, 304)
    assert not Lock.objects.exists() and not locks.is_locked(f"bump:{counter.pk}")
    assert "dropped unsent" not in caplog.text


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.usefixtures("atomic_requests")
def test_under_atomic_requests_a_lease_lost_before_the_view_returns_rolls_its_writes_back(
    locks_apart: str,
) -> None:
    # Found out before the commit, without a statement: LockLost rolls the writes back.
    counter = Counter.objects.create(name="c")
    response = Client(raise_request_exception=False).get(f"/locking/bump/past-ttl/{counter.pk}/")
    assert response.status_code == 500
    assert Counter.objects.get(pk=counter.pk).value == 0


@pytest.mark.django_db
def test_a_view_called_directly_in_a_test_case_releases_its_lease_as_it_returns(
    backend: str,
) -> None:
    # The test case's own transaction never commits: waiting for it would keep the lease
    # until the response is collected.
    if backend == "sqlite":
        pytest.skip("SQLite refuses a lease inside the test case's write transaction")
    counter = Counter.objects.create(name="c")
    response = views_locking.bump(RequestFactory().get("/"), pk=counter.pk)
    assert response.status_code == 200
    assert not locks.is_locked(f"bump:{counter.pk}")


# --- nested locked views --------------------------------------------------------------------


@lock_view("nested:{pk}", ttl=30)
def inner_view(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("inner")


@lock_view("nested:{pk}", ttl=30)
def outer_view(request: HttpRequest, pk: int) -> HttpResponse:
    own = request.lock_lease  # type: ignore[attr-defined]
    inner_view(request, pk=pk)  # the same key in the same request: a re-entry
    assert request.lock_lease is own  # type: ignore[attr-defined]
    request.lock_lease.renew()  # type: ignore[attr-defined]
    return HttpResponse("outer")


@lock_view("nested:{pk}", ttl=30)
async def ainner_view(request: HttpRequest, pk: int) -> HttpResponse:
    return HttpResponse("inner")


@lock_view("nested:{pk}", ttl=30)
async def aouter_view(request: HttpRequest, pk: int) -> HttpResponse:
    own = request.lock_lease  # type: ignore[attr-defined]
    await ainner_view(request, pk=pk)
    assert request.lock_lease is own  # type: ignore[attr-defined]
    await request.lock_lease.arenew()  # type: ignore[attr-defined]
    return HttpResponse("outer")


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.parametrize("kind", ["sync", "sync-in-atomic", "async"])
def test_a_nested_locked_view_leaves_the_caller_its_own_lease(
    kind: str, locks_apart: str, caplog: pytest.LogCaptureFixture
) -> None:
    request = RequestFactory().get("/outer/")
    if kind == "async":
        response = asyncio.run(aouter_view(request, pk=7))
    elif kind == "sync-in-atomic":
        with transaction.atomic():
            response = outer_view(request, pk=7)
    else:
        response = outer_view(request, pk=7)
    assert (response.status_code, response.content) == (200, b"outer")
    assert request.lock_lease.name == "nested:7"  # type: ignore[attr-defined]
    assert not request.lock_lease.held  # type: ignore[attr-defined]
    assert not locks.is_locked("nested:7")
    assert "dropped unsent" not in caplog.text


# --- LockViewMixin's key callable ------------------------------------------------------------


def _mixin_key(request: HttpRequest, *args: Any, **kwargs: Any) -> str:
    assert isinstance(request, HttpRequest), f"called with {request!r}, not the request"
    return f"mixin:{kwargs['pk']}"


class MethodKeyView(LockViewMixin, View):
    def lock_key(self, request: HttpRequest, *args: Any, **kwargs: Any) -> str:
        assert isinstance(self, MethodKeyView), f"called with {self!r}, not the view"
        return _mixin_key(request, *args, **kwargs)

    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return _lease_name(request)


class StaticKeyView(LockViewMixin, View):
    lock_key = staticmethod(_mixin_key)

    def get(self, request: HttpRequest, pk: int) -> HttpResponse:
        return _lease_name(request)


def _lease_name(request: HttpRequest) -> HttpResponse:
    return HttpResponse(request.lock_lease.name)  # type: ignore[attr-defined]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "view",
    [
        MethodKeyView.as_view(),
        StaticKeyView.as_view(),
        StaticKeyView.as_view(lock_key=_mixin_key),  # an instance attribute then
    ],
    ids=["method", "staticmethod", "as_view-argument"],
)
def test_a_mixin_key_callable_is_a_method_or_a_staticmethod_as_documented(view: Any) -> None:
    response = view(RequestFactory().get("/"), pk=3)
    assert (response.status_code, response.content) == (200, b"mixin:3")
    assert not Lock.objects.exists()


# --- transactions: views inside transactions opened outside the lock ------------------------


def _atomic_view(view: Callable[..., Any]) -> Callable[..., Any]:
    """``view`` as Django's handler wraps it for ATOMIC_REQUESTS."""
    handler = BaseHandler()
    handler.load_middleware()
    return cast(Callable[..., Any], handler.make_view_atomic(view))


@pytest.fixture
def atomic_requests_everywhere(backend: str) -> Iterator[None]:
    if backend == "sqlite":
        pytest.skip(
            "SQLite allows one writer per file: lock calls cannot run under "
            "ATOMIC_REQUESTS on the locks database's own alias"
        )
    settings = [connections[alias].settings_dict for alias in ("default", "other")]
    for one in settings:
        one["ATOMIC_REQUESTS"] = True
    try:
        yield
    finally:
        for one in settings:
            one["ATOMIC_REQUESTS"] = False


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.usefixtures("atomic_requests", "locks_apart")
def test_a_view_that_released_its_lease_early_still_commits() -> None:
    counter = Counter.objects.create(name="c")

    @lock_view("early", ttl=0.3)
    def view(request: HttpRequest) -> HttpResponse:
        Counter.objects.filter(pk=counter.pk).update(value=F("value") + 1)
        request.lock_lease.release()  # type: ignore[attr-defined]  # before slow work
        time.sleep(0.5)
        return HttpResponse("ok")

    assert _atomic_view(view)(RequestFactory().get("/")).status_code == 200
    assert Counter.objects.get(pk=counter.pk).value == 1


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.usefixtures("atomic_requests", "locks_apart")
def test_an_inner_locked_view_that_fails_is_rolled_back_and_released_at_once() -> None:
    counter = Counter.objects.create(name="c")
    seen: dict[str, bool] = {}

    @lock_view("inner", ttl=30)
    def inner(request: HttpRequest) -> HttpResponse:
        Counter.objects.filter(pk=counter.pk).update(value=F("value") + 10)
        raise ValueError("inner failed after writing")

    @lock_view("outer", ttl=30)
    def outer(request: HttpRequest) -> HttpResponse:
        Counter.objects.filter(pk=counter.pk).update(value=F("value") + 1)
        with pytest.raises(ValueError):
            inner(request)
        seen["inner_held"] = locks.is_locked("inner")
        return HttpResponse("ok")

    assert _atomic_view(outer)(RequestFactory().get("/")).status_code == 200
    # Its savepoint rolled back what it wrote: releasing it at once let nothing through.
    assert seen == {"inner_held": False}
    assert Counter.objects.get(pk=counter.pk).value == 1
    assert not Lock.objects.exists()


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.usefixtures("atomic_requests", "locks_apart")
def test_an_async_locked_view_called_from_a_sync_one_is_released_after_its_commit() -> None:
    from asgiref.sync import async_to_sync

    counter = Counter.objects.create(name="c")
    seen: dict[str, bool] = {}

    @lock_view("ainner", ttl=30)
    async def inner(request: HttpRequest) -> HttpResponse:
        def write() -> bool:
            Counter.objects.filter(pk=counter.pk).update(value=F("value") + 1)
            return connection.in_atomic_block

        seen["in_outer_transaction"] = await sync_to_async(write)()
        return HttpResponse("inner")

    @lock_view("aouter", ttl=30)
    def outer(request: HttpRequest) -> HttpResponse:
        async_to_sync(inner)(request)
        seen["inner_held"] = locks.is_locked("ainner")
        return HttpResponse("ok")

    assert _atomic_view(outer)(RequestFactory().get("/")).status_code == 200
    assert seen == {"in_outer_transaction": True, "inner_held": True}
    assert not Lock.objects.exists()


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.usefixtures("locks_apart")
def test_under_the_callers_atomic_a_failing_view_is_rolled_back_and_released_at_once() -> None:
    @lock_view("caller", ttl=30)
    def view(request: HttpRequest) -> HttpResponse:
        Counter.objects.create(name="written")
        raise ValueError

    with transaction.atomic():
        with pytest.raises(ValueError):
            view(RequestFactory().get("/"))
        held = locks.is_locked("caller")
    assert (held, Counter.objects.filter(name="written").exists()) == (False, False)


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.usefixtures("atomic_requests_everywhere")
def test_a_lease_under_transactions_opened_outside_on_two_aliases_outlasts_both(
    releases: list[tuple[str, set[str]]],
) -> None:
    assert _atomic_view(LockedGetView.as_view())(RequestFactory().get("/")).status_code == 200
    assert releases == [("exempt", set())]


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.usefixtures("atomic_requests_everywhere")
def test_the_callers_atomic_on_one_alias_leaves_atomic_requests_on_the_others() -> None:
    seen: list[bool] = []

    @lock_view("mixed", ttl=30)
    def view(request: HttpRequest) -> HttpResponse:
        seen.append(connections["other"].in_atomic_block)
        return HttpResponse("ok")

    _atomic_view(transaction.atomic(using="default")(view))(RequestFactory().get("/"))
    assert seen == [True] and not Lock.objects.exists()


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_a_locked_view_builds_no_connection_of_an_alias_it_does_not_use() -> None:
    out: dict[str, list[str]] = {}

    def run() -> None:
        out["before"] = sorted(c.alias for c in connections.all(initialized_only=True))
        lock_view("plain", ttl=30)(lambda request: HttpResponse("ok"))(RequestFactory().get("/"))
        out["after"] = sorted(c.alias for c in connections.all(initialized_only=True))
        for used in connections.all(initialized_only=True):
            used.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert out["after"] == out["before"], out


# --- options that must reach the lease and the busy answer -----------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_default_retry_after_is_the_seconds_left_on_the_holders_lease(held: Any) -> None:
    # Not merely "at least 1": a constant would pass a range check from 1 up.
    held("gate:long", ttl=600)
    response = Client().get("/locking/gated/long/")
    assert response.status_code == 423
    assert 590 <= int(response["Retry-After"]) <= 600
    assert b"retry after" in response.content


def _busy_with_own_retry_after(request: HttpRequest, name: str, retry_after: int) -> HttpResponse:
    response = HttpResponse(f"{name} is busy", status=503)
    response["Retry-After"] = "120"
    return response


@lock_view("own-retry", ttl=30, response=_busy_with_own_retry_after)
def _own_retry_after(request: HttpRequest) -> HttpResponse:  # pragma: no cover - never runs
    raise AssertionError("must not run while the lock is held")


@pytest.mark.django_db(transaction=True)
def test_a_busy_response_that_sets_its_own_retry_after_keeps_it(held: Any) -> None:
    held("own-retry", ttl=30)
    response = _own_retry_after(RequestFactory().get("/"))
    assert (response.status_code, response["Retry-After"]) == (503, "120")


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_the_using_note_and_auto_renew_options_reach_the_lease() -> None:
    seen: dict[str, Any] = {}

    @lock_view("options", ttl=1.5, using="other", note="nightly export", auto_renew=True)
    def view(request: HttpRequest) -> HttpResponse:
        time.sleep(2.5)  # past the ttl: only the renewals keep the lease
        seen["held"] = locks.is_locked("options", using="other")
        seen["rows"] = {
            alias: list(Lock.objects.using(alias).values_list("name", "note"))
            for alias in ("default", "other")
        }
        return HttpResponse("ok")

    response = view(RequestFactory().get("/"))
    assert response.status_code == 200
    assert seen == {
        "held": True,
        "rows": {"default": [], "other": [("options", "nightly export")]},
    }
    assert not Lock.objects.using("other").exists()


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
@pytest.mark.usefixtures("atomic_requests", "locks_apart")
@pytest.mark.parametrize(
    ("view", "atomic"),
    [
        (_locked, b"True"),
        (lock_view("exempt", ttl=30)(_non_atomic(_in_atomic)), b"False"),
        (_non_atomic(lock_view("exempt", ttl=30)(_in_atomic)), b"False"),
        (InAtomicMixinView.as_view(), b"True"),
        (ExemptMixinView.as_view(), b"False"),
        (ExemptDispatchView.as_view(), b"False"),
    ],
    ids=["function", "function-under", "function-over", "mixin", "mixin-dispatch", "dispatch"],
)
def test_a_locked_view_called_without_the_url_resolver_keeps_its_exemptions(
    view: Callable[..., Any], atomic: bytes
) -> None:
    # Called directly (a test with RequestFactory, or one view calling another): no
    # resolver_match carries the exemptions; the view's own marks must.
    response = view(RequestFactory().get("/"))
    assert cast(HttpResponse, response).content == atomic
    assert not Lock.objects.exists()
