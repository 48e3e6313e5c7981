"""Fencing tokens enforced by ``FencedModel``, and the paused holder across OS processes."""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from django.core.management import call_command
from django.db import NotSupportedError, OperationalError, connection, transaction
from django.db.models import Count, Max, Value
from django.db.models.functions import Concat
from django.test.utils import CaptureQueriesContext

import locks
from tests.app.models import (
    Carton,
    FencedCrate,
    FencedPallet,
    FencedParcel,
    FencedRecord,
    FencedShipment,
    Item,
)
from tests.conftest import BACKEND, isolation_level
from tests.remote import Remote, remotes

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def start() -> Iterator[Callable[..., Remote]]:
    with remotes() as start:
        yield start


def stored(pk: int) -> tuple[str, int]:
    record = FencedRecord.objects.get(pk=pk)
    return record.data, record.fence


# --- save(fence=...) -------------------------------------------------------------------------


def test_fenced_save_allows_equal_and_greater_tokens_and_refuses_older_ones() -> None:
    record = FencedRecord.objects.create(key="k")
    record.data = "five"
    record.save(fence=5)
    assert stored(record.pk) == ("five", 5)
    record.data = "five again"
    record.save(fence=5)  # the same holder writes many times
    assert stored(record.pk) == ("five again", 5)

    stale = FencedRecord.objects.get(pk=record.pk)
    stale.data = "three"
    with pytest.raises(locks.StaleToken, match=r"token 3 refused.*newer token 5"):
        stale.save(fence=3)
    assert stored(record.pk) == ("five again", 5)
    assert stale.fence == 5, "the copy keeps the fence it had"

    record.data = "seven"
    record.save(fence=7)
    assert stored(record.pk) == ("seven", 7)


def test_a_fenced_save_is_one_conditional_update() -> None:
    record = FencedRecord.objects.create(key="k")
    record.data = "x"
    with CaptureQueriesContext(connection) as queries:
        record.save(fence=3)
    assert len(queries) == 1
    sql = queries.captured_queries[0]["sql"]
    assert sql.startswith("UPDATE") and "fence" in sql.split("WHERE", 1)[1]


def test_a_fenced_save_inserts_a_row_that_does_not_exist_yet() -> None:
    FencedRecord(key="new", data="x").save(fence=4)
    FencedRecord(pk=999, key="explicit", data="y").save(fence=6)
    assert sorted(FencedRecord.objects.values_list("key", "fence")) == [
        ("explicit", 6),
        ("new", 4),
    ]


def test_a_fenced_save_of_a_row_deleted_since_it_was_loaded_does_not_bring_it_back() -> None:
    record = FencedRecord.objects.create(key="k", data="a")
    stale = FencedRecord.objects.get(pk=record.pk)
    FencedRecord.objects.get(pk=record.pk).delete(fence=6)  # a newer holder deletes it
    stale.data = "stale"
    with pytest.raises(locks.StaleToken, match="deleted after this copy was loaded"):
        stale.save(fence=5)
    assert not FencedRecord.objects.exists()
    stale.save(fence=7, force_insert=True)  # inserting anew is a choice to make explicitly
    assert stored(record.pk) == ("stale", 7)


def test_loaddata_writes_a_fixtures_fence_as_it_is(tmp_path: Path) -> None:
    fixture = tmp_path / "records.json"
    row = {"key": "k", "data": "from fixture", "fence": 12}
    fixture.write_text(json.dumps([{"model": "testapp.fencedrecord", "pk": 80, "fields": row}]))
    call_command("loaddata", str(fixture), verbosity=0)
    assert stored(80) == ("from fixture", 12)
    FencedRecord.objects.filter(pk=80).fenced_update(20, data="newer")
    call_command("loaddata", str(fixture), verbosity=0)  # the fixture's row wins, as in Django
    assert stored(80) == ("from fixture", 12)


def test_an_unfenced_save_writes_the_data_but_never_moves_the_fence() -> None:
    record = FencedRecord.objects.create(key="k")
    record.save(fence=9)
    copy = FencedRecord.objects.get(pk=record.pk)
    copy.fence = 1  # even a copy with a lower fence cannot lower it
    copy.data = "edited in the admin"
    copy.save()
    assert stored(record.pk) == ("edited in the admin", 9)
    with pytest.raises(locks.StaleToken):
        copy.save(fence=8)


def test_a_fenced_save_with_update_fields_writes_the_fence_too() -> None:
    record = FencedRecord.objects.create(key="k", data="a")
    record.data = "b"
    record.save(fence=3, update_fields=["data"])
    assert stored(record.pk) == ("b", 3)


