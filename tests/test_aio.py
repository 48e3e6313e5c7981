"""The async lease API and async views: tasks exclude each other, the event loop never blocks."""

from __future__ import annotations

import asyncio
import functools
import gc
import itertools
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar
from unittest.mock import AsyncMock

import pytest
from django.db import connections
from django.test import AsyncClient, override_settings

import locks
from locks import waiting
from locks.aio import run_sync, task_holder
from locks.identity import default_holder
from locks.models import Lock
from tests import pgbouncer
from tests.conftest import BACKEND, ROOT, finish, spawn, worker_env
from tests.faults import hold_write_lock
from tests.test_decorators import OTHER, http, wait_until

pytestmark = pytest.mark.django_db(transaction=True)
T = TypeVar("T")


def test_aacquire_and_arelease() -> None:
    async def main() -> tuple[locks.Lease, bool]:
        lease = await locks.aacquire("aio:one", ttl=30, timeout=5)
        locked = await run_sync(locks.is_locked, "aio:one")
        await lease.arenew(60)
        await lease.arelease()
        return lease, locked

    lease, locked_inside = asyncio.run(main())
    assert locked_inside and not lease.held
    assert not locks.is_locked("aio:one")


@pytest.mark.skipif(BACKEND != "postgresql", reason="NOTIFY is read only on PostgreSQL")
@override_settings(LOCKS={"NOTIFY": "yes"})
def test_a_bad_notify_setting_fails_an_async_acquire_before_any_grant_as_a_sync_one() -> None:
    # As locks.acquire(): the setting is read before the first attempt, not only once a
    # wait is needed, so a free lock is not taken under a bad setting either.
    calls: list[Callable[[], Coroutine[Any, Any, Any]]] = [
        lambda: locks.aacquire("orders:1", timeout=1),
        lambda: locks.alock("orders:1", timeout=1).__aenter__(),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=r"LOCKS\['NOTIFY'\]"):
            asyncio.run(call())
        assert not Lock.objects.exists()
    with pytest.raises(TypeError, match=r"LOCKS\['NOTIFY'\]"):
        locks.acquire("orders:1", timeout=1)


def test_tasks_on_one_loop_exclude_each_other_and_one_task_reenters() -> None:
    async def main() -> tuple[locks.Lease, locks.Lease | None, locks.Lease | None, bool]:
        first = await locks.aacquire("aio:tasks", ttl=30)
        other = await asyncio.create_task(locks.atry_acquire("aio:tasks", ttl=30))
        again = await locks.atry_acquire("aio:tasks", ttl=30)
        holders_differ = await asyncio.create_task(_holder()) != task_holder()
        if again is not None:
            await again.arelease()
        await first.arelease()
        return first, other, again, holders_differ

    first, other, again, holders_differ = asyncio.run(main())
    assert other is None, "another task on the same loop must not get the lock"
    assert again is not None and again.token == first.token and again.count == 2
    assert holders_differ
    assert task_holder() == default_holder()  # outside a task: the thread's identity


async def _holder() -> str:
    return task_holder()


def test_blocking_calls_through_run_sync_hold_as_the_calling_task() -> None:
    # Worker threads are reused across tasks: with the thread's own identity, a second
    # task's acquire would silently re-enter the first task's lock.
    async def take() -> tuple[str, locks.Lease | None]:
        lease = await run_sync(locks.try_acquire, "aio:run-sync", ttl=30)
        return task_holder(), lease

    async def main() -> list[tuple[str, locks.Lease | None]]:
        return [await asyncio.create_task(take()) for _ in range(3)] + [await take()]

    (first_holder, first), *others = asyncio.run(main())
    assert first is not None and first.holder == first_holder
    assert [lease for _, lease in others] == [None, None, None]
    first.release()
    assert not Lock.objects.exists()


