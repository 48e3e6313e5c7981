"""Optimistic versions: ``VersionedModel``, its form and admin, lost updates across processes."""

from __future__ import annotations

import gc
import json
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, models, transaction
from django.db.models.signals import pre_save
from django.forms import HiddenInput, modelform_factory
from django.test import Client
from django.test.utils import CaptureQueriesContext, isolate_apps
from django.urls import reverse

import locks
from locks.checks import check_versioned_managers
from locks.forms import STALE_VERSION, VersionedModelForm
from locks.models import VersionedModel, VersionedQuerySet
from tests import forms
from tests.app.models import Item, VersionedChapter, VersionedNote, VersionedTask
from tests.conftest import isolation_level
from tests.remote import Remote, remotes
from tests.urls_versioning import FieldsetsNoteAdmin, FieldsNoteAdmin

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def start() -> Iterator[Callable[..., Remote]]:
    with remotes() as start:
        yield start


def stored(pk: int) -> tuple[str, str, int]:
    note = VersionedNote.objects.get(pk=pk)
    return note.title, note.body, note.version


# --- the model -------------------------------------------------------------------------------


def test_each_save_increments_the_version() -> None:
    note = VersionedNote.objects.create(title="t")
    assert note.version == 1
    note.body = "one"
    note.save()
    assert note.version == 2
    assert stored(note.pk) == ("t", "one", 2)


def test_a_save_based_on_an_old_version_is_refused_and_writes_nothing() -> None:
    note = VersionedNote.objects.create(title="t")
    mine, theirs = VersionedNote.objects.get(pk=note.pk), VersionedNote.objects.get(pk=note.pk)
    theirs.body = "theirs"
    theirs.save()
    mine.title = "mine"
    with pytest.raises(locks.ConcurrentUpdate, match=r"based on version 1.*at version 2"):
        mine.save()
    assert stored(note.pk) == ("t", "theirs", 2)
    assert mine.version == 1
    mine.refresh_from_db()  # picks up the current row and version
    assert (mine.title, mine.version) == ("t", 2)
    mine.title = "mine"
    mine.save()
    assert stored(note.pk) == ("mine", "theirs", 3)


def test_after_a_rolled_back_block_the_copy_keeps_its_version_until_refreshed() -> None:
    # Django reverts no instance's fields on a rollback (its docs, "Transactions"): the
    # copy keeps the version its save set, and refresh_from_db() is how to redo the change.
    note = VersionedNote.objects.create(title="t", body="original")
    with pytest.raises(RuntimeError), transaction.atomic():
        note.body = "mine"
        note.save()
        raise RuntimeError("a later step of the same transaction failed")
    assert stored(note.pk) == ("t", "original", 1)
    assert (note.body, note.version) == ("mine", 2)
    note.refresh_from_db()
    assert (note.body, note.version) == ("original", 1)
    note.body = "mine, redone"
    note.save()
    assert stored(note.pk) == ("t", "mine, redone", 2)


def test_a_copy_refreshed_after_a_rollback_and_someone_elses_save_saves_on_theirs() -> None:
    note = VersionedNote.objects.create(title="t", body="original")
    with pytest.raises(RuntimeError), transaction.atomic():
        note.body = "mine"
        note.save()
        raise RuntimeError("a later step of the same transaction failed")
    theirs = VersionedNote.objects.get(pk=note.pk)
    theirs.body = "theirs"
    theirs.save()
    note.refresh_from_db()  # the row as they left it, at their version
    assert (note.body, note.version) == ("theirs", 2)
    note.title = "mine, on theirs"
    note.save()  # no ConcurrentUpdate: the copy is based on the row's current version
    assert stored(note.pk) == ("mine, on theirs", "theirs", 3)
    theirs.body = "theirs, stale"
    with pytest.raises(locks.ConcurrentUpdate, match=r"based on version 2.*at version 3"):
        theirs.save()  # and the now outdated copy is still refused
    assert stored(note.pk) == ("mine, on theirs", "theirs", 3)