def test_a_fenced_save_with_empty_update_fields_saves_nothing_as_in_django() -> None:
    record = FencedRecord.objects.create(key="k", data="a")
    record.data = "b"
    with CaptureQueriesContext(connection) as queries:
        record.save(fence=3, update_fields=[])
    assert len(queries) == 0
    assert stored(record.pk) == ("a", 0)


def test_a_fenced_save_with_positional_arguments_is_refused_before_any_query() -> None:
    # Django 5.2 still takes save(force_insert, force_update, using, update_fields), with
    # a deprecation warning; the fence must not be given a chance to miss update_fields.
    record = FencedRecord.objects.create(key="k", data="original")
    newer = FencedRecord.objects.get(pk=record.pk)
    newer.data = "newer"
    newer.save(fence=9)
    record.data = "stale"
    with CaptureQueriesContext(connection) as queries, pytest.raises(TypeError, match="keywords"):
        record.save(False, False, None, ["data"], fence=3)
    assert len(queries) == 0
    assert stored(record.pk) == ("newer", 9)
    with pytest.raises(locks.StaleToken):
        record.save(update_fields=["data"], fence=3)  # the same save, by keywords
    assert stored(record.pk) == ("newer", 9)


@pytest.mark.parametrize("deferred", [("data",), ("key",)], ids=["only-data", "only-key"])
def test_a_copy_loaded_without_its_fence_is_still_fenced(deferred: tuple[str, ...]) -> None:
    # only() defers the fence; Django then saves just the loaded fields, and the fence
    # given to save() must be among them and checked.
    record = FencedRecord.objects.create(key="k", data="a")
    FencedRecord.objects.get(pk=record.pk).save(fence=7)
    stale = FencedRecord.objects.only(*deferred).get(pk=record.pk)
    stale.data = "stale"
    with pytest.raises(locks.StaleToken):
        stale.save(fence=5)
    assert stored(record.pk) == ("a", 7)
    fresh = FencedRecord.objects.only(*deferred).get(pk=record.pk)
    fresh.data = "fresh"
    fresh.save(fence=8)
    assert stored(record.pk) == ("fresh", 8)


@pytest.mark.parametrize(
    ("fence", "error"),
    [("5", TypeError), (True, TypeError), (1.5, TypeError), (0, ValueError), (-1, ValueError)],
)
def test_a_bad_fencing_token_is_refused_before_any_query(
    fence: Any, error: type[Exception]
) -> None:
    record = FencedRecord.objects.create(key="k", data="a")
    record.data = "b"
    with CaptureQueriesContext(connection) as queries, pytest.raises(error):
        record.save(fence=fence)
    assert len(queries) == 0
    assert stored(record.pk) == ("a", 0)


def test_stale_token_marks_the_outer_transaction_for_rollback_like_any_save_error() -> None:
    record = FencedRecord.objects.create(key="k")
    record.save(fence=5)
    with transaction.atomic():
        FencedRecord.objects.create(key="doomed")
        with pytest.raises(locks.StaleToken):
            record.save(fence=2)
        assert transaction.get_rollback()
    assert not FencedRecord.objects.filter(key="doomed").exists()


def test_stale_token_in_its_own_savepoint_leaves_the_outer_transaction_usable() -> None:
    record = FencedRecord.objects.create(key="k")
    record.save(fence=5)
    with transaction.atomic():
        FencedRecord.objects.create(key="other")
        with pytest.raises(locks.StaleToken), transaction.atomic():
            record.save(fence=2)  # its own savepoint: the outer transaction carries on
        FencedRecord.objects.create(key="third")
    assert FencedRecord.objects.count() == 3


# --- fenced_update ---------------------------------------------------------------------------


def test_fenced_update_updates_every_row_or_none() -> None:
    a, b, c = FencedRecord.objects.bulk_create(
        FencedRecord(key=key, data="new") for key in ("a", "b", "c")
    )
    batch = FencedRecord.objects.filter(pk__in=[a.pk, b.pk, c.pk])
    assert batch.fenced_update(5, data="five") == 3
    assert FencedRecord.objects.filter(pk=c.pk).fenced_update(9, data="nine") == 1
    with pytest.raises(locks.StaleToken, match=r"token 7 refused.*newer token 9"):
        batch.fenced_update(7, data="seven")
    assert [stored(pk) for pk in (a.pk, b.pk, c.pk)] == [("five", 5), ("five", 5), ("nine", 9)]
    assert batch.exclude(pk=c.pk).fenced_update(5, data="five again") == 2  # equal token
    assert [stored(pk) for pk in (a.pk, b.pk)] == [("five again", 5)] * 2


