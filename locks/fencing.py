"""Fencing tokens enforced by models: ``FencedModel`` refuses writes that carry an older token."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from typing import Any, TypeVar, cast

from django.db import NotSupportedError, connections, models, router, transaction
from django.db.models import Field

from . import validation
from .exceptions import StaleToken
from .saving import RawSaveAware, newest

_F = TypeVar("_F", bound=models.Model)

FENCE = "fence"


def _fence_owner(model: type[models.Model]) -> type[models.Model]:
    """The concrete model whose table has the ``fence`` column."""
    owner = model._meta.get_field(FENCE).model
    assert owner is not None
    return cast(type[models.Model], owner._meta.concrete_model)


def _fence_id(model: type[models.Model]) -> str:
    """The name, on ``model``, of the primary key of the row that holds its fence.

    Under multi-table inheritance from several concrete parents, the child's own pk is
    its link to the first parent, and the fence may be on another parent's row.

    Example::

        Pallet.objects.values_list(_fence_id(Pallet), flat=True)  # the crates' ids
    """
    return _fence_owner(model)._meta.pk.name


def _reads_fence(queryset: models.QuerySet[Any]) -> bool:
    """Whether the filter of ``queryset`` reads the fence column.

    Example::

        _reads_fence(Account.objects.filter(fence__lt=5))  # True
    """
    fence = _fence_owner(queryset.model)._meta.get_field(FENCE)
    return any(
        getattr(node, "target", None) is fence
        for leaf in cast(Any, queryset.query.where).leaves()
        for node in (leaf.flatten() if hasattr(leaf, "flatten") else ())
    )


def _by_ids(queryset: models.QuerySet[Any], owner: type[models.Model], values: Any) -> bool:
    """Whether Django's update() would select the rows' ids first and then update by them.

    It does when the filters join other tables, or when a value belongs to another table
    than the fence's (a parent's or a child's, under multi-table inheritance).
    """
    if owner is not queryset.model._meta.concrete_model:
        return True
    if any(getattr(join, "join_type", None) for join in queryset.query.alias_map.values()):
        return True
    meta = queryset.model._meta
    return any(
        cast(Any, meta.get_field(name)).model._meta.concrete_model is not owner for name in values
    )


def _batches(ids: list[Any], using: str, reserve: int) -> Iterator[list[Any]]:
    """``ids`` in slices that fit one statement with ``reserve`` other parameters.

    A statement takes only so many parameters: SQLite's build limit (999 by Django's
    count), PostgreSQL's 65535 when bound on the server.

    Example::

        for batch in _batches(pks, "default", reserve=2):
            Account.objects.filter(pk__in=batch, fence__lte=token).update(fence=token)
    """
    size = max((connections[using].features.max_query_params or 65_535) - reserve, 1)
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def _refuse_unwritable(queryset: models.QuerySet[Any], method: str) -> None:
    """Raise ``NotSupportedError`` for a union(), intersection() or difference() queryset,
    and ``TypeError`` for one after ``distinct(*fields)``.

    As Django's update() and delete() do: the rows of a combined queryset are not rows of
    one table to write; and after ``distinct(*fields)`` the claim would take every row of
    the filter, not one row of each distinct value (Django's delete() refuses it, and its
    update() from 6.1 on; older ones quietly ignored the fields: refused on every Django).

    Example::

        _refuse_unwritable(Account.objects.union(Account.objects.all()), "fenced_update")
    """
    if queryset.query.combinator:
        raise NotSupportedError(
            f"{method}() cannot run after {queryset.query.combinator}(); nothing was written"
        )
    if queryset.query.distinct_fields:
        raise TypeError(f"{method}() cannot run after distinct(*fields)")


def _refuse_newer(rows: models.QuerySet[Any], token: int, model: type[models.Model]) -> None:
    """Raise ``StaleToken`` if any of ``rows`` has a fence greater than ``token``.

    The rows claimed are locked by now; any row left with a greater fence means a newer
    holder wrote first, and then none of the changes may stand (the exception rolls back
    the transaction they run in).

    Example::

        _refuse_newer(Account.objects.filter(pk__in=batch), token, Account)
    """
    check = rows.filter(fence__gt=token).order_by().select_for_update().values_list("pk", FENCE)
    # The rows the UPDATE saw: Django's update() leaves out DISTINCT and GROUP BY, and
    # PostgreSQL refuses them with FOR UPDATE. (An aggregate in the filter is in HAVING,
    # which the UPDATE has already failed on.)
    check.query.distinct, check.query.distinct_fields, check.query.group_by = False, (), None
    newer = list(check[:1])
    if newer:
        pk, fence = newer[0]
        raise StaleToken(
            f"fenced update of {model._meta.label} with token {token} refused: "
            f"row {rows.model._meta.label} pk={pk!r} was written with the newer token {fence}; "
            "nothing was written"
        )


class FencedQuerySet(models.QuerySet[_F]):
    """Queries over a :class:`FencedModel`; adds :meth:`fenced_update`.

    Example::

        class Account(FencedModel):
            objects = FencedQuerySet.as_manager()  # what FencedModel sets already
    """

    def fenced_update(self, token: int, **values: Any) -> int:
        """Update every row of this queryset and set its fence to ``token``, or none of them.

        All or nothing: if any row of the queryset was already written with a greater
        token, nothing is changed and ``StaleToken`` is raised. Rows written with the
        same token may be written again. Returns the number of rows updated. Runs in
        one transaction (a savepoint inside an outer one). As Django's ``update()``, it
        refuses a ``union()`` queryset (``NotSupportedError``), and, as Django 6.1's, one
        after ``distinct(*fields)`` (``TypeError``).

        Example::

            with locks.lock("ledger", ttl=30) as lease:
                Entry.objects.filter(batch=7).fenced_update(lease.token, state="posted")
        """
        token = validation.check_token(token)
        if FENCE in values:
            raise TypeError(f"fenced_update() sets {FENCE!r} itself, to the token; do not pass it")
        if self.query.is_sliced:
            raise TypeError("fenced_update() cannot run on a sliced queryset")
        _refuse_unwritable(self, "fenced_update")
        # The database update() would write to.
        using = cast(Any, self)._db or router.db_for_write(self.model)
        owner = _fence_owner(self.model)
        with transaction.atomic(using=using):
            if not _by_ids(self, owner, values):
                rows: models.QuerySet[Any] = self.using(using)
                updated = rows.filter(fence__lte=token).update(fence=token, **values)
                _refuse_newer(rows, token, self.model)
                return updated
            # Django would update the fence's table through ids it selected first, without
            # the fence condition: claim the rows on that one table, by id, where the
            # condition holds; then write the values by the same ids. The ids go in
            # batches, each statement with room for the token twice and, as Django's
            # bulk_update() counts, one parameter per value; each id once, as a join may
            # repeat a row and batches would count it again.
            key = _fence_id(self.model)
            pks = list(dict.fromkeys(self.using(using).order_by().values_list(key, flat=True)))
            owned = owner._base_manager.using(using)
            batches = list(_batches(pks, using, reserve=2 + len(values)))
            updated = 0
            for batch in batches:
                rows = owned.filter(pk__in=batch)
                updated += rows.filter(fence__lte=token).update(fence=token)
                _refuse_newer(rows, token, self.model)
            if values:
                for batch in batches:
                    ours = self.model._base_manager.using(using).filter(**{f"{key}__in": batch})
                    ours.update(**values)
        return updated

    def fenced_delete(self, token: int) -> tuple[int, dict[str, int]]:
        """Delete every row of this queryset, or none of them if a greater token wrote any.

        All or nothing, as :meth:`fenced_update`: the rows are first claimed for
        ``token`` (which locks them), and if any was written with a greater token,
        ``StaleToken`` is raised and nothing is deleted. Returns what Django's
        ``delete()`` returns. Rows that Django deletes by cascade are not checked. As
        Django's ``delete()``, it refuses a ``union()`` queryset (``NotSupportedError``)
        and one after ``distinct(*fields)``, ``values()`` or ``values_list()``
        (``TypeError``).

        Example::

            with locks.lock("ledger", ttl=30) as lease:
                Entry.objects.filter(batch=7).fenced_delete(lease.token)
        """
        token = validation.check_token(token)
        if self.query.is_sliced:
            raise TypeError("fenced_delete() cannot run on a sliced queryset")
        if cast(Any, self)._fields is not None:
            # As Django's delete(): the ids and the cascade need model rows.
            raise TypeError("fenced_delete() cannot run after values() or values_list()")
        _refuse_unwritable(self, "fenced_delete")
        using = cast(Any, self)._db or router.db_for_write(self.model)
        with transaction.atomic(using=using):
            key = _fence_id(self.model)
            rows = self.using(using).filter(fence__lte=token).order_by()
            # The claim sets the rows' fence to the token: a filter that reads the fence
            # (fence__lt=token) no longer selects them after it, so read their ids before.
            pks = list(rows.values_list(key, flat=True)) if _reads_fence(self) else []
            self.using(using).fenced_update(token)
            # Django's delete() would read the rows and then delete them by id, without
            # the fence condition: a row read from a REPEATABLE READ snapshot (MariaDB), or
            # one that appeared since the claim and was written by a newer holder before
            # the DELETE (READ COMMITTED), would go. Delete only the rows locked here with
            # a fence that is still at most ours, on the fence's own table.
            # Each id once: a row the filter selects before and after the claim is read twice.
            pks = list(dict.fromkeys([*pks, *rows.values_list(key, flat=True)]))
            owner = _fence_owner(self.model)._base_manager.using(using)
            # The ids go in batches, where Django's delete() of the queryset needed no
            # list of them.
            locked: list[Any] = []
            for batch in _batches(pks, using, reserve=1):
                ours = owner.filter(pk__in=batch, fence__lte=token)
                locked += ours.order_by().select_for_update().values_list("pk", flat=True)
            deleted, per_model = 0, Counter[str]()
            for batch in _batches(locked, using, reserve=1):
                ours = self.model._base_manager.using(using).filter(**{f"{key}__in": batch})
                count, counts = ours.delete()
                deleted += count
                per_model.update(counts)
            return deleted, dict(per_model)


class FencedModel(RawSaveAware):
    """Abstract model whose ``save(fence=token)`` refuses writes carrying an older token.

    ``fence`` holds the greatest token that wrote the row. A fenced save is one
    conditional ``UPDATE ... WHERE pk = ... AND fence <= token`` (or an insert when the
    row does not exist yet); if a greater token wrote first, it raises ``StaleToken`` and
    the row is unchanged. A fenced save of a loaded copy whose row was deleted meanwhile
    raises ``StaleToken`` too, instead of inserting the row again. Equal tokens pass, so
    a holder can write many times. A plain ``save()`` (the admin, say) writes the other
    fields and never moves the fence; fixtures (``loaddata``) write theirs as they are.

    Example::

        class Account(FencedModel):
            balance = models.IntegerField(default=0)

        with locks.lock("accounts:7", ttl=30) as lease:
            account = Account.objects.get(pk=7)
            account.balance += 10
            account.save(fence=lease.token)  # StaleToken if a newer holder wrote first
    """

    fence = models.BigIntegerField(
        default=0, editable=False, help_text="the greatest fencing token that wrote this row"
    )

    objects = FencedQuerySet.as_manager()

    class Meta:
        abstract = True

    _locks_fence: int | None = None

    def save(self, *args: Any, fence: int | None = None, **kwargs: Any) -> None:
        """Save; with ``fence=token``, only if no greater token has written this row.

        With ``fence``, the other arguments must be keywords (Django 6.0 takes nothing
        else): ``TypeError`` before any query otherwise, as the fenced save could not see
        a positional ``update_fields``.

        Example::

            obj.save(fence=lease.token, update_fields=["balance"])
        """
        if args and fence is not None:
            raise TypeError(
                f"{self._meta.label}.save(fence=...) takes its other arguments as keywords "
                "only (force_insert=, force_update=, using=, update_fields=); nothing was "
                "written"
            )
        token = None if fence is None else validation.check_token(fence)
        update_fields: Iterable[str] | None = kwargs.get("update_fields")
        if update_fields is not None:
            update_fields = kwargs["update_fields"] = set(update_fields)
        if token is None or update_fields == set():
            # Unfenced; or an empty update_fields, which saves nothing in Django.
            super().save(*args, **kwargs)
            return
        if update_fields is not None:
            kwargs["update_fields"] = {*update_fields, FENCE}
        previous = self.fence
        self.fence, self._locks_fence = token, token
        try:
            super().save(*args, **kwargs)
        except BaseException:
            self.fence = previous
            raise
        finally:
            self._locks_fence = None

    def delete(
        self, using: str | None = None, keep_parents: bool = False, *, fence: int | None = None
    ) -> tuple[int, dict[str, int]]:
        """Delete; with ``fence=token``, only if no greater token has written this row.

        The row is first claimed for the token (one conditional ``UPDATE``, which locks
        it), then Django's own delete runs, in one transaction. Without ``fence`` it is
        Django's ``delete()``. Rows deleted by cascade are not checked.

        Example::

            obj.delete(fence=lease.token)  # StaleToken if a newer holder wrote first
        """
        token = None if fence is None else validation.check_token(fence)
        if token is None or self.pk is None:
            # Unfenced; or unsaved, which Django refuses with its own error before any query.
            return super().delete(using=using, keep_parents=keep_parents)
        db = using or router.db_for_write(type(self), instance=self)
        # The claim runs on the one table that holds the fence (a parent's, under
        # multi-table inheritance), so that it is one conditional UPDATE.
        owner = _fence_owner(type(self))
        rows = owner._base_manager.using(db).filter(pk=getattr(self, owner._meta.pk.attname))
        with transaction.atomic(using=db):
            if not rows.filter(fence__lte=token).update(fence=token):
                newer = newest(rows).values_list(FENCE, flat=True).first()
                if newer is not None:
                    raise StaleToken(
                        f"delete of {self._meta.label} pk={self.pk!r} with fencing token "
                        f"{token} refused: the row was written with the newer token {newer}; "
                        "it is unchanged"
                    )
                # No row to claim, so none of ours to delete. Django's delete would still
                # run an unconditional DELETE by pk, and so remove the row if a newer
                # holder has inserted it again since the claim.
                return 0, {}
            return super().delete(using=db, keep_parents=keep_parents)

    def _do_update(
        self,
        base_qs: models.QuerySet[Any],
        using: str | None,
        pk_val: Any,
        values: Collection[tuple[Field[Any, Any], type[models.Model] | None, Any]],
        *args: Any,
    ) -> Any:
        # *args and the result: Django's own, as in VersionedModel._do_update.
        if self._locks_raw or not any(field.attname == FENCE for field, _, _ in values):
            # A fixture's row, written as it is; or another table of a multi-table
            # inheritance chain: the fence is not there.
            return super()._do_update(base_qs, using, pk_val, values, *args)
        token = self._locks_fence
        if token is None:
            unfenced = [value for value in values if value[0].attname != FENCE]
            return super()._do_update(base_qs, using, pk_val, unfenced, *args)
        updated = super()._do_update(
            base_qs.filter(fence__lte=token), using, pk_val, list(values), *args
        )
        if updated:
            return updated
        # As the UPDATE saw it: not a MariaDB REPEATABLE READ snapshot that predates it.
        newer = newest(base_qs.filter(pk=pk_val)).values_list(FENCE, flat=True).first()
        if newer is None and self._state.adding:
            return updated  # no such row yet: Django inserts it, fence and all
        if newer is None:
            # Perhaps deleted by a newer holder: inserting it again would undo that.
            raise StaleToken(
                f"write to {self._meta.label} pk={pk_val!r} with fencing token {token} "
                "refused: the row was deleted after this copy was loaded; nothing was "
                "written (save(force_insert=True, fence=...) inserts it anew)"
            )
        raise StaleToken(
            f"write to {self._meta.label} pk={pk_val!r} with fencing token {token} refused: "
            f"the row was written with the newer token {newer}; it is unchanged"
        )