def test_a_failed_multi_table_save_leaves_the_copy_at_the_version_the_row_has() -> None:
    VersionedChapter.objects.create(title="other", code="taken")
    chapter = VersionedChapter.objects.create(title="t", code="c1")
    chapter.code = "taken"
    with pytest.raises(IntegrityError):
        chapter.save()  # the parent's table (the version's) updated, then the child's fails
    assert chapter.version == 1
    assert VersionedChapter.objects.get(pk=chapter.pk).version == 1
    theirs = VersionedChapter.objects.get(pk=chapter.pk)
    theirs.body = "theirs"
    theirs.save()
    chapter.code = "c2"
    with pytest.raises(locks.ConcurrentUpdate):
        chapter.save()
    assert (VersionedChapter.objects.get(pk=chapter.pk).body, theirs.version) == ("theirs", 2)


def test_saves_of_one_copy_in_one_transaction_follow_each_other() -> None:
    note = VersionedNote.objects.create(title="t")
    with transaction.atomic():
        note.body = "one"
        note.save()
        note.body = "two"
        note.save()  # based on its own uncommitted save
        assert note.version == 3
    note.body = "three"
    note.save()  # and after the commit
    assert stored(note.pk) == ("t", "three", 4)


def test_a_versioned_save_in_a_transaction_registers_no_commit_callback() -> None:
    note = VersionedNote.objects.create(title="t")
    with transaction.atomic():
        note.body = "one"
        note.save()
        # Callbacks of the caller's own (captureOnCommitCallbacks counts them) only.
        assert connection.run_on_commit == []
        # Nor is the copy kept alive until the commit (batch jobs save many in one block).
        saved = weakref.ref(note)
        del note
        gc.collect()
        assert saved() is None


def test_a_failing_commit_callback_of_the_caller_does_not_fail_later_saves() -> None:
    def fails() -> None:
        raise RuntimeError("the caller's callback failed")

    note = VersionedNote.objects.create(title="t")
    with pytest.raises(RuntimeError, match="callback failed"), transaction.atomic():
        transaction.on_commit(fails)  # not robust: Django runs no later callback
        note.body = "one"
        note.save()
    assert stored(note.pk) == ("t", "one", 2)  # committed before the callbacks ran
    note.body = "two"
    note.save()  # based on the committed version 2, as the row is
    assert stored(note.pk) == ("t", "two", 3)


def test_a_versioned_save_is_one_conditional_update() -> None:
    note = VersionedNote.objects.create(title="t")
    note.body = "x"
    with CaptureQueriesContext(connection) as queries:
        note.save()
    assert len(queries) == 1
    sql = queries.captured_queries[0]["sql"]
    assert sql.startswith("UPDATE") and "version" in sql.split("WHERE", 1)[1]


def test_saving_a_row_deleted_meanwhile_is_refused_and_does_not_bring_it_back() -> None:
    note = VersionedNote.objects.create(title="t")
    VersionedNote.objects.filter(pk=note.pk).delete()
    note.body = "resurrected?"
    with pytest.raises(locks.ConcurrentUpdate, match="deleted"):
        note.save()
    assert not VersionedNote.objects.exists()


def test_a_new_object_with_a_taken_pk_overwrites_a_row_at_version_1_unless_inserted() -> None:
    note = VersionedNote.objects.create(title="t")
    VersionedNote(pk=note.pk, title="new").save()  # Django's UPDATE first: row 1 matches
    assert stored(note.pk) == ("new", "", 2)
    with pytest.raises(locks.ConcurrentUpdate, match=r"based on version 1.*at version 2"):
        VersionedNote(pk=note.pk, title="newer").save()
    for insert in (
        lambda: VersionedNote.objects.create(pk=note.pk, title="created"),
        lambda: VersionedNote(pk=note.pk, title="forced").save(force_insert=True),
    ):
        with pytest.raises(IntegrityError), transaction.atomic():
            insert()
    assert stored(note.pk) == ("new", "", 2)


def test_empty_update_fields_saves_nothing_and_keeps_the_version_as_in_django() -> None:
    note = VersionedNote.objects.create(title="t", body="a")
    note.body = "b"
    with CaptureQueriesContext(connection) as queries:
        note.save(update_fields=[])
    assert len(queries) == 0
    assert note.version == 1
    assert VersionedNote.objects.values_list("body", "version").get() == ("a", 1)