def test_one_alock_object_shared_by_tasks_releases_each_tasks_own_lease() -> None:
    guard = locks.alock("aio:shared", ttl=0.5, timeout=10)

    async def main() -> tuple[str, bool, bool]:
        b_in, b_go = asyncio.Event(), asyncio.Event()
        b_lease: list[locks.Lease] = []

        async def a() -> str:
            try:
                async with guard:
                    await b_in.wait()  # B takes the lock over once A's lease expired
            except locks.LockLost:
                return "lost"
            return "released"

        async def b() -> None:
            async with guard as lease:
                b_lease.append(lease)
                b_in.set()
                await b_go.wait()

        first = asyncio.create_task(a())
        await asyncio.sleep(0.1)
        second = asyncio.create_task(b())
        outcome = await first
        b_still_holds = await run_sync(locks.check_token, "aio:shared", b_lease[0].token)
        b_go.set()
        await second
        return outcome, b_still_holds, await run_sync(locks.is_locked, "aio:shared")

    assert asyncio.run(main()) == ("lost", True, False)


def test_an_alock_built_before_the_settings_changed_reads_them_when_entered() -> None:
    guard = locks.alock("aio:settings")

    async def main() -> locks.Lease:
        async with guard as lease:
            return lease

    with override_settings(LOCKS={"DEFAULT_TTL": 5}):
        assert asyncio.run(main()).ttl == 5.0


def test_alock_decorated_coroutines_never_overlap() -> None:
    spans: list[tuple[float, float]] = []

    @locks.alock("aio:decorated", ttl=30, timeout=30)
    async def critical() -> None:
        started = time.monotonic()
        await asyncio.sleep(0.05)
        spans.append((started, time.monotonic()))

    async def main() -> None:
        await asyncio.gather(*(critical() for _ in range(5)))

    asyncio.run(main())
    spans.sort()
    assert len(spans) == 5
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
    assert not Lock.objects.exists()


def test_one_alock_object_entered_again_inside_its_block_releases_both_holdings() -> None:
    async def main() -> tuple[locks.Lease, locks.Lease, int, bool]:
        guard = locks.alock("aio:nested", ttl=30)
        async with guard as outer:
            async with guard as inner:
                pass
            count = await run_sync(lambda: Lock.objects.get(name="aio:nested").count)
            still = await run_sync(locks.is_locked, "aio:nested")
        return outer, inner, count, still

    outer, inner, count_inside, still_locked = asyncio.run(main())
    assert (inner.token, inner.count) == (outer.token, 2)
    assert count_inside == 1 and still_locked
    assert not locks.is_locked("aio:nested")


def test_alock_releases_when_the_block_raises_or_is_cancelled() -> None:
    async def main() -> bool:
        with pytest.raises(RuntimeError):
            async with locks.alock("aio:raise", ttl=30):
                raise RuntimeError("inside")

        entered = asyncio.Event()

        async def hold_forever() -> None:
            async with locks.alock("aio:cancel", ttl=30):
                entered.set()
                await asyncio.sleep(3600)

        task = asyncio.create_task(hold_forever())
        await entered.wait()
        locked = await run_sync(locks.is_locked, "aio:cancel")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return locked

    assert asyncio.run(main()) is True
    assert not locks.is_locked("aio:raise")
    assert not locks.is_locked("aio:cancel")


def test_a_lease_won_by_a_cancelled_acquire_is_released() -> None:
    async def main() -> bool:
        task = asyncio.create_task(locks.aacquire("aio:cancelled", ttl=60))
        await asyncio.sleep(0)  # the attempt is on its way in a worker thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Let the attempt (and any clean-up it set off) run to its end.
        while len(asyncio.all_tasks()) > 1:
            await asyncio.sleep(0.01)
        return bool(await run_sync(locks.is_locked, "aio:cancelled"))

    assert asyncio.run(main()) is False, "the lease the cancelled task won was left behind"


