"""What each part of an uncontended acquire+release costs: ``python -m bench.anatomy``.

Scenario (a) compares this app with the floor (one INSERT and one DELETE of a small
row). This builds the app's pair up from the floor, each step the step above plus one
thing, and times every step in one process on one key, interleaved in random order so
that noise falls on all steps alike. On MariaDB (``--backend mariadb``, the default):

1. the floor;
2. the lock table's row (its columns and its ``expires_at`` index, which the reaper needs);
3. the upsert (``ON DUPLICATE KEY UPDATE``: re-entry and take-over in one statement);
4. ``RETURNING`` (the grant's token, count and times, in the same round trip);
5. the fencing token's draw under its stripe's row lock: the app's exact acquire;
6. the owner-checked release: the app's exact SQL, through the bare driver;
7. the app's own connection: the same SQL through its cursor and the backend class;
8. the app's Python around it: ``locks.try_acquire`` and ``Lease.release``.

On PostgreSQL (``--backend postgresql``) steps 2-5 are one: the app's SQL, prepared.
The app's own connections send their hot statements through psycopg's libpq layer
(``locks.backends.libpq``) rather than its cursor, so the PostgreSQL steps are:

1. the floor, through psycopg's cursor (as every contender of the benchmark);
2. the floor's two statements sent through libpq the same way as the app's;
3. the app's SQL, through libpq (the app's ``PreparedCursor`` on the bare driver);
4. the app's own connection, its cursor and the backend class;
5. the app's Python around it.

Up to step 6 (MariaDB) or 3 (PostgreSQL) the pair goes to the server through the bare
driver with no Django in between, as the floor does. Each row shows the step's median
time per pair and what it adds to the step above.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import django

KEY = "bench:anatomy"
HOLDER = "anatomy"
TTL = 60.0
FLOOR = "floor (INSERT + DELETE of a small row)"
THROUGH_DJANGO = [
    "+ the app's own connection, its cursor and the backend's row handling",
    "+ the app's Python (try_acquire, release)",
]
STEPS = {
    "mariadb": [
        FLOOR,
        "+ the lock table's row and its expiry index",
        "+ upsert (ON DUPLICATE KEY UPDATE)",
        "+ RETURNING",
        "+ fencing token drawn under a stripe lock",
        "+ owner-checked release (the app's SQL)",
        *THROUGH_DJANGO,
    ],
    "postgresql": [
        FLOOR,
        "the floor's statements through libpq, as the app's",
        "+ the app's SQL, prepared, through libpq",
        *THROUGH_DJANGO,
    ],
}

Run = Callable[[str, Any], Any]
Step = Callable[[], None]


def _runner(cursor: Any, backend: str) -> Run:
    # As the app's own PostgreSQL connections do, and as psycopg does for the floor's
    # statements after a few runs anyway: prepared on the server.
    options = {"prepare": True} if backend == "postgresql" else {}

    def run(sql: str, args: Any) -> Any:
        cursor.execute(sql, args, **options)
        return cursor.fetchone() if cursor.description else None

    return run


def _floor(run: Run) -> Step:
    from .db import FLOOR_DELETE, FLOOR_INSERT

    def floor() -> None:
        run(FLOOR_INSERT, [KEY])
        run(FLOOR_DELETE, [KEY])

    return floor


def _pair(run: Run, acquire: str, acquire_args: Any, release: Callable[[Any], None]) -> Step:
    def pair() -> None:
        release(run(acquire, acquire_args))

    return pair


def _mariadb_sql(run: Run) -> list[Step]:
    from locks.backends import mysql

    args = [KEY, HOLDER, KEY, round(TTL * 1_000_000), ""]
    plain_row = (
        "INSERT INTO locks_lock (name, holder, count, token, acquired_at, expires_at, note) "
        f"VALUES (%s, %s, 1, 1, {mysql.NOW}, {mysql.NOW} + INTERVAL %s MICROSECOND, %s)"
    )
    # The acquire with a constant token, and without its RETURNING clause.
    fixed_token = mysql.ACQUIRE.replace(mysql.TOKEN_DRAW, "1 + 0 * LENGTH(%s)")
    no_returning = fixed_token[: fixed_token.index("RETURNING")]

    def delete(_row: Any) -> None:
        run("DELETE FROM locks_lock WHERE name = %s", [KEY])

    def release(row: Any) -> None:
        run(mysql.RELEASE_LAST, [KEY, HOLDER, row[1], False])

    return [
        _pair(run, plain_row, [KEY, HOLDER, round(TTL * 1_000_000), ""], delete),
        _pair(run, no_returning, args, delete),
        _pair(run, fixed_token, args, delete),
        _pair(run, mysql.ACQUIRE, args, delete),
        _pair(run, mysql.ACQUIRE, args, release),
    ]


def _postgresql_sql(connection: Any) -> list[Step]:
    from locks.backends import postgresql
    from locks.backends.libpq import PreparedCursor, plans

    from .db import FLOOR_DELETE, FLOOR_INSERT

    floor_plans = plans([FLOOR_INSERT, FLOOR_DELETE], "bench_floor_")
    cursor = PreparedCursor(connection.cursor(), {**postgresql.HOT, **floor_plans})

    def run(sql: str, args: Any) -> Any:
        cursor.execute(sql, args)
        return cursor.fetchone()

    def release(row: Any) -> None:
        run(postgresql.RELEASE_LAST, [KEY, HOLDER, row[0], False])

    args = {"name": KEY, "holder": HOLDER, "ttl": timedelta(seconds=TTL), "note": ""}
    return [_floor(run), _pair(run, postgresql.ACQUIRE, args, release)]


def _through_django(alias: str) -> list[Step]:
    import locks
    from locks import connection
    from locks.backends import for_connection

    own = connection.get(alias)
    backend = for_connection(own)

    def backend_calls() -> None:
        cursor = connection.cursor(own)
        grant = backend.acquire(cursor, KEY, HOLDER, TTL, "")
        assert grant is not None, f"{KEY} is held: another run going on?"
        backend.release_last(cursor, KEY, HOLDER, grant.token)

    def public_api() -> None:
        lease = locks.try_acquire(KEY, ttl=TTL, using=alias)
        assert lease is not None, f"{KEY} is held: another run going on?"
        lease.release()

    return [backend_calls, public_api]


def measure(backend: str, pairs: int) -> list[float]:
    """Median seconds per pair of each step, in the order of ``STEPS[backend]``.

    Example::

        floor, *rest = measure("mariadb", 2000)
    """
    from . import db

    db.ensure_database(backend)
    connection = db.connect(backend)
    try:
        run = _runner(connection.cursor(), backend)
        sql = _mariadb_sql(run) if backend == "mariadb" else _postgresql_sql(connection)
        steps = [_floor(run), *sql, *_through_django(db.alias(backend))]
        assert len(steps) == len(STEPS[backend])
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

        main(["--backend", "postgresql", "--pairs", "500"])
    """
    parser = argparse.ArgumentParser(prog="python -m bench.anatomy", description=__doc__)
    parser.add_argument("--backend", default="mariadb", choices=sorted(STEPS))
    parser.add_argument("--pairs", type=int, default=3000, help="pairs per step (default 3000)")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    django.setup()
    medians = measure(args.backend, args.pairs)
    floor = medians[0]
    print(f"{args.backend}: median of {args.pairs} pairs per step, interleaved\n")
    print("| step | us per pair | x floor | adds us |")
    print("|---|---:|---:|---:|")
    for index, (label, median) in enumerate(zip(STEPS[args.backend], medians, strict=True)):
        adds = "" if index == 0 else f"{(median - medians[index - 1]) * 1e6:+.0f}"
        print(f"| {label} | {median * 1e6:.0f} | {median / floor:.2f}x | {adds} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
