"""The history checker itself: hand-made histories that break each rule, and clean ones."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

import locks
from tests.history import BUSY, ERROR, LOST, OK, PENDING, STALE, Op, Recorder, load
from tests.history_check import check

BASE = datetime(2026, 1, 1, tzinfo=UTC)
_ids = itertools.count()


def at(seconds: float) -> datetime:
    """A database-clock time, ``seconds`` after the start of the made-up run."""
    return BASE + timedelta(seconds=seconds)


def op(kind: str, m0: float, m1: float | None, result: str = OK, **details: Any) -> Op:
    details.setdefault("name", "x")
    return Op(id=str(next(_ids)), op=kind, m0=m0, m1=m1, result=result, **details)


def grant(
    proc: str, token: int, m0: float, ttl: float = 1.0, count: int = 1, holder: str = ""
) -> Op:
    """An acquire that returned a lease whose database times match the monotonic ones."""
    return op(
        "acquire",
        m0,
        m0 + 0.01,
        proc=proc,
        holder=holder or proc,
        token=token,
        count=count,
        ttl=ttl,
        acquired_at=at(m0 + 0.005),
        expires_at=at(m0 + 0.005 + ttl),
    )


def rules(ops: list[Op], final_rows: list[tuple[str, int]] | None = None) -> list[str]:
    return [v.split(":")[0] for v in check(ops, final_rows or []).violations]


def clean_run() -> list[Op]:
    """a holds, writes, releases; b takes it, writes, lets it expire; c takes over."""
    return [
        grant("a", 1, 0.0),
        op("write", 0.1, 0.11, proc="a", token=1),
        op("renew", 0.2, 0.21, proc="a", holder="a", token=1, ttl=1.0, expires_at=at(1.205)),
        op("release", 0.3, 0.31, proc="a", holder="a", token=1),
        op("acquire", 0.25, 0.28, BUSY, proc="b", holder="b"),
        grant("b", 2, 0.32),
        op("write", 0.4, 0.41, proc="b", token=2),
        op("write", 0.42, 0.43, STALE, proc="a", token=1),  # a wrote after releasing
        grant("c", 3, 1.4),  # b's lease (until 1.325) expired unreleased
        op("renew", 1.5, 1.51, LOST, proc="b", holder="b", token=2, ttl=1.0),
        op("write", 1.6, 1.61, proc="c", token=3),
        op("release", 1.7, 1.71, proc="c", holder="c", token=3),
    ]


def test_a_clean_history_passes_and_is_counted() -> None:
    report = check(clean_run(), final_rows=[])
    assert report.violations == []
    assert (report.ops, report.holdings, report.writes) == (12, 3, 4)
    assert report.by_op["acquire"] == 4


def test_the_same_token_granted_afresh_twice_is_token_reuse() -> None:
    assert rules([grant("a", 5, 0.0), grant("b", 5, 2.0)]) == ["token-reuse"]


def test_reentry_keeps_the_token_without_being_reuse() -> None:
    assert rules([grant("a", 5, 0.0), grant("a", 5, 0.1, count=2)]) == []


def test_a_smaller_token_granted_later_breaks_token_order() -> None:
    assert rules([grant("b", 5, 0.0), grant("a", 3, 2.0)]) == ["token-order"]


def test_an_old_holder_renewing_after_a_new_grant_means_two_holders() -> None:
    history = [
        grant("a", 1, 0.0, ttl=0.1),
        grant("b", 2, 0.2),
        op("renew", 0.3, 0.31, proc="a", holder="a", token=1, ttl=0.1, expires_at=at(0.4)),
    ]
    assert rules(history) == ["two-holders"]


def test_a_grant_before_the_old_lease_expired_is_an_early_takeover() -> None:
    history = [grant("a", 1, 0.0, ttl=1.0), grant("b", 2, 0.5)]
    assert rules(history) == ["early-takeover"]


@pytest.mark.parametrize("kind", ["release", "break"])
def test_a_release_or_break_before_the_new_grant_excuses_it(kind: str) -> None:
    ending = op(kind, 0.4, 0.41, proc="a", holder="a", token=1)
    assert rules([grant("a", 1, 0.0, ttl=1.0), ending, grant("b", 2, 0.5)]) == []


def test_an_unfinished_release_may_have_happened_and_excuses_the_new_grant() -> None:
    ending = op("release", 0.4, None, PENDING, proc="a", holder="a", token=1)
    assert rules([grant("a", 1, 0.0, ttl=1.0), ending, grant("b", 2, 0.5)]) == []


def test_a_lease_lost_within_its_ttl_without_a_break_is_flagged() -> None:
    lost = op("renew", 1.0, 1.01, LOST, proc="a", holder="a", token=1, ttl=10.0)
    assert rules([grant("a", 1, 0.0, ttl=10.0), lost]) == ["live-lease-lost"]
    broken = op("break", 0.5, 0.51, proc="admin")
    assert rules([grant("a", 1, 0.0, ttl=10.0), broken, lost]) == []


def test_a_lease_lost_after_its_ttl_is_fine() -> None:
    lost = op("release", 1.5, 1.51, LOST, proc="a", holder="a", token=1, ttl=1.0)
    assert rules([grant("a", 1, 0.0, ttl=1.0), lost]) == []


def test_a_write_accepted_after_a_greater_token_wrote_is_stale() -> None:
    history = [op("write", 0.0, 0.01, proc="b", token=2), op("write", 0.1, 0.11, proc="a", token=1)]
    assert rules(history) == ["stale-write"]


def test_overlapping_writes_may_land_in_either_order() -> None:
    history = [op("write", 0.0, 0.2, proc="b", token=2), op("write", 0.1, 0.11, proc="a", token=1)]
    assert rules(history) == []


def test_a_refusal_with_no_greater_token_about_is_flagged() -> None:
    refused = op("write", 0.1, 0.11, STALE, proc="a", token=2)
    assert rules([op("write", 0.0, 0.01, proc="b", token=1), refused]) == ["refused-write"]
    failed = op("write", 0.0, 0.05, ERROR, proc="c", token=3)  # may have been written
    assert rules([failed, refused]) == []


def test_a_row_left_by_a_released_holding_is_a_lost_release() -> None:
    history = [grant("a", 1, 0.0), op("release", 0.1, 0.11, proc="a", holder="a", token=1)]
    assert rules(history, final_rows=[("x", 1)]) == ["release-lost"]
    assert rules(history[:1], final_rows=[("x", 1)]) == []  # never released: may stay


def test_a_failed_acquire_may_have_re_entered_the_row_a_release_leaves() -> None:
    """The server went away after committing a re-entry, before its answer reached us."""
    failed = op("acquire", 0.05, 0.06, ERROR, proc="a")
    release = op("release", 0.1, 0.11, proc="a", holder="a", token=1)
    assert rules([grant("a", 1, 0.0), failed, release], final_rows=[("x", 1)]) == []
    # ... or even granted the row afresh, which a later acquire of ours re-entered.
    reentered = grant("a", 1, 0.07, count=2)
    assert rules([failed, reentered, release], final_rows=[("x", 1)]) == []
    # Not another process's failure, nor one after the release, nor another name's.
    for other in (
        op("acquire", 0.05, 0.06, ERROR, proc="b"),
        op("acquire", 0.2, 0.21, ERROR, proc="a"),
        op("acquire", 0.05, 0.06, ERROR, proc="a", name="y"),
    ):
        assert rules([grant("a", 1, 0.0), other, release], final_rows=[("x", 1)]) == [
            "release-lost"
        ]


def test_two_processes_holding_one_row_lock_overlap() -> None:
    history = [
        op("row_lock", 0.0, 0.01, proc="p1"),
        op("row_unlock", 1.0, 1.01, proc="p1"),
        op("row_lock", 0.5, 0.51, proc="p2"),
    ]
    assert rules(history) == ["row-overlap"]


def test_a_killed_row_lock_holder_held_until_its_last_event_only() -> None:
    history = [
        op("row_lock", 0.0, 0.01, proc="p1"),
        op("row_hold", 0.3, 0.3, proc="p1"),
        op("row_lock", 0.2, 0.25, proc="p2"),
    ]
    assert rules(history) == ["row-overlap"]
    history[2] = op("row_lock", 0.2, 0.4, proc="p2")  # granted after p1's last sign of life
    assert rules(history) == []


def test_recorded_files_load_back_with_outcomes_pending_and_torn_lines(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    recorder = Recorder(path, proc="p")
    assert recorder.run("acquire", "x", lambda: None) == (BUSY, None)

    def lose() -> None:
        raise locks.LockLost("lock 'x' was lost")

    assert recorder.run("renew", "x", lose, token=4)[0] == LOST
    recorder.event("kill", "x", target="q")
    recorder.close()
    with open(path, "a", encoding="utf-8") as out:
        begin = {"ev": "begin", "id": "p:9", "proc": "p", "op": "release", "name": "x", "m": 1e12}
        out.write(json.dumps(begin) + "\n")
        out.write('{"ev": "end", "id": "p:9", "m": 1e12, "res')  # torn by a SIGKILL
    ops = load([path])
    assert [(o.op, o.result, o.token) for o in ops] == [
        ("acquire", BUSY, None),
        ("renew", LOST, 4),
        ("kill", OK, None),
        ("release", PENDING, None),
    ]
    assert ops[1].error == "lock 'x' was lost" and ops[1].m1 is not None
