"""The flush between transactional tests (``tests.flush``) leaves every table empty but two."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.db import connections

import locks
from tests import flush

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])


def _rows(alias: str, table: str) -> int:
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM {connection.ops.quote_name(table)}")
        return int(cursor.fetchone()[0])


def test_the_flush_empties_every_table_of_djangos_flush_but_content_types_and_permissions() -> None:
    user = User.objects.create_user("flushed")
    group = Group.objects.create(name="flushed")
    group.permissions.set(Permission.objects.filter(codename="view_lock"))
    user.groups.add(group)
    lease = locks.try_acquire("flush:row", ttl=60)
    assert lease is not None
    other = locks.try_acquire("flush:row", ttl=60, using="other")
    assert other is not None
    permissions, types = Permission.objects.count(), ContentType.objects.count()

    for alias in ("default", "other"):
        flush.empty(alias)

    for alias in ("default", "other"):
        djangos = connections[alias].introspection.django_table_names(only_existing=True)
        assert set(flush.emptied_tables(alias)) == set(djangos) - flush.KEPT
        assert {"locks_lock", "auth_user", "auth_user_groups", "auth_group_permissions"} <= set(
            flush.emptied_tables(alias)
        )
        left = {t: n for t in flush.emptied_tables(alias) if (n := _rows(alias, t))}
        assert left == {}, alias
    assert Permission.objects.count() == permissions > 0
    assert ContentType.objects.count() == types > 0
    assert not locks.is_locked("flush:row")
