"""System checks: each id, and that ``manage.py check`` runs them."""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections
from django.test import override_settings

import locks
from locks import checks
from locks.conf import DEFAULTS, VALID
from locks.models import Lock
from tests.conftest import BACKEND

# The databases a test that runs manage.py check may use: it runs the model checks
# against every alias, and on MariaDB Django 6.1 connects to each to learn its column
# types (native UUID or not). (SQLite's mirrors of one file could not each hold a test
# transaction.)
CHECKED: str | list[str] = "__all__" if BACKEND == "mariadb" else ["default"]


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


@override_settings(LOCKS={1: 2, "DATABSE": "default"})
def test_e001_names_unknown_keys_that_are_not_strings() -> None:
    messages = checks.check_settings()
    assert ids(messages) == ["locks.E001"]
    assert messages[0].msg == "Unknown LOCKS keys: 1, DATABSE."


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


NAN, INF = math.nan, math.inf
#: Values no duration setting takes: bools are not numbers, text is not parsed.
NOT_SECONDS = [True, False, NAN, -INF, -1, "60", None, [1]]
BAD_VALUES: dict[str, list[Any]] = {
    "DEFAULT_TTL": [*NOT_SECONDS, INF, 0, 0.0005, 10**9, 10**400],
    "TASK_LOCK_TTL": [*NOT_SECONDS, INF, 0, 0.0005, 10**9, 10**400],
    # None and inf mean "no limit" here.
    "REAP_TIME_BUDGET": [True, False, NAN, -INF, -1, "30", [1], 10**9],
    # Over a year: a pause time.sleep() cannot take (OverflowError) comes soon after.
    "BACKOFF_MIN": [*NOT_SECONDS, INF, 0, -0.0, 10**400, 1e11, timedelta(days=367)],
    "BACKOFF_MAX": [*NOT_SECONDS, INF, 0, -0.0, 10**400, 1e11, timedelta(days=367)],
    "TRANSIENT_RETRIES": [True, False, -1, 1.0, 2.5, NAN, INF, "8", None],
    "REAP_BATCH_SIZE": [True, False, 0, -1, 1_000_001, 1000.0, NAN, INF, "1000", None],
    "RENEW_FRACTION": [True, False, 0, 1, 0.0, 1.0, -0.5, 1.5, NAN, INF, -INF, "0.3", None],
}
GOOD_VALUES: dict[str, list[Any]] = {
    "DEFAULT_TTL": [0.001, 60, 366 * 24 * 3600, timedelta(minutes=1)],
    "TASK_LOCK_TTL": [0.001, 3600, timedelta(hours=2)],
    "REAP_TIME_BUDGET": [None, INF, 0, 30, timedelta(seconds=5)],
    "BACKOFF_MIN": [1e-6, 0.25],
    "BACKOFF_MAX": [0.002, 60, 366 * 24 * 3600],
    "TRANSIENT_RETRIES": [0, 100],
    "REAP_BATCH_SIZE": [1, 1_000_000],
    "RENEW_FRACTION": [0.001, 0.5, 0.999],
}


@pytest.mark.parametrize(
    ("key", "value"),
    [(key, value) for key, values in BAD_VALUES.items() for value in values],
    ids=lambda value: repr(value)[:20],
)
def test_e005_names_each_bad_setting_and_its_valid_range(key: str, value: Any) -> None:
    with override_settings(LOCKS={key: value}):
        messages = checks.check_settings()
    assert ids(messages) == ["locks.E005"]
    assert f"LOCKS[{key!r}]" in messages[0].msg
    assert messages[0].hint == f"Use {VALID[key]}."


@pytest.mark.parametrize(
    ("key", "value"),
    [(key, value) for key, values in GOOD_VALUES.items() for value in values],
    ids=lambda value: repr(value)[:20],
)
def test_e005_accepts_values_in_range(key: str, value: Any) -> None:
    with override_settings(LOCKS={key: value}):
        assert checks.check_settings() == []


def test_e005_checks_every_numeric_setting_and_passes_the_defaults() -> None:
    assert set(VALID) == set(BAD_VALUES) == set(GOOD_VALUES)
    assert set(VALID) <= set(DEFAULTS)
    with override_settings(LOCKS={key: DEFAULTS[key] for key in VALID}):
        assert checks.check_settings() == []


@override_settings(LOCKS={"BACKOFF_MIN": 0.5, "BACKOFF_MAX": 0.25})
def test_e005_backoff_min_must_not_exceed_backoff_max() -> None:
    messages = checks.check_settings()
    assert ids(messages) == ["locks.E005"]
    assert "LOCKS['BACKOFF_MIN'] (0.5 s) must not exceed LOCKS['BACKOFF_MAX']" in messages[0].msg


