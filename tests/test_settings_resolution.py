"""How NOTIFY and PREPARED_STATEMENTS are decided for a database (pure settings logic)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from locks.conf import conf

DIRECT: dict[str, Any] = {"OPTIONS": {}}
POOLED: dict[str, Any] = {"OPTIONS": {}, "DISABLE_SERVER_SIDE_CURSORS": True}
UNPREPARED: dict[str, Any] = {"OPTIONS": {"prepare_threshold": None}}


def test_both_are_on_by_default_for_a_direct_connection() -> None:
    assert conf.notify(DIRECT)
    assert conf.prepared_statements(DIRECT)
    assert conf.prepared_statements({})  # no OPTIONS at all


def test_both_are_off_by_default_behind_a_transaction_pooler() -> None:
    assert not conf.notify(POOLED)
    assert not conf.prepared_statements(POOLED)


def test_an_explicit_prepare_threshold_none_turns_preparing_off_only() -> None:
    assert not conf.prepared_statements(UNPREPARED)
    assert conf.notify(UNPREPARED)
    # Django's own default is no preparing: a missing key is not a choice.
    assert conf.prepared_statements({"OPTIONS": {"prepare_threshold": 5}})


@override_settings(LOCKS={"NOTIFY": True, "PREPARED_STATEMENTS": True})
def test_an_explicit_true_wins_over_the_pooler_guess() -> None:
    # e.g. PgBouncer 1.21+ with max_prepared_statements, or a session pooler.
    assert conf.notify(POOLED)
    assert conf.prepared_statements(POOLED)
    assert conf.prepared_statements(UNPREPARED)


@override_settings(LOCKS={"NOTIFY": False, "PREPARED_STATEMENTS": False})
def test_an_explicit_false_wins_everywhere() -> None:
    assert not conf.notify(DIRECT)
    assert not conf.prepared_statements(DIRECT)


@pytest.mark.parametrize("value", ["yes", 1, "False"])
def test_a_value_other_than_true_false_none_is_refused_by_name(value: object) -> None:
    with override_settings(LOCKS={"NOTIFY": value, "PREPARED_STATEMENTS": value}):
        with pytest.raises(TypeError, match=r"LOCKS\['NOTIFY'\]: must be True, False or None"):
            conf.notify(DIRECT)
        with pytest.raises(TypeError, match=r"LOCKS\['PREPARED_STATEMENTS'\]"):
            conf.prepared_statements(DIRECT)
