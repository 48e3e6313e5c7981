"""What each part of an uncontended acquire+release costs on MariaDB: ``python -m bench.anatomy``.

Scenario (a) compares this app with the floor (one INSERT and one DELETE of a small
row). This builds the app's pair up from the floor one feature at a time, each step the
step above plus one thing, and times every step in one process on one key, interleaved
in random order so that noise falls on all steps alike:

1. the floor;
2. the lock table's row (its columns and its ``expires_at`` index, which the reaper needs);
3. the upsert (``ON DUPLICATE KEY UPDATE``: re-entry and take-over in one statement);
4. ``RETURNING`` (the grant's token, count and times, in the same round trip);
5. the fencing token's draw under its stripe's row lock: the app's exact acquire;
6. the owner-checked release: the app's exact SQL, through the bare driver;
7. Django's cursor: the same SQL through the app's own connection and its backend class;
8. the app's Python around it: ``locks.try_acquire`` and ``Lease.release``.

Steps 1-6 talk to the server through mysqlclient with no Django in between, as the
floor does. Each row shows the step's median time per pair and what it
adds to the step above.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import django

KEY = "bench:anatomy"
TTL_MICROS = 60_000_000
STEPS = [
    "floor (INSERT + DELETE of a small row)",
    "+ the lock table's row and its expiry index",
    "+ upsert (ON DUPLICATE KEY UPDATE)",
    "+ RETURNING",
    "+ fencing token drawn under a stripe lock",
    "+ owner-checked release (the app's SQL)",
    "+ Django's cursor and the backend's row handling",
    "+ the app's Python (try_acquire, release)",
]


def _steps(cursor: Any, alias: str) -> list[Callable[[], None]]:
    import locks
    from locks import connection
    from locks.backends import for_connection, mysql

    plain_row = (
        "INSERT INTO locks_lock (name, holder, count, token, acquired_at, expires_at, note) "
        f"VALUES (%s, %s, 1, 1, {mysql.NOW}, {mysql.NOW} + INTERVAL %s MICROSECOND, %s)"
    )
    # The same statement with a constant token, and without its RETURNING clause.
    fixed_token = mysql.ACQUIRE.replace(mysql.TOKEN_DRAW, "1 + 0 * LENGTH(%s)")
    no_returning = fixed_token[: fixed_token.index("RETURNING")]
    acquire_args = [KEY, "anatomy", KEY, TTL_MICROS, ""]

    def run(sql: str, args: list[Any]) -> Any:
        cursor.execute(sql, args)
        return cursor.fetchone() if cursor.description else None

    def delete() -> None:
        run("DELETE FROM locks_lock WHERE name = %s", [KEY])

    def with_delete(sql: str, args: list[Any]) -> Callable[[], None]:
        def pair() -> None:
            run(sql, args)
            delete()

        return pair

    def floor() -> None:
        run("INSERT INTO bench_floor (name) VALUES (%s)", [KEY])
        run("DELETE FROM bench_floor WHERE name = %s", [KEY])

    def the_apps_sql() -> None:
        token = run(mysql.ACQUIRE, acquire_args)[1]
        run(mysql.RELEASE_LAST, [KEY, "anatomy", token, False])

    own = connection.get(alias)
    backend = for_connection(own)

    def through_django() -> None:
        own_cursor = connection.cursor(own)
        grant = backend.acquire(own_cursor, KEY, "anatomy", TTL_MICROS / 1e6, "")
        assert grant is not None, f"{KEY} is held: another run going on?"
        backend.release_last(own_cursor, KEY, "anatomy", grant.token)

    def the_app() -> None:
        lease = locks.try_acquire(KEY, ttl=TTL_MICROS / 1e6, using=alias)
        assert lease is not None, f"{KEY} is held: another run going on?"
        lease.release()

    return [
        floor,
        with_delete(plain_row, [KEY, "anatomy", TTL_MICROS, ""]),
        with_delete(no_returning, acquire_args),
        with_delete(fixed_token, acquire_args),
        with_delete(mysql.ACQUIRE, acquire_args),
        the_apps_sql,
        through_django,
        the_app,
    ]


def measure(pairs: int) -> list[float]:
    """Median seconds per pair of each step, in the order of :data:`STEPS`.

    Example::

        floor, *rest = measure(2000)
    """
    from . import db

    db.ensure_database("mariadb")
    connection = db.connect("mariadb")
    try:
        steps = _steps(connection.cursor(), db.alias("mariadb"))
        times: list[list[float]] = [[] for _ in steps]
        order = list(range(len(steps)))
        for _ in range(max(pairs // 20, 1)):  # warm up: connections, caches, plans
            for step in steps:
                step()
        for _ in range(pairs):
            random.shuffle(order)
            for index in order:
                started = time.perf_counter()
                steps[index]()
                times[index].append(time.perf_counter() - started)
        return [statistics.median(each) for each in times]
    finally:
        connection.close()


def main(argv: list[str] | None = None) -> int:
    """Measure and print the table.

    Example::

        main(["--pairs", "500"])
    """
    parser = argparse.ArgumentParser(prog="python -m bench.anatomy", description=__doc__)
    parser.add_argument("--pairs", type=int, default=3000, help="pairs per step (default 3000)")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    django.setup()
    medians = measure(args.pairs)
    floor = medians[0]
    print(f"mariadb: median of {args.pairs} pairs per step, interleaved\n")
    print("| step | us per pair | x floor | adds us |")
    print("|---|---:|---:|---:|")
    for index, (label, median) in enumerate(zip(STEPS, medians, strict=True)):
        adds = "" if index == 0 else f"{(median - medians[index - 1]) * 1e6:+.0f}"
        print(f"| {label} | {median * 1e6:.0f} | {median / floor:.2f}x | {adds} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
