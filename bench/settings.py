"""Django settings of the benchmark: one alias per database, bench databases named per checkout.

Environment variables:
    LOCKS_BENCH_DB_NAME: name of the bench database on PostgreSQL and MariaDB, and of the
        SQLite file under var/bench/ (default: ``locks_bench_<checkout tag>``).
    PGHOST, PGPORT, PGUSER, PGPASSWORD: the PostgreSQL server (default 127.0.0.1:5432, postgres).
    MYSQL_HOST, MYSQL_PORT, MYSQL_USER, MYSQL_PASSWORD: the MariaDB server (default
        127.0.0.1:3306, root with an empty password).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path
from typing import Any

BASE_DIR = Path(__file__).resolve().parent.parent
VAR = BASE_DIR / "var" / "bench"
VAR.mkdir(parents=True, exist_ok=True)

# Like tests/settings.py: two checkouts on one machine never share a bench database.
CHECKOUT = hashlib.sha256(str(BASE_DIR).encode()).hexdigest()[:6]
NAME = os.environ.get("LOCKS_BENCH_DB_NAME", f"locks_bench_{CHECKOUT}")

#: Which alias holds which database under test.
ALIASES = {"sqlite": "default", "postgresql": "postgresql", "mariadb": "mariadb"}

DATABASES: dict[str, dict[str, Any]] = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(VAR / f"{NAME}.sqlite3"),
        "OPTIONS": {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL",
        },
    },
    "postgresql": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": NAME,
        "HOST": os.environ.get("PGHOST", "127.0.0.1"),
        "PORT": os.environ.get("PGPORT", "5432"),
        "USER": os.environ.get("PGUSER", "postgres"),
        "PASSWORD": os.environ.get("PGPASSWORD", ""),
    },
    "mariadb": {
        "ENGINE": "django.db.backends.mysql",
        "NAME": NAME,
        "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
        "PORT": os.environ.get("MYSQL_PORT", "3306"),
        "USER": os.environ.get("MYSQL_USER", "root"),
        "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
        "OPTIONS": {"charset": "utf8mb4"},
    },
}
# The same PostgreSQL database set up as Django's docs ask behind a transaction pooler:
# the app then neither prepares nor LISTENs (the "locks_pooled" contender).
DATABASES["postgresql_pooled"] = {**DATABASES["postgresql"], "DISABLE_SERVER_SIDE_CURSORS": True}
DATABASE_ROUTERS = ["bench.router.PeerRouter"]

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "locks"]
# django-db-mutex is installed only into the benchmark's own virtualenv (.venv-bench).
if importlib.util.find_spec("db_mutex") is not None:
    INSTALLED_APPS.append("db_mutex")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# django-db-mutex deletes rows older than this before every acquire (its default: 30 min).
DB_MUTEX_TTL_SECONDS = 60
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"locks": {"handlers": ["console"], "level": "WARNING"}},
}