@pytest.mark.parametrize(
    "stale",
    [
        lambda record: FencedRecord.objects.all().fenced_update(2, data="stale"),
        lambda record: FencedRecord.objects.get(pk=record.pk).delete(fence=2),
        lambda record: FencedRecord.objects.all().fenced_delete(2),
    ],
    ids=["fenced_update", "delete", "fenced_delete"],
)
def test_a_stale_fenced_write_leaves_the_outer_transaction_usable(
    stale: Callable[[FencedRecord], object],
) -> None:
    record = FencedRecord.objects.create(key="k")
    record.save(fence=5)
    with transaction.atomic():
        FencedRecord.objects.create(key="kept")
        with pytest.raises(locks.StaleToken):
            stale(record)
        FencedRecord.objects.create(key="also kept")
    assert sorted(FencedRecord.objects.values_list("key", "data", "fence")) == [
        ("also kept", "", 0),
        ("k", "", 5),
        ("kept", "", 0),
    ]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda qs: qs.fenced_update("5", data="x"), TypeError),
        (lambda qs: qs.fenced_update(0, data="x"), ValueError),
        (lambda qs: qs.fenced_update(5, fence=3), TypeError),
        (lambda qs: qs[:1].fenced_update(5, data="x"), TypeError),
        (lambda qs: qs.union(qs).fenced_update(5, data="x"), NotSupportedError),
    ],
    ids=["str-token", "zero-token", "fence-given", "sliced", "union"],
)
def test_fenced_update_refuses_bad_arguments_before_any_query(
    call: Callable[[Any], Any], error: type[Exception]
) -> None:
    record = FencedRecord.objects.create(key="k", data="a")
    with CaptureQueriesContext(connection) as queries, pytest.raises(error):
        call(FencedRecord.objects.all())
    assert len(queries) == 0
    assert stored(record.pk) == ("a", 0)


@pytest.mark.parametrize(
    "call",
    [
        lambda rows: rows.union(rows).fenced_update(5, data="x"),
        lambda rows: rows.union(rows).fenced_delete(5),
        lambda rows: rows.distinct("key").fenced_delete(5),
        lambda rows: rows.order_by("key").distinct("key").fenced_update(5, data="x"),
    ],
    ids=["union-update", "union-delete", "distinct-fields-delete", "distinct-fields-update"],
)
def test_fenced_writes_refuse_what_djangos_writes_refuse_before_any_query(
    call: Callable[[Any], Any],
) -> None:
    # As Django's update() and delete(): a combined queryset has no rows to write by
    # id, and a write after distinct(*fields) would take every row of the filter, not one
    # of each distinct value (Django's update() refuses it from 6.1 on).
    child = shipment(fence=3)
    with (
        CaptureQueriesContext(connection) as queries,
        pytest.raises((TypeError, NotSupportedError)),
    ):
        call(FencedShipment.objects.filter(carrier="ups"))
    assert len(queries) == 0
    assert FencedShipment.objects.values_list("pk", "data", "fence").get() == (child.pk, "newer", 3)


# --- delete(fence=...) and fenced_delete ------------------------------------------------------


def test_fenced_delete_of_one_row_refuses_an_older_token_and_leaves_the_row() -> None:
    record = FencedRecord.objects.create(key="k", data="seven")
    record.save(fence=7)
    stale = FencedRecord.objects.get(pk=record.pk)
    stale.fence = 0  # as a copy loaded before the newer holder wrote
    with pytest.raises(locks.StaleToken, match=r"delete .* token 3 refused.*newer token 7"):
        stale.delete(fence=3)
    assert stored(record.pk) == ("seven", 7)
    assert record.delete(fence=7) == (1, {FencedRecord._meta.label: 1})  # the holder's own token
    assert not FencedRecord.objects.filter(pk=record.pk).exists()


def test_fenced_delete_of_one_row_with_a_newer_token_claims_and_deletes_it() -> None:
    record = FencedRecord.objects.create(key="k")
    record.save(fence=4)
    with CaptureQueriesContext(connection) as queries:
        record.delete(fence=9)
    assert not FencedRecord.objects.filter(pk=record.pk).exists()
    # The claim is the first statement: the row is locked before Django's delete reads it.
    statements = [q["sql"].lstrip().upper() for q in queries.captured_queries]
    writes = [sql for sql in statements if sql.startswith(("UPDATE", "DELETE"))]
    assert writes[0].startswith("UPDATE") and writes[-1].startswith("DELETE"), statements


