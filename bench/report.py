"""Writes the benchmark's Markdown report and the PNG plot of the contended scenario."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .run import DEFAULTS, repeats, shown
from .stats import paired
from .targets import judge

TITLES = {
    "a": "(a) Uncontended acquire+release, one process, one key",
    "b": "(b) 4 processes, each on its own key",
    "c": "(c) 4 processes contend for one key (blocking acquire, counter read+write inside)",
    "d": "(d) Hand-off latency: holder's release call to the waiter's acquire returning",
    "e": "(e) The reaper deletes the expired rows while (a) runs",
}
BEGIN, END = "<!-- analysis:begin -->", "<!-- analysis:end -->"
DEFAULT_ANALYSIS = "_No analysis written for this run yet._"

# The run's defaults as the method text writes them (see bench.run.DEFAULTS).
FULL = {option: shown(default.full) for option, default in DEFAULTS.items()}
QUICK = {option: shown(default.quick) for option, default in DEFAULTS.items()}
HOW = f"""\
## Running it

- `scripts/bench [options]`; every option: `scripts/bench --help`. `--quick` (short
  runs, {repeats(DEFAULTS["repeat"].quick)}, {QUICK["reap_rows"]} rows for (e)),
  `--scenarios a,c`, `--repeat N` (default {FULL["repeat"]}), `--duration S` (seconds per
  measurement, default {FULL["duration"]}), `--reap-rows N` (default {FULL["reap_rows"]}),
  `--backends postgresql,mariadb,sqlite,redis`, `--contenders` (any of `locks`, `locks_pooled`,
  `floor`, `pg_advisory`, `get_lock`, `db_mutex`, `django_mysql`, `redis_lock`), and `--out`,
  `--json`, `--plot` for the output paths.
- Databases: `locks_bench_<checkout tag>` on PostgreSQL and MariaDB (`LOCKS_BENCH_DB_NAME`
  overrides; created and migrated by the run, kept for the next), the SQLite file
  `var/bench/<same name>.sqlite3`, and Redis database 13 (`LOCKS_BENCH_REDIS_URL`).
  Server addresses: `PGHOST`/`PGPORT`/`PGUSER`/`PGPASSWORD`, `MYSQL_HOST`/`MYSQL_PORT`/
  `MYSQL_USER`/`MYSQL_PASSWORD`. A contender whose server or package is missing is skipped,
  and this page lists it with the reason.
- Where the time of an uncontended pair goes:
  `.venv-bench/bin/python -m bench.profile --backend postgresql` (cProfile), and what each
  part of the pair adds to the floor:
  `.venv-bench/bin/python -m bench.anatomy --backend mariadb` (or `postgresql`).
- `tests/test_bench.py` runs a tiny bench of this app and the floor on the backend under
  test in the normal suite.
- Run (d) and (c) on an idle machine for figures to compare across runs: on a loaded one,
  compare the ratios within a run.

## How it was measured

- One command, `scripts/bench` (it creates `.venv-bench` from `requirements-bench.txt`,
  the only place where the three PyPI peers are installed), runs `python -m bench.run`.
- Every contender runs in its own forked OS processes, each with its own connections,
  opened (and warmed up with 10 acquire+release pairs) before a barrier starts the clock.
  Contenders are interleaved: each repeat runs every scenario for every contender, and
  each repeat starts the round at a different contender. Figures are medians over the
  repeats ({FULL["repeat"]} by default: one repeat that something else on the machine disturbed
  moves a median of five less than a median of three); lost updates and errors are
  totals; the longest wait is the worst of all repeats.
