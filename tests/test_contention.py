"""Mutual exclusion across OS processes, checked by what they can observe."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.app.models import Counter, Hold
from tests.conftest import finish, read_event, spawn

pytestmark = pytest.mark.django_db(transaction=True)

WORKERS = 4
ROUNDS = 200


def test_processes_never_overlap_and_tokens_rise_in_hold_order(tmp_path: Path) -> None:
    Counter.objects.create(name="contended", value=0)
    gate = tmp_path / "go"
    workers = [spawn("contend", w, "contended", ROUNDS, 30, gate) for w in range(WORKERS)]
    # All start at once: a worker that finished before the next one started up would
    # make the checks below pass whatever the lock does.
    for worker in workers:
        assert read_event(worker)["event"] == "ready"
    gate.touch()
    for worker in workers:
        finish(worker)

    # A second holder at any moment would lose some of these non-atomic increments.
    assert Counter.objects.get(name="contended").value == WORKERS * ROUNDS

    holds = list(Hold.objects.filter(name="contended").order_by("started"))
    assert len(holds) == WORKERS * ROUNDS
    assert {hold.worker for hold in holds} == set(range(WORKERS))
    for before, after in itertools.pairwise(holds):
        assert before.ended <= after.started, f"overlapping holds: {before} / {after}"
        assert before.token < after.token, "fencing tokens must rise in hold order"