def test_fenced_delete_deletes_every_row_or_none() -> None:
    a, b, c = FencedRecord.objects.bulk_create(
        FencedRecord(key=key, data="new") for key in ("a", "b", "c")
    )
    FencedRecord.objects.filter(pk=c.pk).fenced_update(9, data="nine")
    batch = FencedRecord.objects.filter(pk__in=[a.pk, b.pk, c.pk])
    with pytest.raises(locks.StaleToken, match=r"token 7 refused.*newer token 9"):
        batch.fenced_delete(7)
    assert [stored(pk) for pk in (a.pk, b.pk, c.pk)] == [("new", 0), ("new", 0), ("nine", 9)]
    assert batch.fenced_delete(9) == (3, {FencedRecord._meta.label: 3})
    assert not FencedRecord.objects.exists()


def test_a_fenced_delete_whose_filter_reads_the_fence_deletes_the_rows_it_claimed() -> None:
    # The claim sets the rows' fence to the token, so that a filter on the fence itself no
    # longer selects them afterwards: they must still go, not stay behind claimed.
    *_, c = FencedRecord.objects.bulk_create(FencedRecord(key=key) for key in ("a", "b", "c"))
    FencedRecord.objects.filter(pk=c.pk).fenced_update(7)
    untouched = FencedRecord.objects.filter(fence__lt=5)
    assert untouched.fenced_delete(5) == (2, {FencedRecord._meta.label: 2})
    assert FencedRecord.objects.values_list("key", "fence").get() == ("c", 7)
    # The same where the fence is a parent's column (the rows are claimed by their ids).
    shipment = FencedShipment.objects.create(key="s", carrier="ups")
    assert FencedShipment.objects.filter(fence=0).fenced_delete(5) == (
        2,
        {FencedShipment._meta.label: 1, FencedRecord._meta.label: 1},
    )
    assert not FencedShipment.objects.filter(pk=shipment.pk).exists()
    assert FencedRecord.objects.values_list("key", "fence").get() == ("c", 7)


@pytest.fixture
def few_parameters() -> Iterator[int]:
    """SQLite allows this many parameters per statement, as builds before 3.32 do (and as
    Django counts on: ``max_query_params``); Debian's allows 250000, stock 3.32+ 32766."""
    if BACKEND != "sqlite":
        yield 999
        return
    import sqlite3

    connection.ensure_connection()
    raw = connection.connection
    limit = raw.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
    try:
        yield 999
    finally:
        raw.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, limit)


def test_fenced_delete_of_more_rows_than_a_statement_takes_parameters(
    few_parameters: int,
) -> None:
    # Django's delete() of a queryset needs no list of ids, and batches the ids it reads:
    # a fenced delete must not put all of them into one statement either.
    count = few_parameters * 2 + 3
    FencedRecord.objects.bulk_create(FencedRecord(key=str(n)) for n in range(count))
    deleted = FencedRecord.objects.all().fenced_delete(5)
    assert deleted == (count, {FencedRecord._meta.label: count})
    assert not FencedRecord.objects.exists()


def test_fenced_update_by_ids_of_more_rows_than_a_statement_takes_parameters(
    few_parameters: int,
) -> None:
    # A filter across a join: the ids are selected first, then the fence's table is
    # claimed and the values written by them, in batches that fit a statement; a newer
    # token on the last row still leaves every batch unwritten.
    count = few_parameters * 2 + 3
    FencedRecord.objects.bulk_create(FencedRecord(key=str(n)) for n in range(count))
    rows = FencedRecord.objects.filter(fencedshipment__isnull=True)
    last = FencedRecord.objects.order_by("pk").last()
    assert last is not None
    FencedRecord.objects.filter(pk=last.pk).fenced_update(9, data="nine")
    with pytest.raises(locks.StaleToken, match="newer token 9"):
        rows.fenced_update(7, data="seven")
    assert FencedRecord.objects.filter(fence=0, data="").count() == count - 1
    assert rows.fenced_update(9, data="x", key=Concat("key", Value("!"))) == count
    assert FencedRecord.objects.filter(fence=9, data="x", key__endswith="!").count() == count


GROUPED: dict[str, Callable[[Any], Any]] = {
    "distinct": lambda rows: rows.distinct(),
    "values-distinct": lambda rows: rows.values("key").distinct(),
    "aggregate": lambda rows: rows.annotate(greatest=Max("fence")),
    "values-aggregate": lambda rows: rows.values("data").annotate(count=Count("pk")),
}


