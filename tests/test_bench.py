"""The benchmark runs end to end (this app and the floor, on the backend under test)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

import locks
from bench.anatomy import STEPS
from bench.contenders import base
from bench.report import HOW
from bench.run import parse
from bench.stats import combine, percentile
from bench.targets import judge
from tests.conftest import BACKEND, ROOT
from tests.settings import CHECKOUT

SCENARIOS = "abcde"
COUNT_ANATOMY_ROWS = """
import os, sys, django
os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
django.setup()
from bench import db
cursor = db.connect(sys.argv[1]).cursor()
for table in ("locks_lock", "bench_floor"):
    cursor.execute(f"SELECT COUNT(*) FROM {table} WHERE name = 'bench:anatomy'")
    print(table, cursor.fetchone()[0])
"""
REAP_ROWS = 3000


def bench(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m bench.run`` with outputs under ``tmp_path`` and its own databases."""
    env = {
        **os.environ,
        "LOCKS_BENCH_DB_NAME": f"locks_bench_smoke_{CHECKOUT}",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    outputs = [
        f"--out={tmp_path / 'benchmark.md'}",
        f"--json={tmp_path / 'results.json'}",
        f"--plot={tmp_path / 'contended.png'}",
    ]
    return subprocess.run(
        [sys.executable, "-m", "bench.run", *outputs, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_tiny_run_measures_the_app_and_the_floor_with_no_lost_update(tmp_path: Path) -> None:
    done = bench(
        tmp_path,
        f"--backends={BACKEND}",
        "--contenders=locks,floor",
        "--repeat=1",
        "--duration=0.3",
        f"--reap-rows={REAP_ROWS}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results: dict[str, Any] = json.loads((tmp_path / "results.json").read_text())
    app, floor = f"locks/{BACKEND}", f"floor/{BACKEND}"
    summary = results["summary"]
    for scenario in SCENARIOS:
        keys = {app, floor} if scenario != "e" else {app}
        assert set(summary[scenario]) == keys, scenario
        for key in keys:
            figures = summary[scenario][key]
            assert figures["ops"] > 0, (scenario, key, figures)
            assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"] < 60_000
            assert figures["errors"] == {}, (scenario, key, figures["errors"])
    # One statement per uncontended acquire and one per release (tests/test_statements.py).
    assert summary["a"][app]["statements_per_op"] == 2.0
    assert summary["c"][app]["lost_updates"] == 0
    assert summary["c"][floor]["lost_updates"] == 0
    assert summary["e"][app]["reaped"] == REAP_ROWS
    report = (tmp_path / "benchmark.md").read_text()
    assert "## Targets" in report
    assert "full mode, 1 repeat of 0.3 s per measurement" in report
    assert f"| locks ({BACKEND}) |" in report
    assert "(c) no lost update, any contender | 0 in 2 contenders | met |" in report


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--scenarios=ax"], "unknown --scenarios: x"),
        (["--backends=oracle"], "unknown --backends: oracle"),
        (["--contenders=locks,zookeeper"], "unknown --contenders: zookeeper"),
        (["--repeat=0"], "must be positive"),
        (["--duration=-1"], "must be positive"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(
    tmp_path: Path, args: list[str], error: str
) -> None:
    done = bench(tmp_path, *args)
    assert done.returncode == 2
    assert error in done.stderr
    assert list(tmp_path.iterdir()) == []  # no report, no results, no plot


def test_a_full_run_repeats_five_times_and_a_quick_one_once() -> None:
    # scripts/bench and the published analysis promise these defaults.
    assert (parse([]).repeat, parse(["--quick"]).repeat, parse(["--repeat=2"]).repeat) == (5, 1, 2)
    full, quick = parse([]), parse(["--quick"])
    assert (full.duration, full.reap_rows) == (2.0, 1_000_000)
    assert (quick.duration, quick.reap_rows) == (0.5, 100_000)


def test_the_help_and_the_report_state_the_defaults_the_run_uses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for option in ("repeats per scenario", "seconds per measurement", "expired rows for (e)"):
        assert option in shown
    assert "(default 5; quick 1)" in shown
    assert "short runs, 1 repeat" in shown
    assert "(default 2; quick 0.5)" in shown
    assert "(default 1,000,000; quick 100,000)" in shown
    how = " ".join(HOW.split())
    assert "`--repeat N` (default 5)" in how
    assert "default 2)" in how
    assert "`--reap-rows N` (default 1,000,000)" in how
    assert "1 repeat, 100,000 rows for (e)" in how
    assert "repeats (5 by default" in how


def test_percentile_is_nearest_rank_in_milliseconds() -> None:
    values = [n * 1_000_000 for n in range(1, 101)]  # 1..100 ms
    assert percentile(values, 0.50) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([], 0.99) == 0.0


def test_repeats_combine_to_medians_with_losses_and_errors_added_up() -> None:
    runs = [
        {"ops_per_s": ops, "p50_ms": 1.0, "p99_ms": p99, "max_ms": p99 * 2, "ops": 10,
         "statements_per_op": 2.0, "lost_updates": lost, "errors": errors}
        for ops, p99, lost, errors in [
            (100.0, 5.0, 0, {}), (300.0, 9.0, 2, {"OperationalError 1213": 1}), (200.0, 7.0, 0, {}),
        ]
    ]  # fmt: skip
    combined = combine(runs)
    assert combined["ops_per_s"] == 200.0
    assert combined["p99_ms"] == 7.0
    assert combined["max_ms"] == 18.0  # the worst repeat, not a median
    assert combined["lost_updates"] == 2
    assert combined["errors"] == {"OperationalError 1213": 1}


def test_targets_compare_repeat_by_repeat_and_say_by_how_much() -> None:
    def runs(*ops: float, p99: float = 25.0) -> list[dict[str, Any]]:
        return [
            {"repeat": n, "ops_per_s": value, "p50_ms": 1.0, "p99_ms": p99}
            for n, value in enumerate(ops)
        ]

    results = {
        "runs": {
            # The machine slowed down in repeat 1: both slowed, the ratio held at 0.6.
            "a": {"locks/postgresql": runs(600, 120), "floor/postgresql": runs(1000, 200)},
            "c": {"locks/postgresql": runs(500, 500), "pg_advisory/postgresql": runs(400, 600)},
        },
        "summary": {"c": {"locks/postgresql": {"p99_ms": 25.0, "lost_updates": 0}}},
    }
    verdicts = {target: (measured, verdict) for target, measured, verdict in judge(results)}
    assert verdicts["(a) postgresql: acquire+release within 1.25x of the floor's time"] == (
        "1.67x the floor's time per pair",
        "**MISSED**",
    )
    # Ratios 1.25 and 0.83: their median is 1.04.
    assert verdicts["(c) postgresql: hand-offs/s at least pg_advisory_lock's"] == (
        "1.04x pg_advisory_lock's",
        "met",
    )
    assert verdicts["(c) postgresql: p99 wait at most 10 ms"][1] == "**MISSED**"
    assert verdicts["(a) mariadb: at least 3x django-db-mutex's pairs/s"][1] == "n/a (not run)"


def test_the_anatomy_builds_the_pair_up_from_the_floor_and_leaves_no_row(tmp_path: Path) -> None:
    if BACKEND not in STEPS:
        pytest.skip("the anatomy of a pair is measured on the server databases")
    env = {**os.environ, "LOCKS_BENCH_DB_NAME": f"locks_bench_smoke_{CHECKOUT}"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-m", "bench.anatomy", f"--backend={BACKEND}", "--pairs=30"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split("|") for line in done.stdout.splitlines() if line.startswith("| ")]
    assert [row[1].strip() for row in rows[1:]] == STEPS[BACKEND]  # after the header
    assert rows[1][3].strip() == "1.00x"
    assert all(float(row[2]) > 0 for row in rows[1:])
    # What is left of the key in the bench database, read as the bench reads it.
    left = subprocess.run(
        [sys.executable, "-c", COUNT_ANATOMY_ROWS, BACKEND],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert left.returncode == 0, left.stderr[-3000:]
    assert left.stdout.split() == ["locks_lock", "0", "bench_floor", "0"]


@pytest.mark.django_db(transaction=True)
def test_the_bench_counts_the_apps_statements_and_djangos_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Count in this process as a bench worker does, and put the cursor classes back after.
    counting_in = base._count_in

    def restoring(cursor_class: type[Any]) -> None:
        monkeypatch.setattr(cursor_class, "execute", cursor_class.execute)
        counting_in(cursor_class)

    monkeypatch.setattr(base, "_count_in", restoring)
    monkeypatch.setattr(base, "_PATCHED", set())
    counter = base.DjangoCounting()
    counter.statements = 0
    counter.install_counter(["default"], own=True)  # the app's own connection
    counter.install_counter(["default"])  # Django's, where django-db-mutex's statements go

    def pair() -> None:
        lease = locks.try_acquire("bench:count", ttl=5)
        assert lease is not None
        lease.release()

    counter.counted(pair)
    assert counter.statements == 2

    def django_statement() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    counter.counted(django_statement)
    assert counter.statements == 3
    django_statement()  # outside counted(): not counted
    assert counter.statements == 3
