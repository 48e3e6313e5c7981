"""Optimistic versions: ``VersionedModel`` refuses a save based on an outdated copy of its row."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any, TypeVar, cast

from django import forms
from django.db import models
from django.db.models import F, Field
from django.db.models.manager import BaseManager
from django.db.models.signals import class_prepared

from .exceptions import ConcurrentUpdate
from .saving import RawSaveAware, newest

_V = TypeVar("_V", bound=models.Model)

VERSION = "version"


class VersionField(models.PositiveBigIntegerField):  # type: ignore[type-arg]
    """The ``version`` column of a :class:`VersionedModel`; a hidden input in model forms.

    So the version a user started from travels with every ModelForm (and admin) edit.

    Example::

        version = VersionField()
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("default", 1)
        kwargs.setdefault(
            "help_text", "incremented by every save; a save based on an older one fails"
        )
        super().__init__(*args, **kwargs)

    def formfield(self, **kwargs: Any) -> forms.Field | None:  # type: ignore[override]
        kwargs.setdefault("widget", forms.HiddenInput)
        return super().formfield(**kwargs)


class VersionedQuerySet(models.QuerySet[_V]):
    """Queries over a :class:`VersionedModel`: ``update()`` increments the version too.

    So a bulk update also refuses the saves of copies loaded before it.

    Example::

        class Document(VersionedModel):
            objects = VersionedQuerySet.as_manager()  # what VersionedModel sets already
    """

    def update(self, **kwargs: Any) -> int:
        """Update the rows and increment their ``version`` (unless ``version`` is given).

        The version is not checked: the rows are overwritten whatever their version
        (``bulk_update()`` included, whose objects keep their old version in memory).

        Example::

            Document.objects.filter(state="draft").update(state="review")
        """
        kwargs.setdefault(VERSION, F(VERSION) + 1)
        return super().update(**kwargs)

    def bulk_create(
        self,
        objs: Iterable[_V],
        batch_size: int | None = None,
        ignore_conflicts: bool = False,
        update_conflicts: bool = False,
        update_fields: Collection[str] | None = None,
        unique_fields: Collection[str] | None = None,
    ) -> list[_V]:
        """Django's ``bulk_create()``, but refuses ``update_conflicts=True``.

        An upsert would overwrite existing rows without checking or incrementing their
        version (or set it back to the objects' own). Raises ``TypeError`` before any query.

        Example::

            Document.objects.bulk_create([Document(body="a"), Document(body="b")])
        """
        if update_conflicts:
            raise TypeError(
                f"bulk_create(update_conflicts=True) on {self.model._meta.label} would "
                "overwrite rows without checking or incrementing their version; nothing "
                "was written. Save the changed rows, or update() them."
            )
        return super().bulk_create(
            objs,
            batch_size=batch_size,
            ignore_conflicts=ignore_conflicts,
            update_fields=update_fields,
            unique_fields=unique_fields,
        )