@pytest.mark.parametrize("name", list(GROUPED))
def test_fenced_writes_of_distinct_and_grouped_querysets_work_as_on_the_plain_one(
    name: str,
) -> None:
    # PostgreSQL refuses FOR UPDATE with DISTINCT or GROUP BY: the check for a newer
    # token must not carry them, as Django's UPDATE does not.
    a, b, c = FencedRecord.objects.bulk_create(
        FencedRecord(key=key, data="todo") for key in ("a", "b", "c")
    )
    FencedRecord.objects.create(key="other", data="other")
    rows, shape = FencedRecord.objects.filter(data="todo"), GROUPED[name]
    assert shape(rows).fenced_update(5, data="todo") == 3
    FencedRecord.objects.filter(pk=c.pk).fenced_update(9)
    with pytest.raises(locks.StaleToken, match="newer token 9"):
        shape(rows).fenced_update(7, data="seven")
    # Django's delete() refuses values(), and so does fenced_delete().
    deletes = not name.startswith("values")
    with pytest.raises(locks.StaleToken if deletes else TypeError):
        shape(rows).fenced_delete(7)
    assert [stored(pk) for pk in (a.pk, b.pk, c.pk)] == [("todo", 5), ("todo", 5), ("todo", 9)]
    assert (shape(rows) if deletes else rows).fenced_delete(9) == (3, {FencedRecord._meta.label: 3})
    assert FencedRecord.objects.values_list("key", flat=True).get() == "other"


def shipment(fence: int) -> FencedShipment:
    child = FencedShipment.objects.create(key="ship", data="newer", carrier="ups")
    child.save(fence=fence)
    return child


def claims_check_the_fence(queries: CaptureQueriesContext) -> bool:
    """Whether the UPDATE of the fence's table carries the fence condition."""
    parent = FencedRecord._meta.db_table
    claims = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].lstrip().upper().startswith("UPDATE") and parent in q["sql"]
    ]
    return bool(claims) and all("fence" in sql.split("WHERE", 1)[1] for sql in claims)


@pytest.mark.parametrize(
    "write",
    [
        lambda child: FencedShipment.objects.get(pk=child.pk).delete(fence=3),
        lambda child: FencedShipment.objects.filter(pk=child.pk).fenced_delete(3),
        lambda child: FencedShipment.objects.filter(carrier="ups").fenced_update(3, data="old"),
        # A filter across a join: Django updates by ids it selected first.
        lambda child: FencedRecord.objects.filter(fencedshipment__carrier="ups").fenced_update(
            3, data="old"
        ),
    ],
    ids=["delete", "fenced_delete", "fenced_update", "joined-filter"],
)
def test_fenced_writes_under_multi_table_inheritance_check_the_fence_where_it_is(
    write: Callable[[FencedShipment], object],
) -> None:
    # The fence lives in the parent's table: Django's own update of it would select the
    # ids first and then write them without the fence condition, so that a newer holder's
    # write in between could be overwritten or deleted.
    child = shipment(fence=7)
    with CaptureQueriesContext(connection) as queries, pytest.raises(locks.StaleToken):
        write(child)
    assert claims_check_the_fence(queries), queries.captured_queries
    stored_child = FencedShipment.objects.get(pk=child.pk)
    assert (stored_child.data, stored_child.carrier, stored_child.fence) == ("newer", "ups", 7)


def test_fenced_writes_under_multi_table_inheritance_go_through_with_a_newer_token() -> None:
    child = shipment(fence=7)
    assert FencedShipment.objects.filter(pk=child.pk).fenced_update(8, carrier="dhl") == 1
    assert FencedShipment.objects.values_list("carrier", "fence").get() == ("dhl", 8)
    assert (
        FencedRecord.objects.filter(fencedshipment__carrier="dhl").fenced_update(9, data="nine")
        == 1
    )
    assert FencedShipment.objects.values_list("data", "fence").get() == ("nine", 9)
    FencedShipment.objects.get(pk=child.pk).delete(fence=9)
    assert not FencedRecord.objects.exists()


