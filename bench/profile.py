"""Profiles this app's uncontended acquire+release: ``python -m bench.profile [--backend B]``.

Runs ``locks.try_acquire`` + ``Lease.release`` pairs under cProfile in one process and
prints where the time goes: the functions with the most own time, and the share of the
whole spent under a few functions of interest (the driver's round trip against the
app's own Python). cProfile slows Python code down more than C code, so the Python
shares it shows are upper bounds.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from typing import Any

import django

# Where the cumulative time goes: (label, module path fragment, function name).
OF_INTEREST = [
    ("whole pair (try_acquire + release)", "bench/profile.py", "_pairs"),
    ("driver round trips (cursor execute)", "locks/connection.py", "execute"),
    ("locks: try_acquire", "locks/leases.py", "try_acquire"),
    ("locks: _Request.build (validation, holder)", "locks/leases.py", "build"),
    ("locks: validation.check_name", "locks/validation.py", "check_name"),
    ("locks: settings look-ups (conf._get)", "locks/conf.py", "_get"),
    ("locks: default_holder", "locks/identity.py", "default_holder"),
    ("locks: _execute (own connection, retries)", "locks/leases.py", "_execute"),
    ("locks: check_caller", "locks/backends", "check_caller"),
    ("locks: connection.get", "locks/connection.py", "get"),
    ("locks: connection.cursor (the session's cursor)", "locks/connection.py", "cursor"),
    ("locks: backend.acquire (params, Grant)", "locks/backends", "acquire"),
    ("locks: to_datetime", "locks/backends/base.py", "to_datetime"),
    ("locks: Lease.__init__", "locks/leases.py", "__init__"),
    ("locks: Lease.release", "locks/leases.py", "release"),
    ("logging: logger.debug", "logging/__init__.py", "debug"),
]


def _pairs(alias: str, count: int) -> None:
    import locks

    for number in range(count):
        lease = locks.try_acquire(f"bench:profile:{number % 16}", ttl=60, using=alias)
        assert lease is not None
        lease.release()


def _cumulative(stats: pstats.Stats, fragment: str, name: str) -> float:
    table: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]  # documented, untyped
    return float(
        sum(
            row[3]
            for (path, _line, function), row in table.items()
            if function == name and fragment in path
        )
    )


def main(argv: list[str] | None = None) -> int:
    """Profile uncontended pairs and print the breakdown.

    Example::

        main(["--backend", "mariadb", "--pairs", "500"])
    """
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument(
        "--backend", default="postgresql", choices=["postgresql", "mariadb", "sqlite"]
    )
    parser.add_argument("--pairs", type=int, default=2000)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    django.setup()
    from . import db

    db.ensure_database(args.backend)
    alias = db.alias(args.backend)
    _pairs(alias, 50)  # connect and warm up
    began = time.perf_counter()
    _pairs(alias, args.pairs)
    plain = (time.perf_counter() - began) / args.pairs
    profiler = cProfile.Profile()
    profiler.runcall(_pairs, alias, args.pairs)
    stats = pstats.Stats(profiler)
    whole = _cumulative(stats, "bench/profile.py", "_pairs")
    print(f"{args.backend}: {args.pairs} pairs, {plain * 1e3:.3f} ms per pair unprofiled, "
          f"{whole / args.pairs * 1e3:.3f} ms profiled")  # fmt: skip
    print("\nshare of the profiled time under each function (cumulative):")
    for label, fragment, name in OF_INTEREST:
        spent = _cumulative(stats, fragment, name)
        print(f"  {spent / whole * 100:6.1f} %  {spent / args.pairs * 1e6:8.1f} us/pair  {label}")
    print(f"\ntop {args.top} functions by own time:")
    stats.sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
