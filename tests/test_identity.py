"""Default holder identity: host + pid + thread + a random per-process nonce."""

from __future__ import annotations

import os
import socket
import threading

from locks.identity import default_holder


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


def test_a_forked_child_gets_a_new_nonce() -> None:
    parent = default_holder()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, default_holder().encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = os.read(read, 1000).decode()
    assert parts(child)[1] == str(pid)
    assert parts(child)[3] != parts(parent)[3]
