"""The performance targets of issue 6, judged from one run (ratios paired repeat by repeat)."""

from __future__ import annotations

from typing import Any

from .stats import paired

Row = tuple[str, str, str]  # target, measured, verdict


def _runs(results: dict[str, Any], scenario: str, key: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = results["runs"].get(scenario, {}).get(key, [])
    return found


def _ratio(
    results: dict[str, Any], scenario: str, key: str, other: str, figure: str
) -> float | None:
    return paired(_runs(results, scenario, key), _runs(results, scenario, other), figure)


def _verdict(ok: bool | None) -> str:
    return "n/a (not run)" if ok is None else ("met" if ok else "**MISSED**")


def _at_least(target: str, value: float | None, bound: float, unit: str) -> Row:
    if value is None:
        return target, "-", _verdict(None)
    return target, f"{value:.2f}{unit}", _verdict(value >= bound)


def _floor_and_mutex(results: dict[str, Any], backend: str) -> list[Row]:
    app, floor, mutex = f"locks/{backend}", f"floor/{backend}", f"db_mutex/{backend}"
    slower = _ratio(results, "a", floor, app, "ops_per_s")
    rows: list[Row] = [
        (
            f"(a) {backend}: acquire+release within 1.25x of the floor's time",
            "-" if slower is None else f"{slower:.2f}x the floor's time per pair",
            _verdict(None if slower is None else slower <= 1.25),
        ),
        _at_least(
            f"(a) {backend}: at least 3x django-db-mutex's pairs/s",
            _ratio(results, "a", app, mutex, "ops_per_s"),
            3.0,
            "x",
        ),
    ]
    behind, compared = [], 0
    for scenario, figure in (("a", "ops_per_s"), ("b", "ops_per_s"), ("c", "ops_per_s")):
        value = _ratio(results, scenario, app, mutex, figure)
        if value is not None:
            compared += 1
            if value <= 1:
                behind.append(f"({scenario}) {value:.2f}x its {figure}")
    faster = _ratio(results, "d", mutex, app, "p50_ms")
    if faster is not None:
        compared += 1
        if faster <= 1:
            behind.append(f"(d) {faster:.2f}x its speed (p50)")
    rows.append(
        (
            f"{backend}: ahead of django-db-mutex on every scenario",
            ("behind on " + "; ".join(behind)) if behind else f"ahead on {compared} of {compared}",
            _verdict(not behind if compared else None),
        )
    )
    return rows


def _contended(results: dict[str, Any]) -> list[Row]:
    p99 = results["summary"].get("c", {}).get("locks/postgresql", {}).get("p99_ms")
    return [
        _at_least(
            "(c) postgresql: hand-offs/s at least pg_advisory_lock's",
            _ratio(results, "c", "locks/postgresql", "pg_advisory/postgresql", "ops_per_s"),
            1.0,
            "x pg_advisory_lock's",
        ),
        (
            "(c) postgresql: p99 wait at most 10 ms",
            "-" if p99 is None else f"{p99:.1f} ms (median of the repeats)",
            _verdict(None if p99 is None else p99 <= 10),
        ),
    ]


def _correctness(summary: dict[str, Any]) -> list[Row]:
    deadlocks = sum(
        count
        for by_key in summary.values()
        for key, figures in by_key.items()
        if key == "locks/mariadb"
        for name, count in figures.get("errors", {}).items()
        if "1213" in name
    )
    ran_mariadb = any("locks/mariadb" in by_key for by_key in summary.values())
    lost = {key: figures["lost_updates"] for key, figures in summary.get("c", {}).items()}
    lossy = {key: n for key, n in lost.items() if n}
    return [
        (
            "mariadb: no deadlock (1213) reaches the caller",
            f"{deadlocks} seen" if ran_mariadb else "-",
            _verdict(deadlocks == 0 if ran_mariadb else None),
        ),
        (
            "(c) no lost update, any contender",
            ", ".join(f"{k}: {n}" for k, n in lossy.items()) or f"0 in {len(lost)} contenders",
            _verdict(not lossy if lost else None),
        ),
    ]


def judge(results: dict[str, Any]) -> list[Row]:
    """Every target as (target, measured, verdict).

    Example::

        for target, measured, verdict in judge(results): ...
    """
    rows: list[Row] = []
    for backend in ("postgresql", "mariadb"):
        rows += _floor_and_mutex(results, backend)
    return rows + _contended(results) + _correctness(results["summary"])