def test_update_fields_also_checks_and_writes_the_version() -> None:
    note = VersionedNote.objects.create(title="t")
    note.body = "b"
    note.save(update_fields=["body"])
    assert stored(note.pk) == ("t", "b", 2)


@pytest.mark.parametrize("update_fields", [None, ["body"]], ids=["save", "update_fields"])
@pytest.mark.parametrize(
    "load", [("only", "body"), ("defer", "version")], ids=["only_body", "defer_version"]
)
def test_saving_a_copy_loaded_without_its_version_is_refused_before_any_query(
    load: tuple[str, str], update_fields: list[str] | None
) -> None:
    note = VersionedNote.objects.create(title="t")
    method, field = load
    copy = getattr(VersionedNote.objects, method)(field).get(pk=note.pk)
    VersionedNote.objects.filter(pk=note.pk).update(body="theirs")  # someone else saves
    copy.body = "mine"
    refused = pytest.raises(ValueError, match=r"loaded without its version.*only\(")
    with CaptureQueriesContext(connection) as queries, refused:
        copy.save(update_fields=update_fields)
    assert queries.captured_queries == []  # not even the deferred version was fetched
    assert stored(note.pk) == ("t", "theirs", 2)


@pytest.mark.parametrize("version", [None, "1", True, 1.0, -1])
def test_a_version_that_is_not_a_count_is_refused_before_any_query(version: Any) -> None:
    note = VersionedNote.objects.create(title="t")
    copy = VersionedNote.objects.get(pk=note.pk)
    copy.body, copy.version = "mine", version
    with CaptureQueriesContext(connection) as queries, pytest.raises(TypeError, match="version"):
        copy.save()
    assert queries.captured_queries == []
    assert stored(note.pk) == ("t", "", 1)
    with pytest.raises(TypeError, match="version"):
        VersionedNote(title="new", version=version).save()
    assert VersionedNote.objects.count() == 1


def test_a_copy_loaded_with_only_some_fields_and_its_version_is_checked() -> None:
    note = VersionedNote.objects.create(title="t")
    stale = VersionedNote.objects.only("body", "version").get(pk=note.pk)
    fresh = VersionedNote.objects.only("body", "version").get(pk=note.pk)
    fresh.body = "first"
    fresh.save()
    assert (fresh.version, stored(note.pk)) == (2, ("t", "first", 2))
    stale.body = "second"
    with pytest.raises(locks.ConcurrentUpdate, match=r"based on version 1.*at version 2"):
        stale.save(update_fields=["body"])
    assert stored(note.pk) == ("t", "first", 2)


def test_a_bulk_update_increments_the_version_so_older_copies_are_refused() -> None:
    note = VersionedNote.objects.create(title="t")
    assert VersionedNote.objects.filter(pk=note.pk).update(title="bulk") == 1
    assert stored(note.pk) == ("bulk", "", 2)
    note.body = "stale"
    with pytest.raises(locks.ConcurrentUpdate):
        note.save()
    assert stored(note.pk) == ("bulk", "", 2)
    copy = VersionedNote.objects.get(pk=note.pk)
    copy.body = "bulk_update"
    VersionedNote.objects.bulk_update([copy], ["body"])
    assert stored(note.pk) == ("bulk", "bulk_update", 3)


def test_bulk_update_does_not_check_the_version_and_leaves_the_objects_at_their_old_one() -> None:
    note = VersionedNote.objects.create(title="t")
    stale = VersionedNote.objects.get(pk=note.pk)
    VersionedNote.objects.filter(pk=note.pk).update(body="theirs")  # now version 2
    stale.title = "bulk"
    VersionedNote.objects.bulk_update([stale], ["title"])  # written over version 2
    assert stored(note.pk) == ("bulk", "theirs", 3)
    assert stale.version == 1  # still the old one in memory: reload before saving again
    with pytest.raises(locks.ConcurrentUpdate):
        stale.save()


