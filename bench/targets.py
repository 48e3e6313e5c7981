"""The performance targets of issue 6, judged from one run's medians."""

from __future__ import annotations

from typing import Any

Row = tuple[str, str, str]  # target, measured, verdict


def _get(summary: dict[str, Any], scenario: str, key: str, figure: str) -> float | None:
    value = summary.get(scenario, {}).get(key, {}).get(figure)
    return None if value is None else float(value)


def _verdict(ok: bool | None) -> str:
    return "n/a (not run)" if ok is None else ("met" if ok else "**MISSED**")


def _within_floor(summary: dict[str, Any], backend: str) -> Row:
    app = _get(summary, "a", f"locks/{backend}", "ops_per_s")
    floor = _get(summary, "a", f"floor/{backend}", "ops_per_s")
    target = f"(a) {backend}: acquire+release within 1.25x of the floor's time"
    if not app or not floor:
        return target, "-", _verdict(None)
    factor = floor / app
    return (
        target,
        f"{factor:.2f}x the floor's time ({app:.0f} vs {floor:.0f} pairs/s)",
        _verdict(factor <= 1.25),
    )


def _versus_mutex(summary: dict[str, Any], backend: str) -> list[Row]:
    rows: list[Row] = []
    app = _get(summary, "a", f"locks/{backend}", "ops_per_s")
    mutex = _get(summary, "a", f"db_mutex/{backend}", "ops_per_s")
    target = f"(a) {backend}: at least 3x django-db-mutex"
    if app and mutex:
        rows.append((target, f"{app / mutex:.1f}x", _verdict(app >= 3 * mutex)))
    else:
        rows.append((target, "-", _verdict(None)))
    behind = []
    compared = 0
    for scenario, figure, higher in (
        ("a", "ops_per_s", True),
        ("b", "ops_per_s", True),
        ("c", "ops_per_s", True),
        ("d", "p50_ms", False),
    ):
        mine = _get(summary, scenario, f"locks/{backend}", figure)
        theirs = _get(summary, scenario, f"db_mutex/{backend}", figure)
        if mine is None or theirs is None:
            continue
        compared += 1
        if (mine <= theirs) if higher else (mine >= theirs):
            behind.append(f"({scenario}) {mine:.2f} vs {theirs:.2f} {figure}")
    measured = "behind on " + "; ".join(behind) if behind else f"ahead on {compared} scenarios"
    rows.append(
        (
            f"{backend}: ahead of django-db-mutex on every scenario",
            measured if compared else "-",
            _verdict(not behind if compared else None),
        )
    )
    return rows


def _contended(summary: dict[str, Any]) -> list[Row]:
    app = _get(summary, "c", "locks/postgresql", "ops_per_s")
    advisory = _get(summary, "c", "pg_advisory/postgresql", "ops_per_s")
    p99 = _get(summary, "c", "locks/postgresql", "p99_ms")
    rows: list[Row] = []
    target = "(c) postgresql: hand-offs/s at least pg_advisory_lock's"
    if app and advisory:
        rows.append((target, f"{app:.0f} vs {advisory:.0f} /s", _verdict(app >= advisory)))
    else:
        rows.append((target, "-", _verdict(None)))
    target = "(c) postgresql: p99 wait at most 10 ms"
    rows.append((target, f"{p99:.1f} ms" if p99 is not None else "-", _verdict(
        None if p99 is None else p99 <= 10
    )))  # fmt: skip
    return rows


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


def judge(summary: dict[str, Any]) -> list[Row]:
    """Every target as (target, measured, verdict).

    Example::

        for target, measured, verdict in judge(results["summary"]): ...
    """
    rows = [_within_floor(summary, "postgresql"), _within_floor(summary, "mariadb")]
    for backend in ("postgresql", "mariadb"):
        rows += _versus_mutex(summary, backend)
    return rows + _contended(summary) + _correctness(summary)
