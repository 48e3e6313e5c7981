"""scripts/test refuses a bad environment at once, before any set-up or service start."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.conftest import ROOT

SCRIPT = str(ROOT / "scripts" / "test")


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("LOCKS_TEST_LANES", "3", "LOCKS_TEST_LANES must be 1 or 2, not '3'"),
        ("LOCKS_TEST_BACKENDS", "oracle", "unknown backend 'oracle' in LOCKS_TEST_BACKENDS"),
        ("LOCKS_TEST_BACKENDS", "sqlite@django7", "unknown backend 'sqlite@django7'"),
        ("LOCKS_TEST_BACKENDS", ",", "LOCKS_TEST_BACKENDS selects no backend"),
        ("LOCKS_TEST_BROKERS", "kafka", "unknown broker 'kafka' in LOCKS_TEST_BROKERS"),
        ("LOCKS_TEST_BROKERS", "", "LOCKS_TEST_BROKERS selects no broker"),
    ],
)
def test_bad_setting_is_refused_before_set_up(variable: str, value: str, message: str) -> None:
    env = {**os.environ, variable: value}
    done = subprocess.run(
        [SCRIPT, "--collect-only"],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert done.returncode == 1
    # Only the error: no set-up step (venv, packages, services) ran before it.
    assert done.stdout == ""
    assert done.stderr.startswith(f"ERROR: {message}")
    assert done.stderr.count("\n") == 1


def test_the_brokers_setting_picks_some_of_the_brokers_and_refuses_anything_else() -> None:
    from tests.celery_support import BROKER_URLS, _brokers

    assert _brokers("redis") == {"redis": BROKER_URLS["redis"]}
    assert _brokers("rabbitmq,redis") == BROKER_URLS
    for wrong in ("kafka", "redis kafka", " "):
        with pytest.raises(RuntimeError, match="LOCKS_TEST_BROKERS must name some of"):
            _brokers(wrong)