- This app runs through its public API (`locks.try_acquire`, `locks.acquire(timeout=...)`,
  `Lease.release`, `locks.reap_expired`). The floor, the advisory locks and `GET_LOCK`
  use psycopg 3 / mysqlclient / sqlite3 directly, in autocommit, through the driver's
  cursor. On PostgreSQL the app's own connections send their acquire and release through
  psycopg's libpq layer instead (prepared once per session, see the README); the floor's
  two statements sent that way take about 0.88x the floor's time (`bench.anatomy
  --backend postgresql` times both). django-db-mutex has no
  blocking acquire: its waiters retry with backoff from 1 ms doubling to 50 ms, with jitter.
- (c): each of 4 processes loops: blocking acquire (the wait is timed), read the counter
  row, write it back plus one, release. Throughput counts hand-offs finished in the window;
  lost updates = hand-offs - the counter's final value.
- (d): two processes pass one key back and forth; the holder keeps it 2-8 ms (random) so
  the other is surely waiting, records the instant before it calls release, and waits until
  the other has the lock before it asks again. The latency runs from that instant to the
  waiter's acquire returning (`time.monotonic_ns()` is one clock for all processes here):
  it includes the release round trip, the wake-up and the acquire.
- (e): the lock table gets N expired rows in one INSERT ... SELECT; one process runs
  `locks.reap_expired(batch_size=1000)` once while another runs (a) until the reaper is done.
- The floor is not a lock. (a)/(b): one autocommit INSERT of a small row with a unique key
  plus one DELETE. (c): one process runs the critical section serially (INSERT, counter read,
  counter write, DELETE): no lock can hand off faster; its "wait" is 3 such cycles, what a
  perfectly fair lock would give 4 processes. (d): DELETE + INSERT, the least a hand-off costs.
  Redis has no floor of its own; python-redis-lock is compared with PostgreSQL's floor.
- `x floor` = this figure / the same figure of the floor on the same database, taken
  repeat by repeat (the two were measured in the same round, minutes apart at most) and
  then the median of those ratios: a drifting load on a shared machine cancels out of a
  pair better than out of two medians. For ops/s higher is better; for times lower is.
- Statements per operation are the statements the lock calls sent: counted by a counting
  `execute` patched into the driver's cursor class (under Django's wrappers,
  which it leaves as they are) for a Django-based lock, and per `execute` (or Redis
  command) for the others. The BEGIN/COMMIT that Django sends for `transaction.atomic()`
  outside `execute` are not counted (django-db-mutex's acquire has one such transaction).
"""


def _fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _errors(figures: dict[str, Any]) -> str:
    return ", ".join(f"{name}: {count}" for name, count in figures["errors"].items()) or "0"


Columns = list[tuple[str, Callable[[dict[str, Any], dict[str, Any]], str]]]

PAIRS: Columns = [
    ("ops/s", lambda f, r: _fmt(f["ops_per_s"])),
    ("x floor", lambda f, r: _x(r["ops_per_s"])),
    ("p50 ms", lambda f, r: _fmt(f["p50_ms"])),
    ("x floor", lambda f, r: _x(r["p50_ms"])),
    ("p99 ms", lambda f, r: _fmt(f["p99_ms"])),
    ("x floor", lambda f, r: _x(r["p99_ms"])),
    ("statements/op", lambda f, r: _fmt(f["statements_per_op"])),
    ("errors", lambda f, r: _errors(f)),
]
CONTENDED: Columns = [
    ("hand-offs/s", lambda f, r: _fmt(f["ops_per_s"])),
    ("x floor", lambda f, r: _x(r["ops_per_s"])),
    ("p50 wait ms", lambda f, r: _fmt(f["p50_ms"])),
    ("x floor", lambda f, r: _x(r["p50_ms"])),
    ("p99 wait ms", lambda f, r: _fmt(f["p99_ms"])),
    ("x floor", lambda f, r: _x(r["p99_ms"])),
    ("longest wait ms", lambda f, r: _fmt(f["max_ms"])),
    ("statements/hand-off", lambda f, r: _fmt(f["statements_per_op"])),
    ("lost updates", lambda f, r: str(f["lost_updates"])),
    ("errors", lambda f, r: _errors(f)),
]
HANDOFF: Columns = [
    ("p50 ms", lambda f, r: _fmt(f["p50_ms"])),
    ("x floor", lambda f, r: _x(r["p50_ms"])),
    ("p99 ms", lambda f, r: _fmt(f["p99_ms"])),
    ("x floor", lambda f, r: _x(r["p99_ms"])),
    ("hand-offs timed", lambda f, r: str(f["ops"])),
    ("statements/hand-off", lambda f, r: _fmt(f["statements_per_op"])),
    ("errors", lambda f, r: _errors(f)),
]
REAPER: Columns = [
    ("rows reaped", lambda f, r: f"{f['reaped']:,}" if f.get("reaped") is not None else "-"),
    ("fill s", lambda f, r: _fmt(f.get("fill_seconds"), 1)),
    ("reap s", lambda f, r: _fmt(f.get("reap_seconds"), 1)),
    ("rows/s", lambda f, r: _fmt(f.get("reap_rows_per_s"))),
    ("(a) ops/s meanwhile", lambda f, r: _fmt(f["ops_per_s"])),
    ("(a) p99 ms meanwhile", lambda f, r: _fmt(f["p99_ms"])),
    ("x (a) alone", lambda f, r: _x(r["own_a_p99"])),
    ("x floor (a)", lambda f, r: _x(r["floor_a_p99"])),
    ("errors", lambda f, r: _errors(f)),
]
COLUMNS = {"a": PAIRS, "b": PAIRS, "c": CONTENDED, "d": HANDOFF, "e": REAPER}


def _reference(results: dict[str, Any], scenario: str, key: str) -> dict[str, float | None]:
    """Ratios to the floor of the same run, paired repeat by repeat (medians of the pairs)."""
    runs = results["runs"]
    floor = results["contenders"][key]["floor"]
    mine = runs[scenario][key]
    if scenario == "e":
        return {
            "own_a_p99": paired(mine, runs.get("a", {}).get(key, []), "p99_ms"),
            "floor_a_p99": paired(mine, runs.get("a", {}).get(floor, []), "p99_ms"),
        }
    theirs = runs[scenario].get(floor, [])
    return {figure: paired(mine, theirs, figure) for figure in ("ops_per_s", "p50_ms", "p99_ms")}


def table(results: dict[str, Any], scenario: str) -> list[str]:
    """The Markdown table of one scenario, one row per contender.

    Example::

        lines = table(results, "c")
    """
    columns = COLUMNS[scenario]
    lines = [
        "| contender | " + " | ".join(name for name, _ in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for key, figures in results["summary"][scenario].items():
        reference = _reference(results, scenario, key)
        cells = [render(figures, reference) for _, render in columns]
        label = results["contenders"][key]["label"]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _header(results: dict[str, Any], plot: str | None, out: Path) -> list[str]:
    meta = results["meta"]
    mode = "quick" if meta["quick"] else "full"
    lines = [
        "# Benchmark: locks against its peers and the physical floor",
        "",
        "Re-run everything with one command (about 20 minutes; `--quick` for about one):",
        "",
        "```sh",
        "scripts/bench            # writes this file, var/bench/latest.json and the plot",
        "scripts/bench --quick    # smoke run",
        "```",
        "",
        f"This run: {meta['started']}, {mode} mode, {repeats(meta['repeat'])} of "
        f"{meta['duration']:g} s per measurement, (e) with {meta['reap_rows']:,} rows, "
        f"{meta['seconds']:.0f} s in all, on {meta['cpus']} CPUs. Load average before "
        f"{meta['load_before']}, after {meta['load_after']}"
        + (
            ": **the machine was shared and loaded**, so absolute figures are noisy; "
            "ratios within one run are the figures to read."
            if max(meta["load_before"][0], meta["load_after"][0]) > 1.0
            else "."
        ),
        "",
    ]
    if results["skipped"]:
        lines += ["Not run here:", ""]
        lines += [f"- {key}: {why}" for key, why in results["skipped"].items()]
        lines.append("")
    if results.get("failures"):
        lines += ["Measurements that failed (left out of the medians):", ""]
        lines += [f"- {failure}" for failure in results["failures"]]
        lines.append("")
    lines += ["## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {v} |" for t, m, v in judge(results)]
    lines.append("")
    if plot:
        lines += [f"![scenario (c)]({os.path.relpath(plot, out.parent)})", ""]
    return lines


