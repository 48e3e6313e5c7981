"""Models of the demo project: shared state guarded by fencing tokens and by versions."""

from __future__ import annotations

from django.db import models

from locks.models import FencedModel, VersionedModel


class Account(FencedModel):
    """A balance that Celery workers change while holding the lease ``accounts:<pk>``.

    Each write carries the lease's fencing token, so a worker that was paused past its
    lease (and replaced) cannot overwrite what the newer holder wrote::

        with locks.lock(f"accounts:{pk}", ttl=30) as lease:
            account = Account.objects.get(pk=pk)
            account.balance += amount
            account.save(fence=lease.token)
    """

    name = models.CharField(max_length=100, unique=True)
    balance = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}: {self.balance}"


class Article(VersionedModel):
    """An article edited in the admin by several people; a stale edit is refused."""

    title = models.CharField(max_length=200)
    body = models.TextField(blank=True, default="")

    def __str__(self) -> str:
        return str(self.title)
