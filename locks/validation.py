"""Argument checks that run before any query, so bad input never reaches the database."""

from __future__ import annotations

import math
import sys
from datetime import timedelta
from typing import Any

MAX_NAME_LENGTH = 255
MAX_HOLDER_LENGTH = 255
MAX_NOTE_LENGTH = 255
MIN_TTL = 0.001  # SQLite's clock ticks in milliseconds; a shorter lease would be expired at birth.
MAX_TTL = 366 * 24 * 3600.0  # a lease longer than a year is a bug, not a lease
MAX_TIMEOUT = 366 * 24 * 3600.0
MAX_BATCH_SIZE = 1_000_000


def _text(value: Any, what: str, max_length: int, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise TypeError(f"lock {what} must be a str, not {type(value).__name__}: {value!r}")
    if not value and not allow_empty:
        raise ValueError(f"lock {what} must not be empty")
    if len(value) > max_length:
        raise ValueError(
            f"lock {what} is {len(value)} characters long; the limit is {max_length}: "
            f"{value[:40]!r}..."
        )
    if "\x00" in value:
        raise ValueError(f"lock {what} must not contain NUL characters: {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"lock {what} is not valid Unicode text: {value!r}") from exc
    return value


def check_name(name: Any) -> str:
    """Return ``name`` if it is a usable lock name, else raise ``TypeError``/``ValueError``.

    Example::

        check_name("orders:42")  # -> "orders:42"
    """
    return _text(name, "name", MAX_NAME_LENGTH)


def check_long_name(name: Any) -> str:
    """Like :func:`check_name`, of any length: for text that will be hashed to fit.

    A character refused in a short name is refused in a long one too, not hashed away.

    Example::

        check_long_name("report:" + "x" * 300)
    """
    return _text(name, "name", sys.maxsize)


def check_holder(holder: Any) -> str:
    """Return ``holder`` if it is a usable holder identity.

    Holders are compared exactly on every database, like names: "Alice", "alice" and
    "Alice " are three different holders, which neither re-enter nor release each
    other's leases.

    Example::

        check_holder("celery-task-1234")
    """
    return _text(holder, "holder", MAX_HOLDER_LENGTH)


def check_auto_renew(auto_renew: Any) -> bool:
    """Return ``auto_renew`` if it is True or False (not merely truthy).

    Example::

        check_auto_renew(True)
    """
    if not isinstance(auto_renew, bool):
        raise TypeError(f"auto_renew must be True or False, not {auto_renew!r}")
    return auto_renew


def check_note(note: Any) -> str:
    """Return ``note`` (free text for humans, may be empty) if it fits.

    Example::

        check_note("nightly export")
    """
    return _text(note, "note", MAX_NOTE_LENGTH, allow_empty=True)


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{what} must be a number of seconds or a timedelta, not {value!r}")
    try:
        return float(value)
    except OverflowError:  # an int beyond float range: absurd either way
        raise ValueError(
            f"{what} is absurd: an integer of {value.bit_length()} bits is no number of seconds"
        ) from None


def ttl_seconds(ttl: Any) -> float:
    """Return a validated lease length in seconds.

    Example::

        ttl_seconds(30)  # -> 30.0
    """
    seconds = _seconds(ttl, "ttl")
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"ttl must be a finite number of seconds, not {ttl!r}")
    if seconds < MIN_TTL:
        raise ValueError(f"ttl must be at least {MIN_TTL} seconds, not {ttl!r}")
    if seconds > MAX_TTL:
        raise ValueError(f"ttl of {ttl!r} seconds is absurd; the limit is {MAX_TTL:.0f} (a year)")
    return seconds


def timeout_seconds(timeout: Any) -> float | None:
    """Return a validated wait in seconds; ``None`` (or infinity) waits without limit.

    Example::

        timeout_seconds(0)  # -> 0.0: one attempt only
    """
    if timeout is None:
        return None
    seconds = _seconds(timeout, "timeout")
    if math.isnan(seconds):
        raise ValueError("timeout must be a number of seconds, not NaN")
    if math.isinf(seconds) and seconds > 0:
        return None
    if seconds < 0:
        raise ValueError(f"timeout must not be negative: {timeout!r}")
    if seconds > MAX_TIMEOUT:
        raise ValueError(f"timeout of {timeout!r} seconds is absurd; use None to wait forever")
    return seconds


def check_token(token: Any) -> int:
    """Return a validated fencing token.

    Example::

        check_token(lease.token)
    """
    if isinstance(token, bool) or not isinstance(token, int):
        raise TypeError(f"fencing token must be an int, not {token!r}")
    if not 0 < token < 2**63:
        raise ValueError(f"fencing token out of range: {token!r}")
    return int(token)


def check_batch_size(batch_size: Any) -> int:
    """Return a validated reaper batch size.

    Example::

        check_batch_size(1000)
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise TypeError(f"batch_size must be an int, not {batch_size!r}")
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValueError(f"batch_size must be between 1 and {MAX_BATCH_SIZE}, not {batch_size!r}")
    return int(batch_size)


def check_count(value: Any, what: str) -> int:
    """Return ``value`` if it is an int, 0 or more (retries, whole seconds); ``what`` names it.

    Example::

        check_count(8, "retries")  # -> 8
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, not {value!r}")
    if value < 0:
        raise ValueError(f"{what} must not be negative: {value!r}")
    return int(value)


def pause_seconds(pause: Any) -> float:
    """Return a validated pause between attempts: positive seconds, up to a year.

    Example::

        pause_seconds(0.25)  # -> 0.25
    """
    seconds = _seconds(pause, "pause")
    # Written so that NaN fails too.
    if not 0 < seconds < math.inf:
        raise ValueError(f"pause must be a positive, finite number of seconds, not {pause!r}")
    # A waiter sleeps up to this long: past a few centuries time.sleep() raises
    # OverflowError, in the middle of an acquire.
    if seconds > MAX_TIMEOUT:
        raise ValueError(f"pause of {pause!r} seconds is absurd; the limit is a year")
    return seconds


def check_fraction(fraction: Any) -> float:
    """Return a validated fraction strictly between 0 and 1.

    Example::

        check_fraction(1 / 3)  # -> 0.333...
    """
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise TypeError(f"fraction must be a number, not {fraction!r}")
    # Written so that NaN fails too; an int is never strictly between 0 and 1.
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must be between 0 and 1 (both excluded), not {fraction!r}")
    return float(fraction)


def check_alias(using: Any) -> str:
    """Return ``using`` if it names a configured database.

    Example::

        check_alias("default")
    """
    from django.db import connections

    if not isinstance(using, str):
        raise TypeError(f"using must be a database alias (str), not {using!r}")
    if using not in connections.settings:
        raise ValueError(
            f"unknown database alias {using!r}; configured: {sorted(connections.settings)}"
        )
    return using
