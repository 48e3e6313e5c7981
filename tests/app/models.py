"""Models used only by the tests."""

from __future__ import annotations

from django.db import models


class Counter(models.Model):
    """A counter that workers update with a non-atomic read-modify-write."""

    name = models.CharField(max_length=100, unique=True)
    value = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


class Hold(models.Model):
    """One critical section as a worker saw it, timed by the database clock."""

    name = models.CharField(max_length=100)
    worker = models.IntegerField()
    token = models.BigIntegerField()
    started = models.DateTimeField()
    ended = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.name} by {self.worker} token {self.token}: {self.started}..{self.ended}"


class CeleryRun(models.Model):
    """One run of a test Celery task, as the worker saw it."""

    label = models.CharField(max_length=100)
    task_id = models.CharField(max_length=64)
    pid = models.IntegerField()
    retries = models.IntegerField(default=0)
    finished = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.label} run by task {self.task_id} (pid {self.pid})"