def write(results: dict[str, Any], path: str, plot: str | None) -> None:
    """Write the report to ``path``, keeping the hand-written analysis block of the old one.

    Example::

        write(results, "docs/benchmark.md", "docs/benchmark-contended.png")
    """
    out = Path(path)
    analysis = DEFAULT_ANALYSIS
    if out.exists():
        found = re.search(re.escape(BEGIN) + r"\n(.*?)\n" + re.escape(END), out.read_text(), re.S)
        if found:
            analysis = found.group(1)
    lines = _header(results, plot, out)
    for scenario in results["meta"]["scenarios"]:
        if results["summary"].get(scenario):
            lines += [f"## {TITLES[scenario]}", "", *table(results, scenario), ""]
    lines += ["## Analysis", "", BEGIN, analysis, END, "", HOW]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))


def plot(results: dict[str, Any], path: str) -> str | None:
    """A PNG of scenario (c): hand-offs/s and p50/p99 wait per contender (needs matplotlib).

    Example::

        plot(results, "docs/benchmark-contended.png")
    """
    contended = results["summary"].get("c")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if not contended:
        return None
    labels = [results["contenders"][key]["label"] for key in contended]
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 0.45 * len(labels) + 1.5))
    rows = range(len(labels))
    left.barh(rows, [f["ops_per_s"] for f in contended.values()], color="tab:blue")
    left.set_yticks(rows, labels)
    left.invert_yaxis()
    left.set_xlabel("hand-offs per second (higher is better)")
    right.barh([r - 0.2 for r in rows], [f["p50_ms"] for f in contended.values()], 0.4,
               label="p50 wait")  # fmt: skip
    right.barh([r + 0.2 for r in rows], [f["p99_ms"] for f in contended.values()], 0.4,
               label="p99 wait")  # fmt: skip
    right.set_yticks(rows, [""] * len(labels))
    right.invert_yaxis()
    right.set_xscale("log")
    right.set_xlabel("wait in ms, log scale (lower is better)")
    right.legend()
    figure.suptitle("(c) 4 processes contending for one key")
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path