def test_a_lease_won_after_its_event_loop_shut_down_is_released() -> None:
    # asyncio.run() cancels every task left at its end, the attempt's own among them; the
    # attempt's worker thread then finishes by itself, with a lease nobody will release.
    locks.acquire("aio:shutdown", ttl=0.05, holder=OTHER)
    time.sleep(0.1)  # an expired row, whose takeover must wait for the blocker below
    blocker = hold_write_lock("aio:shutdown", 1.0)

    async def main() -> None:
        acquiring = asyncio.create_task(locks.aacquire("aio:shutdown", ttl=60))
        await asyncio.sleep(0.3)  # the attempt is waiting in its thread; main ends now
        assert not acquiring.done()

    asyncio.run(main())
    blocker.join()
    assert wait_until(lambda: not locks.is_locked("aio:shutdown"), 10), "left behind"


def test_a_lease_won_by_a_run_sync_call_whose_caller_was_cancelled_is_released() -> None:
    # The worker thread cannot be stopped: after asyncio.wait_for gives up, a blocking
    # acquire waits on and takes the lock, which nobody would release until its TTL.
    blocker = locks.acquire("aio:run-sync-cancelled", ttl=30, holder=OTHER)
    returned = threading.Event()

    def acquire() -> locks.Lease:
        try:
            return locks.acquire("aio:run-sync-cancelled", ttl=30, timeout=10)
        finally:
            returned.set()

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(run_sync(acquire), 0.5)
        await run_sync(blocker.release)  # the abandoned thread gets the lock now

    asyncio.run(main())
    assert returned.wait(10), "the abandoned acquire did not get the lock"
    assert wait_until(lambda: not locks.is_locked("aio:run-sync-cancelled"), 5), (
        "the lease the abandoned run_sync call won was left behind"
    )


def cancelled_run_sync(function: Callable[[], T]) -> Coroutine[Any, Any, None]:
    """Call ``function`` through run_sync, cancel the caller while it runs, let it finish."""

    async def main() -> None:
        started, go = threading.Event(), threading.Event()

        def call() -> T:
            started.set()
            go.wait(10)  # until its caller has been cancelled
            return function()

        caller = asyncio.create_task(run_sync(call))
        while not started.is_set():
            await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        go.set()
        # Let the call (and any clean-up it set off) run to its end.
        while len(asyncio.all_tasks()) > 1:
            await asyncio.sleep(0.01)

    return main()


def test_a_cancelled_run_sync_call_leaves_a_lease_it_returned_but_did_not_take_alone() -> None:
    # The caller held the lease before the call, which only renewed it and handed it back:
    # it is not a lease won for nobody, and its owner still relies on it.
    lease = locks.acquire("aio:kept", ttl=30)

    def renewed() -> locks.Lease:
        lease.renew()
        return lease

    asyncio.run(cancelled_run_sync(renewed))
    assert lease.held and locks.check_token("aio:kept", lease.token), (
        "the lease its owner held before the cancelled call was released"
    )
    lease.release()
    assert not Lock.objects.exists()


def test_a_cancelled_run_sync_reentry_gives_back_only_its_own_reentry() -> None:
    lease = locks.acquire("aio:reentered", ttl=30, holder="owner")
    # The call's re-entry is its own to give back; the holding it re-entered is not.
    asyncio.run(cancelled_run_sync(lambda: locks.acquire("aio:reentered", ttl=30, holder="owner")))
    row = Lock.objects.get(name="aio:reentered")
    assert (row.holder, row.token, row.count) == ("owner", lease.token, 1)
    lease.release()
    assert not Lock.objects.exists()


def test_a_cancelled_run_sync_call_releases_a_lease_a_run_sync_call_inside_it_took() -> None:
    # The outer call took the lease, through an inner run_sync (async code it calls): it
    # returns what it took, and its caller is gone, so nobody else would release it.
    from asgiref.sync import async_to_sync

    async def inner() -> locks.Lease:
        return await run_sync(locks.acquire, "aio:nested", ttl=30)

    asyncio.run(cancelled_run_sync(async_to_sync(inner)))
    assert wait_until(lambda: not locks.is_locked("aio:nested"), 5), (
        "the lease the cancelled call took in a nested run_sync was left behind"
    )


