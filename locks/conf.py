"""Settings of the locks app, from ``settings.LOCKS`` with defaults, checked on first use."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar, cast

from django.conf import settings as django_settings
from django.core.signals import setting_changed

from . import validation

T = TypeVar("T")

DEFAULTS: dict[str, Any] = {
    # Database alias whose server holds the lock table.
    "DATABASE": "default",
    # Lease length in seconds when a call gives no ``ttl``.
    "DEFAULT_TTL": 60.0,
    # Backoff between attempts of a blocking acquire, in seconds.
    "BACKOFF_MIN": 0.002,
    "BACKOFF_MAX": 0.25,
    # How many times one attempt retries a transient database error
    # (deadlock, lock wait timeout, SQLite busy) before giving up.
    "TRANSIENT_RETRIES": 8,
    # Rows one reaper statement deletes at most.
    "REAP_BATCH_SIZE": 1000,
    # Seconds one run of the reaper task may spend before it stops (None: until done);
    # keep it below the beat interval so runs do not pile up.
    "REAP_TIME_BUDGET": 30.0,
    # Lease length of a SingletonTask's lock, held from enqueue to the end of the run: it
    # must outlast the time a task waits in the queue plus its run (or use auto-renew).
    "TASK_LOCK_TTL": 3600.0,
    # The auto-renew watchdog renews when this fraction of the TTL has passed.
    "RENEW_FRACTION": 1 / 3,
    # PostgreSQL: wake blocked acquires with LISTEN/NOTIFY (one listening connection per
    # process and alias); off, they poll with backoff. None: on, unless the alias is set
    # up for a transaction pooler (DISABLE_SERVER_SIDE_CURSORS, as for PgBouncer), where
    # LISTEN does not work.
    "NOTIFY": None,
    # PostgreSQL: the app's own connections bind parameters on the server and prepare each
    # lock statement once per session instead of having it parsed and planned every time.
    # MariaDB: they prepare the acquire and the last release at a session's fifth acquire
    # (PREPARE, then EXECUTE ... USING). None: on, unless the alias is set up for a transaction
    # pooler (as for NOTIFY) or its OPTIONS say "prepare_threshold": None. PgBouncer 1.21+
    # with max_prepared_statements follows prepared statements: set True there.
    "PREPARED_STATEMENTS": None,
}


_SECONDS = "a number of seconds (or a timedelta)"

#: What each checked setting accepts, in words: the hint of system check locks.E005.
#: The rules themselves are the validators the ``Settings`` properties call.
VALID: dict[str, str] = {
    "DEFAULT_TTL": f"{_SECONDS} from {validation.MIN_TTL} to {validation.MAX_TTL:.0f} (a year)",
    "BACKOFF_MIN": f"{_SECONDS} above 0, at most {validation.MAX_TIMEOUT:.0f} (a year), "
    "and at most BACKOFF_MAX",
    "BACKOFF_MAX": f"{_SECONDS} above 0, at most {validation.MAX_TIMEOUT:.0f} (a year), "
    "and at least BACKOFF_MIN",
    "TRANSIENT_RETRIES": "an int, 0 or more",
    "REAP_BATCH_SIZE": f"an int from 1 to {validation.MAX_BATCH_SIZE}",
    "REAP_TIME_BUDGET": f"None (no limit) or {_SECONDS} from 0 to "
    f"{validation.MAX_TIMEOUT:.0f} (a year)",
    "TASK_LOCK_TTL": f"{_SECONDS} from {validation.MIN_TTL} to {validation.MAX_TTL:.0f} (a year)",
    "RENEW_FRACTION": "a number between 0 and 1, both excluded",
}


class Settings:
    """Typed, checked access to ``settings.LOCKS``, with defaults.

    Each value is checked on its first read and kept until ``settings.LOCKS`` (or
    ``DATABASES``) changes, which ``override_settings`` announces; a bad value is not
    kept, so every read of it fails, naming the setting.

    Example::

        from locks.conf import conf
        alias = conf.DATABASE
    """

    def __init__(self) -> None:
        self._checked_values: dict[str, Any] = {}
        self._generation = 0
        self._lock = threading.Lock()

    def clear(self) -> None:
        """Forget the checked values (``setting_changed`` calls it)."""
        with self._lock:
            self._generation += 1
            self._checked_values.clear()

    def raw(self, key: str) -> Any:
        """The value of ``key`` as written in ``settings.LOCKS``, or its default; unchecked.

        Example::

            conf.raw("DATABASE")
        """
        user = getattr(django_settings, "LOCKS", None)
        if user is None:
            return DEFAULTS[key]
        if not isinstance(user, dict):
            # Falling back to the defaults would send locks to another database unnoticed.
            raise TypeError(f"settings.LOCKS must be a dict, not {user!r}")
        return user.get(key, DEFAULTS[key])

    @property
    def DATABASE(self) -> str:
        return self._checked("DATABASE", validation.check_alias)

    # Each numeric setting is checked by one validator on its first read after a change
    # (then kept), so a bad value fails naming the setting wherever it is used, and the
    # system check (locks.E005) reads these same properties.

    @property
    def DEFAULT_TTL(self) -> float:
        return self._checked("DEFAULT_TTL", validation.ttl_seconds)

    @property
    def BACKOFF_MIN(self) -> float:
        return self._checked("BACKOFF_MIN", validation.pause_seconds)

    @property
    def BACKOFF_MAX(self) -> float:
        return self._checked("BACKOFF_MAX", validation.pause_seconds)

    def backoff(self) -> tuple[float, float]:
        """``(BACKOFF_MIN, BACKOFF_MAX)``; raises ValueError if the first exceeds the second.

        Example::

            first_pause, longest_pause = conf.backoff()
        """
        low, high = self.BACKOFF_MIN, self.BACKOFF_MAX
        if low > high:
            raise ValueError(
                f"LOCKS['BACKOFF_MIN'] ({low!r} s) must not exceed "
                f"LOCKS['BACKOFF_MAX'] ({high!r} s)"
            )
        return low, high

    @property
    def TRANSIENT_RETRIES(self) -> int:
        return self._checked("TRANSIENT_RETRIES", partial(validation.check_count, what="retries"))

    @property
    def REAP_BATCH_SIZE(self) -> int:
        # The same rule as reap_expired's batch_size argument, which it stands in for.
        return self._checked("REAP_BATCH_SIZE", validation.check_batch_size)

    def notify(self, settings_dict: dict[str, Any]) -> bool:
        """Whether blocked acquires on this database wait for NOTIFY (``NOTIFY``)."""
        return self._unless_pooled("NOTIFY", settings_dict)

    def prepared_statements(self, settings_dict: dict[str, Any]) -> bool:
        """Whether our own connections to this database prepare (``PREPARED_STATEMENTS``)."""
        options = settings_dict.get("OPTIONS") or {}
        if self.tri_state("PREPARED_STATEMENTS") is None and (
            "prepare_threshold" in options and options["prepare_threshold"] is None
        ):
            return False
        return self._unless_pooled("PREPARED_STATEMENTS", settings_dict)

    def tri_state(self, key: str) -> bool | None:
        """A setting that is True, False or None (automatic); raises TypeError otherwise."""
        value = self.raw(key)
        if not (value is None or isinstance(value, bool)):
            raise TypeError(f"LOCKS[{key!r}]: must be True, False or None, not {value!r}")
        return value

    def _unless_pooled(self, key: str, settings_dict: dict[str, Any]) -> bool:
        value = self.tri_state(key)
        if value is None:
            # Django asks for DISABLE_SERVER_SIDE_CURSORS behind a transaction pooler,
            # which drops what these features rely on: session LISTEN, named statements.
            return not settings_dict.get("DISABLE_SERVER_SIDE_CURSORS", False)
        return value

    @property
    def REAP_TIME_BUDGET(self) -> float | None:
        return self._checked("REAP_TIME_BUDGET", validation.timeout_seconds)

    @property
    def TASK_LOCK_TTL(self) -> float:
        return self._checked("TASK_LOCK_TTL", validation.ttl_seconds)

    def _checked(self, key: str, check: Callable[[Any], T]) -> T:
        try:
            return cast(T, self._checked_values[key])
        except KeyError:
            pass
        generation = self._generation
        # The error names the setting: a bad value in settings.py is not a bad argument.
        try:
            value = check(self.raw(key))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"LOCKS[{key!r}]: {exc}") from None
        with self._lock:
            # Read before a change that another thread made meanwhile: not to be kept.
            if generation == self._generation:
                self._checked_values[key] = value
        return value

    @property
    def RENEW_FRACTION(self) -> float:
        # At 1 or more the watchdog would renew at or after expiry; at 0 or less, nonstop.
        return self._checked("RENEW_FRACTION", validation.check_fraction)


conf = Settings()


def _after_fork() -> None:
    # Another thread of the parent may have held the lock at the fork: a new one.
    conf._lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork)


def _forget(setting: str, **kwargs: Any) -> None:
    if setting in ("LOCKS", "DATABASES"):
        conf.clear()


setting_changed.connect(_forget, dispatch_uid="locks.conf.forget")
