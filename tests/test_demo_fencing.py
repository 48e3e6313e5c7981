"""The demo project's fenced and versioned models: migrated, registered, and working."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

DEMO = """
import django
from django.core.management import call_command

django.setup()
call_command("migrate", verbosity=0)
call_command("makemigrations", "project", check=True, dry_run=True, verbosity=0)

import locks
from django.contrib import admin
from locks.versioning_admin import VersionedModelAdmin
from project.models import Account, Article

assert isinstance(admin.site._registry[Article], VersionedModelAdmin)
assert Account in admin.site._registry

account = Account.objects.create(name="alice")
with locks.lock("accounts:alice", ttl=30) as old:
    pass
with locks.lock("accounts:alice", ttl=30) as new:
    account.balance = 10
    account.save(fence=new.token)
try:
    account.balance = 99
    account.save(fence=old.token)
except locks.StaleToken:
    pass
else:
    raise AssertionError("a stale token wrote")
account.refresh_from_db()
assert (account.balance, account.fence) == (10, new.token)

article = Article.objects.create(title="t")
Article.objects.get(pk=article.pk).save()
try:
    article.save()
except locks.ConcurrentUpdate:
    print("demo ok")
"""


def test_the_demo_project_uses_fenced_and_versioned_models(tmp_path: Path) -> None:
    env = dict(os.environ)
    env.pop("LOCKS_TEST_DB_NAMES", None)
    env.update(
        DJANGO_SETTINGS_MODULE="project.settings",
        DATABASE_URL=f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        PYTHONPATH=str(ROOT),
    )
    result = subprocess.run(
        [sys.executable, "-c", DEMO],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "demo ok"
