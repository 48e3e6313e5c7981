"""The default holder identity: host, pid, thread and a random per-process nonce."""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Callable
from contextvars import ContextVar
from itertools import count
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

#: This process's (host:pid prefix, nonce), made once, by the first thread that asks.
_process: tuple[str, str] | None = None
_making = threading.Lock()
_serial = count(1)
_local = threading.local()
#: The holder a worker thread acts as while it runs a call for an asyncio task (run_sync).
_acting_as: ContextVar[str | None] = ContextVar("locks_acting_as", default=None)


def _reset_after_fork() -> None:
    # A child must not share its parent's identity: it would re-enter the parent's locks.
    # (The lock too: another thread of the parent may have held it at the fork.)
    global _process, _local, _making
    _process = None
    _making = threading.Lock()
    _local = threading.local()


os.register_at_fork(after_in_child=_reset_after_fork)


def _process_identity() -> tuple[str, str]:
    global _process
    if _process is None:
        # Threads of a new process can ask at the same moment (a burst of requests): one
        # makes the identity, whole, and the others wait for it.
        with _making:
            if _process is None:
                host = socket.gethostname()[:100]
                _process = (f"{host}:{os.getpid()}", secrets.token_hex(4))
    return _process


def default_holder() -> str:
    """Return this thread's holder identity, unique across hosts, processes and threads.

    A new process that reuses a dead one's pid gets another nonce, and a new thread
    that reuses a dead one's ident gets another serial, so neither re-enters a lock it
    never took.

    Example::

        default_holder()  # 'web-1:4242:140093.3:9f2c1a7b'
    """
    holder = _acting_as.get()
    if holder is not None:
        return holder
    holder = getattr(_local, "holder", None)
    if holder is None:
        prefix, nonce = _process_identity()
        holder = f"{prefix}:{threading.get_ident()}.{next(_serial)}:{nonce}"
        _local.holder = holder
    return holder


def acting_as(holder: str, function: Callable[P, T]) -> Callable[P, T]:
    """``function``, which takes :func:`default_holder` to be ``holder`` while it runs.

    For calls that a worker thread makes on behalf of someone else (an asyncio task):
    pool threads are reused, so their own identity would be shared by unrelated tasks.

    Example::

        await sync_to_async(acting_as(task_holder(), locks.acquire))("orders:42")
    """

    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        token = _acting_as.set(holder)
        try:
            return function(*args, **kwargs)
        finally:
            _acting_as.reset(token)

    return call


def unique_holder(kind: str) -> str:
    """Return a fresh holder identity for something that is not a thread, e.g. an asyncio task.

    It has the same host, pid and nonce as :func:`default_holder`, plus ``kind`` and a
    serial number never handed out before in this process.

    Example::

        unique_holder("task")  # 'web-1:4242:task.7:9f2c1a7b'
    """
    prefix, nonce = _process_identity()
    return f"{prefix}:{kind}.{next(_serial)}:{nonce}"