def test_a_fenced_update_across_tables_never_sets_an_older_fence_over_a_newer_one() -> None:
    # The fence is the child's column, `label` the parent's: Django's own update would
    # select the ids first and then write the child's fence by them without its condition.
    # A newer holder writes in between (here, on the same connection, right after the
    # first SELECT of the update): ours must be refused. (Its write shares our
    # transaction here, so the refusal's rollback takes it back too.)
    parcel = FencedParcel.objects.create(label="new", state="new")
    parcel.save(fence=5)
    table = connection.ops.quote_name(FencedParcel._meta.db_table)
    newer = f"UPDATE {table} SET fence = 10, state = 'newer' WHERE parcel_ptr_id = %s"
    injected: list[str] = []

    def newer_holder_writes(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if not injected and sql.lstrip().upper().startswith("SELECT"):
            injected.append(sql)
            with context["connection"].cursor() as cursor:
                cursor.execute(newer, [parcel.pk])
        return result

    with connection.execute_wrapper(newer_holder_writes), pytest.raises(locks.StaleToken):
        FencedParcel.objects.filter(state="new").fenced_update(5, label="stale")
    assert injected
    assert FencedParcel.objects.values_list("label", "state", "fence").get() == ("new", "new", 5)
    assert FencedParcel.objects.filter(pk=parcel.pk).fenced_update(6, label="six") == 1
    assert FencedParcel.objects.values_list("label", "fence").get() == ("six", 6)


def pallet(fence: int) -> FencedPallet:
    """A pallet whose two parents' ids differ, and a crate of its own with the pallet's pk."""
    Carton.objects.create(label="no pallet")  # the cartons' ids run one ahead of the crates'
    child = FencedPallet.objects.create(label="pallet", contents="newer", slot="a1")
    child.save(fence=fence)
    other = FencedCrate.objects.create(contents="another crate")
    assert child.pk == other.pk != child.fencedcrate_ptr_id
    return child


def pallets_and_crates() -> list[tuple[Any, ...]]:
    return [
        *FencedPallet.objects.values_list("label", "contents", "slot", "fence"),
        *FencedCrate.objects.filter(fencedpallet=None).values_list("contents", "fence"),
    ]


@pytest.mark.parametrize(
    "write",
    [
        lambda child: FencedPallet.objects.get(pk=child.pk).delete(fence=3),
        lambda child: FencedPallet.objects.filter(slot="a1").fenced_delete(3),
        lambda child: FencedPallet.objects.filter(slot="a1").fenced_update(3, slot="b2"),
        lambda child: FencedPallet.objects.filter(slot="a1").fenced_update(3, label="old"),
    ],
    ids=["delete", "fenced_delete", "fenced_update", "fenced_update-first-parent"],
)
def test_fenced_writes_with_the_fence_on_a_second_concrete_parent_check_that_parents_row(
    write: Callable[[FencedPallet], object],
) -> None:
    # The pallet's pk is its link to its first parent; the fence is on its second, whose
    # row has another id: the claim must find the pallet's crate, not the crate whose id
    # is the pallet's pk.
    child = pallet(fence=7)
    before = pallets_and_crates()
    with pytest.raises(locks.StaleToken):
        write(child)
    assert (
        pallets_and_crates()
        == before
        == [
            ("pallet", "newer", "a1", 7),
            ("another crate", 0),
        ]
    )


def test_fenced_writes_with_the_fence_on_a_second_concrete_parent_go_through() -> None:
    child = pallet(fence=7)
    assert FencedPallet.objects.filter(slot="a1").fenced_update(8, slot="b2", contents="8") == 1
    assert pallets_and_crates() == [("pallet", "8", "b2", 8), ("another crate", 0)]
    FencedPallet.objects.get(pk=child.pk).delete(fence=8)
    assert pallets_and_crates() == [("another crate", 0)]
    again = pallet(fence=9)
    assert FencedPallet.objects.filter(pk=again.pk).fenced_delete(9) == (
        3,
        {"testapp.FencedPallet": 1, "testapp.Carton": 1, "testapp.FencedCrate": 1},
    )
    assert pallets_and_crates() == [("another crate", 0)] * 2


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda record: record.delete(fence="5"), TypeError),
        (lambda record: record.delete(fence=True), TypeError),
        (lambda record: record.delete(fence=0), ValueError),
        (lambda record: FencedRecord.objects.all().fenced_delete(-1), ValueError),
        (lambda record: FencedRecord.objects.all()[:1].fenced_delete(5), TypeError),
        # The stubs type values() as a plain QuerySet; at run time it keeps the class.
        (lambda record: cast(Any, FencedRecord.objects.values("key")).fenced_delete(5), TypeError),
        (
            lambda record: cast(Any, FencedRecord.objects.values_list("pk")).fenced_delete(5),
            TypeError,
        ),
        (lambda record: FencedRecord(key="unsaved").delete(fence=5), ValueError),
    ],
    ids=[
        "str-token",
        "bool-token",
        "zero-token",
        "negative-token",
        "sliced",
        "values",
        "values-list",
        "unsaved",
    ],
)
def test_fenced_delete_refuses_bad_arguments_before_any_query(
    call: Callable[[Any], Any], error: type[Exception]
) -> None:
    record = FencedRecord.objects.create(key="k", data="a")
    with CaptureQueriesContext(connection) as queries, pytest.raises(error):
        call(record)
    assert len(queries) == 0
    assert stored(record.pk) == ("a", 0)


NEEDS_SERVER = pytest.mark.skipif(
    BACKEND == "sqlite", reason="SQLite has one writer at a time and no isolation levels"
)