@override_settings(LOCKS={"BACKOFF_MIN": 0.5, "BACKOFF_MAX": 0.25, "RENEW_FRACTION": 1})
def test_e005_reports_every_bad_value_at_once() -> None:
    messages = checks.check_settings()
    assert ids(messages) == ["locks.E005", "locks.E005"]
    assert "RENEW_FRACTION" in messages[0].msg and "BACKOFF_MAX" in messages[1].msg


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("settings", "call", "error", "message"),
    [
        ({"DEFAULT_TTL": 0}, lambda: locks.try_acquire("e005"), ValueError, "DEFAULT_TTL"),
        ({"DEFAULT_TTL": True}, lambda: locks.try_acquire("e005"), TypeError, "DEFAULT_TTL"),
        (
            {"RENEW_FRACTION": 1.5},
            lambda: locks.try_acquire("e005", ttl=5, auto_renew=True),
            ValueError,
            "RENEW_FRACTION",
        ),
        ({"REAP_BATCH_SIZE": 0}, lambda: locks.reap_expired(), ValueError, "REAP_BATCH_SIZE"),
        ({"DATABASE": "nowhere"}, lambda: locks.try_acquire("e005"), ValueError, "DATABASE"),
        ({"DATABASE": "nowhere"}, lambda: locks.is_locked("e005"), ValueError, "DATABASE"),
        ({"DATABASE": "nowhere"}, lambda: locks.reap_expired(), ValueError, "DATABASE"),
        ({"DATABASE": 5}, lambda: locks.acquire("e005"), TypeError, "DATABASE"),
        # When entered: built, lock() reads no setting (see the decorator tests below).
        ({"DATABASE": "nowhere"}, lambda: locks.lock("e005").__enter__(), ValueError, "DATABASE"),
        # Read before the first query, not only when a retry or a wait needs them.
        ({"BACKOFF_MIN": 0}, lambda: locks.try_acquire("e005"), ValueError, "BACKOFF_MIN"),
        (
            {"BACKOFF_MIN": 2, "BACKOFF_MAX": 1},
            lambda: locks.try_acquire("e005"),
            ValueError,
            "BACKOFF_MIN",
        ),
        (
            {"TRANSIENT_RETRIES": "8"},
            lambda: locks.try_acquire("e005"),
            TypeError,
            "TRANSIENT_RETRIES",
        ),
        (
            {"TRANSIENT_RETRIES": -1},
            lambda: locks.is_locked("e005"),
            ValueError,
            "TRANSIENT_RETRIES",
        ),
    ],
)
def test_a_bad_setting_fails_at_use_naming_the_setting_and_touches_nothing(
    settings: dict[str, Any], call: Any, error: type[Exception], message: str
) -> None:
    with override_settings(LOCKS=settings), pytest.raises(error, match=rf"LOCKS\['{message}'\]"):
        call()
    assert not Lock.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_locks_that_is_not_a_dict_fails_at_use_instead_of_using_the_defaults() -> None:
    # The defaults would send locks to another database than the one meant, unnoticed.
    with (
        override_settings(LOCKS=[("DATABASE", "other")]),
        pytest.raises(TypeError, match=r"settings\.LOCKS must be a dict"),
    ):
        locks.try_acquire("e001")
    assert not Lock.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_settings_are_read_again_after_a_change() -> None:
    with override_settings(LOCKS={"DEFAULT_TTL": 120}):
        with locks.lock("ttl") as lease:
            assert lease.ttl == 120
        with override_settings(LOCKS={"DEFAULT_TTL": 7}), locks.lock("ttl") as lease:
            assert lease.ttl == 7
        with locks.lock("ttl") as lease:
            assert lease.ttl == 120
    with override_settings(LOCKS={"DEFAULT_TTL": 0}):
        for _ in range(2):  # not kept: a bad value fails at every read
            with pytest.raises(ValueError, match="DEFAULT_TTL"):
                locks.try_acquire("ttl")
    with locks.lock("ttl") as lease:
        assert lease.ttl == 60


@pytest.mark.django_db(databases=CHECKED)
@override_settings(LOCKS={"RENEW_FRACTION": 1})
def test_manage_py_check_reports_e005() -> None:
    with pytest.raises(SystemCheckError, match=r"locks\.E005"):
        call_command("check")


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


def test_e003_names_a_backend_that_cannot_tell_its_version() -> None:
    def no_version() -> tuple[int, ...]:
        raise NotImplementedError("subclasses of BaseDatabaseWrapper may require ...")

    server = SimpleNamespace(vendor="firebird", get_database_version=no_version)
    assert "firebird is not supported" in (checks._version_problem(server) or "")


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


@pytest.mark.django_db
def test_w002_is_not_given_for_djangos_own_in_memory_test_database(memory_alias: str) -> None:
    # What manage.py test of a project on a SQLite file runs its checks on.
    connection: Any = connections[memory_alias]
    connection.settings_dict["TEST"] = {**connection.settings_dict["TEST"], "NAME": None}
    connection.settings_dict["NAME"] = connection.creation._get_test_db_name()
    assert connection.is_in_memory_db()
    with override_settings(LOCKS={"DATABASE": memory_alias}):
        assert ids(checks.check_database(databases=[memory_alias])) == []