def test_a_bulk_upsert_that_would_bypass_the_version_is_refused_and_writes_nothing() -> None:
    note = VersionedNote.objects.create(title="t", body="kept")
    stale = VersionedNote(pk=note.pk, title="t", body="upserted")
    with pytest.raises(TypeError, match="update_conflicts"):
        VersionedNote.objects.bulk_create(
            [stale], update_conflicts=True, update_fields=["body"], unique_fields=["id"]
        )
    assert stored(note.pk) == ("t", "kept", 1)
    (made,) = VersionedNote.objects.bulk_create([VersionedNote(title="plain")])
    assert stored(made.pk) == ("plain", "", 1)


def test_loaddata_writes_a_fixtures_rows_as_they_are(tmp_path: Path) -> None:
    fixture = tmp_path / "notes.json"
    row = {"title": "from fixture", "body": "", "version": 5}
    fixture.write_text(json.dumps([{"model": "testapp.versionednote", "pk": 90, "fields": row}]))
    call_command("loaddata", str(fixture), verbosity=0)
    call_command("loaddata", str(fixture), verbosity=0)  # again: the same row, unchanged
    assert stored(90) == ("from fixture", "", 5)
    note = VersionedNote.objects.get(pk=90)
    note.body = "edited"
    note.save()
    call_command("loaddata", str(fixture), verbosity=0)  # the fixture's row wins, as in Django
    assert stored(90) == ("from fixture", "", 5)


def test_every_versioned_models_default_manager_increments_the_version_or_check_says_so() -> None:
    assert check_versioned_managers() == []

    with isolate_apps("tests.app") as isolated:

        class PlainManagerNote(VersionedModel):
            objects = models.Manager()  # type: ignore[assignment]

            class Meta:
                app_label = "testapp"

        class Parent(models.Model):  # noqa: DJ008
            class Meta:
                app_label = "testapp"

        class InheritedNote(Parent, VersionedModel):  # noqa: DJ008
            class Meta:
                app_label = "testapp"

        assert isolated is not None
        errors = check_versioned_managers(app_configs=[isolated.get_app_config("testapp")])
    assert [(e.id, e.obj.__name__) for e in errors] == [
        ("locks.E006", "PlainManagerNote"),
        ("locks.E006", "InheritedNote"),
    ]
    assert "update() would not increment the version" in errors[0].msg


def test_on_delete_set_null_increments_the_version_of_the_rows_it_updates() -> None:
    item = Item.objects.create(name="i")
    task = VersionedTask.objects.create(title="t", item=item)
    stale = VersionedTask.objects.get(pk=task.pk)
    item.delete()  # SET_NULL: Django updates the task's row through the base manager
    task.refresh_from_db()
    assert (task.item_id, task.version) == (None, 2)
    stale.title = "edited from a copy loaded before the SET_NULL"
    with pytest.raises(locks.ConcurrentUpdate, match=r"based on version 1.*at version 2"):
        stale.save()  # it would have set the item back to the deleted one
    task.refresh_from_db()
    assert (task.title, task.item_id) == ("t", None)


