"""``manage.py demo_superuser``: create or update the demo's admin user and print its login."""

from __future__ import annotations

import os
from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand

DEFAULT_USERNAME = "admin"
DEFAULT_PASSWORD = "locks-demo"


class Command(BaseCommand):
    help = (
        "Create or update the demo superuser (DEMO_ADMIN_USER / DEMO_ADMIN_PASSWORD, "
        f"default {DEFAULT_USERNAME} / {DEFAULT_PASSWORD}) and print the credentials."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        username = os.environ.get("DEMO_ADMIN_USER") or DEFAULT_USERNAME
        password = os.environ.get("DEMO_ADMIN_PASSWORD") or DEFAULT_PASSWORD
        user, created = User.objects.get_or_create(username=username)
        user.is_staff = True
        user.is_superuser = True
        user.set_password(password)
        user.save()
        verb = "Created" if created else "Updated"
        self.stdout.write(f"{verb} superuser. Admin login: {username} / {password}")
