"""Test settings: ``LOCKS_TEST_BACKEND`` (sqlite, postgresql, mariadb) picks the database."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import django

BASE_DIR = Path(__file__).resolve().parent.parent
VAR = BASE_DIR / "var"
VAR.mkdir(exist_ok=True)

BACKEND = os.environ.get("LOCKS_TEST_BACKEND", "sqlite")
# Server database names carry a tag of the checkout, so two checkouts on one machine can
# run their suites at the same time without dropping each other's test databases.
CHECKOUT = hashlib.sha256(str(BASE_DIR).encode()).hexdigest()[:6]
# Worker processes started by the tests connect to the parent's test databases.
NAMES: dict[str, str] = json.loads(os.environ.get("LOCKS_TEST_DB_NAMES", "{}"))


# SQLite test files carry the Django version: scripts/test may run the suite on two
# Django versions at once, each on files of its own.
SQLITE_TAG = f"django{django.VERSION[0]}"


def _database(alias: str) -> dict[str, Any]:
    if BACKEND == "sqlite":
        name = str(VAR / f"test_{SQLITE_TAG}_{alias}.sqlite3")
        settings: dict[str, Any] = {
            "ENGINE": "django.db.backends.sqlite3",
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL",
            },
        }
        if os.environ.get("LOCKS_TEST_SQLITE_DEFERRED"):
            # Django's default: BEGIN takes no lock, the first write takes the write lock.
            del settings["OPTIONS"]["transaction_mode"]
    elif BACKEND == "postgresql":
        name = f"test_locks_{CHECKOUT}_{alias}"
        settings = {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "USER": os.environ.get("PGUSER", "postgres"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
        }
    elif BACKEND == "mariadb":
        name = f"test_locks_{CHECKOUT}_{alias}"
        settings = {
            "ENGINE": "django.db.backends.mysql",
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "OPTIONS": {"charset": "utf8mb4"},
            "TEST": {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"},
        }
    else:
        raise RuntimeError(f"LOCKS_TEST_BACKEND must be sqlite, postgresql or mariadb: {BACKEND!r}")
    if BACKEND == "postgresql" and os.environ.get("LOCKS_TEST_PGBOUNCER"):
        # Through PgBouncer in transaction pooling mode (tests/pgbouncer.py): own database
        # names, no server-side cursors, and the pooler's port once it runs.
        name = name.replace("test_locks_", "test_locks_pgb_")
        settings["DISABLE_SERVER_SIDE_CURSORS"] = True
        settings["PORT"] = os.environ.get("LOCKS_TEST_PGBOUNCER_PORT", settings["PORT"])
    name = NAMES.get(alias, name)
    settings["NAME"] = name
    settings.setdefault("TEST", {})["NAME"] = name
    return settings


DATABASES = {alias: _database(alias) for alias in ("default", "other")}
if os.environ.get("LOCKS_TEST_PERSISTENT_CONNECTIONS"):
    # Connections kept between requests and tasks, checked before their first use in each
    # (a process whose sessions the server ended while it idled).
    for _settings in DATABASES.values():
        _settings.update(CONN_MAX_AGE=None, CONN_HEALTH_CHECKS=True)
# Mirrors of "default" whose settings the app's own connections must not follow
# (tests/test_connection.py): Django's transactions without autocommit, and, on
# PostgreSQL, Django's connection pool with room for one ORM connection only.
DATABASES["manual"] = {**_database("default"), "AUTOCOMMIT": False, "TEST": {"MIRROR": "default"}}
# A mirror whose sessions cancel any statement that runs over half a second (the
# database's or role's statement_timeout, as a DBA may set it): PostgreSQL's
# statement_timeout, MariaDB's max_statement_time; SQLite has none.
_IMPATIENT_OPTIONS = {
    "postgresql": {"options": "-c statement_timeout=500"},
    "mariadb": {"init_command": "SET SESSION max_statement_time = 0.5"},
}
if os.environ.get("LOCKS_TEST_PGBOUNCER"):
    # PgBouncer refuses the "options" startup parameter (its sessions are the pool's).
    del _IMPATIENT_OPTIONS["postgresql"]
DATABASES["impatient"] = {**_database("default"), "TEST": {"MIRROR": "default"}}
DATABASES["impatient"]["OPTIONS"] = {
    **DATABASES["impatient"].get("OPTIONS", {}),
    **_IMPATIENT_OPTIONS.get(BACKEND, {}),
}
if BACKEND == "postgresql":
    DATABASES["pooled"] = {
        **_database("default"),
        "OPTIONS": {"pool": {"min_size": 1, "max_size": 1, "timeout": 2}},
        "TEST": {"MIRROR": "default"},
    }

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["*"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "locks",
    "tests.app",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
STATIC_URL = "/static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"locks": {"handlers": ["console"], "level": "WARNING"}},
}
