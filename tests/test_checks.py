"""System checks: each id, and that ``manage.py check`` runs them."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections
from django.test import override_settings

from locks import checks


def ids(messages: list[Any]) -> list[str]:
    return [message.id for message in messages]


def test_default_settings_pass() -> None:
    assert checks.check_settings() == []


@override_settings(LOCKS=["DATABASE"])
def test_e001_locks_must_be_a_dict() -> None:
    assert ids(checks.check_settings()) == ["locks.E001"]


@override_settings(LOCKS={"DATABSE": "default"})
def test_e001_unknown_keys_are_named() -> None:
    messages = checks.check_settings()
    assert ids(messages) == ["locks.E001"]
    assert "DATABSE" in messages[0].msg


@override_settings(LOCKS={"DATABASE": "nowhere"})
def test_e002_database_must_be_configured() -> None:
    messages = checks.check_settings()
    assert ids(messages) == ["locks.E002"]
    assert "nowhere" in messages[0].msg


@override_settings(LOCKS={"NOTIFY": "off", "PREPARED_STATEMENTS": 0})
def test_e004_tri_state_settings_take_only_true_false_none() -> None:
    messages = checks.check_settings()
    assert ids(messages) == ["locks.E004", "locks.E004"]
    assert "'NOTIFY'" in messages[0].msg and "'off'" in messages[0].msg
    assert "'PREPARED_STATEMENTS'" in messages[1].msg


@override_settings(LOCKS={"NOTIFY": False, "PREPARED_STATEMENTS": None})
def test_e004_accepts_booleans_and_none() -> None:
    assert checks.check_settings() == []


@override_settings(USE_TZ=False)
def test_w001_use_tz_off_is_warned() -> None:
    assert ids(checks.check_settings()) == ["locks.W001"]


@pytest.mark.django_db
def test_e003_accepts_the_database_under_test() -> None:
    assert checks.check_database(databases=["default"]) == []


@pytest.mark.parametrize(
    ("vendor", "version", "mariadb", "problem"),
    [
        ("postgresql", (12, 9), False, "13 or newer"),
        ("mysql", (8, 0, 36), False, "use MariaDB"),
        ("mysql", (10, 5), True, "10.6 or newer"),
        ("sqlite", (3, 31, 1), False, "3.35 or newer"),
        ("oracle", (19,), False, "not supported"),
    ],
)
def test_e003_names_unsupported_servers(
    vendor: str, version: tuple[int, ...], mariadb: bool, problem: str
) -> None:
    # No such servers run here: a stand-in carries the version the check reads.
    server = SimpleNamespace(
        vendor=vendor, get_database_version=lambda: version, mysql_is_mariadb=mariadb
    )
    assert problem in (checks._version_problem(server) or "")


@pytest.fixture
def memory_alias() -> Iterator[str]:
    connections.settings["memory"] = {
        **connections.settings["default"],
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": ":memory:",
        "OPTIONS": {},
    }
    try:
        yield "memory"
    finally:
        connections["memory"].close()
        del connections["memory"]
        del connections.settings["memory"]


@pytest.mark.django_db
def test_w002_in_memory_sqlite_is_warned(memory_alias: str) -> None:
    with override_settings(LOCKS={"DATABASE": memory_alias}):
        assert ids(checks.check_database(databases=[memory_alias])) == ["locks.W002"]


@override_settings(LOCKS={"DATABASE": "nowhere"})
def test_manage_py_check_runs_the_checks() -> None:
    with pytest.raises(SystemCheckError, match=r"locks\.E002"):
        call_command("check")