def test_a_run_sync_call_keeps_no_lease_it_made_and_dropped_alive() -> None:
    # A long call (a loop over many locks, say) must not accumulate every lease it made.
    def call() -> bool:
        lease = locks.acquire("aio:dropped", ttl=30)
        lease.release()
        dropped = weakref.ref(lease)
        del lease
        gc.collect()
        return dropped() is None

    assert asyncio.run(run_sync(call)), "a released, dropped lease is kept alive by the call"


def test_a_run_sync_call_that_completes_returns_its_lease_held() -> None:
    blocker = locks.acquire("aio:run-sync-done", ttl=30, holder=OTHER)

    async def main() -> tuple[locks.Lease, str, bool]:
        async def release_soon() -> None:
            await asyncio.sleep(0.3)
            await run_sync(blocker.release)

        releasing = asyncio.create_task(release_soon())
        lease = await run_sync(locks.acquire, "aio:run-sync-done", ttl=30, timeout=10)
        await releasing
        await asyncio.sleep(0.2)  # time enough for a wrongful release to show
        return lease, task_holder(), await run_sync(locks.check_token, lease.name, lease.token)

    lease, holder, live = asyncio.run(main())
    assert live and lease.holder == holder
    lease.release()
    assert not Lock.objects.exists()


def test_waiting_for_a_busy_lock_does_not_block_the_event_loop() -> None:
    blocker = locks.acquire("aio:busy", ttl=30, holder=OTHER)
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.02)
            ticks += 1

    async def main() -> float:
        tick_task = asyncio.create_task(ticker())
        started = time.monotonic()
        with pytest.raises(locks.LockBusy, match="aio:busy"):
            await locks.aacquire("aio:busy", ttl=5, timeout=2)
        tick_task.cancel()
        return time.monotonic() - started

    try:
        waited = asyncio.run(main())
    finally:
        blocker.release()
    assert 1.95 <= waited < 60
    # Every 20 ms, ideally 100 ticks; a loop blocked between attempts ticks once per attempt.
    assert ticks >= 25


@override_settings(LOCKS={"BACKOFF_MIN": 10.0, "BACKOFF_MAX": 10.0})
def test_an_async_waiter_is_woken_by_the_release_notification_without_queueing(
    backend: str,
) -> None:
    if backend != "postgresql" or pgbouncer.ENABLED:
        pytest.skip("release notifications are PostgreSQL's LISTEN/NOTIFY (not behind a pooler)")
    from tests.test_queue import queue_locks

    held = locks.acquire("aio:woken", ttl=60, holder=OTHER)

    def in_pool_thread(query: Callable[[], T]) -> Callable[[], T]:
        def run() -> T:
            try:
                return query()
            finally:
                connections.close_all()  # this pool thread's, or the test database stays in use

        return run

    flagged = Lock.objects.filter(name="aio:woken", waiting=True).exists

    async def main() -> tuple[float, tuple[int, int], locks.Lease]:
        waiter = asyncio.create_task(locks.aacquire("aio:woken", ttl=30, timeout=30))
        # The waiter flags the row it cannot take, so that its release notifies.
        while not await run_sync(in_pool_thread(flagged)):
            assert not waiter.done(), waiter
            await asyncio.sleep(0.01)
        queue = await run_sync(in_pool_thread(queue_locks))
        released = time.monotonic()
        await run_sync(held.release)
        lease = await waiter
        woke_after = time.monotonic() - released
        await lease.arelease()
        return woke_after, queue, lease

    woke_after, queue, lease = asyncio.run(main())
    # Backoff alone would have slept 5-10 s; the notification wakes it at once.
    assert woke_after < 3, woke_after
    assert lease.token > held.token
    assert queue == (0, 0), "an async waiter does not take a place in the queue"
    assert not waiting.listener("default")._waiters, "the waiter's subscription was left behind"