class VersionedModel(RawSaveAware):
    """Abstract model with optimistic versions: a save never overwrites a newer row.

    ``save()`` of an existing row is one ``UPDATE ... SET ..., version = v + 1 WHERE pk =
    ... AND version = v``, where ``v`` is the version this copy was loaded with. If the
    row changed since (or was deleted), it raises ``ConcurrentUpdate`` and nothing is
    written; ``refresh_from_db()`` loads the current row and version.

    Example::

        class Document(VersionedModel):
            body = models.TextField()

        doc = Document.objects.get(pk=1)
        doc.body += "more"
        try:
            doc.save()
        except locks.ConcurrentUpdate:
            doc.refresh_from_db()  # someone else saved first: look again, then retry
    """

    version = VersionField()

    objects = VersionedQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        """Save, incrementing ``version``; ``ConcurrentUpdate`` if the row changed meanwhile.

        A save that raises leaves ``version`` as it was before the call. A save that
        succeeded inside an ``atomic()`` block rolled back afterwards keeps the
        incremented version in memory, as Django leaves any instance's fields after a
        rollback: call ``refresh_from_db()`` before redoing the change.

        Raises ``ValueError`` (before any query) for a copy loaded without its version,
        e.g. by ``only("body")`` or ``defer("version")``: reading the deferred version
        would fetch the row's current one, so the check could never fail.

        Example::

            doc.save(update_fields=["body"])  # the version is checked and written as well
        """
        if not self._state.adding and VERSION in self.get_deferred_fields():
            raise ValueError(
                f"{self._meta.label} pk={self.pk!r} was loaded without its version "
                "(only() or defer()), so saving it cannot tell whether someone else "
                "changed the row since; nothing was written. Load the version with the "
                f'copy, e.g. {self._meta.object_name}.objects.only("...", "version").'
            )
        version = self.__dict__.get(VERSION)
        if type(version) is not int or version < 0:
            raise TypeError(
                f"{self._meta.label} pk={self.pk!r}: version must be the int this copy was "
                f"loaded with (0 or more), not {version!r}; nothing was written"
            )
        update_fields: Iterable[str] | None = kwargs.get("update_fields")
        if update_fields is not None:
            update_fields = set(update_fields)
            # An empty update_fields saves nothing in Django: no version bump either.
            kwargs["update_fields"] = {*update_fields, VERSION} if update_fields else set()
        try:
            super().save(*args, **kwargs)
        except BaseException:
            # Django writes the tables of a save under atomic(savepoint=False) (multi-table
            # models) or mark_for_rollback_on_error(), so a save that raised has had its
            # writes undone, or its transaction marked for rollback: the copy must not
            # claim the version it did not keep (a multi-table save whose child table
            # failed after the parent's version UPDATE). A post_save receiver that raises
            # after an autocommitted UPDATE is set back too; the next save then raises
            # ConcurrentUpdate, which errs on the safe side.
            self.version = version
            raise

    def _do_update(
        self,
        base_qs: models.QuerySet[Any],
        using: str | None,
        pk_val: Any,
        values: Collection[tuple[Field[Any, Any], type[models.Model] | None, Any]],
        *args: Any,
    ) -> Any:
        # *args: Django's own further parameters (update_fields, forced_update, and from
        # 6.0 returning_fields), passed on untouched. The result is Django's too: a bool
        # before 6.0, a list of returned rows after; truthy when a row was updated.
        version_field = cast("Field[Any, Any]", self._meta.get_field(VERSION))
        if (
            self._locks_raw
            or base_qs.model._meta.concrete_model is not version_field.model._meta.concrete_model
        ):
            # A fixture's row, written as it is (loaddata); or another table of a
            # multi-table inheritance chain, where the version is not. Decided by the
            # table, not by the values: a save that leaves the version out of its values
            # must still be checked, never silently unconditional.
            return super()._do_update(base_qs, using, pk_val, values, *args)
        expected = self.version
        # Whatever version the values carry, the row gets the one this check expects + 1.
        bumped = [value for value in values if value[0].attname != VERSION]
        bumped.append((version_field, None, expected + 1))
        updated = super()._do_update(base_qs.filter(version=expected), using, pk_val, bumped, *args)
        if updated:
            self.version = expected + 1
            return updated
        # As the UPDATE saw it: not a MariaDB REPEATABLE READ snapshot that predates it.
        current = newest(base_qs.filter(pk=pk_val)).values_list(VERSION, flat=True).first()
        if current is None and self._state.adding:
            return updated  # a new object whose row does not exist yet: Django inserts it
        label = self._meta.label
        if current is None:
            raise ConcurrentUpdate(
                f"{label} pk={pk_val!r} was deleted after this copy was loaded "
                f"(version {expected}); nothing was written"
            )
        raise ConcurrentUpdate(
            f"{label} pk={pk_val!r} was changed by someone else: this copy is based on "
            f"version {expected}, the row is at version {current}; nothing was written. "
            "Load it again (refresh_from_db) and redo the change."
        )


def _base_manager_from_default(sender: type[models.Model], **kwargs: Any) -> None:
    """``class_prepared``: make a versioned model's base manager its default manager.

    Django writes through the base manager where it writes no object of its own: the
    ``update()`` by which deleting a row sets ``on_delete=SET_NULL`` (or ``SET(value)``)
    foreign keys pointing at it. Django's own base manager is a plain ``Manager``, whose
    update leaves the version, so copies loaded before it could then save over it. The
    default manager is taken only where it is a plain ``VersionedQuerySet`` manager:
    one that overrides ``get_queryset()`` may leave rows out, which the base manager must
    not (saves and related lookups go through it). A model that names its own base manager
    keeps it. System check ``locks.E006`` reports what this leaves unversioned.
    """
    meta = sender._meta
    if not issubclass(sender, VersionedModel) or meta.abstract or meta.base_manager_name:
        return
    manager = meta.default_manager
    queryset_class = getattr(manager, "_queryset_class", None)
    if (
        manager is None
        or not (isinstance(queryset_class, type) and issubclass(queryset_class, VersionedQuerySet))
        or type(manager).get_queryset is not BaseManager.get_queryset
    ):
        return
    # Set as the model's Meta option, not as the cached manager: the cache is cleared
    # whenever the app registry changes, the option is what it is rebuilt from.
    meta.base_manager_name = manager.name
    meta.__dict__.pop("base_manager", None)


class_prepared.connect(_base_manager_from_default, dispatch_uid="locks.versioned_base_manager")
