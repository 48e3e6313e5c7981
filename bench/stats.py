"""Figures of one measurement, medians over repeats, and ratios to the floor of the same run."""

from __future__ import annotations

import math
import statistics
from typing import Any


def percentile(values: list[int], fraction: float) -> float:
    """Nearest-rank percentile of nanosecond values, in milliseconds (0.0 when empty).

    Example::

        percentile([1_000_000, 3_000_000], 0.5)  # 1.0
    """
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = min(len(ordered), max(1, math.ceil(fraction * len(ordered))))
    return ordered[rank - 1] / 1e6


def summarise(outcomes: list[dict[str, Any]], scenario: str) -> dict[str, Any]:
    """One measurement's figures from its workers' outcomes.

    Example::

        summarise(outcomes, "c")["p99_ms"]
    """
    if scenario == "e":
        reaper, pairs = outcomes[0], outcomes[1]
        figures = summarise([pairs], "a")
        seconds = reaper["extra"]["reap_seconds"]
        figures.update(
            reaped=reaper["extra"].get("reaped", 0),
            reap_seconds=seconds,
            reap_rows_per_s=reaper["extra"].get("reaped", 0) / seconds if seconds else 0.0,
        )
        return figures
    lat = [value for outcome in outcomes for value in outcome["lat"]]
    ops = sum(outcome["ops"] for outcome in outcomes)
    total = sum(outcome["total"] for outcome in outcomes)
    window = max((outcome["window"] for outcome in outcomes), default=0.0)
    errors: dict[str, int] = {}
    for outcome in outcomes:
        for name, count in outcome["errors"].items():
            errors[name] = errors.get(name, 0) + count
    statements = sum(outcome["statements"] for outcome in outcomes)
    return {
        "ops": ops,
        "total": total,
        "ops_per_s": ops / window if window else 0.0,
        "p50_ms": percentile(lat, 0.50),
        "p99_ms": percentile(lat, 0.99),
        "max_ms": max(lat, default=0) / 1e6,
        "statements_per_op": statements / total if total else 0.0,
        "errors": errors,
    }


MEDIAN_KEYS = (
    "ops_per_s", "p50_ms", "p99_ms", "statements_per_op", "reap_seconds", "reap_rows_per_s",
    "fill_seconds",
)  # fmt: skip


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over repeats; lost updates and errors add up; the longest wait is the worst.

    Example::

        combine([run1, run2, run3])["ops_per_s"]
    """
    combined: dict[str, Any] = {"repeats": len(runs)}
    for key in MEDIAN_KEYS:
        values = [run[key] for run in runs if key in run]
        if values:
            combined[key] = statistics.median(values)
    combined["max_ms"] = max(run["max_ms"] for run in runs)
    combined["ops"] = sum(run["ops"] for run in runs)
    combined["lost_updates"] = sum(run.get("lost_updates", 0) for run in runs)
    combined["reaped"] = min((run["reaped"] for run in runs if "reaped" in run), default=None)
    errors: dict[str, int] = {}
    for run in runs:
        for name, count in run["errors"].items():
            errors[name] = errors.get(name, 0) + count
    combined["errors"] = errors
    return combined


def ratio(value: float | None, floor: float | None) -> float | None:
    """``value / floor``, or ``None`` when either is missing or the floor is zero.

    Example::

        ratio(300.0, 1000.0)  # 0.3
    """
    if value is None or floor is None or not floor:
        return None
    return value / floor


def paired(
    mine: list[dict[str, Any]], theirs: list[dict[str, Any]], figure: str, other: str = ""
) -> float | None:
    """Median over repeats of ``mine[figure] / theirs[other or figure]``, repeat by repeat.

    Both were measured in the same round of the run, minutes apart at most, so a ratio
    of a pair cancels most of the machine's drifting load; ``None`` when no repeat has both.

    Example::

        paired(runs["a"]["locks/postgresql"], runs["a"]["floor/postgresql"], "ops_per_s")
    """
    by_repeat = {run.get("repeat"): run for run in theirs}
    values = [
        value
        for run in mine
        if (match := by_repeat.get(run.get("repeat"))) is not None
        and (value := ratio(run.get(figure), match.get(other or figure))) is not None
    ]
    return statistics.median(values) if values else None