def test_a_cancelled_async_waiter_leaves_no_subscription_behind(backend: str) -> None:
    if backend != "postgresql" or pgbouncer.ENABLED:
        pytest.skip("release notifications are PostgreSQL's LISTEN/NOTIFY (not behind a pooler)")
    from locks.aio import _LoopEvent

    held = locks.acquire("aio:cancel-wait", ttl=60, holder=OTHER)
    listener = waiting.listener("default")

    async def main() -> tuple[bool, _LoopEvent]:
        waiter = asyncio.create_task(locks.aacquire("aio:cancel-wait", ttl=30, timeout=30))
        while not listener._waiters:
            await asyncio.sleep(0)
        subscribed = True
        waiter.cancel()  # as soon as it has subscribed, while the listener may still connect
        with pytest.raises(asyncio.CancelledError):
            await waiter
        return subscribed, _LoopEvent()

    try:
        subscribed, stale = asyncio.run(main())
    finally:
        held.release()
    assert subscribed and not listener._waiters
    stale.set()  # what the listener does for a waiter whose loop has closed: no error


def test_broken_lease_raises_lock_lost_on_arenew_and_arelease() -> None:
    async def main() -> list[str]:
        lease = await locks.aacquire("aio:broken", ttl=30)
        await run_sync(locks.break_lock, "aio:broken")
        outcomes = []
        for step in (lease.arenew, lease.arelease):
            try:
                await step()
                outcomes.append("ok")
            except locks.LockLost:
                outcomes.append("LockLost")
        return outcomes

    assert asyncio.run(main()) == ["LockLost", "LockLost"]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: locks.aacquire("", ttl=5), ValueError),
        (lambda: locks.aacquire("a", ttl=-1), ValueError),
        (lambda: locks.aacquire("a", timeout=-1), ValueError),
        (lambda: locks.atry_acquire(b"a", ttl=5), TypeError),  # type: ignore[arg-type]
        (lambda: locks.aacquire("a\x00b"), ValueError),
    ],
)
def test_bad_arguments_raise_before_any_query(call: Any, error: type) -> None:
    with pytest.raises(error):
        asyncio.run(call())
    with pytest.raises(ValueError):
        locks.alock("x", ttl=float("inf"))
    assert not Lock.objects.exists()


async def _coroutine_function() -> None: ...


async def _async_generator_function() -> AsyncIterator[int]:
    yield 1


def _generator_function() -> Iterator[int]:
    yield 1


def _plain_function() -> None: ...


class _AsyncCallable:
    async def __call__(self) -> None: ...


@pytest.mark.parametrize(
    ("func", "message"),
    [
        (_async_generator_function, "an async generator function, cannot hold the lock"),
        (_generator_function, "a generator function, cannot hold the lock"),
        (_plain_function, "decorates async def functions.*use @locks.lock"),
        (lambda: None, "decorates async def functions"),
        (_AsyncCallable, "decorates async def functions"),  # the class makes no coroutine
    ],
)
def test_alock_refuses_to_decorate_what_is_not_a_coroutine_function(
    func: Callable[..., Any], message: str
) -> None:
    with pytest.raises(TypeError, match=message):
        locks.alock("aio:decorated", ttl=30)(func)
    assert not Lock.objects.exists()


@pytest.mark.parametrize(
    "func",
    [
        _coroutine_function,
        functools.partial(_coroutine_function),
        _AsyncCallable(),
        staticmethod(_coroutine_function),
        AsyncMock(return_value=None),
        functools.partial(_AsyncCallable()),
        functools.partial(AsyncMock(return_value=None)),
        staticmethod(AsyncMock(return_value=None)),
    ],
    ids=[
        "function",
        "partial",
        "async-callable",
        "staticmethod",
        "async-mock",
        "partial-async-callable",
        "partial-async-mock",
        "staticmethod-async-mock",
    ],
)
def test_alock_decorates_coroutine_functions_and_async_callables(
    func: Callable[[], Coroutine[Any, Any, None]],
) -> None:
    decorated = locks.alock("aio:decorated", ttl=30)(func)
    asyncio.run(decorated())
    assert not Lock.objects.exists()


# --- async views ------------------------------------------------------------------------------