@pytest.fixture(params=["REPEATABLE READ", "SERIALIZABLE"])
def isolation(request: pytest.FixtureRequest) -> Iterator[str]:
    """Django's connection runs its transactions under this isolation level, as with the
    alias's ``OPTIONS["isolation_level"]`` (REPEATABLE READ is MariaDB's own default)."""
    with isolation_level(request.param):
        yield request.param


@NEEDS_SERVER
def test_a_stale_fenced_delete_never_deletes_the_row_a_newer_holder_inserts_meanwhile(
    start: Callable[..., Remote],
) -> None:
    # A newer holder (token 7) deleted the row, and inserts it anew with its token right
    # after the stale holder's claim found no row to claim: the stale delete must not
    # remove the newer holder's row.
    record = FencedRecord.objects.create(key="k", data="old")
    record.save(fence=3)
    stale = FencedRecord.objects.get(pk=record.pk)
    newer = start()
    assert newer.call("fenced_delete", pk=record.pk, token=7)["ok"]
    inserted: list[dict[str, Any]] = []

    def newer_holder_inserts(execute: Any, sql: str, params: Any, many: bool, ctx: Any) -> Any:
        result = execute(sql, params, many, ctx)
        if not inserted and sql.lstrip().upper().startswith("SELECT"):
            # The claim matched nothing; the row comes back before the stale delete ends.
            inserted.append(newer.call("fenced_insert", pk=record.pk, key="k", data="B", token=7))
        return result

    with connection.execute_wrapper(newer_holder_inserts):
        deleted = stale.delete(fence=5)
    assert inserted and inserted[0]["ok"], inserted
    assert deleted == (0, {})  # there was no row of ours to delete
    assert stored(record.pk) == ("B", 7)


@NEEDS_SERVER
def test_a_stale_fenced_delete_under_another_isolation_level_leaves_a_newer_holders_row(
    start: Callable[..., Remote], isolation: str
) -> None:
    # The stale holder's transaction took its snapshot after a newer holder (token 7)
    # deleted the row and before it inserted it anew. Its claim (an UPDATE) sees the
    # newest row on MariaDB while its plain reads see the snapshot, without the row.
    record = FencedRecord.objects.create(key="k", data="old")
    record.save(fence=3)
    stale = FencedRecord.objects.get(pk=record.pk)
    newer = start()
    assert newer.call("fenced_delete", pk=record.pk, token=7)["ok"]
    refused = False
    with transaction.atomic():
        Item.objects.count()  # the snapshot is taken here, on another table
        wrote = newer.call("fenced_insert", pk=record.pk, key="k", data="B", token=7)
        assert wrote["ok"], wrote
        try:
            stale.delete(fence=5)
        except locks.StaleToken:
            refused = True
    assert stored(record.pk) == ("B", 7)
    if connection.vendor == "mysql" and isolation == "REPEATABLE READ":
        assert refused, "MariaDB's locking reads see the newer row: the delete is refused"


@NEEDS_SERVER
def test_a_fenced_delete_of_a_queryset_leaves_a_row_a_newer_holder_writes_meanwhile(
    start: Callable[..., Remote],
) -> None:
    # After the claim, a row that matches appears (unclaimed, fence 0), and a newer holder
    # (token 9) writes it while the delete runs: it must not be deleted with token 5.
    FencedRecord.objects.create(key="a", data="todo")
    other = start()
    late: list[dict[str, Any]] = []

    def others_write(execute: Any, sql: str, params: Any, many: bool, ctx: Any) -> Any:
        result = execute(sql, params, many, ctx)
        if sql.lstrip().upper().startswith("SELECT"):
            if not late:  # the claim's check: a new row appears
                late.append(other.call("create_record", key="late", data="todo"))
            elif len(late) == 1:  # the rows to delete were read: a newer holder writes
                late.append(other.call("fenced_save", pk=late[0]["pk"], data="nine", token=9))
        return result

    with connection.execute_wrapper(others_write):
        FencedRecord.objects.filter(data="todo").fenced_delete(5)
    assert len(late) == 2 and all(event["ok"] for event in late), late
    assert FencedRecord.objects.values_list("key", "data", "fence").get() == ("late", "nine", 9)


