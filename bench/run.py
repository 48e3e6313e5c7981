"""The benchmark's entry point: ``python -m bench.run [--quick] [--scenarios a,b] [--repeat N]``.

Use ``scripts/bench`` (it prepares .venv-bench with the peers and starts nothing else).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import django

SCENARIOS = "abcde"
BACKENDS = ["postgresql", "mariadb", "sqlite", "redis"]
ALL_FAMILIES = [
    "locks",
    "locks_pooled",
    "floor",
    "pg_advisory",
    "get_lock",
    "db_mutex",
    "django_mysql",
    "redis_lock",
]


class Default(NamedTuple):
    """A numeric option's help, its value for a full run, and for ``--quick``."""

    what: str
    full: int | float
    quick: int | float


#: The help text and the report's method section are written from these.
DEFAULTS = {
    "repeat": Default("repeats per scenario", 5, 1),
    "duration": Default("seconds per measurement", 2.0, 0.5),
    "reap_rows": Default("expired rows for (e)", 1_000_000, 100_000),
}


def shown(value: int | float) -> str:
    """A default as the help and the report write it: ``shown(1_000_000) == "1,000,000"``."""
    return f"{value:g}" if isinstance(value, float) else f"{value:,}"


def repeats(count: int | float) -> str:
    """How many repeats, in words: ``repeats(1) == "1 repeat"``, ``repeats(5) == "5 repeats"``."""
    return f"{shown(count)} repeat{'' if count == 1 else 's'}"


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Parse and check the command line; refuse unknown names before anything runs.

    Example::

        args = parse(["--quick", "--scenarios", "a,c"])
    """
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    quick_help = f"about a minute: short runs, {repeats(DEFAULTS['repeat'].quick)}"
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--scenarios", default=SCENARIOS, help="subset of a,b,c,d,e (default all)")
    for option, default in DEFAULTS.items():
        parser.add_argument(
            f"--{option.replace('_', '-')}",
            type=type(default.full),
            help=f"{default.what} (default {shown(default.full)}; quick {shown(default.quick)})",
        )
    parser.add_argument("--backends", default=",".join(BACKENDS), help="databases to run on")
    parser.add_argument("--contenders", default=",".join(ALL_FAMILIES), help="families to run")
    parser.add_argument("--out", default="docs/benchmark.md", help="Markdown report")
    parser.add_argument("--json", default="var/bench/latest.json", help="raw results")
    parser.add_argument("--plot", default="docs/benchmark-contended.png", help="PNG of (c)")
    args = parser.parse_args(argv)
    args.scenarios = list(dict.fromkeys(args.scenarios.replace(",", "")))
    unknown = {
        "scenarios": sorted(set(args.scenarios) - set(SCENARIOS)),
        "backends": sorted(set(args.backends.split(",")) - set(BACKENDS)),
        "contenders": sorted(set(args.contenders.split(",")) - set(ALL_FAMILIES)),
    }
    for option, names in unknown.items():
        if names:
            parser.error(f"unknown --{option}: {', '.join(names)}")
    if not args.scenarios:
        parser.error("--scenarios names none of a, b, c, d, e")
    for option, default in DEFAULTS.items():
        if getattr(args, option) is None:
            setattr(args, option, default.quick if args.quick else default.full)
    if args.repeat < 1 or args.duration <= 0 or args.reap_rows < 1:
        parser.error("--repeat, --duration and --reap-rows must be positive")
    return args


def log(message: str) -> None:
    """Print a progress line on stderr.

    Example::

        log("starting")
    """
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def select(args: argparse.Namespace) -> tuple[list[Any], dict[str, str]]:
    """The contenders to run, and the reasons the others cannot run here.

    Example::

        ready, skipped = select(parse(["--contenders", "locks,floor"]))
    """
    from . import contenders, db

    backends = set(args.backends.split(","))
    families = set(args.contenders.split(","))
    chosen = [c for c in contenders.every() if c.family in families and c.backend in backends]
    skipped: dict[str, str] = {}
    ready: list[Any] = []
    prepared: set[str] = set()
    for c in chosen:
        reason = c.missing()
        if reason is None and c.backend in db.BACKENDS and c.backend not in prepared:
            db.ensure_database(c.backend)
            prepared.add(c.backend)
        if reason is None:
            reason = c.probe()
        if reason is None:
            c.prepare()
            c.clear("bench:")
            ready.append(c)
        else:
            skipped[c.key] = reason
            log(f"skipping {c.key}: {reason}")
    return ready, skipped


def cell(c: Any, scenario: str, prefix: str, args: argparse.Namespace) -> dict[str, Any]:
    """One measurement of one contender, with its book-keeping around it.

    Example::

        figures = cell(contender, "a", "bench:1:1:", parse([]))
    """
    from . import db, runner, stats

    extra: dict[str, Any] = {}
    if c.backend in db.BACKENDS:
        db.tidy(c.backend)
    if scenario == "c":
        c.counter_init(f"{prefix}shared")
    if scenario == "e":
        c.clear("bench:")  # rows an interrupted earlier attempt left would be reaped too
        began = time.monotonic()
        c.fill_expired(f"{prefix}x", args.reap_rows)
        extra["fill_seconds"] = time.monotonic() - began
        db.analyze(c.backend, "locks_lock")  # as autovacuum/auto-recalc would, soon after
    duration = 900.0 if scenario == "e" else args.duration
    figures = stats.summarise(runner.measure(c, scenario, prefix, duration), scenario)
    figures.update(extra)
    if scenario == "c":
        figures["lost_updates"] = figures["total"] - c.counter_value(f"{prefix}shared")
    c.clear(prefix)
    return figures


ATTEMPTS = 3


def retried(
    c: Any, scenario: str, prefix: str, args: argparse.Namespace, failures: list[str]
) -> dict[str, Any] | None:
    """:func:`cell`, tried again after a failure (e.g. a database server restarted under it).

    Returns ``None`` after the last failed attempt, which ``failures`` then describes.

    Example::

        figures = retried(contender, "c", "bench:1:2:", args, failures)
    """
    from . import db

    for attempt in range(1, ATTEMPTS + 1):
        try:
            return cell(c, scenario, f"{prefix}{attempt}:", args)
        except Exception as exc:
            first = _cause(exc)
            log(f"({scenario}) {c.key}: attempt {attempt} failed: {first}")
            db.close_all()
            if attempt == ATTEMPTS:
                failures.append(f"({scenario}) {c.key}: {ATTEMPTS} attempts failed, last: {first}")
            else:
                time.sleep(5)
    return None


def _cause(exc: Exception) -> str:
    """The line of a (worker's) traceback that names the exception, not its notes."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    named = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Shutdown)\b", line)]
    return (named or lines)[-1]


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run every scenario for every contender, interleaved; return the results.

    Example::

        results = run(parse(["--quick"]))
    """
    from . import stats

    started = time.time()
    load_before = os.getloadavg()
    ready, skipped = select(args)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {s: {} for s in args.scenarios}
    failures: list[str] = []
    serial = 0
    for repeat in range(args.repeat):
        for scenario in args.scenarios:
            taking = [c for c in ready if scenario in c.scenarios]
            # Round-robin: each repeat starts with another contender, so none always
            # runs first (or right after the same neighbour).
            shift = repeat % len(taking) if taking else 0
            for c in taking[shift:] + taking[:shift]:
                serial += 1
                prefix = f"bench:{int(started)}:{serial}:"
                figures = retried(c, scenario, prefix, args, failures)
                if figures is None:
                    continue
                figures["repeat"] = repeat
                runs[scenario].setdefault(c.key, []).append(figures)
                log(f"repeat {repeat + 1}/{args.repeat} ({scenario}) {c.key}: {_brief(figures)}")
    summary = {
        s: {key: stats.combine(figures) for key, figures in by_key.items()}
        for s, by_key in runs.items()
    }
    return {
        "meta": {
            "started": dt.datetime.fromtimestamp(started, dt.UTC).isoformat(timespec="seconds"),
            "seconds": round(time.time() - started, 1),
            "cpus": os.cpu_count(),
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "quick": args.quick,
            "repeat": args.repeat,
            "duration": args.duration,
            "reap_rows": args.reap_rows,
            "scenarios": args.scenarios,
        },
        "contenders": {
            c.key: {"label": c.label, "family": c.family, "backend": c.backend, "floor": c.floor}
            for c in ready
        },
        "skipped": skipped,
        "failures": failures,
        "runs": runs,
        "summary": summary,
    }


def _brief(figures: dict[str, Any]) -> str:
    text = (
        f"{figures['ops_per_s']:.0f} ops/s, p50 {figures['p50_ms']:.2f} ms, "
        f"p99 {figures['p99_ms']:.2f} ms, {figures['statements_per_op']:.2f} stmt/op"
    )
    if "lost_updates" in figures:
        text += f", lost {figures['lost_updates']}"
    if "reap_seconds" in figures:
        text += f", reaped {figures['reaped']} in {figures['reap_seconds']:.1f} s"
    if figures["errors"]:
        text += f", errors {figures['errors']}"
    return text


def main(argv: list[str] | None = None) -> int:
    """The command: run, then write the JSON, the plot and the report.

    Example::

        main(["--quick"])
    """
    args = parse(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    django.setup()
    from . import report

    results = run(args)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1))
    plot = report.plot(results, args.plot)
    report.write(results, args.out, plot)
    log(f"wrote {args.json}, {args.out}" + (f", {plot}" if plot else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
