"""A short soak: four processes under random faults for about 15 s, with no violation."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.history_check import summarize
from tests.pgbouncer import ENABLED as PGBOUNCER
from tests.soak import FAULTS, soak

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_short_soak_under_random_faults_finds_no_violation(tmp_path: Path, backend: str) -> None:
    # SQLite has no server sessions to end; SIGSTOP and SIGKILL apply everywhere.
    faults = FAULTS if backend != "sqlite" else ("stop", "kill")
    seed = random.randrange(2**31)
    result = soak(
        tmp_path, processes=4, names=6, seconds=15, seed=seed, faults=faults, min_faults=8
    )
    name = backend + ("+pgbouncer" if PGBOUNCER else "")
    summarize("soak: random faults", name, sum(result.faults.values()), result.report)
    assert not result.violations, (seed, result.violations[:20])
    assert sum(result.faults.values()) >= 8, result.summary()
    assert result.report.holdings > 50, result.summary()
