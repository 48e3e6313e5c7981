"""The default holder identity: host, pid, thread and a random per-process nonce."""

from __future__ import annotations

import os
import secrets
import socket
import threading
from itertools import count

_state: dict[str, str] = {}
_serial = count(1)
_local = threading.local()


def _reset_after_fork() -> None:
    # A child must not share its parent's identity: it would re-enter the parent's locks.
    _state.clear()
    global _local
    _local = threading.local()


os.register_at_fork(after_in_child=_reset_after_fork)


def default_holder() -> str:
    """Return this thread's holder identity, unique across hosts, processes and threads.

    A new process that reuses a dead one's pid gets another nonce, and a new thread
    that reuses a dead one's ident gets another serial, so neither re-enters a lock it
    never took.

    Example::

        default_holder()  # 'web-1:4242:140093:3:9f2c1a7b'
    """
    holder: str | None = getattr(_local, "holder", None)
    if holder is None:
        if "prefix" not in _state:
            host = socket.gethostname()[:100]
            _state["prefix"] = f"{host}:{os.getpid()}"
            _state["nonce"] = secrets.token_hex(4)
        thread = f"{threading.get_ident()}.{next(_serial)}"
        holder = f"{_state['prefix']}:{thread}:{_state['nonce']}"
        _local.holder = holder
    return holder


def unique_holder(kind: str) -> str:
    """Return a fresh holder identity for something that is not a thread, e.g. an asyncio task.

    It has the same host, pid and nonce as :func:`default_holder`, plus ``kind`` and a
    serial number never handed out before in this process.

    Example::

        unique_holder("task")  # 'web-1:4242:task.7:9f2c1a7b'
    """
    if "prefix" not in _state:
        default_holder()  # sets the host:pid prefix and the nonce
    return f"{_state['prefix']}:{kind}.{next(_serial)}:{_state['nonce']}"