@pytest.mark.django_db(transaction=True)
def test_locks_none_is_locks_unset_for_the_checks_as_for_the_app() -> None:
    with override_settings(LOCKS=None):
        assert ids(checks.check_settings()) == []
        lease = locks.acquire("orders:1", ttl=30)
        assert lease.using == "default"
        lease.release()


@pytest.fixture
def lazy_innodb_flush(backend: str) -> Iterator[None]:
    if backend != "mariadb":
        pytest.skip("innodb_flush_log_at_trx_commit is a MariaDB setting")
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT @@GLOBAL.innodb_flush_log_at_trx_commit")
        (before,) = cursor.fetchone()
        # Server-wide, and for this moment only: it changes durability, not behaviour.
        cursor.execute("SET GLOBAL innodb_flush_log_at_trx_commit = 2")
    try:
        yield
    finally:
        with connections["default"].cursor() as cursor:
            cursor.execute("SET GLOBAL innodb_flush_log_at_trx_commit = %s", [before])


@pytest.mark.django_db
def test_w003_mariadb_that_may_lose_committed_grants_is_warned(lazy_innodb_flush: None) -> None:
    messages = checks.check_database(databases=["default"])
    assert ids(messages) == ["locks.W003"]
    assert "innodb_flush_log_at_trx_commit is 2" in messages[0].msg


@pytest.mark.django_db(databases=CHECKED)
@override_settings(LOCKS={"DATABASE": "nowhere"})
def test_manage_py_check_runs_the_checks() -> None:
    with pytest.raises(SystemCheckError, match=r"locks\.E002"):
        call_command("check")


# A bad setting, the check that reports it, and the setting an error names.
BAD_SETTINGS = [
    ({"DATABASE": "nowhere"}, "locks.E002", "DATABASE"),
    ({"DEFAULT_TTL": 0}, "locks.E005", "DEFAULT_TTL"),
    ({"RENEW_FRACTION": 1}, "locks.E005", "RENEW_FRACTION"),
]


@pytest.mark.django_db(transaction=True, databases=CHECKED)
@pytest.mark.parametrize(("settings", "check_id", "key"), BAD_SETTINGS)
def test_a_bad_setting_is_reported_by_check_not_raised_where_lock_view_decorates(
    settings: dict[str, Any], check_id: str, key: str
) -> None:
    # lock_view runs when the URLconf is imported, which manage.py check does (its URL
    # checks) before it reports anything: raising there is a traceback, not the check.
    from django.http import HttpResponse
    from django.test import RequestFactory

    from locks.decorators import lock_view

    def report(request: Any) -> HttpResponse:
        return HttpResponse("done")

    with override_settings(LOCKS=settings):
        view = lock_view("report", auto_renew=True)(report)
        with pytest.raises(SystemCheckError, match=check_id):
            call_command("check")
        with pytest.raises((TypeError, ValueError), match=rf"LOCKS\['{key}'\]"):
            view(RequestFactory().get("/report"))
    assert not Lock.objects.exists()
    assert view(RequestFactory().get("/report")).content == b"done"


@pytest.mark.django_db(transaction=True, databases=CHECKED)
@pytest.mark.parametrize(("settings", "check_id", "key"), BAD_SETTINGS)
@pytest.mark.parametrize("kind", ["lock", "alock"])
def test_a_bad_setting_is_reported_by_check_not_raised_where_lock_decorates(
    settings: dict[str, Any], check_id: str, key: str, kind: str
) -> None:
    # @locks.lock() on a function runs when its module is imported (models, a view the
    # URLconf imports, a Celery task), before manage.py check could report anything.
    import asyncio

    def report() -> str:
        return "done"

    async def areport() -> str:
        return "done"

    def call(decorated: Any) -> str:
        return str(asyncio.run(decorated()) if kind == "alock" else decorated())

    with override_settings(LOCKS=settings):
        if kind == "alock":
            decorated: Any = locks.alock("report", auto_renew=True)(areport)
        else:
            decorated = locks.lock("report", auto_renew=True)(report)
        with pytest.raises(SystemCheckError, match=check_id):
            call_command("check")
        with pytest.raises((TypeError, ValueError), match=rf"LOCKS\['{key}'\]"):
            call(decorated)
    assert not Lock.objects.exists()
    assert call(decorated) == "done"


@pytest.mark.parametrize("kind", ["lock", "alock"])
@pytest.mark.parametrize(
    "arguments",
    [{"ttl": 0}, {"using": "nowhere"}, {"timeout": -1}, {"holder": ""}, {"auto_renew": 1}],
)
@override_settings(LOCKS={"DEFAULT_TTL": 0, "DATABASE": "nowhere"})
def test_a_bad_argument_to_lock_still_raises_where_it_decorates(
    kind: str, arguments: dict[str, Any]
) -> None:
    # Only the settings wait for the call: a bad argument is the decorator's own error.
    with pytest.raises((TypeError, ValueError)) as raised:
        getattr(locks, kind)("report", **arguments)
    assert "LOCKS[" not in str(raised.value)
