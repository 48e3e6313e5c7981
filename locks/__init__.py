"""Distributed locks for Django on the database you already have.

Example::

    import locks

    with locks.lock("orders:42", ttl=30, timeout=5) as lease:
        charge(order, fence=lease.token)
"""

from __future__ import annotations

from .aio import aacquire, alock, atry_acquire
from .exceptions import (
    ConcurrentUpdate,
    DuplicateTask,
    LockBusy,
    LockError,
    LockLost,
    StaleToken,
)
from .leases import (
    Lease,
    acquire,
    break_lock,
    check_token,
    is_locked,
    lock,
    reap_expired,
    try_acquire,
)
from .rowlocks import lock_rows, row_lock

__all__ = [
    "ConcurrentUpdate",
    "DuplicateTask",
    "Lease",
    "LockBusy",
    "LockError",
    "LockLost",
    "StaleToken",
    "aacquire",
    "acquire",
    "alock",
    "atry_acquire",
    "break_lock",
    "check_token",
    "is_locked",
    "lock",
    "lock_rows",
    "reap_expired",
    "row_lock",
    "try_acquire",
]