@NEEDS_SERVER
def test_a_stale_fenced_delete_of_a_queryset_under_another_isolation_level_leaves_newer_rows(
    start: Callable[..., Remote], isolation: str
) -> None:
    # The stale holder's snapshot still shows the row as the queryset selects it; a newer
    # holder (token 7) has rewritten it since, so that it no longer matches.
    record = FencedRecord.objects.create(key="k", data="todo")
    record.save(fence=3)
    newer = start()
    with transaction.atomic():
        Item.objects.count()  # the snapshot is taken here, on another table
        wrote = newer.call("fenced_save", pk=record.pk, data="done", token=7)
        assert wrote["ok"], wrote
        # PostgreSQL refuses to write a row changed since the snapshot.
        with contextlib.suppress(locks.StaleToken, OperationalError):
            FencedRecord.objects.filter(data="todo").fenced_delete(5)
    assert stored(record.pk) == ("done", 7)


@NEEDS_SERVER
def test_a_stale_fenced_save_under_another_isolation_level_names_the_newer_token(
    start: Callable[..., Remote], isolation: str
) -> None:
    # The stale holder's snapshot shows the row at fence 3; a newer holder writes it with
    # token 7 after that. MariaDB's UPDATE sees the newer row, its plain reads the snapshot.
    record = FencedRecord.objects.create(key="k", data="old")
    record.save(fence=3)
    stale = FencedRecord.objects.get(pk=record.pk)
    newer = start()
    with transaction.atomic():
        Item.objects.count()  # the snapshot is taken here, on another table
        wrote = newer.call("fenced_save", pk=record.pk, data="B", token=7)
        assert wrote["ok"], wrote
        stale.data = "stale"
        # PostgreSQL refuses to write a row changed since the snapshot (OperationalError).
        refused = pytest.raises(locks.StaleToken if connection.vendor == "mysql" else Exception)
        with refused as error, transaction.atomic():
            stale.save(fence=5)
    if connection.vendor == "mysql":
        assert "newer token 7" in str(error.value), error.value
    assert stored(record.pk) == ("B", 7)


@NEEDS_SERVER
def test_a_stale_fenced_save_under_another_isolation_level_never_overwrites_a_new_row(
    start: Callable[..., Remote], isolation: str
) -> None:
    # The snapshot was taken after a newer holder (token 7) deleted the row and before it
    # inserted it anew: the stale copy's save must not overwrite the new row.
    record = FencedRecord.objects.create(key="k", data="old")
    record.save(fence=3)
    stale = FencedRecord.objects.get(pk=record.pk)
    newer = start()
    assert newer.call("fenced_delete", pk=record.pk, token=7)["ok"]
    with transaction.atomic():
        Item.objects.count()  # the snapshot is taken here, on another table
        wrote = newer.call("fenced_insert", pk=record.pk, key="k", data="B", token=7)
        assert wrote["ok"], wrote
        stale.data = "stale"
        with pytest.raises(locks.StaleToken) as error, transaction.atomic():
            stale.save(fence=5)
    if connection.vendor == "mysql" and isolation == "REPEATABLE READ":
        assert "newer token 7" in str(error.value), error.value
    assert stored(record.pk) == ("B", 7)


# --- the paused holder -----------------------------------------------------------------------


def test_a_paused_holder_wakes_up_to_stale_token_and_the_newer_holders_data_stands(
    start: Callable[..., Remote],
) -> None:
    record = FencedRecord.objects.create(key="shared", data="initial")
    a, b = start(), start()
    # A holds a short lease that its watchdog keeps renewing while A runs.
    first = a.call("acquire", name="shared", ttl=2.0, auto_renew=True)
    assert first["ok"], first
    assert locks.check_token("shared", first["token"])
    a.kill(signal.SIGSTOP)  # a GC pause, swap, a debugger: A cannot renew now
    deadline = time.monotonic() + 30
    while locks.is_locked("shared"):  # past the TTL, by the database clock
        assert time.monotonic() < deadline, "A's lease never expired"
        time.sleep(0.1)

    second = b.call("acquire", name="shared", ttl=60)
    assert second["ok"] and second["token"] > first["token"], (first, second)
    wrote = b.call("fenced_save", pk=record.pk, data="B", token=second["token"])
    assert wrote["ok"], wrote

    a.kill(signal.SIGCONT)  # A wakes up believing it still holds the lock
    checked = a.call("check_token", name="shared", token=first["token"])
    assert checked["ok"] and checked["live"] is False
    stale = a.call("fenced_save", pk=record.pk, data="A", token=first["token"])
    assert not stale["ok"] and stale["error"] == "StaleToken", stale
    stale = a.call("fenced_delete", pk=record.pk, token=first["token"])
    assert not stale["ok"] and stale["error"] == "StaleToken", stale

    assert stored(record.pk) == ("B", second["token"])
    assert b.call("check_token", name="shared", token=second["token"])["live"] is True
    assert locks.check_token("shared", second["token"])
    assert not locks.check_token("shared", first["token"])