def test_the_base_manager_is_the_default_one_when_that_one_is_versioned_and_unfiltered() -> None:
    # A subclass with a Meta of its own does not inherit an abstract parent's
    # base_manager_name, and the registry's cache clears drop a cached base manager.
    with isolate_apps("tests.app") as isolated:

        class Target(models.Model):  # noqa: DJ008
            class Meta:
                app_label = "testapp"

        class OwnMetaTask(VersionedModel):
            target = models.ForeignKey(Target, null=True, on_delete=models.SET_NULL)

            class Meta:
                app_label = "testapp"
                ordering = ["pk"]

        class Filtering(models.Manager["FilteringTask"]):
            def get_queryset(self) -> models.QuerySet[FilteringTask]:
                return VersionedQuerySet(self.model, using=self._db).filter(version__gt=0)

        class FilteringTask(VersionedModel):
            target = models.ForeignKey(Target, null=True, on_delete=models.SET_NULL)
            objects = Filtering()  # type: ignore[assignment]

            class Meta:
                app_label = "testapp"

        class NamedBaseTask(FilteringTask):
            rows = VersionedQuerySet.as_manager()
            objects = Filtering()

            class Meta:
                app_label = "testapp"
                base_manager_name = "rows"

        class SetDefaultTask(VersionedModel):
            target = models.ForeignKey(Target, null=True, on_delete=models.SET_DEFAULT)
            other = models.ForeignKey(
                Target, null=True, on_delete=models.SET(lambda: None), related_name="+"
            )

            class Meta:
                app_label = "testapp"

        class PlainParent(models.Model):  # noqa: DJ008
            target = models.ForeignKey(
                Target, null=True, on_delete=models.SET_NULL, related_name="+"
            )

            class Meta:
                app_label = "testapp"

        class InheritedTask(PlainParent, VersionedModel):  # noqa: DJ008
            objects = VersionedQuerySet.as_manager()

            class Meta:
                app_label = "testapp"

        assert isolated is not None
        isolated.clear_cache()
        assert OwnMetaTask._base_manager is OwnMetaTask._default_manager
        assert NamedBaseTask._base_manager.name == "rows"
        assert not isinstance(FilteringTask._base_manager.get_queryset(), VersionedQuerySet)
        errors = check_versioned_managers(app_configs=[isolated.get_app_config("testapp")])
    assert [(e.id, e.obj.model.__name__, e.obj.name) for e in errors] == [
        ("locks.E006", "FilteringTask", "target"),
        ("locks.E007", "SetDefaultTask", "target"),
        ("locks.E007", "SetDefaultTask", "other"),
        ("locks.E007", "PlainParent", "target"),
    ]
    assert "through the base manager (_base_manager)" in errors[0].msg
    assert "base_manager_name" in str(errors[0].hint)
    assert "on_delete=SET_DEFAULT" in errors[1].msg and "SET_NULL" in str(errors[1].hint)
    assert "on_delete=SET(...)" in errors[2].msg
    assert "InheritedTask.target" in errors[3].msg and "not versioned" in errors[3].msg


def test_two_processes_saving_the_same_row_lose_no_update(start: Callable[..., Remote]) -> None:
    note = VersionedNote.objects.create(title="shared")
    first, second = start(), start()
    assert first.call("load", pk=note.pk)["version"] == 1
    assert second.call("load", pk=note.pk)["version"] == 1
    first.send("append", pk=note.pk, text="[first]")
    second.send("append", pk=note.pk, text="[second]")
    outcomes = {"first": first.reply(), "second": second.reply()}

    winners = [who for who, event in outcomes.items() if event["ok"]]
    losers = [who for who, event in outcomes.items() if not event["ok"]]
    assert len(winners) == 1 and len(losers) == 1, outcomes
    assert outcomes[losers[0]]["error"] == "ConcurrentUpdate"
    assert stored(note.pk) == ("shared", f"[{winners[0]}]", 2)

    loser = first if losers[0] == "first" else second
    retried = loser.call("append", pk=note.pk, text=f"[{losers[0]}]", reload=True)
    assert retried["ok"] and retried["version"] == 3, retried
    assert stored(note.pk) == ("shared", f"[{winners[0]}][{losers[0]}]", 3)


