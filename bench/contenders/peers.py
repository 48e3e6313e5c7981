"""The PyPI peers: django-db-mutex, django-mysql's ``Lock``, python-redis-lock (.venv-bench)."""

from __future__ import annotations

import os
from typing import Any, ClassVar

from django.db import IntegrityError

from bench import db, router

from .base import Busy, Contender, DjangoCounting, backoff_wait

REDIS_URL = os.environ.get("LOCKS_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")


class DBMutex(DjangoCounting, Contender):
    """django-db-mutex: ``db_mutex(lock_id)``; it has no blocking acquire, so waits back off.

    Example::

        DBMutex("postgresql").try_acquire("bench:k")
    """

    family = "db_mutex"
    title = "django-db-mutex"
    backends: ClassVar[tuple[str, ...]] = ("postgresql", "mariadb")
    needs = ("db_mutex",)

    def clear(self, prefix: str) -> None:
        db.execute(
            self.backend, "DELETE FROM db_mutex_dbmutex WHERE lock_id LIKE %s", [prefix + "%"]
        )

    def open(self) -> None:
        from db_mutex.db_mutex import db_mutex

        self.db_mutex = db_mutex
        router.target = db.alias(self.backend)
        self.install_counter([router.target])

    def close(self) -> None:
        db.close_all()

    def _try(self, key: str) -> Any | None:
        from db_mutex.exceptions import DBMutexError

        mutex = self.db_mutex(key)
        try:
            mutex.start()
        except (DBMutexError, IntegrityError):
            return None
        return mutex

    def try_acquire(self, key: str) -> Any | None:
        return self.counted(lambda: self._try(key))

    def acquire(self, key: str, timeout: float) -> Any:
        return backoff_wait(lambda: self.try_acquire(key), key, timeout)

    def release(self, handle: Any) -> None:
        self.counted(handle.stop)


class DjangoMySQL(DjangoCounting, Contender):
    """django-mysql: ``django_mysql.locks.Lock(name, acquire_timeout, using=...)`` (GET_LOCK).

    Example::

        DjangoMySQL("mariadb").acquire("bench:k", 30)
    """

    family = "django_mysql"
    title = "django-mysql Lock"
    backends: ClassVar[tuple[str, ...]] = ("mariadb",)
    needs = ("django_mysql",)

    def open(self) -> None:
        from django_mysql.locks import Lock

        self.Lock = Lock
        self.using = db.alias(self.backend)
        self.install_counter([self.using])

    def close(self) -> None:
        db.close_all()

    def acquire(self, key: str, timeout: float) -> Any:
        from django_mysql.exceptions import TimeoutError as LockTimeout

        lock = self.Lock(key, acquire_timeout=timeout, using=self.using)
        try:
            return self.counted(lock.acquire)
        except LockTimeout as exc:
            raise Busy(str(exc)) from exc

    def try_acquire(self, key: str) -> Any | None:
        try:
            return self.acquire(key, 0)
        except Busy:
            return None

    def release(self, handle: Any) -> None:
        self.counted(handle.release)


class RedisLock(Contender):
    """python-redis-lock on Redis: ``Lock(client, name, expire=60)``; waiters BLPOP a signal.

    Example::

        RedisLock("redis").acquire("bench:k", 30)
    """

    family = "redis_lock"
    title = "python-redis-lock"
    backends: ClassVar[tuple[str, ...]] = ("redis",)
    needs = ("redis_lock",)

    def _client(self) -> Any:
        import redis

        contender = self

        class Counting(redis.StrictRedis):
            def execute_command(self, *args: Any, **options: Any) -> Any:
                contender.statements += 1
                return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]

        return Counting.from_url(REDIS_URL)

    def unreachable(self) -> str | None:
        try:
            self._client().ping()
        except Exception as exc:
            return f"Redis not reachable at {REDIS_URL}: {exc}"
        return None

    def clear(self, prefix: str) -> None:
        client = self._client()
        for name in client.scan_iter(match=f"*{prefix}*"):
            client.delete(name)

    def open(self) -> None:
        import redis_lock

        self.redis_lock = redis_lock
        self.client = self._client()
        self.client.ping()
        self.statements = 0

    def close(self) -> None:
        self.client.close()

    def try_acquire(self, key: str) -> Any | None:
        lock = self.redis_lock.Lock(self.client, key, expire=60)
        return lock if lock.acquire(blocking=False) else None

    def acquire(self, key: str, timeout: float) -> Any:
        lock = self.redis_lock.Lock(self.client, key, expire=60)
        if not lock.acquire(blocking=True, timeout=max(1, int(timeout))):
            raise Busy(f"redis lock {key!r} timed out")
        return lock

    def release(self, handle: Any) -> None:
        handle.release()

    # The counter lives in Redis too: GET, then SET.
    def counter_init(self, key: str) -> None:
        self._client().set(f"counter:{key}", 0)

    def counter_value(self, key: str) -> int:
        return int(self._client().get(f"counter:{key}") or 0)

    def counter_get(self, key: str) -> int:
        self.statements -= 1
        return int(self.client.get(f"counter:{key}") or 0)

    def counter_set(self, key: str, value: int) -> None:
        self.statements -= 1
        self.client.set(f"counter:{key}", value)
