"""Models used only by the tests."""

from __future__ import annotations

from django.db import models

from locks.models import FencedModel, FencedQuerySet, VersionedModel


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


# VersionedTask's reverse manager is built on VersionedQuerySet.as_manager(), which the
# django-stubs plugin cannot resolve.
class Item(models.Model):  # type: ignore[django-manager-missing]
    """A plain row for ``lock_rows`` tests (and VersionedTask's)."""

    name = models.CharField(max_length=100)
    value = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name}={self.value}"


class FencedRecord(FencedModel):
    """Shared state written by lock holders, guarded by fencing tokens."""

    key = models.CharField(max_length=100, unique=True)
    data = models.CharField(max_length=100, blank=True, default="")

    def __str__(self) -> str:
        return f"{self.key}={self.data!r} (fence {self.fence})"


class FencedShipment(FencedRecord):
    """A FencedRecord's child by multi-table inheritance: its fence is the parent's column."""

    carrier = models.CharField(max_length=100, blank=True, default="")


class Parcel(models.Model):
    """A plain model with a fenced child: its fields live on another table than the fence."""

    label = models.CharField(max_length=100, blank=True, default="")

    def __str__(self) -> str:
        return self.label


class FencedParcel(Parcel, FencedModel):  # type: ignore[misc]  # two default managers: ours wins
    """Fenced by multi-table inheritance from a plain parent: the fence is the child's column."""

    state = models.CharField(max_length=100, blank=True, default="")

    # The parent's automatic manager would come first, without fenced_update().
    objects = FencedQuerySet.as_manager()  # type: ignore[misc,django-manager-missing]

    def __str__(self) -> str:
        return f"{self.label}: {self.state} (fence {self.fence})"


class Carton(models.Model):
    """A plain model, FencedPallet's first parent: the pallet's pk is its link to it."""

    carton_id = models.BigAutoField(primary_key=True)
    label = models.CharField(max_length=100, blank=True, default="")

    def __str__(self) -> str:
        return self.label


class FencedCrate(FencedModel):
    """A fenced model, FencedPallet's second parent: the pallet's fence is its column."""

    crate_id = models.BigAutoField(primary_key=True)
    contents = models.CharField(max_length=100, blank=True, default="")

    def __str__(self) -> str:
        return f"{self.contents} (fence {self.fence})"


class FencedPallet(Carton, FencedCrate):  # type: ignore[misc]  # two default managers: ours wins
    """Two concrete parents: its pk is the link to the first, its fence the second's column."""

    slot = models.CharField(max_length=100, blank=True, default="")

    # The first parent's manager would come first, without fenced_update().
    objects = FencedQuerySet.as_manager()  # type: ignore[misc,django-manager-missing]

    def __str__(self) -> str:
        return f"{self.label} in {self.slot} (fence {self.fence})"


class VersionedNote(VersionedModel):
    """A row edited by several people at once, guarded by optimistic versions."""

    title = models.CharField(max_length=100)
    body = models.TextField(blank=True, default="")

    def __str__(self) -> str:
        return f"{self.title} (version {self.version})"


class CeleryRun(models.Model):
    """One run of a test Celery task, as the worker saw it."""

    label = models.CharField(max_length=100)
    task_id = models.CharField(max_length=64)
    pid = models.IntegerField()
    retries = models.IntegerField(default=0)
    finished = models.BooleanField(default=False)

    def __str__(self) -> str:
        return f"{self.label} run by task {self.task_id} (pid {self.pid})"


class VersionedChapter(VersionedNote):
    """A VersionedNote's child by multi-table inheritance, with a unique column of its own.

    Its version is the parent's column: a save updates that table before this one.
    """

    code = models.CharField(max_length=20, unique=True)

    def __str__(self) -> str:
        return f"{self.code}: {self.title} (version {self.version})"


class VersionedTask(VersionedModel):
    """A versioned row whose item is set to NULL when the item is deleted."""

    title = models.CharField(max_length=100, default="")
    item = models.ForeignKey(Item, null=True, on_delete=models.SET_NULL)

    def __str__(self) -> str:
        return f"{self.title} (version {self.version})"
