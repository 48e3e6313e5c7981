"""Default holder identity: host + pid + thread + a random per-process nonce."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable

from locks.identity import default_holder
from tests.conftest import forks_while_threaded


def parts(holder: str) -> list[str]:
    return holder.split(":")


def test_default_holder_names_host_pid_thread_and_nonce() -> None:
    host, pid, thread, nonce = parts(default_holder())
    assert host == socket.gethostname()[:100]
    assert pid == str(os.getpid())
    assert thread.startswith(f"{threading.get_ident()}.")
    assert len(nonce) == 8
    assert default_holder() == default_holder()  # stable within a thread


def test_each_thread_gets_its_own_holder_even_if_its_ident_is_reused() -> None:
    seen: list[str] = []
    for _ in range(3):
        thread = threading.Thread(target=lambda: seen.append(default_holder()))
        thread.start()
        thread.join()  # the next thread may well get the same ident
    assert len(set(seen)) == 3
    assert default_holder() not in seen


def in_a_child(holder: Callable[[], str]) -> tuple[int, str]:
    """Fork; the child reports ``holder()``. Returns the child's pid and what it said."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, holder().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    return pid, os.read(read, 1000).decode()


@forks_while_threaded
def test_a_forked_child_gets_a_new_nonce() -> None:
    parent = default_holder()
    pid, child = in_a_child(default_holder)
    assert parts(child)[1] == str(pid)
    assert parts(child)[3] != parts(parent)[3]


@forks_while_threaded
def test_a_child_forked_inside_an_asyncio_task_gets_a_task_holder_of_its_own() -> None:
    # asyncio forgets the running loop in a child, so the task's holder is not inherited.
    from locks.aio import task_holder

    async def fork_in_a_task() -> tuple[str, str]:
        return task_holder(), in_a_child(task_holder)[1]

    parent, child = asyncio.run(fork_in_a_task())
    assert child != parent
    assert parts(child)[3] != parts(parent)[3]  # the child's own nonce


RACE = """
import json, secrets, threading, time
from locks import identity

slow = secrets.token_hex
def token_hex(n):
    time.sleep(0.05)  # widens the moment between the process identity's parts
    return slow(n)
secrets.token_hex = token_hex

start = threading.Barrier(8)
holders, errors = [], []
def first_call():
    start.wait()
    try:
        holders.append(identity.default_holder())
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=first_call) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps({"holders": holders, "errors": errors}))
"""


def test_threads_of_a_new_process_asking_at_once_get_one_process_identity() -> None:
    import json
    import subprocess
    import sys

    from tests.conftest import ROOT

    done = subprocess.run(
        [sys.executable, "-c", RACE], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["errors"] == []
    assert len(result["holders"]) == 8 and len(set(result["holders"])) == 8
    # One host:pid prefix and one nonce for the whole process.
    processes = {(h.split(":")[0], h.split(":")[1], h.split(":")[3]) for h in result["holders"]}
    assert len(processes) == 1


@forks_while_threaded
def test_a_child_forked_while_a_parent_thread_holds_the_listeners_mutex_can_listen() -> None:
    from locks import waiting

    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with waiting._listeners_mutex:
            held.set()
            done.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        waiting.listener("default")  # the parent's held mutex would block it for ever
        os._exit(0)
    done.set()
    thread.join()
    deadline = time.monotonic() + 20
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child hung on the listeners mutex")
        time.sleep(0.05)