def test_async_view_answers_busy_releases_after_errors_and_streams(tmp_path: Path) -> None:
    gate = tmp_path / "gate"

    async def main() -> dict[str, Any]:
        client = AsyncClient(raise_request_exception=True)
        seen: dict[str, Any] = {}
        free = await client.get("/locking/agated/a/")
        seen["free"] = (free.status_code, json.loads(free.content)["name"])
        seen["released"] = not await run_sync(locks.is_locked, "gate:a")
        other = await run_sync(locks.acquire, "gate:a", ttl=30, holder=OTHER)
        busy = await client.get("/locking/agated/a/")
        seen["busy"] = (busy.status_code, int(busy["Retry-After"]))
        await other.arelease()
        with pytest.raises(RuntimeError, match="boom"):
            await client.get("/locking/aboom/a/")
        seen["after_error"] = await run_sync(locks.is_locked, "boom:a")
        streaming: Any = await client.get(f"/locking/astream/a/?gate={gate}")
        parts = aiter(streaming.streaming_content)
        seen["first"] = await anext(parts)
        seen["mid_stream"] = await run_sync(locks.is_locked, "stream:a")
        gate.touch()
        seen["rest"] = [part async for part in parts]
        seen["after_stream"] = await run_sync(locks.is_locked, "stream:a")
        return seen

    seen = asyncio.run(main())
    assert seen["free"] == (200, "gate:a") and seen["released"]
    assert seen["busy"][0] == 423 and 1 <= seen["busy"][1] <= 30
    assert seen["after_error"] is False
    assert (seen["first"], seen["mid_stream"]) == (b"first\n", True)
    assert (seen["rest"], seen["after_stream"]) == ([b"last\n"], False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def asgi_server() -> Iterator[str]:
    """uvicorn serving tests/asgi.py on the test databases, in its own OS process."""
    port = _free_port()
    server = subprocess.Popen(
        [
            *(sys.executable, "-m", "uvicorn", "tests.asgi:application"),
            *("--host", "127.0.0.1", "--port", str(port)),
            *("--log-level", "warning", "--no-access-log"),
        ],
        env=worker_env(),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def up() -> bool:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            try:
                return http(f"{url}/locking/ping/", timeout=5)[0] == 200
            except OSError:
                return False

        assert wait_until(up, 60), "uvicorn did not start"
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_async_views_on_a_real_asgi_server(asgi_server: str, tmp_path: Path) -> None:
    gate, log = tmp_path / "gate", tmp_path / "log"
    url = f"{asgi_server}/locking/agated/job/?gate={gate}&log={log}"
    workers = [spawn("get", url, module="tests.workers_django") for _ in range(4)]
    waiter = None
    try:
        assert wait_until(lambda: sum(w.poll() is not None for w in workers) >= 3, 120)
        # This one waits for the lock on the server's event loop (timeout=60 in the view) ...
        waiting = tmp_path / "waiting"
        waiter = spawn(
            "get",
            f"{asgi_server}/locking/await/job/?waiting={waiting}",
            module="tests.workers_django",
        )
        assert wait_until(waiting.exists, 60)
        time.sleep(0.3)
        # ... and the same loop still answers other requests meanwhile.
        with urllib.request.urlopen(f"{asgi_server}/locking/ping/", timeout=30) as response:
            assert response.read() == b"pong"
        assert waiter.poll() is None, "the waiter must still be waiting for the lock"
    finally:
        gate.touch()
    responses = [finish(w)[0] for w in workers]
    assert waiter is not None
    waited = finish(waiter)[0]

    assert sorted(r["status"] for r in responses) == [200, 423, 423, 423]
    assert all(1 <= int(r["retry_after"]) <= 60 for r in responses if r["status"] == 423)
    assert len(log.read_text().split()) == 1, "exactly one request ran the view"
    winner = next(json.loads(r["body"]) for r in responses if r["status"] == 200)
    assert waited["status"] == 200
    assert json.loads(waited["body"])["token"] > winner["token"]
    assert wait_until(lambda: not locks.is_locked("gate:job"), 30)
