"""Settings for the demo project: SQLite and Celery's filesystem transport unless told otherwise.

Environment variables:
    DATABASE_URL: database URL for dj-database-url (default: SQLite file var/demo.sqlite3).
    CELERY_BROKER_URL: Celery broker (default: the filesystem transport under var/celery-fs).
    CELERY_RESULT_BACKEND: Celery result backend (default: none).
    CELERY_FS_DIR: folder of the filesystem transport (default: var/celery-fs).
    CELERY_BEAT_SCHEDULE_FILENAME: beat's schedule file (default: var/celerybeat-schedule).
    LOCKS_REAP_INTERVAL: seconds between runs of the reaper task under beat (default: 60).
    DEMO_REPORT_SECONDS: how long the demo page's locked view works (default: 3).
    DJANGO_DEBUG: "1"/"true" or "0"/"false" (default: true; this is a demo).
    DJANGO_SECRET_KEY: secret key (default: an insecure key for local use only).
    DJANGO_ALLOWED_HOSTS: comma-separated host names (default: localhost names).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import dj_database_url


def _env_bool(name: str, default: bool) -> bool:
    """Read a boolean environment variable such as "1", "true", "0" or "false"."""
    value = os.environ.get(name)
    if value is None or not value.strip():
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = BASE_DIR / "var"

DEBUG = _env_bool("DJANGO_DEBUG", default=True)
SECRET_KEY = os.environ.get(
    "DJANGO_SECRET_KEY", "django-insecure-locks-demo-only-never-use-in-production"
)
ALLOWED_HOSTS = [
    host.strip()
    for host in os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",")
    if host.strip()
]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "locks",
    "project",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -----------------------------------------------------------------------------
# SQLite works across processes when every write transaction starts with BEGIN IMMEDIATE
# (a deferred one that upgrades to a write fails at once with "database is locked"), waits
# up to `timeout` seconds for the file lock, and uses WAL so readers do not block the writer.
# Django's SQLite backend runs each ";"-separated statement of init_command on connect.
SQLITE_OPTIONS: dict[str, Any] = {
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
    "init_command": "PRAGMA journal_mode=WAL",
}

DATABASES: dict[str, dict[str, Any]] = {
    "default": dict(
        dj_database_url.config(default=f"sqlite:///{VAR_DIR / 'demo.sqlite3'}"),
    ),
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Options given in DATABASE_URL's query string win over these defaults.
    DATABASES["default"]["OPTIONS"] = {**SQLITE_OPTIONS, **DATABASES["default"].get("OPTIONS", {})}
    sqlite_name = str(DATABASES["default"]["NAME"])
    if sqlite_name != ":memory:" and not sqlite_name.startswith("file:"):
        # SQLite creates the file but not its directory.
        Path(sqlite_name).parent.mkdir(parents=True, exist_ok=True)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"

# --- Celery -------------------------------------------------------------------------------
# Read by project/celery.py through config_from_object(..., namespace="CELERY").
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "filesystem://")
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND") or None
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = {}
if CELERY_BROKER_URL.startswith("filesystem:"):
    # One folder serves as both inbox and outbox: producers and workers share it.
    CELERY_FS_DIR = Path(os.environ.get("CELERY_FS_DIR") or VAR_DIR / "celery-fs")
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(CELERY_FS_DIR / "queue"),
        "data_folder_out": str(CELERY_FS_DIR / "queue"),
        "processed_folder": str(CELERY_FS_DIR / "processed"),
        "control_folder": str(CELERY_FS_DIR / "control"),
        "store_processed": False,
    }
    # kombu's filesystem transport does not create its folders.
    for _folder in ("queue", "processed", "control"):
        (CELERY_FS_DIR / _folder).mkdir(parents=True, exist_ok=True)

CELERY_TIMEZONE = TIME_ZONE
CELERY_BEAT_SCHEDULE_FILENAME = os.environ.get("CELERY_BEAT_SCHEDULE_FILENAME") or str(
    VAR_DIR / "celerybeat-schedule"
)
CELERY_BEAT_SCHEDULE = {
    # The reaper deletes expired lock rows in bounded batches; run exactly one beat.
    "locks-reap-expired": {
        "task": "locks.reap_expired",
        "schedule": float(os.environ.get("LOCKS_REAP_INTERVAL") or 60.0),
    },
}