@pytest.fixture(params=["REPEATABLE READ", "SERIALIZABLE"])
def isolation(request: pytest.FixtureRequest) -> Iterator[str]:
    """Django's connection runs its transactions under this isolation level."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no isolation levels")
    with isolation_level(request.param):
        yield request.param


def test_a_lost_update_under_another_isolation_level_is_refused_and_names_the_version(
    start: Callable[..., Remote], isolation: str
) -> None:
    note = VersionedNote.objects.create(title="t")
    mine = VersionedNote.objects.get(pk=note.pk)
    other = start()
    assert other.call("load", pk=note.pk)["version"] == 1
    with transaction.atomic():
        Item.objects.count()  # the snapshot is taken here, on another table
        assert other.call("append", pk=note.pk, text="theirs")["version"] == 2
        mine.body = "mine"
        # PostgreSQL refuses to write a row changed since the snapshot (OperationalError).
        refused = pytest.raises(
            locks.ConcurrentUpdate if connection.vendor == "mysql" else Exception
        )
        with refused as error, transaction.atomic():
            mine.save()
    if connection.vendor == "mysql":
        assert "at version 2" in str(error.value), error.value
    assert stored(note.pk) == ("t", "theirs", 2)


# --- model forms -------------------------------------------------------------------------------


class NoteForm(VersionedModelForm):
    class Meta:
        model = VersionedNote
        fields = ["title", "body"]


def test_the_form_carries_the_version_in_a_hidden_field() -> None:
    note = VersionedNote.objects.create(title="t")
    note.save()
    html = str(NoteForm(instance=note))
    assert 'type="hidden" name="version" value="2"' in html


def test_any_model_form_of_a_versioned_model_carries_the_version_and_checks_it() -> None:
    # A ModelForm that is not a VersionedModelForm (admin inlines, list_editable, generic
    # UpdateViews with fields="__all__") builds the version's field from the model field.
    note = VersionedNote.objects.create(title="t")
    form_class = modelform_factory(VersionedNote, fields="__all__")
    assert isinstance(form_class().fields["version"].widget, HiddenInput)
    data = {"title": "edited", "body": "", "version": "1"}
    VersionedNote.objects.filter(pk=note.pk).update(body="theirs")
    form = form_class(data, instance=VersionedNote.objects.get(pk=note.pk))
    assert form.is_valid(), form.errors
    with pytest.raises(locks.ConcurrentUpdate):
        form.save()
    assert stored(note.pk) == ("t", "theirs", 2)


def test_a_form_edit_based_on_an_old_version_is_refused_with_a_clear_error() -> None:
    note = VersionedNote.objects.create(title="t")
    VersionedNote.objects.filter(pk=note.pk).update(body="theirs")  # now version 2
    form = NoteForm(
        {"title": "mine", "body": "", "version": "1"},
        instance=VersionedNote.objects.get(pk=note.pk),
    )
    assert not form.is_valid()
    assert form.has_error("__all__", STALE_VERSION)
    assert "changed by someone else" in str(form.non_field_errors())
    assert stored(note.pk) == ("t", "theirs", 2)


def test_a_form_edit_of_the_current_version_saves() -> None:
    note = VersionedNote.objects.create(title="t")
    form = NoteForm({"title": "mine", "body": "b", "version": "1"}, instance=note)
    assert form.is_valid(), form.errors
    form.save()
    assert stored(note.pk) == ("mine", "b", 2)


def test_a_form_without_a_valid_version_is_refused() -> None:
    note = VersionedNote.objects.create(title="t")
    for data in ({"title": "x"}, {"title": "x", "version": "v1"}, {"title": "x", "version": "-1"}):
        form = NoteForm(data, instance=VersionedNote.objects.get(pk=note.pk))
        assert not form.is_valid()
        assert "version" in form.errors
    assert stored(note.pk) == ("t", "", 1)


def test_a_form_save_that_loses_the_race_after_validation_raises_concurrent_update() -> None:
    note = VersionedNote.objects.create(title="t")
    form = NoteForm({"title": "mine", "body": "", "version": "1"}, instance=note)
    assert form.is_valid()
    VersionedNote.objects.filter(pk=note.pk).update(body="theirs")
    with pytest.raises(locks.ConcurrentUpdate):
        form.save()
    assert stored(note.pk) == ("t", "theirs", 2)


# --- the admin -----------------------------------------------------------------------------------


def change_url(pk: int) -> str:
    return reverse("versioning_admin:testapp_versionednote_change", args=[pk])


def post(client: Client, pk: int, **data: Any) -> Any:
    return client.post(change_url(pk), {"title": "", "body": "", "_save": "Save", **data})


@pytest.mark.urls("tests.urls_versioning")
def test_the_admin_refuses_a_change_form_based_on_an_old_version(admin_client: Client) -> None:
    note = VersionedNote.objects.create(title="t")
    page = admin_client.get(change_url(note.pk))
    assert 'name="version" value="1"' in page.content.decode()
    VersionedNote.objects.filter(pk=note.pk).update(body="theirs")  # someone else saves

    response = post(admin_client, note.pk, title="mine", version="1")
    assert response.status_code == 200
    assert "changed by someone else" in response.content.decode()
    assert stored(note.pk) == ("t", "theirs", 2)

    response = post(admin_client, note.pk, title="mine", body="theirs", version="2")
    assert response.status_code == 302
    assert stored(note.pk) == ("mine", "theirs", 3)


@pytest.mark.urls("tests.urls_versioning")
def test_the_admin_reports_a_save_that_loses_the_race_after_validation(
    admin_client: Client,
) -> None:
    note = VersionedNote.objects.create(title="t")

    def someone_else_saves_first(sender: Any, instance: VersionedNote, **kwargs: Any) -> None:
        # Between the form's check and the admin's save, the row moves on.
        VersionedNote.objects.filter(pk=instance.pk).update(body="theirs")

    pre_save.connect(someone_else_saves_first, sender=VersionedNote)
    try:
        response = post(admin_client, note.pk, title="mine", version="1")
    finally:
        pre_save.disconnect(someone_else_saves_first, sender=VersionedNote)
    assert response.status_code == 302
    assert response["Location"] == change_url(note.pk)
    page = admin_client.get(response["Location"]).content.decode()
    assert "Not saved" in page and "changed by someone else" in page
    assert stored(note.pk)[0] == "t", "the admin's edit must not be written"


def rendered_change_form(client: Client, url: str) -> dict[str, str]:
    """The values a browser would post from the admin change form of a page."""
    page = client.get(url).content.decode()
    fields = forms.form_fields(page, lambda form: form.get("id") == "versionednote_form")
    return {name: values[-1] for name, values in fields.items()}


# Admins whose fields or fieldsets do not list the version.
PARTIAL_ADMIN_SITES = ["versioning_fields_admin", "versioning_fieldsets_admin"]


@pytest.mark.urls("tests.urls_versioning")
@pytest.mark.parametrize("site", PARTIAL_ADMIN_SITES)
def test_an_admin_with_fields_or_fieldsets_sends_the_version_and_saves(
    admin_client: Client, site: str
) -> None:
    note = VersionedNote.objects.create(title="t", body="b")
    url = reverse(f"{site}:testapp_versionednote_change", args=[note.pk])
    page = admin_client.get(url).content.decode()
    assert page.count('name="version"') == 1
    assert 'type="hidden" name="version" value="1"' in page
    data = rendered_change_form(admin_client, url)
    assert data["version"] == "1"
    response = admin_client.post(url, {**data, "title": "mine", "_save": "Save"})
    assert response.status_code == 302, response.content.decode()
    assert stored(note.pk) == ("mine", "b", 2)
    # The version is added to a copy: the admin classes' own settings stay as declared.
    assert FieldsNoteAdmin.fields == ["title"]
    assert [options["fields"] for _, options in FieldsetsNoteAdmin.fieldsets] == [
        [("title",)],
        ["body"],
    ]


@pytest.mark.urls("tests.urls_versioning")
@pytest.mark.parametrize("site", PARTIAL_ADMIN_SITES)
def test_an_admin_with_fields_or_fieldsets_refuses_a_change_form_based_on_an_old_version(
    admin_client: Client, site: str
) -> None:
    note = VersionedNote.objects.create(title="t", body="b")
    url = reverse(f"{site}:testapp_versionednote_change", args=[note.pk])
    data = rendered_change_form(admin_client, url)
    VersionedNote.objects.filter(pk=note.pk).update(body="theirs")  # someone else saves
    response = admin_client.post(url, {**data, "title": "mine", "_save": "Save"})
    assert response.status_code == 200
    assert "changed by someone else" in response.content.decode()
    assert stored(note.pk) == ("t", "theirs", 2)


@pytest.mark.urls("tests.urls_versioning")
@pytest.mark.parametrize("site", PARTIAL_ADMIN_SITES)
def test_an_admin_with_fields_or_fieldsets_adds_a_row(admin_client: Client, site: str) -> None:
    url = reverse(f"{site}:testapp_versionednote_add")
    data = rendered_change_form(admin_client, url)
    assert data["version"] == "1"
    response = admin_client.post(url, {**data, "title": "new", "_save": "Save"})
    assert response.status_code == 302, response.content.decode()
    assert [(note.title, note.version) for note in VersionedNote.objects.all()] == [("new", 1)]
